"""Issue 16 (5): a total deadline per outbound call. A loopback server that trickles its answer one byte at a time
(each byte well within the per-read timeout) or hangs after the headers is cut at the configured deadline: the
Prometheus query is an errored SignalResult (a source error, never a breach) and the kit's call (Argo CD, webhooks,
the local tier) a transient failure. Bounded: every trickle ends when the test closes the server; the only timing
assertions are generous hang guards above the configured deadline.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.kit.http import RetryPolicy, request_with_retry

BODY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


class TricklingServer:
    """Answers every request with complete headers, then the body one byte per `pace` seconds (or nothing)."""

    def __init__(self, *, pace: float = 0.05, hang: bool = False) -> None:
        self.pace = pace
        self.hang = hang
        self.requests = 0
        self._closed = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)  # accept() wakes up to notice close()
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            self.requests += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        body = BODY + b" " * 100_000  # long enough to trickle far past any deadline
        try:
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
            )
            if self.hang:
                self._closed.wait(30)
                return
            for byte in body:
                if self._closed.wait(self.pace):
                    return
                conn.sendall(bytes([byte]))
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self._sock.close()


@pytest.fixture
def trickle() -> Iterator[TricklingServer]:
    server = TricklingServer()
    yield server
    server.close()


@pytest.fixture
def hanging() -> Iterator[TricklingServer]:
    server = TricklingServer(hang=True)
    yield server
    server.close()


def timed(call: object) -> tuple[object, float]:
    started = time.monotonic()
    result = call()  # type: ignore[operator]
    return result, time.monotonic() - started


def test_a_trickling_prometheus_is_errored_within_the_timeout(trickle: TricklingServer) -> None:
    settings = PrometheusSettings(url=trickle.url, timeout=1.0, retries=0)
    with PrometheusSource(settings, ManualClock()) as source:
        result, elapsed = timed(lambda: source.instant("up", ["service"]))
    assert result.error is not None and "deadline" in result.error  # type: ignore[attr-defined]
    assert not result.values and not result.policy_error  # type: ignore[attr-defined]
    assert elapsed < 1.0 + 2.0, f"{elapsed:.2f}s"  # hang guard: the per-read timeout alone never ends a trickle


def test_the_deadline_covers_every_retry(trickle: TricklingServer) -> None:
    settings = PrometheusSettings(url=trickle.url, timeout=1.0, retries=3, backoff=0.1, deadline=1.5)
    with PrometheusSource(settings, ManualClock()) as source:
        result, elapsed = timed(lambda: source.instant("up", ["service"]))
    assert result.error is not None  # type: ignore[attr-defined]
    assert trickle.requests <= 2  # the second attempt got what was left of 1.5 s; no third started
    assert elapsed < 1.5 + 2.0, f"{elapsed:.2f}s"


def test_the_default_deadline_is_timeout_times_attempts(hanging: TricklingServer) -> None:
    settings = PrometheusSettings(url=hanging.url, timeout=0.5, retries=1)
    with PrometheusSource(settings, ManualClock()) as source:
        result, elapsed = timed(lambda: source.range("up", ["service"], 0.0, 60.0, 15.0))
    assert result.error is not None  # type: ignore[attr-defined]
    assert elapsed < 0.5 * 2 + 2.0, f"{elapsed:.2f}s"


@pytest.mark.parametrize("server", ["trickle", "hanging"])
def test_the_kit_call_ends_within_its_timeout(server: str, request: pytest.FixtureRequest) -> None:
    fake: TricklingServer = request.getfixturevalue(server)
    with requests.Session() as session:
        answer, elapsed = timed(
            lambda: request_with_retry(
                session, "GET", fake.url, clock=ManualClock(), timeout=1.0, retry=RetryPolicy(attempts=1)
            )
        )
    assert answer.status is None and answer.transient and "timed out" in answer.error  # type: ignore[attr-defined]
    assert elapsed < 1.0 + 2.0, f"{elapsed:.2f}s"


def test_the_kit_budget_bounds_all_attempts(trickle: TricklingServer) -> None:
    with requests.Session() as session:
        answer, elapsed = timed(
            lambda: request_with_retry(
                session,
                "GET",
                trickle.url,
                clock=ManualClock(),
                timeout=1.0,
                retry=RetryPolicy(attempts=5, backoff=0.1),
                budget=1.5,
            )
        )
    assert answer.error is not None  # type: ignore[attr-defined]
    assert trickle.requests <= 2
    assert elapsed < 1.5 + 2.0, f"{elapsed:.2f}s"
