"""One outbound HTTP call with a timeout, a bounded retry with backoff on transient errors only.

Transient: connection errors, timeouts, 429 and 5xx. Everything else (4xx) is the
caller's mistake and retrying it would only repeat it. Sleeping goes through the
injected clock, so tests never wait. Answers are data (`HttpAnswer`), never
exceptions, and error texts name the URL without credentials or query string.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

from controller.kit.clock import Clock

log = logging.getLogger(__name__)

TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3  # total tries, the first included
    backoff: float = 0.5  # seconds before the second try, doubled each time
    max_backoff: float = 8.0

    def delay(self, failed_attempts: int) -> float:
        return float(min(self.max_backoff, self.backoff * (2 ** max(0, failed_attempts - 1))))


@dataclass(frozen=True)
class HttpAnswer:
    status: int | None  # None: no HTTP answer at all (connection error, timeout)
    body: Any  # parsed JSON, or None
    text: str
    error: str | None  # None on 2xx
    transient: bool
    attempts: int

    @property
    def ok(self) -> bool:
        return self.error is None

    def server_message(self) -> str:
        """The `{"error": ...}` text the server sent, else a short excerpt of the body."""
        if isinstance(self.body, Mapping) and isinstance(self.body.get("error"), str):
            return str(self.body["error"])
        return self.text[:200]


def redact_url(url: str) -> str:
    """The URL as it may appear in logs and errors: no user:password@, no query, no fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def request_with_retry(
    session: requests.Session,
    method: str,
    url: str,
    *,
    clock: Clock,
    timeout: float,
    retry: RetryPolicy,
    json_body: Any = None,
    data: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> HttpAnswer:
    shown = f"{method} {redact_url(url)}"
    attempts = max(1, retry.attempts)
    answer: HttpAnswer | None = None
    for attempt in range(1, attempts + 1):
        answer = _once(
            session,
            method,
            url,
            shown,
            timeout=timeout,
            json_body=json_body,
            data=data,
            headers=headers,
            attempt=attempt,
        )
        if answer.ok or not answer.transient or attempt == attempts:
            return answer
        delay = retry.delay(attempt)
        log.info(
            "%s failed (%s), attempt %d of %d; retrying in %.2fs",
            shown,
            answer.error,
            attempt,
            attempts,
            delay,
        )
        clock.sleep(delay)
    assert answer is not None
    return answer


def _once(
    session: requests.Session,
    method: str,
    url: str,
    shown: str,
    *,
    timeout: float,
    json_body: Any,
    data: bytes | None,
    headers: Mapping[str, str] | None,
    attempt: int,
) -> HttpAnswer:
    try:
        response = session.request(
            method,
            url,
            json=json_body,
            data=data,
            headers=dict(headers or {}),
            timeout=timeout,
            allow_redirects=False,
        )
    except requests.Timeout:
        return HttpAnswer(None, None, "", f"{shown}: timed out after {timeout:g}s", True, attempt)
    except requests.ConnectionError as exc:
        return HttpAnswer(None, None, "", f"{shown}: connection failed ({type(exc).__name__})", True, attempt)
    except requests.RequestException as exc:
        return HttpAnswer(None, None, "", f"{shown}: request failed ({type(exc).__name__})", False, attempt)
    text = response.text
    body: Any = None
    if text:
        try:
            body = json.loads(text)
        except ValueError:
            body = None
    if 200 <= response.status_code < 300:
        return HttpAnswer(response.status_code, body, text, None, False, attempt)
    answer = HttpAnswer(response.status_code, body, text, None, response.status_code in TRANSIENT_STATUSES, attempt)
    error = f"{shown}: HTTP {response.status_code}: {answer.server_message()}"
    return HttpAnswer(response.status_code, body, text, error, answer.transient, attempt)
