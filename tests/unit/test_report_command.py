"""`tailguard report --decision ID --journal FILE`: the incident report of any journaled incident, from a journal a
real Controller and Dispatcher wrote (fake source, rollback port and change tracker): the rollback's revision,
the blamed rollout, the evidence in its unit, the stated rollout-time source; a missing decision is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app import cli
from tailguard.controller.core.attribution import Rollout
from tailguard.controller.core.model import SignalResult, target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeChangeTracker, FakeRollback, FakeSource
from tests.integration.test_status_page_browser import POLICY, T0

CHAT = target_key({"service": "chat"})


def journaled_incident(tmp_path: Path) -> tuple[Path, str]:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "chat.yaml").write_text(POLICY)
    journal = Journal(tmp_path / "journal.db")
    clock = ManualClock(T0)
    source = FakeSource()
    dispatcher = Dispatcher(journal, Actuators(rollback=FakeRollback({"chat": 2})), clock, GlobalLimits())
    controller = Controller(
        policy_paths=[rules], source=source, journal=journal, dispatcher=dispatcher, clock=clock, schedule=False,
        controls_store=journal, change_tracker=FakeChangeTracker([Rollout({"service": "chat"}, "2", "1", T0 - 2.0,
        "tier")]), change_window=1800.0,
    )  # fmt: skip
    controller.start()
    try:
        for value in (0.93, 0.97, 0.42, 0.41):
            source.default = SignalResult({CHAT: value})
            controller.evaluate("chat-p99-rollback")
            clock.advance(15.0)
        (fire,) = [d for d in controller.recent_decisions(10) if d["kind"] == "fire"]
    finally:
        controller.stop()
    return tmp_path / "journal.db", str(fire["id"])


def test_the_report_of_a_journaled_incident(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal, decision = journaled_incident(tmp_path)
    out = tmp_path / "report"
    argv = ["report", "--decision", decision, "--journal", str(journal), "--out", str(out),
            "--rollout-at", "2025-12-01T14:39:58Z", "--rollout-source", "Argo CD's history (deployedAt)"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    text = (out / "incident.md").read_text()
    assert "rolled back to r1" in text and "rollout of r2" in text
    assert "| 2025-12-01 14:40:15Z | 17.0 s | rollback to r1 done |" in text
    assert "| 2025-12-01 14:40:00Z | 930 ms |" in text and "| 2025-12-01 14:40:15Z | 970 ms |" in text
    assert "The rollout's time is Argo CD's history (deployedAt)." in text
    assert "decision resolved" in text and f"Decision `{decision}`" in text
    assert (out / "incident.png").read_bytes()[:4] == b"\x89PNG"


def test_an_unknown_decision_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal, _ = journaled_incident(tmp_path)
    assert cli.main(["report", "--decision", "nope", "--journal", str(journal), "--out", str(tmp_path / "r")]) == 1
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tailguard report: ")]
    assert line.startswith("tailguard report: no fired decision 'nope'")
