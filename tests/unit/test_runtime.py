"""Controller runtime: evaluation loop, per-policy serialisation, restart, hot reload, readiness."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.logging_setup import JsonLogFormatter
from tailguard.controller.core.controls import Control, Controls
from tailguard.controller.core.model import DecisionKind, SignalResult, target_key
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.core.ports import ControlsHandoverPort
from tailguard.controller.core.signals import render_signal_queries
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.policy_set import PolicyLoadError
from tailguard.controller.loop.ports import TRIGGER_ALERT
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDispatcher, FakeLeader, FakeSource


def policy_yaml(
    name: str, *, namespace: str = "llm", interval: str = "15s", threshold: float = 0.8, for_: int = 2
) -> str:
    return f"""\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: {name}
interval: {interval}
targets:
  groupBy: [service]
  match:
    namespace: {namespace}
signals:
  - name: p99
    query: histogram_quantile(0.99, sum by (le, {{{{ by }}}}) (rate(lat_bucket{{ {{{{ selector }}}} }}[1m])))
conditions:
  - name: p99-high
    signal: p99
    when: {{op: ">", value: {threshold}}}
    for: {for_}
    noData: hold
    actions:
      - type: annotate
        text: "p99 {{{{ value }}}} on {{{{ service }}}}"
"""


def query_of(path: Path) -> str:
    loaded, errors = load_policies([path])
    assert not errors
    return render_signal_queries(loaded[0].policy)["p99"]


def sample(name: str, registry: CollectorRegistry, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    directory = tmp_path / "rules"
    directory.mkdir()
    (directory / "a.yaml").write_text(policy_yaml("lat-a"))
    return directory


def make_controller(
    rules: Path,
    tmp_path: Path,
    source: Any,
    clock: ManualClock,
    registry: CollectorRegistry | None = None,
    **kwargs: Any,
) -> tuple[Controller, FakeDispatcher]:
    dispatcher = FakeDispatcher()
    controller = Controller(
        policy_paths=[rules],
        source=source,
        journal=Journal(tmp_path / "journal.db"),
        dispatcher=dispatcher,
        clock=clock,
        metrics=ControllerMetrics(registry or CollectorRegistry()),
        schedule=False,
        **kwargs,
    )
    return controller, dispatcher


def test_evaluation_fires_journals_dispatches_and_counts(rules: Path, tmp_path: Path) -> None:
    clock = ManualClock()
    registry = CollectorRegistry()
    source = FakeSource(
        instant_answers={query_of(rules / "a.yaml"): SignalResult({target_key({"service": "chat"}): 0.93})}
    )
    controller, dispatcher = make_controller(rules, tmp_path, source, clock, registry)
    controller.start()
    try:
        first = controller.evaluate("lat-a")
        clock.advance(15)
        second = controller.evaluate("lat-a")
    finally:
        controller.stop()
    assert first is not None and first.decisions == ()
    assert second is not None and [d.kind for d in second.decisions] == [DecisionKind.FIRE]
    assert [d.id for d in dispatcher.dispatched] == [second.decisions[0].id]
    assert dispatcher.resumed == 1
    journal = Journal(tmp_path / "journal.db")
    try:
        assert [d["kind"] for d in journal.recent_decisions()] == ["fire"]
    finally:
        journal.close()
    assert sample("tailguard_evaluations_total", registry, policy="lat-a", trigger="schedule") == 2
    assert sample("tailguard_decisions_total", registry, policy="lat-a", condition="p99-high", kind="fire") == 1
    assert sample("tailguard_condition_state", registry, policy="lat-a", condition="p99-high", phase="firing") == 1
    assert sample("tailguard_condition_state", registry, policy="lat-a", condition="p99-high", phase="pending") == 0
    assert sample("tailguard_query_duration_seconds_count", registry, policy="lat-a", signal="p99") == 2
    assert sample("tailguard_last_evaluation_timestamp_seconds", registry, policy="lat-a") == clock.now()
    assert sample("tailguard_policies_loaded", registry) == 1


def test_restart_continues_from_the_journaled_state(rules: Path, tmp_path: Path) -> None:
    clock = ManualClock()
    answers = {query_of(rules / "a.yaml"): SignalResult({target_key({"service": "chat"}): 0.93})}
    controller, _ = make_controller(rules, tmp_path, FakeSource(instant_answers=dict(answers)), clock)
    controller.start()
    first = controller.evaluate("lat-a")
    controller.stop()
    assert first is not None and first.decisions == ()  # one breach of the two needed: pending

    clock.advance(15)
    restarted, dispatcher = make_controller(rules, tmp_path, FakeSource(instant_answers=dict(answers)), clock)
    restarted.start()
    try:
        second = restarted.evaluate("lat-a")
    finally:
        restarted.stop()
    assert second is not None and [d.kind for d in second.decisions] == [DecisionKind.FIRE]
    assert len(dispatcher.dispatched) == 1


def test_source_errors_are_counted_and_never_breach(rules: Path, tmp_path: Path) -> None:
    clock = ManualClock()
    registry = CollectorRegistry()
    source = FakeSource(default=SignalResult.failed("connection refused"))
    controller, dispatcher = make_controller(rules, tmp_path, source, clock, registry)
    controller.start()
    try:
        for _ in range(3):
            outcome = controller.evaluate("lat-a")
            assert outcome is not None and outcome.decisions == ()
            assert outcome.source_errors == ("p99: connection refused",)
            clock.advance(15)
    finally:
        controller.stop()
    assert sample("tailguard_source_errors_total", registry, policy="lat-a", signal="p99") == 3
    assert dispatcher.dispatched == []


def test_start_refuses_a_broken_policy_set_with_file_and_line(rules: Path, tmp_path: Path) -> None:
    (rules / "b.yaml").write_text(policy_yaml("lat-b").replace("noData: hold", "noData: maybe"))
    controller, _ = make_controller(rules, tmp_path, FakeSource(), ManualClock())
    with pytest.raises(PolicyLoadError) as raised:
        controller.start()
    controller.stop()
    assert len(raised.value.errors) == 1
    error = raised.value.errors[0]
    assert error.file.endswith("b.yaml") and error.line == 17 and error.field == "conditions[0].noData"


def test_hot_reload_applies_good_edits_and_keeps_the_last_good_set_on_bad_ones(rules: Path, tmp_path: Path) -> None:
    clock = ManualClock()
    registry = CollectorRegistry()
    controller, _ = make_controller(rules, tmp_path, FakeSource(default=SignalResult({})), clock, registry)
    controller.start()
    try:
        assert controller.reload().changed is False

        (rules / "b.yaml").write_text(policy_yaml("lat-b", namespace="batch"))
        outcome = controller.reload()
        assert outcome.applied and outcome.added == ("lat-b",)
        assert sorted(controller.policies()) == ["lat-a", "lat-b"]

        (rules / "a.yaml").write_text(policy_yaml("lat-a", threshold=1.5))
        outcome = controller.reload()
        assert outcome.updated == ("lat-a",)
        assert controller.policies()["lat-a"].conditions[0].when.value == 1.5

        (rules / "b.yaml").write_text(policy_yaml("lat-b", namespace="batch").replace("for: 2", "for: -1"))
        outcome = controller.reload()
        assert outcome.changed and not outcome.applied
        assert sorted(controller.policies()) == ["lat-a", "lat-b"]  # the last good set keeps running
        assert controller.policies()["lat-b"].conditions[0].for_.count == 2
        errors = [str(e) for e in controller.reload_errors()]
        assert len(errors) == 1 and "b.yaml:16: conditions[0].for:" in errors[0]
        assert sample("tailguard_reload_errors_total", registry) == 1
        assert controller.readiness().reload_errors == tuple(errors)
        assert controller.reload().changed is False  # the same bad file is not re-reported
        assert sample("tailguard_reload_errors_total", registry) == 1

        (rules / "b.yaml").unlink()
        outcome = controller.reload()
        assert outcome.applied and outcome.removed == ("lat-b",)
        assert controller.reload_errors() == []
        assert controller.evaluate("lat-b") is None
        assert sample("tailguard_policies_loaded", registry) == 1
    finally:
        controller.stop()


def test_readiness_is_serving_the_api_and_late_evaluations_are_warnings(rules: Path, tmp_path: Path) -> None:
    """Readiness means "can serve its API" (issue 24): a late evaluation (a hung Prometheus holds each query for its
    timeout) is a warning on /readyz and the status page's health, never unreadiness."""
    clock = ManualClock()
    controller, _ = make_controller(rules, tmp_path, FakeSource(default=SignalResult({})), clock)
    assert controller.readiness().reasons == ("controller not started",)
    controller.start()
    try:
        assert controller.readiness().ready
        assert controller.readiness().warnings == ("policy lat-a: not evaluated yet",)
        controller.evaluate("lat-a")
        assert controller.readiness().ready and controller.readiness().warnings == ()
        clock.advance(46)
        assert controller.readiness().ready
        assert controller.readiness().warnings == ("policy lat-a: last evaluation 46s ago (limit 45s)",)
    finally:
        controller.stop()
    assert not controller.readiness().ready
    assert "journal closed" in controller.readiness().reasons


def test_alert_and_scheduled_evaluations_of_one_policy_never_interleave(rules: Path, tmp_path: Path) -> None:
    entered = threading.Event()
    release = threading.Event()
    active = 0
    most_active = 0
    calls = 0
    guard = threading.Lock()

    def answer(query: str, at: float | None) -> SignalResult:
        nonlocal active, most_active, calls
        with guard:
            active += 1
            calls += 1
            most_active = max(most_active, active)
            first = calls == 1
        if first:
            entered.set()
            release.wait(timeout=30)
        with guard:
            active -= 1
        return SignalResult({target_key({"service": "chat"}): 0.1})

    clock = ManualClock()
    controller, _ = make_controller(
        rules, tmp_path, FakeSource(instant_answers={query_of(rules / "a.yaml"): answer}), clock
    )
    controller.start()
    try:
        scheduled = threading.Thread(target=controller.evaluate, args=("lat-a",))
        scheduled.start()
        assert entered.wait(timeout=30)
        assert controller.trigger(["lat-a", "unknown"], TRIGGER_ALERT) == ["lat-a"]
        assert controller.trigger(["lat-a"], TRIGGER_ALERT) == ["lat-a"]  # queued once, not twice
        release.set()
        scheduled.join(timeout=30)
        assert controller.wait_for_triggered(timeout=30)
    finally:
        release.set()
        controller.stop()
    assert most_active == 1
    assert calls == 2
    state = controller.metrics.registry
    assert sample("tailguard_evaluations_total", state, policy="lat-a", trigger="alert") == 1
    assert controller.trigger(["lat-a"]) == []  # stopped: nothing is queued any more


def test_scheduler_evaluates_at_start_and_stop_waits_and_closes(rules: Path, tmp_path: Path) -> None:
    evaluated = threading.Event()

    def answer(query: str, at: float | None) -> SignalResult:
        evaluated.set()
        return SignalResult({})

    clock = ManualClock()
    dispatcher = FakeDispatcher()
    registry = CollectorRegistry()
    controller = Controller(
        policy_paths=[rules],
        source=FakeSource(instant_answers={query_of(rules / "a.yaml"): answer}),
        journal=Journal(tmp_path / "journal.db"),
        dispatcher=dispatcher,
        clock=clock,
        metrics=ControllerMetrics(registry),
        schedule=True,
        reload_interval=3600,
    )
    controller.start()
    try:
        assert evaluated.wait(timeout=30)
    finally:
        controller.stop()
    assert sample("tailguard_evaluations_total", registry, policy="lat-a", trigger="schedule") == 1
    assert "journal closed" in controller.readiness().reasons


def test_dry_run_override_marks_every_decision(rules: Path, tmp_path: Path) -> None:
    clock = ManualClock()
    source = FakeSource(instant_answers={query_of(rules / "a.yaml"): SignalResult({target_key({"service": "x"}): 2.0})})
    controller, dispatcher = make_controller(rules, tmp_path, source, clock, dry_run=True)
    controller.start()
    try:
        controller.evaluate("lat-a")
        clock.advance(15)
        controller.evaluate("lat-a")
    finally:
        controller.stop()
    assert [d.dry_run for d in dispatcher.dispatched] == [True]


def test_json_log_formatter_merges_structured_fields() -> None:
    import json
    import logging

    record = logging.LogRecord("tailguard", logging.INFO, __file__, 1, "evaluated %s", ("p",), None)
    record.fields = {"policy": "p", "trigger": "alert"}
    line = json.loads(JsonLogFormatter().format(record))
    assert line["msg"] == "evaluated p" and line["policy"] == "p" and line["trigger"] == "alert"


def test_actions_run_by_the_real_dispatcher_are_counted(rules: Path, tmp_path: Path) -> None:
    from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
    from tailguard.controller.testing import FakeAnnotator

    clock = ManualClock()
    registry = CollectorRegistry()
    journal = Journal(tmp_path / "journal.db")
    annotator = FakeAnnotator()
    source = FakeSource(instant_answers={query_of(rules / "a.yaml"): SignalResult({target_key({"service": "x"}): 2.0})})
    controller = Controller(
        policy_paths=[rules],
        source=source,
        journal=journal,
        dispatcher=Dispatcher(journal, Actuators(annotator=annotator), clock, GlobalLimits()),
        clock=clock,
        metrics=ControllerMetrics(registry),
        schedule=False,
    )
    controller.start()
    try:
        controller.evaluate("lat-a")
        clock.advance(15)
        controller.evaluate("lat-a")
    finally:
        controller.stop()
    assert len(annotator.calls) == 1
    assert sample("tailguard_actions_total", registry, type="annotate", status="succeeded") == 1


def test_the_reload_job_picks_up_edits_on_its_own(rules: Path, tmp_path: Path) -> None:
    controller = Controller(
        policy_paths=[rules],
        source=FakeSource(default=SignalResult({})),
        journal=Journal(tmp_path / "j.db"),
        dispatcher=FakeDispatcher(),
        clock=ManualClock(),
        metrics=ControllerMetrics(CollectorRegistry()),
        schedule=True,
        reload_interval=0.2,
    )
    controller.start()
    try:
        (rules / "a.yaml").write_text(policy_yaml("lat-a").replace("noData: hold", "noData: sometimes"))
        for _ in range(300):
            if controller.reload_errors():
                break
            threading.Event().wait(0.1)
        assert [e.field for e in controller.reload_errors()] == ["conditions[0].noData"]
        assert list(controller.policies()) == ["lat-a"]
    finally:
        controller.stop()


def test_the_elector_is_given_the_handover_never_the_controller(rules: Path, tmp_path: Path) -> None:
    """Issue 26: no object hands itself to another. The elector gets what the Lease carries (the policy set's action
    times, the operator's controls) through a handover of its own, which answers for the running controller."""
    clock = ManualClock(start=1_000.0)
    leader = FakeLeader()
    controller, _ = make_controller(rules, tmp_path, FakeSource(), clock, leader=leader)
    handover = leader.handover
    assert handover is not None and handover is not controller
    assert isinstance(handover, ControlsHandoverPort)
    controller.start()
    try:
        controller.set_paused("lat-a", True, by="alice", reason="INC-1")
        assert handover.controls_snapshot() == controller.controls()
        chat = target_key({"service": "chat"})
        handover.inherit_handover({"lat-a": {chat: (999.0,)}})
        assert handover.handover_snapshot() == {"lat-a": {chat: (999.0,)}}
        assert controller.controls().pause_of("lat-a") is not None
        clock.advance(10)
        handover.inherit_controls(Controls({"lat-a": Control(False, "bob", "resolved", clock.now())}))
        assert controller.controls().pause_of("lat-a") is None  # the later control from the Lease wins
    finally:
        controller.stop()
