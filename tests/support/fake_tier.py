"""Serving-tier helpers for tests.

`running_serving_tier` starts the real tier process (integration tests).
`running_fake_tier` serves a minimal in-memory stand-in for the control API
(docs/architecture.md), in-process.

For the LocalTierClient unit tests: unlike the real tier (serving/tier/server.py, used by
the integration tests) it can be told to fail (`fail_next(503, 503)`), to be slow
(`delay_next(seconds)`) or to misreport a weight (`lie_about_weights`), and it
records every request it saw.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class SeenRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeService:
    name: str
    revisions: list[dict[str, Any]]
    weights: dict[str, int]
    replicas: int = 2

    @property
    def active(self) -> int:
        return max(int(v[1:]) for v in self.weights)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "namespace": "llm",
            "model": "tiny",
            "active_revision": self.active,
            "replicas": self.replicas,
            "versions": [
                {"version": v, "revision": int(v[1:]), "weight": w, "replicas": []}
                for v, w in sorted(self.weights.items())
            ],
        }


@dataclass
class FakeTierState:
    services: dict[str, FakeService] = field(default_factory=dict)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    seen: list[SeenRequest] = field(default_factory=list)
    failures: deque[int] = field(default_factory=deque)
    delays: deque[float] = field(default_factory=deque)
    lie_about_weights: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_service(self, name: str, revisions: int = 3, replicas: int = 2) -> None:
        self.services[name] = FakeService(
            name,
            [
                {
                    "revision": n,
                    "version": f"r{n}",
                    "profile": {},
                    "created_at": float(n),
                    "bad": False,
                    "reason": None,
                    "profile_diff": {},  # as the real tier's revisions answer; the profiles here are all alike
                }
                for n in range(1, revisions + 1)
            ],
            {f"r{revisions}": 100},
            replicas,
        )

    def fail_next(self, *statuses: int) -> None:
        self.failures.extend(statuses)

    def delay_next(self, *seconds: float) -> None:
        self.delays.extend(seconds)

    def mutations(self, kind: str) -> list[SeenRequest]:
        return [r for r in self.seen if r.method == "POST" and r.path.endswith("/" + kind)]

    # -- the API ---------------------------------------------------------------------------------------------

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if path == "/healthz":
            return 200, {"status": "ok"}
        if parts[:3] != ["api", "v1", "services"]:
            return 404, {"error": f"no route {path}"}
        if len(parts) == 3:
            return 200, [s.to_json() for s in self.services.values()]
        service = self.services.get(parts[3])
        if service is None:
            return 404, {"error": f"unknown service {parts[3]!r}"}
        if method == "GET" and len(parts) == 4:
            answer = service.to_json()
            if self.lie_about_weights:
                for version in answer["versions"]:
                    version["weight"] = 50
            return 200, answer
        if method == "GET" and parts[4:] == ["revisions"]:
            return 200, service.revisions
        if method != "POST" or len(parts) != 5:
            return 404, {"error": f"no route {method} {path}"}
        key = body.get("idempotency_key") if isinstance(body, dict) else None
        if not isinstance(key, str) or not key:
            return 400, {"error": "'idempotency_key' (a non-empty string) is required"}
        if key in self.answers:
            return 200, {**self.answers[key], "replayed": True}
        status, answer = self._mutate(service, parts[4], body)
        if status == 200:
            self.answers[key] = answer
            return 200, {**answer, "replayed": False}
        return status, answer

    def _mutate(self, service: FakeService, operation: str, body: dict[str, Any]) -> tuple[int, Any]:
        if operation == "rollback":
            leaving = service.active
            earlier = [r for r in service.revisions if r["revision"] < leaving and not r["bad"]]
            if not earlier:
                return 409, {"error": f"service {service.name!r} has no good revision earlier than r{leaving}"}
            target = max(earlier, key=lambda r: r["revision"])
            service.revisions[leaving - 1].update(bad=True, reason=body.get("reason") or "rolled back")
            service.weights = {target["version"]: 100}
            return 200, {"from_revision": leaving, "to_revision": target["revision"]}
        if operation == "scale":
            replicas = body.get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                return 400, {"error": f"'replicas' must be a non-negative integer, got {replicas!r}"}
            before, service.replicas = service.replicas, replicas
            return 200, {"from": before, "to": replicas}
        if operation == "weights":
            version, weight = body.get("version"), body.get("weight")
            if not isinstance(weight, int) or not 0 <= weight <= 100:
                return 400, {"error": f"'weight' must be an integer from 0 to 100, got {weight!r}"}
            if not isinstance(version, str) or version not in service.weights:
                return 409, {"error": f"'version' must be one of the live versions {sorted(service.weights)}"}
            others = [v for v in service.weights if v != version]
            service.weights = {version: weight, **{v: (100 - weight) // len(others) for v in others}}
            return 200, {"weights": dict(service.weights)}
        return 404, {"error": f"no operation {operation!r}"}


@contextmanager
def running_fake_tier(*services: str) -> Iterator[tuple[str, FakeTierState]]:
    """Serve the stand-in on 127.0.0.1, a free port; yields (base_url, state). Always shut down on exit."""
    state = FakeTierState()
    for name in services:
        state.add_service(name)

    class Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            with state.lock:
                state.seen.append(SeenRequest(method, self.path, dict(self.headers), body))
                delay = state.delays.popleft() if state.delays else 0.0
                failure = state.failures.popleft() if state.failures else None
            if delay:
                time.sleep(delay)
            if failure is not None:
                status, answer = failure, {"error": f"injected {failure}"}
            else:
                with state.lock:
                    status, answer = state.handle(method, self.path, body)
            data = json.dumps(answer).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client timed out and went away

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def running_serving_tier(tmp: Path, config_text: str) -> Iterator[str]:
    """The REAL tier (`python -m tailguard.serving.tier`) on a free loopback port; yields its control URL.

    For integration tests. The process (and its process group) is always stopped, even on failure.
    """
    config = tmp / "tier.yaml"
    config.write_text(config_text)
    # stderr to a file: an unread pipe could fill up and block the tier.
    stderr = (tmp / "tier.stderr").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tailguard.serving.tier",
            "--config",
            str(config),
            "--state-dir",
            str(tmp / "tier-state"),
            "--port",
            "0",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines: queue.Queue[str] = queue.Queue()

    def read_stdout() -> None:
        assert process.stdout is not None
        for line in iter(process.stdout.readline, ""):
            lines.put(line)

    threading.Thread(target=read_stdout, daemon=True).start()
    try:
        try:
            ready = json.loads(lines.get(timeout=60))
        except queue.Empty:
            raise AssertionError(
                "the serving tier did not report ready within 60 s: " + (tmp / "tier.stderr").read_text()[-2000:]
            ) from None
        assert ready["event"] == "ready", ready
        yield str(ready["control_url"])
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=15)
        if process.stdout is not None:
            process.stdout.close()
        stderr.close()
