"""Issue 12 item 6: the backtest decides as the live loop does. The same incident (a bad rollout, then P99 above
the threshold) runs live (a Controller with the public fakes, one evaluation per interval) and as a backtest over
the same data and rollouts; their decisions are compared one by one (ids, kinds, action types and targets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from controller.adapters.stores.journal import Journal
from controller.core.attribution import Rollout
from controller.core.model import SignalResult, target_key
from controller.core.policy_files import load_policies
from controller.core.ports import RangeResult
from controller.core.signals import render_signal_queries
from controller.kit.clock import ManualClock
from controller.loop.metrics import ControllerMetrics
from controller.loop.runtime import Controller
from controller.testing import FakeChangeTracker, FakeDispatcher, FakeSource
from controller.tools.backtest import evaluation_times, load_rollouts, run_backtest

RULES = Path(__file__).resolve().parents[2] / "rules" / "examples" / "attributed-rollback-or-scale.yaml"
T0 = 1_700_000_000.0
START, END = T0, T0 + 600
CHAT = target_key({"service": "chat"})
ROLLOUT = Rollout({"service": "chat", "namespace": "llm"}, "rev-2", "rev-1", T0 + 100, "recorded")


def value(at: float) -> float:
    return 2.0 if T0 + 120 <= at <= T0 + 360 else 0.2  # P99 seconds: bad from 20 s after the rollout


def decisions_of(items: Any) -> list[tuple[str, str, tuple[str, ...], tuple[tuple[str, str], ...]]]:
    return [(d.id, d.kind.value, tuple(a.type.value for a in d.actions), d.target) for d in items]


def test_the_same_incident_live_and_as_a_backtest_decides_the_same(tmp_path: Path) -> None:
    loaded, errors = load_policies([RULES])
    assert not errors
    policy = loaded[0].policy
    queries = render_signal_queries(policy)
    times = evaluation_times(START, END, policy.interval)

    # Live: one evaluation per interval, the source answering at the clock's time, the tracker knowing the rollout.
    clock = ManualClock(START)

    def at_clock(_query: str, _at: float | None) -> SignalResult:
        return SignalResult({CHAT: value(clock.now())})

    source = FakeSource(instant_answers=dict.fromkeys(queries.values(), at_clock), default=SignalResult({}))
    dispatcher = FakeDispatcher()
    controller = Controller(
        policy_paths=[RULES],
        source=source,
        journal=Journal(tmp_path / "journal.db"),
        dispatcher=dispatcher,
        clock=clock,
        metrics=ControllerMetrics(CollectorRegistry()),
        schedule=False,
        change_tracker=FakeChangeTracker([ROLLOUT]),
        dry_run=False,
    )
    controller.start()
    try:
        for now in times:
            clock.advance(now - clock.now())
            controller.evaluate(policy.name)
    finally:
        controller.stop()
    live = decisions_of(dispatcher.dispatched)

    # Backtest over the same data, the rollout from a recorded list.
    recorded = tmp_path / "rollouts.json"
    recorded.write_text(json.dumps([ROLLOUT.to_json()]))
    history = RangeResult(series={CHAT: {t: value(t) for t in times}})
    backtest_source = FakeSource(range_answers=dict.fromkeys(queries.values(), history))
    report = run_backtest(
        backtest_source, [policy.model_copy(update={"dryRun": False})], START, END, None,
        rollouts=load_rollouts(str(recorded)),
    )  # fmt: skip
    backtest = [
        (entry.id, kind, (action.type.value,), entry.target)
        for entry in report.decisions
        for kind, action in entry.actions
    ]
    live_actions = [(i, k, (t,), tgt) for i, k, types, tgt in live for t in types]
    assert live_actions, "the incident must act"
    assert ("rollback",) in [types for _i, _k, types, _t in live_actions]  # attributed to the rollout
    assert sorted(backtest, key=str) == sorted(live_actions, key=str)
