"""The API server's limits (issue 16 item 4), served for real on loopback: idle connections are bounded and never
lock a probe out, a request head or body that does not arrive in time is cut, a deeply nested JSON body is a 400
(no traceback), an oversize one a 413 unread, every connection has TCP_NODELAY, and the decisions endpoint is
behind the token. Bounded loops, no wall-clock assertions."""

from __future__ import annotations

import json
import logging
import socket
import threading
from asyncio import selector_events
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tailguard.controller.app.api import MAX_JSON_DEPTH, ControllerAPI
from tests.unit.test_api_standby import FakeController, FakeLeader, controller  # noqa: F401 - the fixture

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "alertmanager"
TOKEN = "hardening-token"
TIMEOUT = 10


@pytest.fixture
def api(controller: FakeController) -> Iterator[ControllerAPI]:  # noqa: F811 - the imported fixture
    served = ControllerAPI(controller, webhook_token=TOKEN, max_connections=200, idle_timeout=0.5, body_timeout=0.5)
    served.start()
    try:
        yield served
    finally:
        served.stop()


def connect(api: ControllerAPI) -> socket.socket:
    sock = socket.create_connection((api.host, api.port), timeout=TIMEOUT)
    return sock


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP answer from a raw socket (status, headers, body), read up to its Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk
        rest += chunk
    return int(status_line.split()[1]), headers, rest[:length]


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def post_raw(api: ControllerAPI, body: bytes, *, length: int | None = None) -> tuple[int, dict[str, str], bytes]:
    with connect(api) as sock:
        head = (
            f"POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body) if length is None else length}\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        return read_answer(sock)


def test_two_thousand_idle_connections_leave_healthz_answering_and_threads_bounded(api: ControllerAPI) -> None:
    threads_before = threading.active_count()
    idle: list[socket.socket] = []
    try:
        for _ in range(2000):
            idle.append(connect(api))
        assert requests.get(f"{api.url}/healthz", timeout=TIMEOUT).status_code == 200
        assert requests.get(f"{api.url}/readyz", timeout=TIMEOUT).status_code == 200  # on the worker pool
        assert api.open_connections() <= api.max_connections
        # One event-loop thread and a fixed pool: no thread per connection.
        assert threading.active_count() <= threads_before + 4
    finally:
        for sock in idle:
            sock.close()


def test_a_connection_that_sends_no_complete_head_is_closed_at_the_idle_timeout(api: ControllerAPI) -> None:
    with connect(api) as silent, connect(api) as slow:
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the head never ends
        assert closed_by_server(silent)  # within the socket's 10 s bound: the idle timeout is 0.5 s
        assert closed_by_server(slow)


def test_a_kept_alive_connection_is_closed_once_idle(api: ControllerAPI) -> None:
    with connect(api) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_answer(sock)[0] == 200
        assert closed_by_server(sock)


def test_a_body_that_does_not_arrive_in_time_is_408(api: ControllerAPI) -> None:
    status, headers, body = post_raw(api, b'{"version": "4"', length=1000)
    assert status == 408 and "did not arrive" in json.loads(body)["error"]
    assert headers.get("connection") == "close"


def test_a_deeply_nested_json_body_is_400_without_a_traceback(
    api: ControllerAPI,
    controller: FakeController,  # noqa: F811 - the imported fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    for nested in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000):
        status, _, body = post_raw(api, nested)
        assert status == 400 and "nested deeper" in json.loads(body)["error"]
    payload = json.loads((FIXTURES / "firing.json").read_text())
    deep: object = "x"
    for _ in range(MAX_JSON_DEPTH + 1):
        deep = {"d": deep}
    payload["extra"] = deep  # an unknown field, but too deep: refused before validation
    status, _, body = post_raw(api, json.dumps(payload).encode())
    assert status == 400 and f"deeper than {MAX_JSON_DEPTH}" in json.loads(body)["error"]
    assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert controller.triggered == []


def test_an_oversize_body_is_413_unread_and_the_connection_closed(api: ControllerAPI) -> None:
    with connect(api) as sock:
        head = (
            "POST /api/v1/alerts HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Length: {50 * 1024 * 1024}\r\n\r\n"
        )
        sock.sendall(head.encode() + b"{" * 1000)  # 50 MB announced, a kilobyte sent: answered before the rest
        status, headers, body = read_answer(sock)
        assert status == 413 and "exceeds the limit" in json.loads(body)["error"]
        assert headers.get("connection") == "close" and closed_by_server(sock)
    assert requests.get(f"{api.url}/healthz", timeout=TIMEOUT).status_code == 200


def test_kept_alive_connections_have_tcp_nodelay(api: ControllerAPI) -> None:
    with requests.Session() as session:
        for _ in range(3):
            assert session.get(f"{api.url}/healthz", timeout=TIMEOUT).status_code == 200
        sockets = api.connection_sockets()
        assert sockets, "the kept-alive connection is open"
        assert all(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for sock in sockets)


def test_headers_and_body_of_an_answer_go_out_in_one_write(api: ControllerAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Nagle pause between a head and its body: aiohttp hands the transport one buffer per answer."""
    writes: list[bytes] = []
    original = selector_events._SelectorSocketTransport.write

    def recording(self: selector_events._SelectorSocketTransport, data: bytes) -> None:
        writes.append(bytes(data))
        original(self, data)

    monkeypatch.setattr(selector_events._SelectorSocketTransport, "write", recording)
    with connect(api) as sock:
        for _ in range(2):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(sock)[0] == 200
    answers = [write for write in writes if write.startswith(b"HTTP/1.1 200")]
    assert len(answers) == 2 and all(write.endswith(b'{"status": "ok"}\n') for write in answers)


def test_decisions_need_the_token_when_one_is_configured(api: ControllerAPI) -> None:
    url = f"{api.url}/api/v1/decisions"
    assert requests.get(url, timeout=TIMEOUT).status_code == 401
    assert requests.get(url, headers={"Authorization": "Bearer wrong"}, timeout=TIMEOUT).status_code == 403
    answer = requests.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=TIMEOUT)
    assert answer.status_code == 200 and answer.json() == []
    for path in ("/healthz", "/readyz", "/metrics"):  # open: probes and Prometheus have no token
        assert requests.get(f"{api.url}{path}", timeout=TIMEOUT).status_code == 200


def test_the_standby_still_answers_503_with_retry_after(controller: FakeController) -> None:  # noqa: F811
    served = ControllerAPI(controller, webhook_token=TOKEN, leader=FakeLeader(leading=False), standby_retry_after=3)
    served.start()
    try:
        status, headers, body = post_raw(served, (FIXTURES / "firing.json").read_bytes())
    finally:
        served.stop()
    assert status == 503 and headers["retry-after"] == "3" and json.loads(body)["standby"] is True
