"""A full disk (issue 24): the journal refuses the commit (SQLITE_FULL, made here with max_page_count), the
evaluation decides and acts on nothing, and the log says it in one line when it starts, at most one line per 5
minutes while it lasts, and one when the journal writes again: no traceback per evaluation."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.model import SignalResult, target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDispatcher, FakeSource
from tests.unit.test_runtime import policy_yaml

T0 = 1_767_362_520.0


def test_a_full_disk_is_one_line_then_rate_limited_and_nothing_is_decided(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "a.yaml").write_text(policy_yaml("lat-a", for_=1))
    registry = CollectorRegistry()
    clock = ManualClock(T0)
    journal = Journal(tmp_path / "journal.db")
    dispatcher = FakeDispatcher()
    breaching = SignalResult({target_key({"service": f"svc-{i}"}): 5.0 for i in range(300)})
    controller = Controller(
        policy_paths=[rules], source=FakeSource(default=breaching), journal=journal, dispatcher=dispatcher,
        clock=clock, metrics=ControllerMetrics(registry), schedule=False,
    )  # fmt: skip
    controller.start()
    try:
        pages = journal._db.execute("PRAGMA page_count").fetchone()[0]
        journal._db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full: the file cannot grow
        with caplog.at_level(logging.INFO):
            for _ in range(40):  # 10 minutes of 15 s evaluations: a line at the first, one 5 minutes later
                assert controller.evaluate("lat-a") is None
                clock.advance(15)
            failing = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert dispatcher.dispatched == []  # nothing committed: nothing decided, nothing acted on
            assert all(r.exc_info is None for r in caplog.records)  # no traceback
            assert [r.getMessage().split(";")[0].split(":")[0] for r in failing] == [
                "journal write failed",
                "journal writes still failing",
            ]
            assert "database or disk is full" in failing[0].getMessage()
            assert "20 evaluations failed in the last 300s" in failing[1].getMessage()
            assert registry.get_sample_value("tailguard_journal_errors_total", {"operation": "commit_evaluation"}) == 40
            caplog.clear()
            journal._db.execute("PRAGMA max_page_count = 1000000")  # space again
            outcome = controller.evaluate("lat-a")
            assert outcome is not None and len(outcome.decisions) == 300
            assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
                "journal writes again after 600s of failures"
            ]
    finally:
        controller.stop()
