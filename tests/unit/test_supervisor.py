"""Supervisor: warm-up gating, restart with backoff after a crash, failover weights, clean stop (no orphans).

The replicas are a tiny fake OpenAI server (a Python script written to tmp_path) with the HTTP surface the
supervisor and warm-up use; its behaviour is switched by files in its directory, so the test drives real
processes, ports and signals. Real vLLM is exercised in tests/integration/test_vllm_supervisor.py.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tailguard.serving.tier.failover import FailoverState, Rotation
from tailguard.serving.tier.supervisor import Backoff, Replica, ReplicaSpec, Supervisor, free_port

FAKE_SERVER = r"""
import json, os, subprocess, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, control = int(sys.argv[1]), sys.argv[2]
# A grandchild in the same process group: stopping the replica must stop it too.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.path.join(control, f"pids-{os.getpid()}"), "w") as handle:
    handle.write(f"{os.getpid()} {child.pid}")

def flag(name):
    return os.path.exists(os.path.join(control, name))

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def reply(self, status, body, kind="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            self.reply(503 if flag("unhealthy") else 200, "")
        elif self.path == "/v1/models":
            self.reply(200, json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}))
        elif self.path == "/metrics":
            self.reply(200, "# plain\nother_metric 1\n" if flag("no-vllm-metrics") else "vllm:num_requests_running 0\n",
                       "text/plain")
        else:
            self.reply(404, "{}")
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if flag("completions-fail"):
            self.reply(500, json.dumps({"error": "boom"}))
        else:
            self.reply(200, json.dumps({"choices": [{"text": "ok"}]}))

ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        # A zombie is dead for our purposes (its parent has not reaped it yet).
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _spec(tmp_path: Path, name: str = "svc-r1-0") -> ReplicaSpec:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    control = tmp_path / name
    control.mkdir(exist_ok=True)
    port = free_port()
    return ReplicaSpec(
        id=name,
        service="svc",
        version="r1",
        model="tiny",
        command=(sys.executable, str(script), str(port), str(control)),
        port=port,
        log_path=tmp_path / f"{name}.log",
    )


def _pids(control: Path) -> list[tuple[int, int]]:
    found = []
    for path in sorted(control.glob("pids-*")):
        text = path.read_text().split()
        if len(text) == 2:
            found.append((int(text[0]), int(text[1])))
    return found


async def _until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def _supervisor(weights: list[int] | None = None, **kwargs: object) -> tuple[Supervisor, list[int]]:
    seen: list[int] = [] if weights is None else weights
    holder: dict[str, Replica] = {}

    def changed() -> None:
        for replica in supervisor.replicas.values():
            holder["r"] = replica
        if holder:
            seen.append(holder["r"].weight)

    supervisor = Supervisor(
        on_change=changed,
        registry=CollectorRegistry(),
        backoff=Backoff(initial_s=0.05, factor=2.0, max_s=0.2),
        health_interval_s=0.05,
        health_timeout_s=1.0,
        startup_timeout_s=15.0,
        stop_grace_s=3.0,
        **kwargs,  # type: ignore[arg-type]
    )
    return supervisor, seen


def test_backoff_doubles_and_caps() -> None:
    backoff = Backoff(initial_s=1.0, factor=2.0, max_s=5.0)
    assert [backoff.delay(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]


@pytest.mark.parametrize(
    ("checks", "weights"),
    [
        ([False, False, False], [100, 100, 0]),
        ([False, True, False, False, True], [100, 100, 100, 100, 100]),
        ([False] * 3 + [True] * 4, [100, 100, 0, 50, 50, 50, 100]),
        ([False] * 3 + [True, False, False, False, True], [100, 100, 0, 50, 50, 50, 0, 50]),
    ],
)
def test_failover_sequence(checks: list[bool], weights: list[int]) -> None:
    state = FailoverState()
    observed = []
    for healthy in checks:
        state.observe(healthy)
        observed.append(state.weight)
    assert observed == weights


def test_failover_reports_transitions() -> None:
    state = FailoverState()
    assert state.observe(False) is None and state.observe(False) is None
    out = state.observe(False)
    assert out is not None and (out.before, out.after) == (Rotation.IN, Rotation.OUT)
    back = state.observe(True)
    assert back is not None and back.after is Rotation.RECOVERING


def test_replica_joins_only_after_warmup_and_crash_is_restarted_with_backoff(tmp_path: Path) -> None:
    async def scenario() -> None:
        supervisor, weights = _supervisor()
        spec = _spec(tmp_path)
        control = Path(spec.command[3])
        (control / "completions-fail").touch()
        try:
            replica = supervisor.start(spec)
            # Up and healthy, but completions fail: warm-up fails, it never joins, and it is restarted.
            await _until(lambda: supervisor.metrics.warmups.labels("svc", "r1", "completions")._value.get() >= 1)
            assert replica.weight == 0 and supervisor.serving("svc", "r1") == []
            (control / "completions-fail").unlink()
            await _until(lambda: replica.warm)
            assert supervisor.serving("svc", "r1") == [replica]
            restarts_before = replica.restarts
            assert restarts_before >= 1
            # Crash it: the supervisor notices, reports it, and brings up a new process.
            first_pid = replica.pid
            assert first_pid is not None
            os.kill(first_pid, 9)
            await _until(lambda: replica.restarts == restarts_before + 1)
            exited = supervisor.metrics.restarts.labels("svc", "r1", spec.id, "exited")._value.get()
            assert exited == 1
            await _until(lambda: replica.warm and replica.pid != first_pid)
            # A restarted replica rejoins at half weight, then full.
            await _until(lambda: replica.weight == 100)
            last_out = len(weights) - 1 - weights[::-1].index(0)
            assert weights[last_out:] == [0, 50, 100]
        finally:
            await supervisor.stop_all()

    asyncio.run(scenario())


def test_warmup_requires_vllm_metrics(tmp_path: Path) -> None:
    async def scenario() -> None:
        supervisor, _ = _supervisor()
        spec = _spec(tmp_path)
        (Path(spec.command[3]) / "no-vllm-metrics").touch()
        try:
            replica = supervisor.start(spec)
            await _until(lambda: supervisor.metrics.warmups.labels("svc", "r1", "metrics")._value.get() >= 1)
            assert not replica.warm and replica.last_warmup is not None
            assert replica.last_warmup.step == "metrics"
        finally:
            await supervisor.stop_all()

    asyncio.run(scenario())


def test_three_failed_health_checks_take_it_out_then_half_then_full(tmp_path: Path) -> None:
    async def scenario() -> None:
        supervisor, weights = _supervisor()
        spec = _spec(tmp_path)
        control = Path(spec.command[3])
        try:
            replica = supervisor.start(spec)
            await _until(lambda: replica.warm)
            assert weights[-1] == 100
            (control / "unhealthy").touch()
            await _until(lambda: replica.weight == 0)
            assert replica.failover.consecutive_failures == 3
            assert supervisor.serving("svc", "r1") == [replica]  # still supervised, just weight 0
            (control / "unhealthy").unlink()
            await _until(lambda: replica.weight == 100)
            assert weights[-3:] == [0, 50, 100]
            assert replica.restarts == 0, "a failed health check is failover, not a restart"
            gauge = supervisor.metrics.weight.labels("svc", "r1", spec.id)._value.get()
            assert gauge == 100
        finally:
            await supervisor.stop_all()

    asyncio.run(scenario())


def test_stop_all_leaves_no_process_behind(tmp_path: Path) -> None:
    async def scenario() -> list[tuple[int, int]]:
        supervisor, _ = _supervisor()
        specs = [_spec(tmp_path, f"svc-r1-{index}") for index in range(2)]
        try:
            replicas = [supervisor.start(spec) for spec in specs]
            await _until(lambda: all(r.warm for r in replicas))
        finally:
            await supervisor.stop_all()
        return [pair for spec in specs for pair in _pids(Path(spec.command[3]))]

    pids = asyncio.run(scenario())
    assert len(pids) == 2
    # SIGKILL is delivered at once but the kernel tears a process down asynchronously: allow it a moment.
    deadline = time.monotonic() + 5.0
    while any(_alive(pid) for pair in pids for pid in pair) and time.monotonic() < deadline:
        time.sleep(0.05)
    for leader, grandchild in pids:
        assert not _alive(leader), f"replica process {leader} survived stop_all"
        assert not _alive(grandchild), f"replica child {grandchild} survived stop_all"
