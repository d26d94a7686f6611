"""controller/loop/evaluation.py without a Controller: evaluate(policy, state, now, ports) queries, decides,
commits, hands the new state over, asks the Lease gate and dispatches, in that order; the reload's diff."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.model import Decision, DecisionKind, SignalResult, target_key
from tailguard.controller.core.policy_files import LoadedPolicy, load_policies
from tailguard.controller.core.signals import render_signal_queries
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.evaluation import EvaluationPorts, UnconfiguredPredictions, evaluate
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.policy_set import diff_policies
from tailguard.controller.testing import FakeDispatcher, FakeJournal, FakeSource
from tests.unit.test_runtime import policy_yaml


def _policy(directory: Path, name: str = "lat-a", *, threshold: float = 0.8, for_: int = 2) -> LoadedPolicy:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(policy_yaml(name, threshold=threshold, for_=for_))
    loaded, errors = load_policies([path])
    assert not errors
    return loaded[0]


def test_evaluate_commits_then_keeps_the_state_then_gates_then_dispatches(tmp_path: Path) -> None:
    policy = _policy(tmp_path, for_=1).policy
    query = render_signal_queries(policy)["p99"]
    events: list[str] = []

    class Journal(FakeJournal):
        def commit_evaluation(self, policy: str, state: PolicyState, decisions: Sequence[Decision], now: float) -> None:
            events.append("commit")
            super().commit_evaluation(policy, state, decisions, now)

    class Dispatcher(FakeDispatcher):
        def dispatch(self, decision: Decision) -> Sequence[object]:
            events.append("dispatch")
            return super().dispatch(decision)

    def gate(name: str, decisions: Sequence[Decision]) -> bool:
        events.append(f"gate {name} {len(decisions)}")
        return True

    clock = ManualClock()
    journal, dispatcher = Journal(), Dispatcher()
    ports = EvaluationPorts(
        source=FakeSource(instant_answers={query: SignalResult({target_key({"service": "chat"}): 0.93})}),
        journal=journal,
        dispatcher=dispatcher,
        clock=clock,
        metrics=ControllerMetrics(CollectorRegistry()),
        predictions=UnconfiguredPredictions(),
        before_acting=gate,
    )
    kept: list[PolicyState] = []

    def committed(state: PolicyState) -> None:
        events.append("keep")
        kept.append(state)

    outcome = evaluate(policy, PolicyState(), clock.now(), ports, trigger="alert", committed=committed)
    assert [d.kind for d in outcome.decisions] == [DecisionKind.FIRE]
    assert (outcome.policy, outcome.trigger, outcome.at) == ("lat-a", "alert", clock.now())
    assert events == ["commit", "keep", "gate lat-a 1", "dispatch"]
    assert kept == [outcome.state] and journal.states["lat-a"] == outcome.state
    assert dispatcher.dispatched == list(outcome.decisions)


def test_a_closed_gate_commits_but_does_not_dispatch(tmp_path: Path) -> None:
    policy = _policy(tmp_path, for_=1).policy
    query = render_signal_queries(policy)["p99"]
    journal, dispatcher = FakeJournal(), FakeDispatcher()
    ports = EvaluationPorts(
        source=FakeSource(instant_answers={query: SignalResult({target_key({"service": "chat"}): 0.93})}),
        journal=journal,
        dispatcher=dispatcher,
        clock=ManualClock(),
        metrics=ControllerMetrics(CollectorRegistry()),
        predictions=UnconfiguredPredictions(),
        before_acting=lambda _name, _decisions: False,
    )
    outcome = evaluate(policy, PolicyState(), 0.0, ports)
    assert [d.kind for d in outcome.decisions] == [DecisionKind.FIRE]
    assert [d.id for d, _ in journal.decisions] == [outcome.decisions[0].id]
    assert dispatcher.dispatched == []


def test_diff_policies_names_the_added_removed_and_updated(tmp_path: Path) -> None:
    a, b, c = _policy(tmp_path, "a"), _policy(tmp_path, "b"), _policy(tmp_path, "c")
    b_changed = _policy(tmp_path / "edited", "b", threshold=0.9)
    old = {"a": a, "b": b}
    new = {"b": b_changed, "c": c}
    assert diff_policies(old, new) == (["c"], ["a"], ["b"])
    assert diff_policies(old, {"a": a, "b": b}) == ([], [], [])
