"""Issue 12 item 6 through a real Prometheus over backfilled history (tests/support/scenarios.py): the same hour
runs live (the real Controller, Dispatcher and Journal, the public fakes as ports, one evaluation of each policy
per interval with the instant queries at the simulated time, an alert triggering an evaluation) and as a
backtest (range queries, the same alert as a recorded one); decisions and dispatch outcomes are compared one by
one. Two policies act on one service: p99-rollback (the shipped example) and p99-scale (scale one interval
later), under a 2m global cooldown: the rollback runs, the later scale is deferred and runs once the cooldown
is over while its condition still fires."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.adapters.stores.incidents import SqliteIncidentStore
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.alerts import alert_scopes
from tailguard.controller.core.model import target_key
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.core.ports import MetricsSource
from tailguard.controller.core.signals import query_signals
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.incident_ports import incident_layer
from tailguard.controller.loop.incidents import IncidentKeeper
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeAnnotator, FakeDeployer, FakeNotifier
from tailguard.controller.tools.backtest import evaluation_times, run_backtest
from tailguard.controller.tools.backtest_world import RecordedAlert, dispatch_outcome
from tests.conftest import BackfilledPrometheus
from tests.support.scenarios import T0

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "rules" / "examples" / "p99-rollback.yaml"
START, END = T0 + 65, T0 + 2400  # the grid (+65, +80, ... +1190, +1205, ...) misses +1200, the alert's time
LIMITS = GlobalLimits(cooldown=120.0, maxActionsPerHour=10)
ALERT = RecordedAlert(T0 + 1200, {"alertname": "P99High", "namespace": "llm", "service": "regress"})
SCALE = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: p99-scale
interval: 15s
targets:
  groupBy: [service]
  match: {namespace: llm}
signals:
  - name: p99
    query: >-
      histogram_quantile(0.99,
        sum by (le, {{ by }}) (rate(vllm:e2e_request_latency_seconds_bucket{ {{ selector }} }[1m])))
conditions:
  - name: p99-above-800ms
    signal: p99
    when: {op: ">", value: 0.8}
    for: 4
    noData: hold
    actions:
      - type: scale
        service: "{{ service }}"
        delta: 1
        max: 8
"""


def _rules(tmp_path: Path) -> tuple[Path, list[Policy]]:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "p99-rollback.yaml").write_text(EXAMPLE.read_text())
    (rules / "p99-scale.yaml").write_text(SCALE)
    loaded, errors = load_policies([rules])
    assert not errors
    return rules, [entry.policy for entry in loaded]


def _live(tmp_path: Path, url: str, rules: Path) -> tuple[list[Any], dict[str, Any]]:
    clock = ManualClock(START)

    def at_clock(source: MetricsSource, policy: Policy, _at: float | None) -> dict[str, Any]:
        return query_signals(source, policy, clock.now())  # the instant query at the simulated time

    journal = Journal(tmp_path / "live.db")
    deployer = FakeDeployer()
    # Incidents as `tailguard run` wires them (controller/app/build.py): in the journal's file.
    keeper = IncidentKeeper(SqliteIncidentStore(tmp_path / "live.db"), clock)
    layer = incident_layer(
        keeper, Actuators(rollback=deployer, scale=deployer, annotator=FakeAnnotator(), notifier=FakeNotifier()), None
    )
    dispatcher = Dispatcher(journal, layer.actuators, clock, LIMITS)
    with PrometheusSource(PrometheusSettings(url=url), clock) as source:
        controller = Controller(
            policy_paths=[rules],
            source=source,
            journal=journal,
            dispatcher=layer.dispatcher(dispatcher),
            clock=clock,
            metrics=ControllerMetrics(CollectorRegistry()),
            query_signals=at_clock,
            schedule=False,
            dry_run=False,
        )
        controller.start()
        keeper.bind(controller.policies)
        try:
            policies = controller.policies()
            alerted = False
            for now in evaluation_times(START, END, 15.0):
                if not alerted and ALERT.at < now:
                    clock.advance(ALERT.at - clock.now())
                    scopes = alert_scopes(policies, [ALERT.labels])
                    controller.trigger(sorted(scopes), targets=scopes)
                    assert controller.wait_for_triggered(30)
                    alerted = True
                clock.advance(now - clock.now())
                for name in sorted(policies):
                    controller.evaluate(name)
            decisions = []
            outcomes = {}
            for record in journal.all_actions():
                decision = journal.decision(record.decision_id, record.decision_kind) or {}
                target = target_key(decision["target"])
                decisions.append((record.decision_id, record.decision_kind, record.type.value, target))
                got = dispatch_outcome(record, journal.action_events(record.idempotency_key))
                outcomes[record.idempotency_key] = got
        finally:
            controller.stop()
    return sorted(decisions), outcomes


def test_live_and_backtest_decide_and_dispatch_the_same_over_backfilled_history(
    tmp_path: Path, backfilled_prometheus: BackfilledPrometheus
) -> None:
    rules, policies = _rules(tmp_path)
    live_decisions, live_outcomes = _live(tmp_path, backfilled_prometheus.url, rules)

    with PrometheusSource(PrometheusSettings(url=backfilled_prometheus.url), ManualClock()) as source:
        report = run_backtest(source, policies, START, END, None, limits=LIMITS, alerts=[ALERT])
    assert report.signal_errors == [] and report.alert_evaluations == 2  # the alert wakes both policies
    decisions = sorted(
        (entry.id, kind.value, action.type.value, entry.target)
        for entry in report.decisions
        for kind, action in entry.actions
    )
    outcomes = {
        action.idempotency_key: entry.dispatch[action.idempotency_key]
        for entry in report.decisions
        for _kind, action in entry.actions
    }
    assert decisions and decisions == live_decisions
    assert outcomes == live_outcomes

    regress = target_key({"service": "regress"})
    by_policy = {(e.policy, e.target): e for e in report.decisions if e.policy_fired}
    rollback = by_policy[("p99-rollback", regress)]
    assert rollback.onset == T0 + 1200  # the alert's observation starts the streak (the grid's first is +1205)
    assert rollback.fired_at == T0 + 1235  # 3 observations spanning 30 s: +1200, +1205, +1220, +1235
    scale = by_policy[("p99-scale", regress)]
    (scale_action,) = [a for _k, a in scale.actions]
    dispatched = scale.dispatch[scale_action.idempotency_key]
    assert dispatched["outcome"] == "would_run" and dispatched["at"] == T0 + 1235 + 120
    assert [e["event"] for e in dispatched["events"]][-2:] == ["started", "succeeded"]
    assert all(e["detail"].startswith("global cooldown: rollback on regress") for e in dispatched["events"][:-2])
