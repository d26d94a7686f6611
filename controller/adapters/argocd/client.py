"""The Argo CD REST API as tailguard calls it: read an application, roll it back, merge-patch it.

Every call has a timeout and bounded retry of transient errors (the kit's `request_with_retry`, through the
injected clock); the bearer token is read from a file or an environment variable at each call and never logged.
Reads raise `ArgoCDError` (transient or not); actions get the `HttpAnswer` and decide. `history_of` reads an
application's deployment history. Shared by the rollback adapter and change tracking.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from tailguard.controller.core.ports import Clock
from tailguard.controller.kit.errors import ActuatorError
from tailguard.controller.kit.http import HttpAnswer, RetryPolicy, redact_url, request_with_retry

GRPC_FAILED_PRECONDITION = 9
GRPC_INVALID_ARGUMENT = 3
GRPC_UNAUTHENTICATED = 16


class ArgoCDError(ActuatorError):
    """A read from Argo CD failed (reads raise; actions return outcomes)."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message, transient=transient)


def read_token(token_file: str | Path | None, token_env: str | None) -> str | None:
    """The bearer token from its file or environment variable; None when absent (never logged)."""
    if token_file is not None:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return token or None
    if token_env is not None:
        return os.environ.get(token_env, "").strip() or None
    return None


@dataclass(frozen=True)
class HistoryEntry:
    id: int
    revision: str
    deployed_at: str | None
    source: Mapping[str, Any]


def history_of(app: Mapping[str, Any]) -> list[HistoryEntry]:
    """`status.history`, oldest first (ids ascend; int64 may arrive as a JSON string)."""
    entries = []
    for raw in (app.get("status") or {}).get("history") or []:
        try:
            entry_id = int(raw["id"])
        except (KeyError, TypeError, ValueError):
            continue
        entries.append(
            HistoryEntry(entry_id, str(raw.get("revision", "")), raw.get("deployedAt"), dict(raw.get("source") or {}))
        )
    return sorted(entries, key=lambda e: e.id)


def grpc_code(answer: HttpAnswer) -> int | None:
    body = answer.body
    if isinstance(body, Mapping) and isinstance(body.get("code"), int):
        return int(body["code"])
    return None


def error_message(answer: HttpAnswer) -> str:
    body = answer.body
    if isinstance(body, Mapping):
        text = body.get("message") or body.get("error")
        if isinstance(text, str):
            return text.strip()
    return answer.error or answer.text[:200]


class ArgoCDClient:
    """The Argo CD REST calls tailguard makes: read an app, roll it back, merge-patch it."""

    def __init__(
        self,
        base_url: str,
        *,
        clock: Clock,
        token: Callable[[], str | None],
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.5,
        session: requests.Session | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.clock = clock
        self.token = token
        self.timeout = timeout
        self.retry = RetryPolicy(attempts=max(1, retries), backoff=backoff)
        self.session = session or requests.Session()

    def url(self, name: str, suffix: str = "", app_namespace: str | None = None) -> str:
        url = f"{self.base_url}/api/v1/applications/{quote(name, safe='')}{suffix}"
        return url + (f"?appNamespace={quote(app_namespace, safe='')}" if app_namespace else "")

    def call(
        self,
        method: str,
        url: str,
        body: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> HttpAnswer:
        token = self.token()
        if token is None:
            return HttpAnswer(None, None, "", f"{method} {redact_url(url)}: no Argo CD token configured", False, 0)
        headers = {"Accept": "application/json", "Authorization": f"Bearer {token}"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        return request_with_retry(
            self.session,
            method,
            url,
            clock=self.clock,
            timeout=self.timeout,
            retry=retry or self.retry,
            json_body=dict(body) if body is not None else None,
            headers=headers,
        )

    def get_app(self, name: str, app_namespace: str | None = None) -> dict[str, Any]:
        answer = self.call("GET", self.url(name, app_namespace=app_namespace))
        if not answer.ok:
            raise ArgoCDError(describe_failure(answer, f"reading application {name!r}"), transient=answer.transient)
        if not isinstance(answer.body, Mapping):
            raise ArgoCDError(f"reading application {name!r}: expected a JSON object", transient=False)
        return dict(answer.body)


def describe_failure(answer: HttpAnswer, what: str) -> str:
    if answer.status == 401 or grpc_code(answer) == GRPC_UNAUTHENTICATED:
        return f"{what}: unauthorized (HTTP 401: {error_message(answer)}); check the Argo CD token"
    if answer.status is None:
        return f"{what}: {answer.error}"
    return f"{what}: HTTP {answer.status}: {error_message(answer)}"
