"""Webhook notifications signed with HMAC-SHA256.

Each POST carries:
    X-Tailguard-Timestamp: <unix seconds>
    X-Tailguard-Signature: sha256=<hex HMAC-SHA256(secret, f"{timestamp}.{body}")>
    Idempotency-Key: <the action's key>
A receiver recomputes the signature over the raw body with `verify_signature`, which also refuses a timestamp
more than `window` seconds (default 300) from its clock: a captured notification cannot be replayed later. A
retried notification keeps its first timestamp (the same signed message, deduplicated by its key) while that is
younger than half the window, and is signed afresh after that, so a retry is never refused as a replay.
The secret is read from an environment variable or a file when sending, and is
never logged nor put into an error message.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlencode

import requests
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tailguard.controller.core.ports import ActionOutcome, Clock, NotifyRequest, OutcomeStatus
from tailguard.controller.kit.errors import ConfigError
from tailguard.controller.kit.http import RetryPolicy, request_with_retry
from tailguard.controller.kit.redact import url_origin
from tailguard.controller.kit.signing import (
    DEFAULT_REPLAY_WINDOW_SECONDS,
    hmac_sha256_hex,
    same_digest,
    timestamp_fresh,
    to_bytes,
)

log = logging.getLogger(__name__)

TIMESTAMP_HEADER = "X-Tailguard-Timestamp"
SIGNATURE_HEADER = "X-Tailguard-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"


class WebhookSecretError(ConfigError):
    """The configured secret cannot be read. The message names the source, never the value."""


class WebhookReceiver(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="http(s) URL the notification is POSTed to")
    secretEnv: str | None = Field(default=None, description="name of the environment variable holding the secret")
    secretFile: Path | None = Field(
        default=None, description="file holding the secret (surrounding whitespace is stripped)"
    )
    timeout: float = Field(default=5.0, gt=0, description="seconds per attempt")
    # Accepted as before (the controller YAML is a contract), but a notification is an action: the notifier makes
    # one attempt and the dispatcher's `attempts` bound the retries.
    retries: int = Field(default=3, ge=1, description="attempts in all, on connection errors, 429 and 5xx only")
    format: Literal["generic", "slack"] = Field(
        default="generic", description="generic: the decision as JSON; slack: Slack-compatible text + blocks"
    )

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


REPLAY_WINDOW_SECONDS = DEFAULT_REPLAY_WINDOW_SECONDS


def sign(secret: str | bytes, timestamp: str, body: str | bytes) -> str:
    """The signature header value: `sha256=` + hex HMAC-SHA256 over `{timestamp}.{body}`."""
    return "sha256=" + hmac_sha256_hex(secret, to_bytes(timestamp) + b"." + to_bytes(body))


def verify_signature(
    secret: str | bytes,
    timestamp: str,
    body: str | bytes,
    header: str,
    *,
    now: float | None = None,
    window: float = REPLAY_WINDOW_SECONDS,
) -> bool:
    """For receivers: does `header` (X-Tailguard-Signature) match the raw body and timestamp, and is the timestamp
    within `window` seconds of `now` (default: this machine's clock)? An old (or far-future) timestamp is refused
    even with a right signature: a notification captured once cannot be posted again later."""
    if not header.startswith("sha256="):
        return False
    if not timestamp_fresh(timestamp, time.time() if now is None else now, window):
        return False
    return same_digest(sign(secret, timestamp, body), header)


# Idempotency keys whose first timestamp is remembered, so a retried notification is the same signed message.
TIMESTAMPS_KEPT = 1024


class WebhookNotifier:
    def __init__(
        self,
        receivers: Mapping[str, WebhookReceiver],
        clock: Clock,
        *,
        session: requests.Session | None = None,
    ) -> None:
        self.receivers = dict(receivers)
        self.clock = clock
        self.session = session or requests.Session()
        # idempotency key -> the timestamp of its first attempt (the last TIMESTAMPS_KEPT keys)
        self._timestamps: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def notify(self, request: NotifyRequest) -> ActionOutcome:
        receiver, idempotency_key = request.receiver, request.idempotency_key
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
        message: Mapping[str, Any] = {
            **request.payload.to_json(),
            "receiver": receiver,
            "idempotency_key": idempotency_key,
        }
        if settings.format == "slack":
            message = slack_payload(message)
        body = json.dumps(
            message,
            sort_keys=True,
            separators=(",", ":"),
            default=str,
        ).encode("utf-8")
        # One timestamp for every attempt: a retry (the dispatcher's) is the same message, the receiver dedups by key.
        timestamp = self._timestamp(idempotency_key)
        headers = {
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: sign(secret, timestamp, body),
            IDEMPOTENCY_HEADER: idempotency_key,
        }
        # One attempt (the dispatcher alone retries actions, transient failures only).
        answer = request_with_retry(
            self.session,
            "POST",
            settings.url,
            clock=self.clock,
            timeout=settings.timeout,
            retry=RetryPolicy(attempts=1),
            data=body,
            headers=headers,
            # A receiver URL's secret may be its path (Slack-style): errors, the journal and logs show its origin.
            shown_url=url_origin(settings.url),
        )
        detail = {
            "receiver": receiver,
            "format": settings.format,
            "url": url_origin(settings.url),
            "http_status": answer.status,
        }
        if not answer.ok:
            log.warning("notification to %s failed: %s", receiver, answer.error)
            return ActionOutcome(
                OutcomeStatus.FAILED, detail, f"receiver {receiver!r}: {answer.error}", answer.transient
            )
        log.info("notified %s (%s, HTTP %s)", receiver, url_origin(settings.url), answer.status)
        return ActionOutcome(OutcomeStatus.SUCCEEDED, detail)

    def _timestamp(self, idempotency_key: str) -> str:
        with self._lock:
            now = self.clock.now()
            timestamp = self._timestamps.pop(idempotency_key, None)
            if timestamp is None or not timestamp_fresh(timestamp, now, REPLAY_WINDOW_SECONDS / 2):
                # A retry late enough that the receiver could take the first timestamp for a replay: signed anew
                # (the Idempotency-Key still says it is the same notification).
                timestamp = str(int(now))
            self._timestamps[idempotency_key] = timestamp
            while len(self._timestamps) > TIMESTAMPS_KEPT:
                self._timestamps.popitem(last=False)
            return timestamp


# -- links and Slack-compatible payloads ---------------------------------------------------------------------------

# The dashboard opens this long before the onset and runs this long past the resolution (or now).
LINK_LEAD_SECONDS = 15 * 60
LINK_TAIL_SECONDS = 5 * 60


class LinkSettings(BaseModel):
    """Where a notification's links point: the Grafana SLO dashboard and the Argo CD application."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    grafanaUrl: str | None = Field(default=None, description="Grafana base URL, e.g. https://grafana.example.com")
    dashboardUid: str = Field(default="tailguard-vllm-slo", min_length=1, description="the SLO dashboard's uid")
    argocdUrl: str | None = Field(default=None, description="Argo CD base URL, e.g. https://argocd.example.com")
    argocdApp: str = Field(
        default="{service}", min_length=1, description="Argo CD application name; {label} takes a target label"
    )

    @field_validator("grafanaUrl", "argocdUrl")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("expected an http:// or https:// URL")
        return value.rstrip("/") if value is not None else None


def _float(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def decision_links(links: LinkSettings, decision: Mapping[str, Any], now: float) -> dict[str, str]:
    """Links for a decision: the dashboard from onset-15m to resolution (or now) +5m, in ms; the Argo CD app."""
    out: dict[str, str] = {}
    target = {str(k): str(v) for k, v in (decision.get("target") or {}).items()}
    if links.grafanaUrl is not None:
        onset = _float(decision.get("onset")) or _float(decision.get("at")) or now
        end = _float(decision.get("resolved_at")) or now
        query: list[tuple[str, str]] = [
            ("from", str(round((onset - LINK_LEAD_SECONDS) * 1000))),
            ("to", str(round((max(end, onset) + LINK_TAIL_SECONDS) * 1000))),
        ]
        query += [(f"var-{name}", target[name]) for name in ("namespace", "service", "version") if name in target]
        out["grafana"] = f"{links.grafanaUrl}/d/{links.dashboardUid}?{urlencode(query)}"
    if links.argocdUrl is not None:
        try:
            app = links.argocdApp.format(**target)
        except (KeyError, IndexError, ValueError):
            app = ""  # the target lacks the label the template names: no link rather than a wrong one
        if app:
            out["argocd"] = f"{links.argocdUrl}/applications/{app}"
    return out


def _mrkdwn(text: str) -> str:
    # Slack mrkdwn: &, < and > must be escaped; everything else is literal.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_payload(message: Mapping[str, Any]) -> dict[str, Any]:
    """A Slack incoming-webhook body (text + blocks) for a tailguard notification."""
    decision = message.get("decision") if isinstance(message.get("decision"), Mapping) else {}
    assert isinstance(decision, Mapping)
    target = decision.get("target") or {}
    where = ", ".join(f"{k}={v}" for k, v in sorted(target.items())) if isinstance(target, Mapping) else ""
    kind = str(decision.get("kind", "notification"))
    title = f"tailguard {kind}: {decision.get('policy', '?')}/{decision.get('condition', '?')}"
    if where:
        title += f" ({where})"
    value, threshold = decision.get("value"), decision.get("threshold")
    summary = str(message.get("message") or decision.get("reason") or "")
    text = f"{title}: {summary}" if summary else title
    fields = [
        f"*value*\n{value if value is not None else 'no-data'}",
        f"*threshold*\n{threshold if threshold is not None else '-'}",
        f"*decision*\n`{decision.get('id', '?')}`",
        f"*dry run*\n{bool(decision.get('dry_run'))}",
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:150]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": _mrkdwn(summary or title)[:3000]}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": _mrkdwn(f)} for f in fields]},
    ]
    extra: list[str] = []
    if decision.get("reason") and decision.get("reason") != summary:
        extra.append(f"*reason*: {decision['reason']}")
    branch = decision.get("branch")
    if isinstance(branch, Mapping):  # the engine's shape (BranchChoice.to_json): {name, reason}
        extra.append(f"*branch*: {branch.get('name')} ({branch.get('reason')})")
    elif branch:
        extra.append(f"*branch*: {branch}")
    attribution = decision.get("attribution")
    if isinstance(attribution, Mapping) and "status" in attribution:
        # The engine's shape (Attribution.to_json): {status, reason, rollout: {revision, ...}}.
        extra.append(f"*attribution*: {attribution.get('reason') or attribution.get('status')}")
    elif isinstance(attribution, Mapping) and attribution.get("revision") is not None:
        extra.append(f"*attributed to rollout* {attribution.get('revision')}")
    actions = message.get("actions") or []
    if isinstance(actions, list) and actions:
        shown = [f"{a.get('type')}: {a.get('status')}" for a in actions if isinstance(a, Mapping)]
        extra.append("*actions*: " + ", ".join(shown))
    evidence = message.get("evidence") or decision.get("evidence") or []
    if isinstance(evidence, list) and evidence:
        recent = evidence[-5:]
        extra.append("*evidence* (last values): " + ", ".join(str(pair[1]) for pair in recent if len(pair) == 2))
    if extra:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _mrkdwn("\n".join(extra))[:3000]}})
    links = message.get("links") or {}
    if isinstance(links, Mapping) and links:
        buttons = [
            {
                "type": "button",
                "text": {
                    "type": "plain_text",
                    "text": {"grafana": "Grafana dashboard", "argocd": "Argo CD app"}.get(name, name),
                },
                "url": str(url),
            }
            for name, url in sorted(links.items())
        ]
        blocks.append({"type": "actions", "elements": buttons})
    context = f"tailguard · receiver {message.get('receiver', '')} · key {message.get('idempotency_key', '')}"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": _mrkdwn(context)}]})
    return {"text": text, "blocks": blocks}
