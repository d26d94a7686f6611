"""Issue 12 item 6: the backtest decides as the live loop does. The same incident (a bad rollout, then P99 above
the threshold) runs live (a Controller with the public fakes, one evaluation per interval) and as a backtest over
the same data and rollouts; their decisions are compared one by one (ids, kinds, action types and targets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.stores.incidents import SqliteIncidentStore
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.attribution import Rollout
from tailguard.controller.core.model import SignalResult, target_key
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.core.ports import RangeResult
from tailguard.controller.core.signals import render_signal_queries
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeChangeTracker, FakeDispatcher, FakeSource
from tailguard.controller.tools.backtest import evaluation_times, load_rollouts, run_backtest

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


# ----- the two-policy incident: decisions AND dispatch outcomes (global limits, precedence, deferral) -----------

from collections.abc import Callable

import pytest

from tailguard.controller.core.alerts import alert_scopes
from tailguard.controller.core.model import TargetKey
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.ports import MetricsSource
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.incident_ports import incident_layer
from tailguard.controller.loop.incidents import IncidentKeeper
from tailguard.controller.testing import FakeAnnotator, FakeDeployer, FakeNotifier
from tailguard.controller.tools.backtest import BacktestReport
from tailguard.controller.tools.backtest_world import RecordedAlert, dispatch_outcome, load_alerts
from tests.unit.test_arbiter import P99_ROLLBACK, QUEUE_SCALE

LIMITS = GlobalLimits(cooldown=120.0, maxActionsPerHour=10)
Values = Callable[[str, TargetKey, float], float]  # (signal, target, time) -> value


class LiveLoop:
    """`tailguard run` minus the network: the real Controller, Dispatcher and Journal, the public fakes as ports,
    every loaded policy evaluated each interval (as the arbiter's tests drive it), alerts triggering evaluations of
    the targets they name (controller/core/alerts.py, the API's rule)."""

    def __init__(self, tmp_path: Path, rules: Path, values: Values, targets: list[TargetKey]) -> None:
        self.clock = ManualClock(START)
        self.values, self.targets = values, targets
        self.journal = Journal(tmp_path / "live.db")
        # Incidents as `tailguard run` wires them (controller/app/build.py): in the journal's file.
        self.keeper = IncidentKeeper(SqliteIncidentStore(tmp_path / "live.db"), self.clock)
        layer = incident_layer(
            self.keeper,
            Actuators(
                rollback=FakeDeployer(replicas={"chat": 2}),
                scale=FakeDeployer(),
                annotator=FakeAnnotator(),
                notifier=FakeNotifier(),
            ),
            None,
        )
        self.dispatcher = Dispatcher(self.journal, layer.actuators, self.clock, LIMITS)
        self.controller = Controller(
            policy_paths=[rules],
            source=FakeSource(),
            journal=self.journal,
            dispatcher=layer.dispatcher(self.dispatcher),
            clock=self.clock,
            metrics=ControllerMetrics(CollectorRegistry()),
            query_signals=self._query,
            schedule=False,
            dry_run=False,
        )
        self.controller.start()
        self.keeper.bind(self.controller.policies)

    def _query(self, _source: MetricsSource, policy: Policy, _at: float | None) -> dict[str, SignalResult]:
        now = self.clock.now()
        return {s.name: SignalResult({t: self.values(s.name, t, now) for t in self.targets}) for s in policy.signals}

    def run(self, alerts: list[RecordedAlert] = ()) -> None:  # type: ignore[assignment]
        policies = self.controller.policies()
        ticks = sorted({t for p in policies.values() for t in evaluation_times(START, END, p.interval)})
        pending = sorted(alerts, key=lambda a: a.at)
        for now in ticks:
            while pending and pending[0].at < now:
                self._alert(pending.pop(0))
            self.clock.advance(now - self.clock.now())
            for name in sorted(policies):
                self.controller.evaluate(name)
            while pending and pending[0].at == now:
                self._alert(pending.pop(0))
        self.decisions, self.dispatched = self._decisions(), self._outcomes()
        self.controller.stop()  # closes the journal

    def _alert(self, alert: RecordedAlert) -> None:
        self.clock.advance(alert.at - self.clock.now())
        scopes = alert_scopes(self.controller.policies(), [alert.labels])
        self.controller.trigger(sorted(scopes), targets=scopes)
        assert self.controller.wait_for_triggered(10)

    def _decisions(self) -> list[tuple[str, str, str, TargetKey]]:
        out = []
        for record in self.journal.all_actions():
            decision = self.journal.decision(record.decision_id, record.decision_kind) or {}
            out.append((record.decision_id, record.decision_kind, record.type.value, target_key(decision["target"])))
        return sorted(out)

    def _outcomes(self) -> dict[str, tuple[str, float | None, str | None, list[dict[str, Any]]]]:
        out = {}
        for record in self.journal.all_actions():
            got = dispatch_outcome(record, self.journal.action_events(record.idempotency_key))
            out[record.idempotency_key] = (got["outcome"], got["at"], got["why"], got["events"])
        return out


def backtest_source(policies: list[Policy], values: Values, targets: list[TargetKey]) -> FakeSource:
    """The same data as history: range answers on each policy's grid, instant answers at any time (alerts)."""
    ranges: dict[str, Any] = {}
    instants: dict[str, Any] = {}
    for policy in policies:
        times = evaluation_times(START, END, policy.interval)
        for name, query in render_signal_queries(policy).items():
            ranges[query] = RangeResult({t: {at: values(name, t, at) for at in times} for t in targets})
            instants[query] = lambda _q, at, name=name: SignalResult({t: values(name, t, at or 0.0) for t in targets})
    return FakeSource(instant_answers=instants, range_answers=ranges)


def backtested(report: BacktestReport) -> tuple[list[tuple[str, str, str, TargetKey]], dict[str, Any]]:
    decisions = sorted(
        (entry.id, kind, action.type.value, entry.target)
        for entry in report.decisions
        for kind, action in entry.actions
    )
    outcomes = {
        action.idempotency_key: tuple(
            entry.dispatch[action.idempotency_key][k] for k in ("outcome", "at", "why", "events")
        )
        for entry in report.decisions
        for _kind, action in entry.actions
    }
    return decisions, outcomes


def two_policies(tmp_path: Path, scale_for: int, rollback_for: int) -> tuple[Path, list[Policy]]:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "queue-scale.yaml").write_text(QUEUE_SCALE.format(for_=scale_for))
    (rules / "p99-rollback.yaml").write_text(P99_ROLLBACK.format(for_=rollback_for))
    loaded, errors = load_policies([rules])
    assert not errors
    return rules, [entry.policy for entry in loaded]


def queue_resolving_at(resolved: float | None) -> Values:
    """Both signals breach from the start (a bad rollout fills the queue and slows every request); the queue
    drains at `resolved` (None: never)."""

    def values(signal: str, _target: TargetKey, at: float) -> float:
        if signal == "p99-e2e-latency":
            return 2.0
        return 5.0 if resolved is not None and at >= resolved else 45.0

    return values


def outcome_kinds(outcomes: dict[str, Any]) -> dict[str, tuple[str, float | None]]:
    return {key.split(":", 1)[1] + "@" + key.split(":")[0][:6]: (o[0], o[1]) for key, o in outcomes.items()}


@pytest.mark.parametrize(
    "scale_for, rollback_for, resolved, expected",
    [
        # The reproduction: the scale runs at +15 s, the rollback 15 s later still runs (precedence).
        (2, 3, None, {("scale", "would_run", START + 15), ("rollback", "would_run", START + 30)}),
        # The rollback first: the later scale is deferred by the global cooldown, then runs once it is over.
        (3, 2, None, {("rollback", "would_run", START + 15), ("scale", "would_run", START + 135)}),
        # ... or ends suppressed when the queue drains while it waits.
        (3, 2, START + 75, {("rollback", "would_run", START + 15), ("scale", "suppressed", START + 75)}),
    ],
)
def test_the_two_policy_incident_dispatches_the_same_live_and_as_a_backtest(
    tmp_path: Path,
    scale_for: int,
    rollback_for: int,
    resolved: float | None,
    expected: set[tuple[str, str, float]],
) -> None:
    rules, policies = two_policies(tmp_path, scale_for, rollback_for)
    values = queue_resolving_at(resolved)
    live = LiveLoop(tmp_path, rules, values, [CHAT])
    live.run()

    report = run_backtest(backtest_source(policies, values, [CHAT]), policies, START, END, None, limits=LIMITS)
    decisions, outcomes = backtested(report)
    assert decisions == live.decisions
    assert outcomes == live.dispatched  # outcome, time, why and every journaled event (each refusal)
    mutating = {
        (
            action.type.value,
            entry.dispatch[action.idempotency_key]["outcome"],
            entry.dispatch[action.idempotency_key]["at"],
        )
        for entry in report.decisions
        for _kind, action in entry.actions
        if action.type.value in ("scale", "rollback")
    }
    assert mutating == expected
    if scale_for > rollback_for:
        (scale,) = [
            entry.dispatch[a.idempotency_key]
            for entry in report.decisions
            for _k, a in entry.actions
            if a.type.value == "scale"
        ]
        refusals = [e for e in scale["events"] if e["event"] == "deferred"]
        assert refusals and refusals[0]["detail"].startswith(
            "global cooldown: rollback on chat by policy 'p99-rollback'"
        )
        if resolved is not None:
            assert scale["why"] == f"condition resolved while deferred: {refusals[-1]['detail']}"


# ----- alert-triggered evaluations --------------------------------------------------------------------------

ALERT_POLICY = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: p99
interval: 15s
targets:
  groupBy: [service]
signals:
  - name: p99
    query: histogram_quantile(0.99, sum by (le, {{ by }}) (rate(lat_bucket{ {{ selector }} }[1m])))
conditions:
  - name: slow
    signal: p99
    when: {op: ">", value: 0.8}
    for: 3
    noData: hold
    actions:
      - type: rollback
        service: "{{ service }}"
"""
CODE = target_key({"service": "code"})


def test_an_alert_triggered_evaluation_decides_the_same_live_and_as_a_backtest(tmp_path: Path) -> None:
    """P99 breaches from +5 s on chat and code; alerts name chat at +5 s and +35 s. Live, chat's streak starts
    at the alert (+5) and the alert at +35 completes it (3 observations spanning 30 s): fire at +35. code, not
    named, fires on the schedule at +45 (onset +15). The old backtest knew no alerts (chat: onset +15, fire +45)."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "p99.yaml").write_text(ALERT_POLICY)
    loaded, errors = load_policies([rules])
    assert not errors
    policies = [loaded[0].policy]

    def values(_signal: str, _target: TargetKey, at: float) -> float:
        return 2.0 if at >= START + 5 else 0.2

    recorded = tmp_path / "alerts.json"
    recorded.write_text(
        json.dumps(
            [
                {"at": START + 5, "labels": {"alertname": "P99High", "service": "chat"}},
                {  # an Alertmanager payload, posted at +35 s
                    "at": START + 35,
                    "version": "4",
                    "status": "firing",
                    "alerts": [{"status": "firing", "labels": {"alertname": "P99High", "service": "chat"}}],
                },
            ]
        )
    )
    alerts = list(load_alerts(str(recorded)))
    assert [a.at for a in alerts] == [START + 5, START + 35]

    live = LiveLoop(tmp_path, rules, values, [CHAT, CODE])
    live.run(alerts)
    report = run_backtest(backtest_source(policies, values, [CHAT, CODE]), policies, START, END, None, alerts=alerts)

    decisions, outcomes = backtested(report)
    assert decisions == live.decisions
    assert outcomes == live.dispatched
    fired = {entry.target: (entry.onset, entry.fired_at) for entry in report.decisions if entry.policy_fired}
    assert fired == {CHAT: (START + 5, START + 35), CODE: (START + 15, START + 45)}
    # Nothing in the replay ends the breach: each service's incident escalates at its first scheduled evaluation 5
    # minutes or more after its rollback (chat's at +35 s, by the alert; code's at +45 s), as live.
    escalated = {entry.target: entry.fired_at for entry in report.decisions if not entry.policy_fired}
    assert escalated == {CHAT: START + 345, CODE: START + 345}
    assert report.alert_evaluations == 2 and report.to_json()["alert_evaluations"] == 2
