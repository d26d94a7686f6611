"""Webhook notifications signed with HMAC-SHA256.

Each POST carries:
    X-Tailguard-Timestamp: <unix seconds>
    X-Tailguard-Signature: sha256=<hex HMAC-SHA256(secret, f"{timestamp}.{body}")>
    Idempotency-Key: <the action's key>
A receiver recomputes the signature over the raw body with `verify_signature`.
The secret is read from an environment variable or a file when sending, and is
never logged nor put into an error message.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import requests
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from controller.actuators.http import RetryPolicy, redact_url, request_with_retry
from controller.protocols import ActionOutcome, Clock, OutcomeStatus

log = logging.getLogger(__name__)

TIMESTAMP_HEADER = "X-Tailguard-Timestamp"
SIGNATURE_HEADER = "X-Tailguard-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"


class WebhookSecretError(Exception):
    """The configured secret cannot be read. The message names the source, never the value."""


class WebhookReceiver(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="http(s) URL the notification is POSTed to")
    secretEnv: str | None = Field(default=None, description="name of the environment variable holding the secret")
    secretFile: Path | None = Field(
        default=None, description="file holding the secret (surrounding whitespace is stripped)"
    )
    timeout: float = Field(default=5.0, gt=0, description="seconds per attempt")
    retries: int = Field(default=3, ge=1, description="attempts in all, on connection errors, 429 and 5xx only")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("expected an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _one_secret(self) -> WebhookReceiver:
        if (self.secretEnv is None) == (self.secretFile is None):
            raise ValueError("set exactly one of secretEnv (an environment variable name) or secretFile (a path)")
        return self

    def secret(self) -> bytes:
        if self.secretEnv is not None:
            value = os.environ.get(self.secretEnv)
            if not value:
                raise WebhookSecretError(f"environment variable {self.secretEnv} is not set or empty")
            return value.encode("utf-8")
        assert self.secretFile is not None
        try:
            text = self.secretFile.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise WebhookSecretError(f"secret file {self.secretFile}: {exc.strerror or type(exc).__name__}") from None
        if not text:
            raise WebhookSecretError(f"secret file {self.secretFile} is empty")
        return text.encode("utf-8")


def _bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


def sign(secret: str | bytes, timestamp: str, body: str | bytes) -> str:
    """The signature header value: `sha256=` + hex HMAC-SHA256 over `{timestamp}.{body}`."""
    message = _bytes(timestamp) + b"." + _bytes(body)
    return "sha256=" + hmac.new(_bytes(secret), message, hashlib.sha256).hexdigest()


def verify_signature(secret: str | bytes, timestamp: str, body: str | bytes, header: str) -> bool:
    """For receivers: does `header` (X-Tailguard-Signature) match the raw body and timestamp?"""
    if not header.startswith("sha256="):
        return False
    return hmac.compare_digest(sign(secret, timestamp, body).encode("ascii"), header.strip().encode("ascii", "replace"))


class WebhookNotifier:
    def __init__(
        self,
        receivers: Mapping[str, WebhookReceiver],
        clock: Clock,
        *,
        backoff: float = 0.5,
        session: requests.Session | None = None,
    ) -> None:
        self.receivers = dict(receivers)
        self.clock = clock
        self.backoff = backoff
        self.session = session or requests.Session()

    def notify(self, receiver: str, payload: Mapping[str, Any], *, idempotency_key: str) -> ActionOutcome:
        settings = self.receivers.get(receiver)
        if settings is None:
            known = ", ".join(sorted(self.receivers)) or "none"
            return ActionOutcome(
                OutcomeStatus.FAILED,
                {"receiver": receiver},
                f"unknown receiver {receiver!r}; configured: {known}",
                False,
            )
        try:
            secret = settings.secret()
        except WebhookSecretError as exc:
            return ActionOutcome(OutcomeStatus.FAILED, {"receiver": receiver}, f"receiver {receiver!r}: {exc}", False)
        body = json.dumps(
            {**payload, "receiver": receiver, "idempotency_key": idempotency_key},
            sort_keys=True,
            separators=(",", ":"),
            default=str,
        ).encode("utf-8")
        # One timestamp for every attempt: a retry is the same message, the receiver dedups by key.
        timestamp = str(int(self.clock.now()))
        headers = {
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: sign(secret, timestamp, body),
            IDEMPOTENCY_HEADER: idempotency_key,
        }
        answer = request_with_retry(
            self.session,
            "POST",
            settings.url,
            clock=self.clock,
            timeout=settings.timeout,
            retry=RetryPolicy(attempts=settings.retries, backoff=self.backoff),
            data=body,
            headers=headers,
        )
        detail = {
            "receiver": receiver,
            "url": redact_url(settings.url),
            "http_status": answer.status,
            "attempts": answer.attempts,
        }
        if not answer.ok:
            log.warning("notification to %s failed after %d attempt(s): %s", receiver, answer.attempts, answer.error)
            return ActionOutcome(
                OutcomeStatus.FAILED, detail, f"receiver {receiver!r}: {answer.error}", answer.transient
            )
        log.info("notified %s (%s, HTTP %s)", receiver, redact_url(settings.url), answer.status)
        return ActionOutcome(OutcomeStatus.SUCCEEDED, detail)
