"""The status page in a real headless browser (Debian `chromium`, installed by scripts/ensure-system-deps.sh for the
tests that need it): a running controller (real Controller, Dispatcher, journal and API on loopback; fake Prometheus,
rollback port and change tracker) through one incident: a rollout (r2) 2 s before the onset, P99 over 800 ms for 2
evaluations, rolled back r2 -> r1; then the policy paused; then resolved. Chromium signs in through the page's form
(the token is POSTed, never in a URL: an auto-submitting local form, as a person's browser would post it), renders
`/status` (`--dump-dom`, asserted) and takes the screenshots kept in docs/ (written there with
TAILGUARD_UPDATE_SCREENSHOT=1): status-page.png (firing, with the action's detail and the next step),
status-page-paused.png and status-page-resolved.png."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.core.attribution import Rollout
from tailguard.controller.core.model import SignalResult, target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeChangeTracker, FakeRollback, FakeSource

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "page-token"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--virtual-time-budget=5000",  # the sign-in form's POST and the 303 to /status complete before the dump
]
CHAT = target_key({"service": "chat"})
SEARCH = target_key({"service": "search"})
T0 = 1_764_600_000.0

POLICY = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: chat-p99-rollback
description: P99 end-to-end latency of the serving tier
targets:
  groupBy: [service]
signals:
  - name: p99-e2e-latency
    query: histogram_quantile(0.99, sum by (le, {{ by }}) (rate(vllm:e2e_request_latency_seconds_bucket[1m])))
conditions:
  - name: p99-above-800ms
    signal: p99-e2e-latency
    when: {op: ">", value: 0.8}
    for: 2
    noData: hold
    attribution: {window: 30m, labels: [service]}
    recovery: {for: 2}
    actions:
      - type: rollback
        service: "{{ service }}"
limits: {cooldown: 10m, maxActionsPerHour: 3}
"""


@dataclass
class Running:
    api: ControllerAPI
    controller: Controller
    source: FakeSource
    clock: ManualClock

    def evaluate(self, chat: float, search: float) -> None:
        self.source.default = SignalResult({CHAT: chat, SEARCH: search})
        self.controller.evaluate("chat-p99-rollback")
        self.clock.advance(15.0)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    assert CHROMIUM is not None, "chromium is not installed: `make test` installs it (scripts/ensure-system-deps.sh)"
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "chat.yaml").write_text(POLICY)
    journal = Journal(tmp_path / "journal.db")
    clock = ManualClock(T0)
    source = FakeSource()
    rollout = Rollout({"service": "chat"}, "2", "1", T0 - 2.0, "tier")
    dispatcher = Dispatcher(journal, Actuators(rollback=FakeRollback({"chat": 2})), clock, GlobalLimits())
    controller = Controller(
        policy_paths=[rules],
        source=source,
        journal=journal,
        dispatcher=dispatcher,
        clock=clock,
        schedule=False,
        controls_store=journal,
        change_tracker=FakeChangeTracker([rollout]),
        change_window=1800.0,
    )
    api = ControllerAPI(controller, "127.0.0.1", 0, webhook_token=TOKEN,
                        status_links={"grafanaDashboard": "https://grafana.example/d/tailguard-vllm-slo"})  # fmt: skip
    api.start()
    controller.start()
    try:
        yield Running(api, controller, source, clock)
    finally:
        api.stop()
        controller.stop()


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *FLAGS, *args], capture_output=True, text=True, timeout=90, check=False)


def _sign_in_page(running: Running, tmp_path: Path) -> str:
    """A local page that posts the token to the sign-in form at once (the browser then follows the 303 to /status
    with its session cookie); the token is in the POST body, never in a URL."""
    page = tmp_path / "sign-in.html"
    page.write_text(
        f'<form id=f method=post action="{running.api.url}/status/login"><input name=token value="{TOKEN}"></form>'
        "<script>document.getElementById('f').submit()</script>"
    )
    return page.as_uri()


def _shot(url: str, tmp_path: Path, name: str) -> Path:
    shot = tmp_path / name
    taken = _chromium(f"--screenshot={shot}", "--window-size=1280,1100", url)
    assert taken.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", taken.stderr[-2000:]
    if os.environ.get("TAILGUARD_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, ROOT / "docs" / name)
    return shot


def test_the_incident_view_firing_paused_and_resolved(running: Running, tmp_path: Path) -> None:
    refused = _chromium("--dump-dom", f"{running.api.url}/status?token={TOKEN}")
    assert 'action="status/login"' in refused.stdout
    assert "chat-p99-rollback" not in refused.stdout, "a token in the URL must not open the page"
    sign_in = _sign_in_page(running, tmp_path)

    running.evaluate(0.93, 0.42)
    running.evaluate(0.97, 0.41)  # the second breaching evaluation: fires, rolls back r2 -> r1
    dom = _chromium("--dump-dom", sign_in).stdout
    assert 'id="incidents"' in dom and 'data-policy="chat-p99-rollback"' in dom
    assert "970 ms" in dom and "fires when &gt; 800 ms for 2 evaluations" in dom
    assert "rollback chat: r2 -&gt; r1" in dom and 'data-status="succeeded"' in dom
    assert "rollout r2 of service=chat" in dom
    assert "recovers when &lt;= 800 ms for 2 evaluations" in dom
    assert "cooldown 9 m 45 s" in dom  # 10 m after the rollback, read 15 s later (the clock moved on)
    assert 'kubectl tailguard pause chat-p99-rollback --reason "..."' in dom
    assert "kubectl tailguard abort " in dom and "<svg" in dom and "polyline" in dom
    assert 'data-phase="ok"' in dom  # search stays ok
    _shot(sign_in, tmp_path, "status-page.png")

    paused = requests.post(
        f"{running.api.url}/api/v1/policies/chat-p99-rollback/pause",
        json={"by": "alice", "reason": "INC-7: investigating"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert paused.status_code == 200, paused.text
    dom = _chromium("--dump-dom", sign_in).stdout
    assert 'data-badge="policy-paused"' in dom and "INC-7: investigating" in dom
    assert 'data-badge="kill-switch"' not in dom  # a policy's pause is not the kill switch
    assert "none while the policy is paused" in dom and "kubectl tailguard resume chat-p99-rollback" in dom
    _shot(sign_in, tmp_path, "status-page-paused.png")

    running.evaluate(0.42, 0.40)
    running.evaluate(0.41, 0.40)  # two healthy evaluations: resolved
    dom = _chromium("--dump-dom", sign_in).stdout
    assert 'id="no-incidents"' in dom and 'data-kind="resolve"' in dom and 'data-kind="fire"' in dom
    _shot(sign_in, tmp_path, "status-page-resolved.png")
