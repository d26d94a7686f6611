"""The demo's rollout call on a loaded host (issue 25 item 6): an attempt that times out is sent again with the same
idempotency key until the deadline, and the tier's key makes it one rollout (serving/lab/demo.py `_post_rollout`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tailguard.serving.lab.demo import DemoError, _post_rollout


class SlowTier:
    """A rollout endpoint that holds its first answer past the client's attempt timeout (a vLLM import on a loaded
    host) and answers a repeated key with its first answer, under one lock, as serving/tier/server.py does."""

    def __init__(self, first_delay: float) -> None:
        self.first_delay = first_delay
        self.lock = threading.Lock()
        self.answers: dict[str, dict[str, Any]] = {}
        self.rollouts = 0
        self.requests = 0

    def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests += 1
            key = body["idempotency_key"]
            if key in self.answers:
                return {**self.answers[key], "replayed": True}
            time.sleep(self.first_delay)
            self.rollouts += 1
            self.answers[key] = {"version": "r2"}
            return {"version": "r2", "replayed": False}


@pytest.fixture
def served() -> Iterator[tuple[SlowTier, str, ThreadingHTTPServer]]:
    tier = SlowTier(first_delay=1.5)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            data = json.dumps(tier.handle(body)).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the client's attempt timed out and closed

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield tier, f"http://127.0.0.1:{server.server_address[1]}/api/v1/services/chat/rollout", server
    finally:
        server.shutdown()
        server.server_close()


def test_a_timed_out_rollout_is_sent_again_with_its_key_and_is_one_rollout(
    served: tuple[SlowTier, str, ThreadingHTTPServer],
) -> None:
    tier, url, _ = served
    answer = _post_rollout(url, {"idempotency_key": "demo-rollout-r2"}, attempt_timeout=0.5, deadline_s=30.0)
    assert answer.json() == {"version": "r2", "replayed": True}  # the first answer, replayed to the retry
    assert tier.rollouts == 1 and tier.requests >= 2


def test_a_tier_that_never_answers_in_time_is_one_clear_error(
    served: tuple[SlowTier, str, ThreadingHTTPServer],
) -> None:
    tier, url, _ = served
    tier.first_delay = 5.0
    with pytest.raises(DemoError, match="did not answer the rollout within 2s"):
        _post_rollout(url, {"idempotency_key": "demo-rollout-r2"}, attempt_timeout=0.5, deadline_s=2.0)
