"""The backtest's skip over quiet evaluations (controller/tools/backtest_feed.py) changes nothing: the same report,
decision by decision and dispatch outcome by outcome, as running every evaluation; over several policies, global
limits, recorded alerts, targets that come and go, NaN samples, breaches, a failing chunk and chunk boundaries.
And engine.advance_healthy is exactly the evaluations one by one."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest

from tailguard.controller.adapters.metrics.grid import on_grid
from tailguard.controller.core.engine import ConditionState, PolicyState, advance_healthy, transition
from tailguard.controller.core.model import SignalResult, TargetKey, target_key
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.ports import RangeResult
from tailguard.controller.core.signals import render_signal_queries
from tailguard.controller.loop.dispatcher import GlobalLimits
from tailguard.controller.testing import FakeSource
from tailguard.controller.tools import backtest, backtest_feed
from tailguard.controller.tools.backtest import run_backtest
from tailguard.controller.tools.backtest_feed import QuietRun
from tailguard.controller.tools.backtest_world import RecordedAlert

SERVICES = [target_key({"service": f"s{i}"}) for i in range(6)]


def _policies() -> list[Policy]:
    latency = Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": "latency",
            "interval": "15s",
            "targets": {"groupBy": ["service"]},
            "signals": [{"name": "p99", "query": "p99"}, {"name": "queue", "query": "queue"}],
            "conditions": [
                {
                    "name": "slow",
                    "signal": "p99",
                    "when": {"op": ">", "value": 0.8},
                    "for": 2,
                    "noData": "hold",
                    "staleAfter": "1m",
                    "actions": [{"type": "rollback"}],
                    "recovery": {"for": 2, "actions": [{"type": "annotate", "text": "ok {{ service }}"}]},
                },
                {
                    "name": "queued",
                    "signal": "queue",
                    "when": {"op": ">=", "value": 50},
                    "for": 3,
                    "noData": "ok",
                    "actions": [{"type": "scale", "service": "{{ service }}", "delta": 1, "max": 8}],
                },
            ],
            "limits": {"cooldown": "2m"},
        }
    )
    errors = Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": "errors",
            "interval": "15s",
            "targets": {"groupBy": ["service"]},
            "signals": [{"name": "ratio", "query": "ratio"}],
            "conditions": [
                {
                    "name": "failing",
                    "signal": "ratio",
                    "when": {"op": ">", "value": 0.1},
                    "for": 2,
                    "noData": "hold",
                    "actions": [{"type": "rollback"}, {"type": "annotate", "text": "errors {{ service }}"}],
                }
            ],
        }
    )
    return [latency, errors]


def _series(seed: int, points: int, low: float, high: float) -> dict[TargetKey, dict[float, float]]:
    """Mostly healthy values; a few breach episodes, gaps, NaN samples and a target that starts late."""
    rng = random.Random(seed)
    out: dict[TargetKey, dict[float, float]] = {}
    for n, target in enumerate(SERVICES):
        samples: dict[float, float] = {}
        episode_end = -1
        for i in range(points):
            at = i * 15.0
            if n == 5 and i < points // 3:
                continue  # comes later
            if (n == 4 and i > 2 * points // 3) or (n == 2 and 60 <= i < 75) or (n == 3 and 150 <= i < 165):
                continue  # goes for good; away for longer than staleAfter
            if (n == 0 and 155 <= i <= 158) or (n == 1 and 65 <= i <= 68):
                samples[at] = high  # a breach while another target is away: a real evaluation then
                continue
            roll = rng.random()
            if roll < 0.005:
                continue  # a gap
            if roll < 0.01:
                samples[at] = math.nan
                continue
            if i > episode_end and rng.random() < 0.01:
                episode_end = i + rng.randint(1, 8)
            samples[at] = high if i <= episode_end else low * rng.random()
        out[target] = samples
    return out


def _source(points: int, failing_chunk: bool) -> FakeSource:
    history = {
        "p99": _series(1, points, 0.5, 2.0),
        "queue": _series(2, points, 20.0, 80.0),
        "ratio": _series(3, points, 0.05, 0.5),
    }

    def answer(name: str) -> Callable[[str, float, float, float], RangeResult]:
        def ranged(_query: str, start: float, end: float, _step: float) -> RangeResult:
            if failing_chunk and name == "queue" and start <= 300.0 <= end:
                return RangeResult(error="HTTP 503: overloaded")
            return RangeResult(
                {
                    target: {at: v for at, v in samples.items() if start <= at <= end}
                    for target, samples in history[name].items()
                }
            )

        return ranged

    queries: dict[str, Any] = {}
    for policy in _policies():
        for name, query in render_signal_queries(policy).items():
            queries[query] = answer(name)
    return FakeSource(range_answers=queries, default=SignalResult({SERVICES[0]: 0.9, SERVICES[1]: 0.1}))


@pytest.mark.parametrize("chunk_points", [11_000, 37])
@pytest.mark.parametrize("failing_chunk", [False, True])
def test_skipping_quiet_evaluations_gives_the_same_report(
    monkeypatch: pytest.MonkeyPatch, chunk_points: int, failing_chunk: bool
) -> None:
    monkeypatch.setattr(backtest_feed, "CHUNK_POINTS", chunk_points)
    points = 400
    alerts = [RecordedAlert(1000.5, {"service": "s0"}), RecordedAlert(2400.0, {"service": "s1"})]
    reports = []
    skipped = []
    for skip in (False, True):
        monkeypatch.setattr(backtest, "SKIP_QUIET", skip)
        report = run_backtest(
            _source(points, failing_chunk),
            _policies(),
            0.0,
            (points - 1) * 15.0,
            None,
            limits=GlobalLimits(cooldown=60.0, maxActionsPerHour=6),
            alerts=alerts,
        )
        reports.append(report.to_json())
        skipped.append(report.skipped_evaluations)
    slow, fast = reports
    assert skipped[0] == 0 and skipped[1] > points // 4  # many evaluations were skipped, and it changed nothing
    assert slow["evaluations"] == fast["evaluations"] == 2 * points + 4  # each alert wakes both policies
    kinds = [kind for entry in fast["decisions"] for kind in entry["kinds"]]
    assert {"fire", "resolve", "suppressed"} <= set(kinds)  # the scenario reaches the interesting paths
    assert fast == slow
    assert ("queue/queue: prometheus" not in str(fast["signal_errors"])) and (
        bool(fast["signal_errors"]) is failing_chunk
    )


def test_advance_healthy_is_the_evaluations_one_by_one() -> None:
    policy = _policies()[0]
    old = target_key({"service": "old"})
    state = PolicyState(
        conditions={
            ("slow", old): ConditionState(last_data_at=0.0, last_value=0.3, error_count=2, errors_since=0.0),
            ("queued", old): ConditionState(last_data_at=0.0, last_value=3.0, stale=True),
        },
        actions_at={old: (-4000.0, 100.0)},
        evaluations=7,
        last_evaluated_at=0.0,
    )
    stepped = state
    late = target_key({"service": "late"})
    for i in range(1, 21):
        now = 15.0 * i
        p99 = {old: 0.1 * (i % 5)} | ({late: 0.2} if i >= 10 else {})
        queue = {old: float(i)} | ({late: 1.0} if i >= 10 else {})
        stepped, decisions = transition(policy, {"p99": SignalResult(p99), "queue": SignalResult(queue)}, stepped, now)
        assert decisions == []
    observed = {("slow", old): 0.0, ("queued", old): 20.0, ("slow", late): 0.2, ("queued", late): 1.0}
    assert advance_healthy(policy, state, 300.0, 20, observed) == stepped
    assert stepped.actions_at == {old: (100.0,)}  # pruned at the last evaluation's time, as transition does


def test_quiet_run_gives_the_engine_state_of_every_evaluation() -> None:
    """Driven directly: at every evaluation that runs for real (and at the end), the state with skipping is the
    state without it, field by field; targets that vanish under noData ok/hold, NaN samples and breaches."""
    policy = _policies()[0]
    points = 400
    times = tuple(i * 15.0 for i in range(points))
    grids = {
        "p99": on_grid(RangeResult(_series(1, points, 0.5, 2.0)), times),
        "queue": on_grid(RangeResult(_series(2, points, 20.0, 80.0)), times),
    }
    quiet = QuietRun(policy)
    commits: list[float] = []
    stepped = skipping = PolicyState()
    quiet.arm(skipping, grids, deferred=False)
    skipped = 0
    for i, now in enumerate(times):
        observations = {name: grid.at(i) for name, grid in grids.items()}
        stepped, _ = transition(policy, observations, stepped, now)
        if quiet.skip(i):
            skipped += 1
            continue
        skipping = quiet.apply(skipping, lambda _state, at: commits.append(at))
        skipping, _ = transition(policy, observations, skipping, now)
        assert skipping == stepped
        quiet.arm(skipping, grids, deferred=False)
    assert quiet.apply(skipping, lambda _state, at: commits.append(at)) == stepped
    assert points // 10 < skipped < points and commits  # skipped stretches were applied and committed
