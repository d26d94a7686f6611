"""One outbound HTTP call with a timeout, a bounded retry with backoff on transient errors only.

Transient: connection errors, timeouts, 429 and 5xx. Everything else (4xx) is the
caller's mistake and retrying it would only repeat it. Sleeping goes through the
injected clock, so tests never wait. Answers are data (`HttpAnswer`), never
exceptions, and error texts name the URL without credentials or query string.

The retry rule lives here once, for every READ path of every adapter: `backoff_delay` (exponential, capped,
never shorter than a server's Retry-After) and `retrying` (the bounded loop through the clock). Adapters whose
client library is not `requests` (the Kubernetes client, grafana-client, prometheus-api-client) drive their one
attempt through `retrying` too. Actions are not retried here: an action adapter makes one attempt and reports
`transient`, and the dispatcher alone retries it (with the same `backoff_delay`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import requests

from controller.kit.clock import Clock

log = logging.getLogger(__name__)

TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})

R = TypeVar("R")


def backoff_delay(
    failed_attempts: int,
    *,
    backoff: float,
    max_backoff: float,
    factor: float = 2.0,
    retry_after: float | None = None,
) -> float:
    """Seconds to wait after `failed_attempts` failures: `backoff`, times `factor` per further failure, at least
    the server's `retry_after` when it sent one, and never more than `max_backoff`."""
    delay = backoff * factor ** max(0, failed_attempts - 1)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return float(min(max_backoff, delay))


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3  # total tries, the first included
    backoff: float = 0.5  # seconds before the second try, doubled each time
    max_backoff: float = 8.0

    def delay(self, failed_attempts: int, retry_after: float | None = None) -> float:
        return backoff_delay(
            failed_attempts, backoff=self.backoff, max_backoff=self.max_backoff, retry_after=retry_after
        )


def retrying(
    attempt: Callable[[int], R],
    *,
    retry: RetryPolicy,
    clock: Clock,
    failure: Callable[[R], str | None],
    transient: Callable[[R], bool],
    what: str,
    retry_after: Callable[[R], float | None] | None = None,
) -> R:
    """Call `attempt(1)`, `attempt(2)`, ... until it succeeds (`failure` is None), fails for good (not
    `transient`) or `retry.attempts` are spent, sleeping `retry.delay` through the clock in between; the last
    answer is returned as it is (answers are data: nothing here raises)."""
    attempts = max(1, retry.attempts)
    number = 1
    while True:
        answer = attempt(number)
        error = failure(answer)
        if error is None or not transient(answer) or number >= attempts:
            return answer
        delay = retry.delay(number, retry_after(answer) if retry_after is not None else None)
        log.info("%s failed (%s), attempt %d of %d; retrying in %.2fs", what, error, number, attempts, delay)
        clock.sleep(delay)
        number += 1


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
    return retrying(
        lambda attempt: _once(
            session,
            method,
            url,
            shown,
            timeout=timeout,
            json_body=json_body,
            data=data,
            headers=headers,
            attempt=attempt,
        ),
        retry=retry,
        clock=clock,
        failure=lambda answer: answer.error,
        transient=lambda answer: answer.transient,
        what=shown,
    )


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
