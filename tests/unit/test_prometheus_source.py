"""PrometheusSource against a tiny scripted HTTP server on loopback: retries, errors, auth, secrets."""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tailguard.controller.adapters.metrics.prometheus import (
    PrometheusSettings,
    PrometheusSource,
    SourceConfigError,
    matrix_result,
    redact_url,
    vector_result,
)
from tailguard.controller.core.model import target_key
from tailguard.controller.kit.clock import ManualClock

VECTOR_OK = {
    "status": "success",
    "data": {
        "resultType": "vector",
        "result": [
            {"metric": {"service": "a"}, "value": [1700000000, "0.5"]},
            {"metric": {"service": "b"}, "value": [1700000000, "NaN"]},
        ],
    },
}


@dataclass
class Script:
    """Responses served in order (the last repeats); every request's path, query and headers are recorded."""

    responses: list[tuple[int, dict[str, str], Any]]
    requests: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def prom() -> Iterator[tuple[str, Script]]:
    script = Script([(200, {}, VECTOR_OK)])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            script.requests.append({"path": self.path, "headers": dict(self.headers)})
            status, headers, body = script.responses.pop(0) if len(script.responses) > 1 else script.responses[0]
            payload = json.dumps(body).encode() if not isinstance(body, bytes) else body
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", script
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _source(url: str, clock: ManualClock, **settings: Any) -> tuple[PrometheusSource, list[tuple[str, bool]]]:
    calls: list[tuple[str, bool]] = []
    source = PrometheusSource(
        PrometheusSettings(url=url, **settings),
        clock,
        on_query=lambda kind, seconds, ok: calls.append((kind, ok)),
    )
    return source, calls


def _error(status: int, error_type: str, message: str) -> Any:
    return {"status": "error", "errorType": error_type, "error": message}


@pytest.mark.integration
def test_retries_503_with_backoff_then_succeeds(prom: tuple[str, Script]) -> None:
    url, script = prom
    script.responses = [
        (503, {}, _error(503, "unavailable", "busy")),
        (503, {}, b"oops"),
        (200, {}, VECTOR_OK),
    ]
    clock = ManualClock(1000.0)
    source, calls = _source(url, clock, retries=3, backoff=0.5)
    result = source.instant("up", ["service"], at=1700000000.0)
    assert result.ok
    assert result.values[target_key({"service": "a"})] == 0.5
    assert math.isnan(result.values[target_key({"service": "b"})])
    assert len(script.requests) == 3
    assert clock.now() == pytest.approx(1000.0 + 0.5 + 1.0)  # exponential backoff through the clock
    keys = {r["headers"]["Idempotency-Key"] for r in script.requests}
    assert len(keys) == 1  # one logical query, one key across its retries
    assert "time=1700000000.000" in script.requests[0]["path"]
    assert calls == [("query", True)]


@pytest.mark.integration
def test_400_is_not_retried_and_carries_prometheus_message(prom: tuple[str, Script]) -> None:
    url, script = prom
    script.responses = [(400, {}, _error(400, "bad_data", 'parse error: unexpected "}"'))]
    clock = ManualClock()
    source, calls = _source(url, clock, retries=3)
    result = source.instant("up{", ["service"])
    assert result.error is not None
    assert "HTTP 400" in result.error and 'bad_data: parse error: unexpected "}"' in result.error
    assert len(script.requests) == 1
    assert clock.now() == 1_700_000_000.0
    assert calls == [("query", False)]


@pytest.mark.integration
def test_only_a_bad_data_refusal_is_a_policy_error(prom: tuple[str, Script]) -> None:
    """Issue 12 item 5: 400 bad_data is the policy's error (the query is refused); 422, 503 are not."""
    url, script = prom
    source, _calls = _source(url, ManualClock(), retries=0)
    script.responses = [(400, {}, _error(400, "bad_data", "parse error: unclosed left parenthesis"))]
    refused = source.instant("sum(", ["service"])
    assert refused.policy_error and refused.error is not None and "bad_data" in refused.error
    ranged = source.range("sum(", ["service"], 1700000000.0, 1700000060.0, 15.0)
    assert ranged.policy_error and ranged.error is not None
    for status, kind in ((422, "execution"), (503, "unavailable"), (400, "bad_request")):
        script.responses = [(status, {}, _error(status, kind, "no"))]
        failed = source.instant("up", ["service"])
        assert failed.error is not None and not failed.policy_error, (status, kind)
    script.responses = [(200, {}, VECTOR_OK)]
    assert not source.instant("up", ["service"]).policy_error


@pytest.mark.integration
def test_retries_are_bounded(prom: tuple[str, Script]) -> None:
    url, script = prom
    script.responses = [(502, {}, b"bad gateway")]
    source, calls = _source(url, ManualClock(), retries=2, backoff=0.1)
    result = source.instant("up", ["service"])
    assert result.error is not None and "HTTP 502" in result.error
    assert len(script.requests) == 3
    assert calls == [("query", False)]


@pytest.mark.integration
def test_429_honours_retry_after(prom: tuple[str, Script]) -> None:
    url, script = prom
    script.responses = [(429, {"Retry-After": "3"}, b"slow down"), (200, {}, VECTOR_OK)]
    clock = ManualClock(0.0)
    source, _ = _source(url, clock, retries=1, backoff=0.1)
    assert source.instant("up", ["service"]).ok
    assert clock.now() == pytest.approx(3.0)


@pytest.mark.integration
def test_range_query_sends_exact_times_and_step(prom: tuple[str, Script]) -> None:
    url, script = prom
    script.responses = [
        (
            200,
            {},
            {
                "status": "success",
                "data": {
                    "resultType": "matrix",
                    "result": [{"metric": {"service": "a"}, "values": [[1700000000.5, "1"], [1700000015.5, "+Inf"]]}],
                },
            },
        )
    ]
    source, calls = _source(url, ManualClock())
    result = source.range("up", ["service"], 1700000000.5, 1700000015.5, 15.0)
    assert result.error is None
    samples = result.series[target_key({"service": "a"})]
    assert samples[1700000000.5] == 1.0 and math.isnan(samples[1700000015.5])
    path = script.requests[0]["path"]
    assert "/api/v1/query_range" in path and "start=1700000000.500" in path and "step=15s" in path
    assert calls == [("query_range", True)]


@pytest.mark.integration
def test_bearer_token_is_sent_but_never_logged_or_in_errors(
    prom: tuple[str, Script], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, script = prom
    token_file = tmp_path / "token"
    token_file.write_text("s3cr3t-token\n")
    script.responses = [(503, {}, b"s"), (401, {}, _error(401, "unauthorized", "no"))]
    source = PrometheusSource(
        PrometheusSettings(url=url, bearer={"token_file": token_file}, retries=2, backoff=0.01), ManualClock()
    )
    with caplog.at_level(logging.DEBUG):
        result = source.instant("up", ["service"])
    assert script.requests[0]["headers"]["Authorization"] == "Bearer s3cr3t-token"
    assert result.error is not None and "s3cr3t" not in result.error
    assert "s3cr3t" not in caplog.text and "s3cr3t" not in repr(source)


@pytest.mark.integration
def test_basic_auth_from_password_file(prom: tuple[str, Script], tmp_path: Path) -> None:
    url, script = prom
    (tmp_path / "pw").write_text("hunter2")
    source = PrometheusSource(
        PrometheusSettings(url=url, basic={"username": "sre", "password_file": tmp_path / "pw"}),
        ManualClock(),
    )
    assert source.instant("up", ["service"]).ok
    assert script.requests[0]["headers"]["Authorization"].startswith("Basic ")


def test_connection_refused_is_an_error_after_retries() -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    clock = ManualClock(0.0)
    source, calls = _source(f"http://user:pw@127.0.0.1:{port}", clock, retries=2, backoff=1.0)
    result = source.instant("up", ["service"])
    assert result.error is not None and "cannot connect" in result.error and "pw" not in result.error
    assert clock.now() == pytest.approx(3.0)
    assert calls == [("query", False)]


def test_bearer_env_must_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TG_TEST_TOKEN", raising=False)
    with pytest.raises(SourceConfigError, match="TG_TEST_TOKEN"):
        PrometheusSource(
            PrometheusSettings(url="http://127.0.0.1:1", bearer={"token_env": "TG_TEST_TOKEN"}), ManualClock()
        )


def test_settings_reject_unknown_fields_and_two_auths(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="extra"):
        PrometheusSettings.model_validate({"url": "http://x", "tiemout": 3})
    with pytest.raises(ValidationError, match="not both"):
        PrometheusSettings.model_validate(
            {
                "url": "http://x",
                "bearer": {"token_env": "T"},
                "basic": {"username": "u", "password_file": str(tmp_path)},
            }
        )


def test_vector_conversion_errors() -> None:
    missing = vector_result([{"metric": {"pod": "x"}, "value": [1, "1"]}], ["service"])
    assert missing.error is not None and "lacks group_by label(s) service" in missing.error
    twice = vector_result(
        [
            {"metric": {"service": "a", "pod": "1"}, "value": [1, "1"]},
            {"metric": {"service": "a", "pod": "2"}, "value": [1, "2"]},
        ],
        ["service"],
    )
    assert twice.error is not None and "same target" in twice.error
    scalar = vector_result([1700000000, "1"], ["service"])
    assert scalar.error is not None and "scalar" in scalar.error
    inf = vector_result([{"metric": {"service": "a"}, "value": [1, "+Inf"]}], ["service"])
    assert math.isnan(inf.values[target_key({"service": "a"})])
    assert matrix_result([{"metric": {}, "values": []}], ["service"]).error is not None


def test_redact_url() -> None:
    assert redact_url("https://u:p@prom:9090/x") == "https://prom:9090/x"
    assert redact_url("http://prom:9090") == "http://prom:9090"
