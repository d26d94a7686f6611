"""Issue 16 (1, 2) with real `tailguard run` processes on loopback: a fake Prometheus that says the P99 of `chat`
(and `code`) breaches, the spec-validating fake Argo CD (every request recorded), a policy shaped like the shipped
p99-rollback.yaml (no attribution; 1 s interval).

* SIGKILL at a seeded random moment of an Argo CD rollback (before the POST, while the sync runs, after it
  finished), restart on the same journal and state directory: exactly one rollback accepted, to the good revision,
  and the journal's action succeeded.
* A rollback waiting on a slow sync (held by the fake) holds neither the other policy's evaluations nor the other
  service's rollback; after a SIGKILL in that wait, the restarted process answers /healthz and becomes ready
  (evaluating) while the resumed rollback still waits.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from tailguard.controller.adapters.stores.journal import ActionStatus, Journal
from tests.support.fake_argocd import FakeArgoCD, application

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
GOOD, BAD = "1f0e9d8c7b6a", "aa11bb22cc33"
TOKEN = "argocd-test-token"
DEADLINE = 90.0
EPISODES = 4

POLICY = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: p99-rollback
description: the shipped p99-rollback shape (no attribution), at a test's pace
interval: 1s
targets: {groupBy: [service]}
signals:
  - name: p99
    query: tailguard_test_p99{ {{ selector }} }
conditions:
  - name: p99-above-800ms
    signal: p99
    when: {op: ">", value: 0.8}
    for: 2
    noData: hold
    actions:
      - type: rollback
        service: "{{ service }}"
limits:
  cooldown: 10m
  maxActionsPerHour: 3
"""

WATCH = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: queue-watch
description: another policy, evaluated every second, that never acts
interval: 1s
targets: {groupBy: [service]}
signals:
  - name: queue
    query: tailguard_test_queue{ {{ selector }} }
conditions:
  - name: queue-high
    signal: queue
    when: {op: ">", value: 1000}
    for: 2
    noData: hold
    actions:
      - type: rollback
        service: "{{ service }}"
"""


class FakePrometheus:
    """Instant queries only: `tailguard_test_p99` is `p99` per service, anything else 1.0."""

    def __init__(self, p99: dict[str, float]) -> None:
        self.p99 = p99
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return None

            def _answer(self, query: str) -> None:
                value = fake.p99 if "tailguard_test_p99" in query else {name: 1.0 for name in fake.p99}
                result = [{"metric": {"service": s}, "value": [time.time(), str(v)]} for s, v in value.items()]
                body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer(" ".join(parse_qs(urlsplit(self.path).query).get("query", [""])))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode())
                self._answer(" ".join(form.get("query", [""])))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class HoldingArgoCD(FakeArgoCD):
    """The fake Argo CD, whose rollback of an app in `held` stays Running until released."""

    def __init__(self) -> None:
        super().__init__()
        self.held: set[str] = set()

    def _rollback(self, name: str, app: dict[str, Any], body: Any) -> tuple[int, Any]:
        status, answer = super()._rollback(name, app, body)
        if status == 200 and name in self.held:
            self.state.pending[name] = 10**9
        return status, answer

    def release(self, name: str) -> None:
        with self.lock:
            self.held.discard(name)
            if name in self.state.pending:
                self.state.pending[name] = 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Controller:
    def __init__(self, directory: Path, prometheus: str, argocd: str, apps: list[str]) -> None:
        self.dir = directory
        self.port = free_port()
        rules = directory / "rules"
        rules.mkdir(parents=True, exist_ok=True)
        (rules / "p99-rollback.yaml").write_text(POLICY, encoding="utf-8")
        (rules / "queue-watch.yaml").write_text(WATCH, encoding="utf-8")
        config = {
            "prometheus": {"url": prometheus, "timeout": 2, "retries": 0},
            "policies": ["rules"],
            "journal": "journal.db",
            "stateDir": "state",
            "listen": f"127.0.0.1:{self.port}",
            "reloadInterval": "60s",
            "argocd": {
                "url": argocd,
                "tokenEnv": "TAILGUARD_TEST_ARGOCD_TOKEN",
                "apps": {name: name for name in apps},
                "timeout": 2,
                "pollInterval": 0.2,
                "waitTimeout": 120,
            },
        }
        self.config = directory / "controller.yaml"
        self.config.write_text(json.dumps(config), encoding="utf-8")
        self.log = directory / "controller.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    def start(self) -> None:
        with self.log.open("ab") as output:
            self.started_at = time.monotonic()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tailguard.controller", "run", "--config", str(self.config)],
                cwd=self.dir,
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONPATH": str(REPO), "TAILGUARD_TEST_ARGOCD_TOKEN": TOKEN},
            )

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)

    def get(self, path: str) -> requests.Response | None:
        try:
            return requests.get(f"http://127.0.0.1:{self.port}{path}", timeout=2)
        except requests.RequestException:
            return None

    def last_evaluation(self, policy: str) -> float | None:
        answer = self.get("/readyz")
        if answer is None:
            return None
        return answer.json().get("policies", {}).get(policy, {}).get("last_evaluation")

    def tail(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-4000:] if self.log.exists() else ""

    def poll(self, what: str, probe: Any, deadline: float = DEADLINE) -> Any:
        end = time.monotonic() + deadline
        while True:
            if self.process is not None and self.process.poll() is not None:
                pytest.fail(f"tailguard exited ({self.process.returncode}) waiting for {what}:\n{self.tail()}")
            answer = probe()
            if answer:
                return answer
            if time.monotonic() > end:
                pytest.fail(f"timed out waiting for {what}:\n{self.tail()}")
            time.sleep(0.05)


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    server = FakePrometheus({"chat": 1.5})
    yield server
    server.stop()


def posts(fake: FakeArgoCD, app: str) -> list[Any]:
    return [r for r in fake.calls("POST", "/rollback") if r.path.split("?")[0].endswith(f"/{app}/rollback")]


def synced(fake: FakeArgoCD, app: str) -> bool:
    status = fake.app(app)["status"]
    return status["sync"]["revision"] == GOOD and status["operationState"]["phase"] == "Succeeded"


def rollback_actions(directory: Path) -> list[Any]:
    with Journal(directory / "journal.db") as journal:
        return [a for a in journal.all_actions() if a.type.value == "rollback"]


@pytest.mark.parametrize("seed", range(EPISODES))
def test_sigkill_during_an_argocd_rollback(seed: int, prometheus: FakePrometheus, tmp_path: Path) -> None:
    rng = random.Random(f"process-{seed}")
    moment = rng.choice(["before-post", "in-sync", "after-sync"])
    with FakeArgoCD() as argocd:
        argocd.add_app(application("chat", [(GOOD, time.time() - 7200), (BAD, time.time() - 600)]))
        argocd.state.progress_polls = rng.randint(3, 10)
        controller = Controller(tmp_path, prometheus.url, argocd.url, ["chat"])
        try:
            controller.start()
            kills = 0
            if moment == "before-post":
                # Killed between the decision's commit and the rollback (or right after it): a random moment
                # after the first evaluations.
                controller.poll("the first evaluation", lambda: controller.last_evaluation("p99-rollback"))
                time.sleep(rng.uniform(0.5, 1.5))
            elif moment == "in-sync":
                controller.poll("the rollback POST", lambda: posts(argocd, "chat"))
                time.sleep(rng.uniform(0.0, 0.3))
            else:
                controller.poll("the sync to finish", lambda: synced(argocd, "chat"))
                time.sleep(rng.uniform(0.0, 0.15))  # before or after the controller records it
            controller.kill()
            kills += 1
            controller.start()
            controller.poll("the rollback to finish", lambda: synced(argocd, "chat"))
            controller.poll(
                "the journal to record it",
                lambda: [a for a in rollback_actions(tmp_path) if a.terminal],
            )
            time.sleep(1.5)  # more evaluations: the condition stays firing, nothing is redone
        finally:
            controller.stop()
        context = f"seed {seed} ({moment}):\n{controller.tail()}"
        accepted = [p for p in posts(argocd, "chat") if p.status == 200]
        assert len(accepted) == 1 and accepted[0].body["id"] == 1, context
        assert argocd.app("chat")["status"]["sync"]["revision"] == GOOD, context
        assert argocd.state.spec_violations == [], context
        [action] = rollback_actions(tmp_path)
        assert action.status is ActionStatus.SUCCEEDED, context
        assert action.plan is not None and action.plan["to_revision"] == GOOD, context
        assert kills == 1


def test_a_slow_sync_starves_nothing_and_the_probes_answer_during_a_long_resume(
    prometheus: FakePrometheus, tmp_path: Path
) -> None:
    prometheus.p99["code"] = 1.5
    argocd = HoldingArgoCD().start()
    try:
        for name in ("chat", "code"):
            argocd.add_app(application(name, [(GOOD, time.time() - 7200), (BAD, time.time() - 600)]))
        argocd.held.add("chat")  # chat's sync runs until released (~as long as the test wants)
        controller = Controller(tmp_path, prometheus.url, argocd.url, ["chat", "code"])
        try:
            controller.start()
            controller.poll("chat's rollback POST", lambda: posts(argocd, "chat"))
            # code's rollback is decided by the same evaluation: it runs on its own lane and finishes.
            controller.poll("code's rollback while chat's sync waits", lambda: synced(argocd, "code"), deadline=30)
            assert not synced(argocd, "chat")
            # The other policy goes on evaluating every second, and /readyz says ready, while chat's waits.
            first = controller.poll("queue-watch evaluated", lambda: controller.last_evaluation("queue-watch"))
            time.sleep(3.0)
            later = controller.last_evaluation("queue-watch")
            assert later is not None and later - first >= 1.5, (first, later)
            ready = [controller.get("/readyz") for _ in range(10)]
            assert all(a is not None and a.status_code == 200 for a in ready), [a and a.text for a in ready]
            assert not synced(argocd, "chat")

            # Killed while chat's sync waits; the restart resumes that rollback (which keeps waiting).
            controller.kill()
            controller.start()
            health = controller.poll("/healthz", lambda: (a := controller.get("/healthz")) and a.status_code == 200)
            assert health
            answered_after = time.monotonic() - controller.started_at
            controller.poll(
                "/readyz ready (evaluating) during the resume",
                lambda: (a := controller.get("/readyz")) is not None and a.status_code == 200,
                deadline=30,
            )
            assert not synced(argocd, "chat"), "the resumed rollback was meant to be still waiting"
            assert answered_after < 30, answered_after
            # SIGTERM cuts the wait short (the clock's interrupt) and leaves the action resumable.
            assert controller.process is not None
            stopping = time.monotonic()
            os.killpg(controller.process.pid, signal.SIGTERM)
            assert controller.process.wait(30) == 0, controller.tail()
            assert time.monotonic() - stopping < 15
            [pending] = [a for a in rollback_actions(tmp_path) if a.status is ActionStatus.STARTED]
            assert pending.params["service"] == "chat" and pending.plan is not None
            controller.start()
            argocd.release("chat")
            controller.poll("chat's rollback after the release", lambda: synced(argocd, "chat"), deadline=30)
            controller.poll(
                "both rollbacks journaled",
                lambda: len([a for a in rollback_actions(tmp_path) if a.status is ActionStatus.SUCCEEDED]) == 2,
                deadline=30,
            )
        finally:
            controller.stop()
        for name in ("chat", "code"):
            accepted = [p for p in posts(argocd, name) if p.status == 200]
            assert len(accepted) == 1 and accepted[0].body["id"] == 1, (name, controller.tail())
        assert argocd.state.spec_violations == []
    finally:
        argocd.stop()
