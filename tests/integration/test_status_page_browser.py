"""The status page in a real headless browser (Debian `chromium`, installed by scripts/ensure-system-deps.sh):
a running controller (real Controller, journal and API on loopback; fake Prometheus and dispatcher) with one
target firing and one resolved; chromium renders `/status?token=...` (`--dump-dom`, asserted) and takes the
screenshot kept in docs/status-page.png (written there with TAILGUARD_UPDATE_SCREENSHOT=1)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.adapters.stores.journal import Journal
from controller.app.api import ControllerAPI
from controller.core.model import SignalResult, target_key
from controller.kit.clock import ManualClock
from controller.loop.runtime import Controller
from controller.testing import FakeDispatcher, FakeSource

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
]
CHECKOUT = target_key({"service": "checkout"})
SEARCH = target_key({"service": "search"})

POLICY = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: checkout-p99
description: p99 latency of the serving tier
targets:
  groupBy: [service]
signals:
  - name: p99
    query: max by ({{ by }}) (lat{ {{ selector }} })
conditions:
  - name: p99-high
    signal: p99
    when: {op: ">", value: 0.8}
    for: 1
    noData: hold
    actions:
      - type: scale
        service: "{{ service }}"
        delta: 1
        max: 4
"""


@pytest.fixture
def running(tmp_path: Path) -> Iterator[ControllerAPI]:
    assert CHROMIUM is not None, "chromium is not installed: `make test` installs it (scripts/ensure-system-deps.sh)"
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "checkout.yaml").write_text(POLICY)
    journal = Journal(tmp_path / "journal.db")
    clock = ManualClock(1_764_600_000.0)
    source = FakeSource(
        instant_answers={
            "max by (service) (lat{  })": [
                SignalResult({CHECKOUT: 0.93, SEARCH: 0.91}),
                SignalResult({CHECKOUT: 0.97, SEARCH: 0.42}),
            ]
        },
        default=SignalResult({CHECKOUT: 0.97, SEARCH: 0.42}),
    )
    controller = Controller(
        policy_paths=[rules],
        source=source,
        journal=journal,
        dispatcher=FakeDispatcher(),
        clock=clock,
        schedule=False,
        controls_store=journal,
    )
    api = ControllerAPI(controller, "127.0.0.1", 0, webhook_token=TOKEN,
                        status_links={"grafanaDashboard": "https://grafana.example/d/tailguard-vllm-slo"})  # fmt: skip
    api.start()
    controller.start()
    try:
        controller.evaluate("checkout-p99")
        clock.advance(15.0)
        controller.evaluate("checkout-p99")
        yield api
    finally:
        api.stop()
        controller.stop()


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *FLAGS, *args], capture_output=True, text=True, timeout=90, check=False)


def test_the_page_renders_the_running_controller_and_is_screenshotted(running: ControllerAPI, tmp_path: Path) -> None:
    url = f"{running.url}/status?token={TOKEN}"
    dumped = _chromium("--dump-dom", url)
    dom = dumped.stdout
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    assert "<title>tailguard status</title>" in dom
    assert 'data-phase="firing"' in dom and 'data-phase="ok"' in dom
    assert 'data-kind="fire"' in dom and 'data-kind="resolve"' in dom
    assert "service=checkout" in dom and "service=search" in dom
    assert "https://grafana.example/d/tailguard-vllm-slo?from=" in dom
    refused = _chromium("--dump-dom", f"{running.url}/status")
    assert "authentication required" in refused.stdout
    shot = tmp_path / "status-page.png"
    taken = _chromium(f"--screenshot={shot}", "--window-size=1280,900", url)
    assert taken.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", taken.stderr[-2000:]
    if os.environ.get("TAILGUARD_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, ROOT / "docs" / "status-page.png")
