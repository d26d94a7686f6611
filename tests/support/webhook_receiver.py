"""A webhook receiver on 127.0.0.1 for notifier tests: answers scripted statuses in order, then 200."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    statuses: deque[int] = field(default_factory=deque)
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


@contextmanager
def receiver(*statuses: int) -> Iterator[tuple[str, Received]]:
    """Yields the hook URL (free port) and what it received (headers, body) per request."""
    state = Received(deque(statuses))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            state.requests.append((dict(self.headers), body))
            status = state.statuses.popleft() if state.statuses else 200
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
