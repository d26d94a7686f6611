"""Prometheus as a MetricsSource through prometheus-api-client: instant queries by its `custom_query`, range
queries through its session with the answer parsed by orjson (exact timestamps; straight to numpy grids).

One call is one logical PromQL request. Transient failures (connection errors,
timeouts, 5xx, 429) are retried a bounded number of times with exponential
backoff slept through the injected clock, honouring Retry-After; anything else
(a bad query is a 400, an execution error a 422) is answered at once as
`SignalResult.failed` carrying Prometheus' own error message. A query Prometheus
refuses as bad data (HTTP 400, errorType `bad_data`: a PromQL syntax error) is a
POLICY error, not an outage: the result says so (`SignalResult.refused`,
`policy_error=True`) so the controller reports the policy instead of waiting for
Prometheus to come back. Deadlines are total, never per read: one attempt ends
within `timeout` from connect to the last byte of the answer (a trickling server
is cut there), and one logical query, every attempt and backoff included, within
`deadline` (default timeout x attempts); a query cut by a deadline is an errored
SignalResult (a source error, never a breach). Nothing here
raises for an expected failure, and neither the bearer token nor the basic-auth
password is ever logged or put into an error message.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import orjson
import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from pydantic import BaseModel, ConfigDict, Field, model_validator
from urllib3.util.retry import Retry

from tailguard.controller.adapters.metrics.grid import FloatArray, RangeGrid
from tailguard.controller.core.model import SignalResult, TargetKey, target_key
from tailguard.controller.core.ports import Clock, RangeResult
from tailguard.controller.kit.durations import format_duration
from tailguard.controller.kit.errors import ConfigError
from tailguard.controller.kit.http import DeadlineAdapter, DeadlineExceeded, RetryPolicy, retrying

log = logging.getLogger(__name__)

IDEMPOTENCY_HEADER = "Idempotency-Key"
# Kinds passed to `on_query`: low-cardinality, so they can be metric labels.
INSTANT = "query"
RANGE = "query_range"
ERROR_TEXT_LIMIT = 500


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BearerAuth(_Strict):
    token_file: Path | None = Field(default=None, description="file holding the token (e.g. a mounted secret)")
    token_env: str | None = Field(default=None, description="name of the environment variable holding the token")

    @model_validator(mode="after")
    def _one_source(self) -> BearerAuth:
        if (self.token_file is None) == (self.token_env is None):
            raise ValueError("bearer auth needs exactly one of token_file or token_env")
        return self


class BasicAuth(_Strict):
    username: str = Field(min_length=1)
    password_file: Path = Field(description="file holding the password")


class TLSSettings(_Strict):
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure_skip_verify: bool = False

    @model_validator(mode="after")
    def _pair(self) -> TLSSettings:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("tls key_file needs cert_file")
        return self


class PrometheusSettings(_Strict):
    url: str = Field(pattern=r"^https?://", description="base URL, e.g. http://127.0.0.1:9090")
    timeout: float = Field(
        default=10.0, gt=0, description="seconds per HTTP request in total (connect, and the whole answer)"
    )
    deadline: float | None = Field(
        default=None,
        gt=0,
        description="seconds for one query in total: every attempt and backoff (default: timeout x attempts)",
    )
    retries: int = Field(default=3, ge=0, le=10, description="retries after the first attempt, transient errors only")
    backoff: float = Field(default=0.5, ge=0, description="first backoff in seconds; doubles per retry")
    max_backoff: float = Field(default=10.0, ge=0, description="cap on one backoff, Retry-After included")
    bearer: BearerAuth | None = None
    basic: BasicAuth | None = None
    tls: TLSSettings = Field(default_factory=TLSSettings)

    @model_validator(mode="after")
    def _one_auth(self) -> PrometheusSettings:
        if self.bearer is not None and self.basic is not None:
            raise ValueError("choose bearer or basic auth, not both")
        return self


class SourceConfigError(ConfigError, ValueError):
    """The settings name a secret that cannot be read. Raised at construction, never per query."""


def _read_secret(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as unreadable:
        raise SourceConfigError(f"cannot read {what} file {str(path)!r}: {unreadable.strerror}") from None


def build_session(settings: PrometheusSettings) -> requests.Session:
    """A requests Session carrying auth and TLS options; timeouts are passed per request."""
    session = requests.Session()
    if settings.bearer is not None:
        if settings.bearer.token_file is not None:
            token = _read_secret(settings.bearer.token_file, "bearer token")
        else:
            assert settings.bearer.token_env is not None
            token = os.environ.get(settings.bearer.token_env, "").strip()
            if not token:
                raise SourceConfigError(f"environment variable {settings.bearer.token_env!r} is unset or empty")
        session.headers["Authorization"] = f"Bearer {token}"
    if settings.basic is not None:
        session.auth = (
            settings.basic.username,
            _read_secret(settings.basic.password_file, "basic auth password"),
        )
    tls = settings.tls
    if tls.insecure_skip_verify:
        session.verify = False
    elif tls.ca_file is not None:
        session.verify = str(tls.ca_file)
    if tls.cert_file is not None:
        session.cert = (str(tls.cert_file), str(tls.key_file)) if tls.key_file else str(tls.cert_file)
    return session


class _Attempt(threading.local):
    """Per-thread: the idempotency key to send and the last response seen (for status and Retry-After)."""

    key: str | None = None
    response: requests.Response | None = None
    ends: float | None = None  # time.monotonic() by which the current logical query must be answered
    bad_data: bool = False  # the last logical query was refused as bad data


class _KeyedAdapter(DeadlineAdapter):
    """Adds the idempotency key of the current logical query and remembers the response.

    The client library raises on non-200 with only the status and body in a string; the
    remembered response gives us the status code, Retry-After and the JSON error cleanly.
    Its own urllib3 retries are disabled (Retry(0)): retrying is ours, through the clock. Each request ends within
    its timeout in total and by the logical query's deadline (DeadlineAdapter), however slowly the answer comes.
    """

    def __init__(self, attempt: _Attempt):
        super().__init__(max_retries=Retry(total=0, redirect=0, raise_on_status=False), deadline=lambda: attempt.ends)
        self._attempt = attempt

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        if self._attempt.key is not None:
            request.headers[IDEMPOTENCY_HEADER] = self._attempt.key
        response = super().send(request, *args, **kwargs)
        self._attempt.response = response
        return response


@dataclass(frozen=True)
class _Failure:
    message: str
    transient: bool
    retry_after: float | None = None
    bad_data: bool = False  # HTTP 400 errorType bad_data: the query itself is refused (a policy error)


def _is_bad_data(response: requests.Response) -> bool:
    if response.status_code != 400:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("errorType") == "bad_data"


def _retry_after(response: requests.Response, now: float) -> float | None:
    raw = response.headers.get("Retry-After")
    if not raw:
        return None
    raw = raw.strip()
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


def _prometheus_error(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return text[:ERROR_TEXT_LIMIT] if text else response.reason or "no body"
    if isinstance(body, dict) and body.get("error"):
        kind = body.get("errorType")
        return f"{kind}: {body['error']}" if kind else str(body["error"])
    return json.dumps(body)[:ERROR_TEXT_LIMIT]


def _to_float(raw: Any) -> float:
    value = float(raw)
    # +Inf/-Inf (e.g. histogram_quantile landing in the +Inf bucket) carry no usable number: no-data.
    return value if math.isfinite(value) else math.nan


class PrometheusSource:
    """MetricsSource over Prometheus' HTTP API (instant and range queries)."""

    def __init__(
        self,
        settings: PrometheusSettings,
        clock: Clock,
        on_query: Callable[[str, float, bool], None] | None = None,
        *,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`on_query(kind, seconds, ok)` is called once per logical query (kind: "query" or "query_range").

        `timer` is a monotonic clock for latencies only; all waiting goes through `clock`.
        """
        self._settings = settings
        self._clock = clock
        self._on_query = on_query
        self._timer = timer
        self._attempt = _Attempt()
        self._retry = RetryPolicy(
            attempts=settings.retries + 1, backoff=settings.backoff, max_backoff=settings.max_backoff
        )
        self._budget = settings.deadline or settings.timeout * (settings.retries + 1)
        self._shown_url = redact_url(settings.url)
        session = build_session(settings)
        url = settings.url.rstrip("/")
        # The library annotates timeout as int; requests takes float seconds.
        self._client = PrometheusConnect(
            url=url,
            session=session,
            timeout=settings.timeout,  # type: ignore[arg-type]
            retry=Retry(total=0, raise_on_status=False),
        )
        # Replace the library's adapter (mounted on the same prefix) with ours.
        session.mount(url, _KeyedAdapter(self._attempt))
        self._session = session
        self._url = url

    def __repr__(self) -> str:
        return f"PrometheusSource(url={self._shown_url!r})"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- MetricsSource --------------------------------------------------------------------------

    def instant(self, query: str, group_by: Sequence[str], at: float | None = None) -> SignalResult:
        params: dict[str, Any] = {} if at is None else {"time": _format_time(at)}
        # The library's own query method, through this session (auth, TLS, the total deadline, the idempotency
        # key): as fast as parsing it ourselves at these sizes (tests/bench/bench_prometheus_client.py).
        data, error = self._call(INSTANT, query, params, lambda: self._client.custom_query(query, params=dict(params)))
        if error is not None:
            return SignalResult.refused(error) if self._attempt.bad_data else SignalResult.failed(error)
        return vector_result(data, group_by)

    def range(self, query: str, group_by: Sequence[str], start: float, end: float, step: float) -> RangeResult:
        # Exact start/end go through params: the library would round them to whole seconds.
        data, error = self._range(query, start, end, step)
        if error is not None:
            return RangeResult(error=error, policy_error=self._attempt.bad_data)
        return matrix_result(data, group_by)

    # -- RangeGridSource (the backtest's fast path) --------------------------------------------------

    def range_grid(self, query: str, group_by: Sequence[str], times: Sequence[float], step: float) -> RangeGrid:
        """The same request as range(times[0], times[-1], step), its samples put on the grid as arrays (no dict per
        sample): exactly `on_grid(range(...), times)`."""
        data, error = self._range(query, times[0], times[-1], step)
        if error is not None:
            return RangeGrid.failed(times, error, self._attempt.bad_data)
        return matrix_grid(data, group_by, times, step)

    def _range(self, query: str, start: float, end: float, step: float) -> tuple[Any, str | None]:
        # Exact start/end (the library would round them to whole seconds).
        params = {"start": _format_time(start), "end": _format_time(end), "step": format_duration(step)}
        return self._call(RANGE, query, params, lambda: self._get("/api/v1/query_range", {"query": query, **params}))

    def _get(self, path: str, params: Mapping[str, Any]) -> Any:
        """One GET as the client library sends it (its session: auth, TLS, our adapter), the body parsed with orjson;
        non-200 raises as the library does. For range queries: the library's custom_query_range rounds start and
        end to whole seconds, and a backtest chunk's answer (~10 MB) goes straight to numpy (matrix_grid)."""
        response = self._session.get(f"{self._url}{path}", params=dict(params), timeout=self._settings.timeout)
        if response.status_code != 200:
            raise PrometheusApiClientException(f"HTTP Status Code {response.status_code}")
        return orjson.loads(response.content)["data"]["result"]

    def probe(self) -> str | None:
        """None when Prometheus answers a trivial query, else why not (for CLIs' start-up checks)."""
        _data, error = self._call(INSTANT, "vector(1)", {}, lambda: self._client.custom_query("vector(1)"))
        return error

    # -- internals --------------------------------------------------------------------------------

    def _call(
        self, kind: str, query: str, params: Mapping[str, Any], send: Callable[[], Any]
    ) -> tuple[Any, str | None]:
        material = json.dumps([kind, query, sorted((k, str(v)) for k, v in params.items())])
        self._attempt.key = hashlib.sha256(material.encode()).hexdigest()[:32]
        started = self._timer()

        def once(_attempt: int) -> tuple[Any, _Failure | None]:
            self._attempt.response = None
            try:
                return send(), None
            except PrometheusApiClientException:
                return None, self._http_failure()
            except DeadlineExceeded:
                return None, _Failure(f"no whole answer within the deadline ({self._budget:g}s)", transient=True)
            except requests.Timeout:
                return None, _Failure(f"timed out after {self._settings.timeout:g}s", transient=True)
            except requests.ConnectionError as refused:
                return None, _Failure(f"cannot connect to {self._shown_url}: {_reason(refused)}", transient=True)
            except requests.RequestException as other:
                return None, _Failure(f"request failed: {type(other).__name__}", transient=False)
            except (ValueError, KeyError, TypeError) as malformed:
                return None, _Failure(f"malformed response from Prometheus: {malformed}", transient=False)

        # The library's own urllib3 retries are off (Retry(0)); the kit's one retry rule applies, through the clock,
        # honouring Retry-After.
        self._attempt.ends = time.monotonic() + self._budget
        try:
            data, failure = retrying(
                once,
                retry=self._retry,
                clock=self._clock,
                failure=lambda answer: answer[1].message if answer[1] is not None else None,
                transient=lambda answer: answer[1] is not None and answer[1].transient,
                retry_after=lambda answer: answer[1].retry_after if answer[1] is not None else None,
                what=f"prometheus {kind}",
                budget=self._budget,
            )
        finally:
            self._attempt.key = None
            self._attempt.ends = None
        elapsed = self._timer() - started
        self._attempt.bad_data = failure is not None and failure.bad_data
        if self._on_query is not None:
            self._on_query(kind, elapsed, failure is None)
        if failure is not None:
            retried = " (after retries)" if failure.transient and self._settings.retries else ""
            return None, f"prometheus {kind} failed{retried}: {failure.message}"
        return data, None

    def _http_failure(self) -> _Failure:
        response = self._attempt.response
        if response is None:
            return _Failure("no response", transient=True)
        status = response.status_code
        message = f"HTTP {status}: {_prometheus_error(response)}"
        if status == 429 or status >= 500:
            return _Failure(message, transient=True, retry_after=_retry_after(response, self._clock.now()))
        return _Failure(message, transient=False, bad_data=_is_bad_data(response))


def _reason(error: requests.ConnectionError) -> str:
    # The innermost cause is short and says what happened ("Connection refused"); no URLs with credentials.
    cause: BaseException = error
    while cause.__cause__ is not None or cause.__context__ is not None:
        nxt = cause.__cause__ or cause.__context__
        assert nxt is not None
        cause = nxt
    text = str(cause)
    if "] " in text:
        text = text.split("] ", 1)[1]
    return text[:200] or type(error).__name__


def redact_url(url: str) -> str:
    """The URL without any user:password part, for messages and logs."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _format_time(timestamp: float) -> str:
    return f"{timestamp:.3f}"


def _target(metric: Mapping[str, str], group_by: Sequence[str]) -> tuple[TargetKey | None, str | None]:
    missing = [name for name in group_by if name not in metric]
    if missing:
        shown = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(metric.items())) + "}"
        return None, (
            f"series {shown} lacks group_by label(s) {', '.join(missing)}; "
            f"the query must aggregate `by ({', '.join(group_by)})`"
        )
    return target_key({name: metric[name] for name in group_by}), None


def _duplicate(target: TargetKey, group_by: Sequence[str]) -> str:
    labels = ",".join(f'{k}="{v}"' for k, v in target)
    return (
        f"two series map to the same target {{{labels}}}; the query must aggregate "
        f"`by ({', '.join(group_by)})` so that each target has one series"
    )


def vector_result(data: Any, group_by: Sequence[str]) -> SignalResult:
    """Turn an instant query's `result` into values by target (one series per target, or an error)."""
    if not isinstance(data, list) or any(not isinstance(item, dict) for item in data):
        return SignalResult.failed(
            f"query returned a scalar or string, expected an instant vector grouped by ({', '.join(group_by)})"
        )
    values: dict[TargetKey, float] = {}
    names = sorted(set(group_by))  # target_key's order, computed once: one tuple per series, nothing else
    for item in data:
        metric = item.get("metric", {})
        try:
            target: TargetKey | None = tuple([(name, metric[name]) for name in names])
        except (KeyError, TypeError):
            target, error = _target(metric, group_by)
            if error is not None:
                return SignalResult.failed(error)
        assert target is not None
        if target in values:
            return SignalResult.failed(_duplicate(target, group_by))
        try:
            values[target] = _to_float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            return SignalResult.failed(f"malformed sample in Prometheus response: {item!r:.200}")
    return SignalResult(values)


def matrix_result(data: Any, group_by: Sequence[str]) -> RangeResult:
    """Turn a range query's `result` into samples by target; timestamps rounded to the millisecond."""
    if not isinstance(data, list) or any(not isinstance(item, dict) for item in data):
        return RangeResult(error="range query did not return a matrix")
    series: dict[TargetKey, dict[float, float]] = {}
    for item in data:
        target, error = _target(item.get("metric", {}), group_by)
        if error is not None:
            return RangeResult(error=error)
        assert target is not None
        if target in series:
            return RangeResult(error=_duplicate(target, group_by))
        try:
            series[target] = {round(float(t), 3): _to_float(v) for t, v in item["values"]}
        except (KeyError, TypeError, ValueError):
            return RangeResult(error=f"malformed samples in Prometheus response: {item!r:.200}")
    return RangeResult(series=series)


def matrix_grid(data: Any, group_by: Sequence[str], times: Sequence[float], step: float) -> RangeGrid:
    """A range query's `result` on the evaluation grid `times`: exactly on_grid(matrix_result(data, group_by), times)
    (same errors; +Inf/-Inf are NaN as in _to_float), each series converted in bulk by numpy."""
    if not isinstance(data, list) or any(not isinstance(item, dict) for item in data):
        return RangeGrid.failed(times, "range query did not return a matrix")
    columns: list[tuple[TargetKey, FloatArray, FloatArray]] = []
    seen: set[TargetKey] = set()
    for item in data:
        target, error = _target(item.get("metric", {}), group_by)
        if error is not None:
            return RangeGrid.failed(times, error)
        assert target is not None
        if target in seen:
            return RangeGrid.failed(times, _duplicate(target, group_by))
        seen.add(target)
        try:
            pairs = item["values"]
            stamps = np.fromiter(map(_first, pairs), np.float64, len(pairs))
            samples = np.array(list(map(_second, pairs)), dtype=np.float64)
        except (KeyError, TypeError, ValueError, IndexError):
            return RangeGrid.failed(times, f"malformed samples in Prometheus response: {item!r:.200}")
        samples[np.isinf(samples)] = np.nan
        columns.append((target, stamps, samples))
    return RangeGrid.from_columns(times, step, columns)


def _first(pair: Sequence[Any]) -> Any:
    return pair[0]


def _second(pair: Sequence[Any]) -> Any:
    return pair[1]
