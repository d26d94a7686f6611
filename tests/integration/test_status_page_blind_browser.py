"""The status page when the controller is blind (issue 24, item 1), in a real headless chromium: a running
controller (real Controller, journal and API on loopback) whose Prometheus answered twice (one target firing) and
then became unreachable. The page says it first, in red: "BLIND since ...: Prometheus unreachable", the policies
affected and the last error; the targets below keep their last phase (held, never a breach). The screenshot is
docs/status-page-blind.png (written there with TAILGUARD_UPDATE_SCREENSHOT=1)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.core.model import SignalResult, target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDispatcher, FakeSource

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "page-token"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-dev-shm-usage", "--hide-scrollbars"]  # fmt: skip
CHECKOUT = target_key({"service": "checkout"})
SEARCH = target_key({"service": "search"})
UNREACHABLE = "prometheus query failed: cannot connect to http://prometheus.monitoring:9090: Connection refused"


def _policy(name: str, query: str) -> str:
    return f"""\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: {name}
targets:
  groupBy: [service]
signals:
  - name: p99
    query: max by ({{{{ by }}}}) ({query}{{ {{{{ selector }}}} }})
conditions:
  - name: p99-high
    signal: p99
    when: {{op: ">", value: 0.8}}
    for: 1
    noData: hold
    actions:
      - type: annotate
        text: "p99 {{{{ value }}}} on {{{{ service }}}}"
"""


@pytest.fixture
def blind(tmp_path: Path) -> Iterator[ControllerAPI]:
    assert CHROMIUM is not None, "chromium is not installed: `make test` installs it (scripts/ensure-system-deps.sh)"
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "checkout.yaml").write_text(_policy("checkout-p99", "lat"))
    (rules / "queue.yaml").write_text(_policy("queue-depth", "queue"))
    journal = Journal(tmp_path / "journal.db")
    clock = ManualClock(1_764_597_720.0)  # 2025-12-01 14:02:00Z
    answered = SignalResult({CHECKOUT: 0.97, SEARCH: 0.42})
    down = SignalResult.failed(UNREACHABLE)
    source = FakeSource(
        instant_answers={
            "max by (service) (lat{  })": [answered, answered, down],
            "max by (service) (queue{  })": [SignalResult({CHECKOUT: 0.2, SEARCH: 0.3}), down],
        }
    )
    controller = Controller(policy_paths=[rules], source=source, journal=journal, dispatcher=FakeDispatcher(),
                            clock=clock, schedule=False, controls_store=journal)  # fmt: skip
    api = ControllerAPI(controller, "127.0.0.1", 0, webhook_token=TOKEN)
    api.start()
    controller.start()
    try:
        controller.evaluate("checkout-p99")
        controller.evaluate("queue-depth")
        clock.advance(15.0)
        controller.evaluate("checkout-p99")
        for _ in range(4):  # Prometheus is gone from here: a minute of evaluations that see nothing
            controller.evaluate("queue-depth")
            clock.advance(15.0)
            controller.evaluate("checkout-p99")
        yield api
    finally:
        api.stop()
        controller.stop()


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *FLAGS, *args], capture_output=True, text=True, timeout=90, check=False)


def test_the_blind_page_says_it_first_in_red_and_is_screenshotted(blind: ControllerAPI, tmp_path: Path) -> None:
    # Signed in as a person's browser is (tests/integration/test_status_page_browser.py): a local page posts the
    # token to the sign-in form, the browser follows the 303 to /status with its session cookie.
    sign_in = tmp_path / "sign-in.html"
    sign_in.write_text(
        f'<form id=f method=post action="{blind.url}/status/login"><input name=token value="{TOKEN}"></form>'
        "<script>document.getElementById('f').submit()</script>"
    )
    url = sign_in.as_uri()
    dumped = _chromium("--dump-dom", url)
    dom = dumped.stdout
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    banner = dom.index('data-health="blind"')
    assert banner < dom.index('id="policies"') and banner < dom.index("Recent decisions")
    assert "BLIND since 14:02:30Z: Prometheus unreachable" in dom
    assert "blind: checkout-p99, queue-depth" in dom
    assert "Connection refused" in dom
    assert 'data-phase="firing"' in dom  # checkout's phase held from before: a source error is never a resolve
    shot = tmp_path / "status-page-blind.png"
    taken = _chromium(f"--screenshot={shot}", "--window-size=1280,720", url)
    assert taken.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", taken.stderr[-2000:]
    if os.environ.get("TAILGUARD_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, ROOT / "docs" / "status-page-blind.png")
