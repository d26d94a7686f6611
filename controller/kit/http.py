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

Deadlines are TOTAL, not per read: `timeout` bounds one attempt from connect to the body's last byte (a server
that trickles its answer a byte at a time is cut there: `read_within`, `DeadlineAdapter`), and `retrying`'s
`budget` bounds a whole call, every attempt and backoff included: a retry that cannot finish within it is not
started. So one call costs at most `budget` (or attempts x timeout + backoffs without one), never "per read".
A server that trickles its HEADERS is still bounded per read only (urllib3 reads them before the body is ours).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import parse_qs, urlsplit, urlunsplit

import requests
import urllib3.exceptions
from requests.adapters import HTTPAdapter

from tailguard.controller.kit.clock import Clock
from tailguard.controller.kit.errors import TailguardError

log = logging.getLogger(__name__)

TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})

R = TypeVar("R")
READ_CHUNK = 64 * 1024


class DeadlineExceeded(requests.Timeout, TailguardError):
    """An answer did not arrive whole within its total deadline (a hanging or trickling server)."""


def total_seconds(timeout: Any) -> float:
    """A requests timeout (seconds, or (connect, read)) as one total: the sum of a pair."""
    if isinstance(timeout, tuple):
        return float(sum(part for part in timeout if part is not None))
    return float(timeout)


def read_within(response: requests.Response, deadline: float, *, timer: Callable[[], float] = time.monotonic) -> bytes:
    """The whole body of a `stream=True` response, or DeadlineExceeded once `timer()` passes `deadline`.

    Each read waits at most what is left (the socket's timeout is lowered before each read), and a read returns
    what has arrived (read1), so a trickle of one byte per second is cut at the deadline, not at the end."""
    try:
        return read_raw_within(response.raw, deadline, timer=timer)
    except urllib3.exceptions.ReadTimeoutError as slow:
        response.close()
        raise DeadlineExceeded("the answer did not arrive whole within its deadline") from slow
    except urllib3.exceptions.HTTPError as broken:
        response.close()
        raise requests.ConnectionError(f"the answer broke off: {type(broken).__name__}") from broken
    except DeadlineExceeded:
        response.close()
        raise


def read_raw_within(raw: Any, deadline: float, *, timer: Callable[[], float] = time.monotonic) -> bytes:
    """The whole body of a streamed urllib3 response by `deadline` (DeadlineExceeded after it); urllib3's own
    errors pass through. Each read waits at most what is left and returns what has arrived (read1).

    An empty read is not the end by itself: a read whose bytes decode to nothing yet (a gzip header alone, a
    compressed block still buffered in the decoder) comes back empty too, with more of the body behind it
    (urllib3-future's read1 does this for each such block; a gzip answer in HTTP chunks was cut at its first
    one). The body has ended only when an empty read took nothing from the wire, or the response is closed."""
    chunks: list[bytes] = []
    reads = 0
    while True:
        remaining = deadline - timer()
        if remaining <= 0:
            raise DeadlineExceeded(f"the answer did not arrive whole within its deadline ({reads} reads)")
        sock = getattr(getattr(raw, "connection", None), "sock", None)
        if sock is not None:
            sock.settimeout(remaining)
        taken = _wire_position(raw)
        chunk = raw.read1(READ_CHUNK, decode_content=True)
        reads += 1
        if chunk:
            chunks.append(chunk)
        elif _body_ended(raw, taken):
            break
    return b"".join(chunks)


def _wire_position(raw: Any) -> int | None:
    """How many bytes of the body the response has taken from the wire (urllib3's `tell()`), None unknown."""
    tell = getattr(raw, "tell", None)
    if tell is None:
        return None
    try:
        position = tell()
    except (OSError, ValueError):
        return None
    return position if isinstance(position, int) else None


def _body_ended(raw: Any, taken_before: int | None) -> bool:
    """After an empty read: the response is closed, or the read took nothing from the wire (where that is
    known; where it is not, an empty read is the end, as urllib3's own read1 promises)."""
    if getattr(raw, "closed", False) is True:
        return True
    taken_after = _wire_position(raw)
    return taken_before is None or taken_after is None or taken_after == taken_before


CONNECT_SECONDS = 5.0  # the connect part of a total deadline, at most


def _urllib3_total(timeout: Any) -> float | None:
    """The total seconds a urllib3/requests timeout allows: a number, (connect, read) summed, or a Timeout's
    total (else its connect + read); None for no timeout."""
    if timeout is None:
        return None
    if isinstance(timeout, urllib3.Timeout):
        if isinstance(timeout.total, (int, float)):
            return float(timeout.total)
        parts = [part for part in (timeout.connect_timeout, timeout.read_timeout) if isinstance(part, (int, float))]
        return float(sum(parts)) if parts else None
    return total_seconds(timeout)


def _is_watch(url: str) -> bool:
    values = parse_qs(urlsplit(url).query).get("watch", [])
    return any(value.lower() in ("true", "1") for value in values)


class DeadlinePoolManager:
    """A urllib3 PoolManager whose every request ends within its timeout IN TOTAL (connect, headers, the whole
    body; a watch, which never ends, each of its reads): for the Kubernetes client, which hands urllib3 a
    per-read timeout only (`_request_timeout`). The
    timeout becomes (connect, read) = (min(total, CONNECT_SECONDS), what is left), the body is read under the
    deadline (a trickle is cut: DeadlineExceeded, an OSError, so "no answer" to the adapters), and a request
    without a timeout gets `default_total`. Everything else is the wrapped pool's."""

    def __init__(self, pool: Any, default_total: float) -> None:
        self._pool = pool
        self.default_total = default_total

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> urllib3.BaseHTTPResponse:
        total = _urllib3_total(kwargs.pop("timeout", None)) or self.default_total
        if _is_watch(url):
            # A Kubernetes watch (`?watch=true`) is a stream the caller reads event by event: it has no end to
            # wait for, so the timeout bounds the connect and each read, and the caller bounds the whole (the
            # watch's timeoutSeconds, and its `_request_timeout` above that).
            kwargs["timeout"] = urllib3.Timeout(connect=min(total, CONNECT_SECONDS), read=total)
            return cast(urllib3.BaseHTTPResponse, self._pool.request(method, url, *args, **kwargs))
        started = time.monotonic()
        deadline = started + total
        kwargs["timeout"] = urllib3.Timeout(connect=min(total, CONNECT_SECONDS), read=total)
        kwargs["preload_content"] = False
        response = self._pool.request(method, url, *args, **kwargs)
        try:
            body = read_raw_within(response, deadline)
        except urllib3.exceptions.ReadTimeoutError as slow:  # the last read, cut where the deadline is
            response.close()
            raise DeadlineExceeded("the answer did not arrive whole within its deadline") from slow
        except BaseException:
            response.close()  # half read: the connection must not go back to the pool
            raise
        response.release_conn()
        return urllib3.HTTPResponse(
            body=body,
            headers=response.headers,
            status=response.status,
            reason=response.reason,
            preload_content=True,
            decode_content=False,
            request_method=method,
            request_url=url,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


class DeadlineAdapter(HTTPAdapter):
    """A transport adapter whose every request ends within its `timeout` IN TOTAL (connect, headers, the whole
    body), for client libraries that only take a per-read timeout (grafana-client, prometheus-api-client).

    `deadline()` may lower the end further (a call's overall budget); it returns a `time.monotonic()` instant."""

    def __init__(self, *args: Any, deadline: Callable[[], float | None] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def send(  # type: ignore[override]
        self, request: requests.PreparedRequest, stream: bool = False, timeout: Any = None, **kwargs: Any
    ) -> requests.Response:
        started = time.monotonic()
        end = started + total_seconds(timeout) if timeout is not None else None
        outer = self._deadline() if self._deadline is not None else None
        if outer is not None:
            end = outer if end is None else min(end, outer)
        if end is not None:
            left = end - started
            if left <= 0:
                raise DeadlineExceeded("no time left for the request")
            timeout = left if timeout is None else min(total_seconds(timeout), left)
        response = super().send(request, stream=True, timeout=timeout, **kwargs)
        if not stream:
            if end is None:
                response._content = response.raw.read(decode_content=True)
            else:
                response._content = read_within(response, end)
            response._content_consumed = True  # type: ignore[attr-defined]
            response.close()
        return response


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
    budget: float | None = None,
    timer: Callable[[], float] = time.monotonic,
) -> R:
    """Call `attempt(1)`, `attempt(2)`, ... until it succeeds (`failure` is None), fails for good (not
    `transient`) or `retry.attempts` are spent, sleeping `retry.delay` through the clock in between; the last
    answer is returned as it is (answers are data: nothing here raises). With a `budget` (seconds, measured on
    `timer`), no retry starts whose backoff would end past it: the call's total stays within the budget."""
    attempts = max(1, retry.attempts)
    number = 1
    started = timer()
    while True:
        answer = attempt(number)
        error = failure(answer)
        if error is None or not transient(answer) or number >= attempts:
            return answer
        delay = retry.delay(number, retry_after(answer) if retry_after is not None else None)
        if budget is not None and timer() - started + delay >= budget:
            log.info("%s failed (%s), attempt %d of %d; no time left for a retry", what, error, number, attempts)
            return answer
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
    budget: float | None = None,
    shown_url: str | None = None,
) -> HttpAnswer:
    """One call: each attempt ends within `timeout` in total (body included); with a `budget`, the whole call
    (attempts and backoffs) ends within it too. Errors name `shown_url` (default: `redact_url(url)`); a URL whose
    path is a secret (a receiver's) passes its origin (`tailguard.controller.kit.redact.url_origin`)."""
    shown = f"{method} {shown_url if shown_url is not None else redact_url(url)}"
    ends = time.monotonic() + budget if budget is not None else None
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
            ends=ends,
        ),
        retry=retry,
        clock=clock,
        failure=lambda answer: answer.error,
        transient=lambda answer: answer.transient,
        what=shown,
        budget=budget,
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
    ends: float | None = None,
) -> HttpAnswer:
    started = time.monotonic()
    deadline = started + timeout if ends is None else min(started + timeout, ends)
    limit = timeout if ends is None else max(0.001, deadline - started)
    try:
        # Streamed, so that the body is read under the attempt's TOTAL deadline (a trickle is cut there).
        response = session.request(
            method,
            url,
            json=json_body,
            data=data,
            headers=dict(headers or {}),
            timeout=limit,
            allow_redirects=False,
            stream=True,
        )
        response._content = read_within(response, deadline)
        response._content_consumed = True  # type: ignore[attr-defined]
        response.close()
    except requests.Timeout:
        return HttpAnswer(None, None, "", f"{shown}: timed out after {limit:g}s", True, attempt)
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
