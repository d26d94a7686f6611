"""The loop's rooms on their own (issue 26 item 3): the policy set's reload as a diff and what each kind of change
does to the engine state, and the scheduler's anchors across a reload."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.engine import ConditionState, Phase, PolicyState
from tailguard.controller.core.model import target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.health import SourceHealthTracker
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.policy_set import PolicySet
from tailguard.controller.loop.scheduling import EvaluationScheduler
from tailguard.controller.testing import FakeSource

CHAT = target_key({"service": "chat"})


def policy_yaml(name: str, conditions: tuple[str, ...] = ("high",), interval: str = "15s") -> str:
    blocks = "".join(
        f"""  - name: {condition}
    signal: p99
    when: {{op: ">", value: 0.8}}
    for: 2
    noData: hold
    actions:
      - type: annotate
        text: "{condition}"
"""
        for condition in conditions
    )
    return f"""\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: {name}
interval: {interval}
targets:
  groupBy: [service]
signals:
  - name: p99
    query: up
conditions:
{blocks}"""


def breaching(*conditions: str) -> PolicyState:
    return PolicyState(
        conditions={(name, CHAT): ConditionState(Phase.PENDING, breach_count=1, onset=1.0) for name in conditions},
        evaluations=1,
        last_evaluated_at=1.0,
    )


def policy_set(rules: Path, journal: Journal, clock: ManualClock) -> PolicySet:
    metrics = ControllerMetrics(CollectorRegistry())
    return PolicySet(
        [rules], source=FakeSource(), journal=journal, clock=clock, metrics=metrics, health=SourceHealthTracker(metrics)
    )


def test_a_reload_is_a_diff_and_each_change_has_its_state_consequence(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "a.yaml").write_text(policy_yaml("a", ("high", "low")))
    (rules / "b.yaml").write_text(policy_yaml("b"))
    clock = ManualClock(start=100.0)
    with Journal(tmp_path / "journal.db") as journal:
        journal.commit_evaluation("c", breaching("high"), [], 1.0)  # what an earlier process left for `c`
        policies = policy_set(rules, journal, clock)
        assert policies.load() == ["a", "b"]
        policies.committed("a", breaching("high", "low"), 100.0, None)
        policies.committed("b", breaching("high"), 100.0, None)
        policies.record_policy_errors("b", ("p99: refused",))

        (rules / "a.yaml").write_text(policy_yaml("a", ("high",)))  # updated: `low` is gone
        (rules / "b.yaml").unlink()  # removed
        (rules / "c.yaml").write_text(policy_yaml("c"))  # added
        outcome = policies.reload()

        assert (outcome.applied, outcome.added, outcome.removed, outcome.updated) == (True, ("c",), ("b",), ("a",))
        states = policies.states()
        assert set(states) == {"a", "c"}
        assert set(states["a"].conditions) == {("high", CHAT)}  # the gone condition's state is dropped
        assert states["c"] == journal.load_state("c")  # an added policy starts from its journaled state
        view = policies.readiness_view()
        assert view.policy_errors == () and set(view.last_evaluation) == {"a", "c"}
        assert policies.reload().changed is False  # the same files: nothing to do


def test_the_scheduler_keeps_an_anchor_unless_the_interval_changes() -> None:
    clock = ManualClock(start=100.0)
    seen: dict[str, tuple[float, float] | None] = {}

    def run(name: str, _trigger: str, anchor: tuple[float, float] | None, _targets: object) -> None:
        seen[name] = anchor

    scheduler = EvaluationScheduler(clock, run)
    try:
        scheduler.apply({"a": 15.0, "b": 30.0}, added=["a", "b"], removed=(), updated=())
        clock.advance(7)
        scheduler.apply({"a": 15.0, "b": 60.0}, added=(), removed=(), updated=["a", "b"])
        scheduler.evaluate_scheduled("a")
        scheduler.evaluate_scheduled("b")
        assert seen == {"a": (100.0, 15.0), "b": (107.0, 60.0)}  # b's interval changed: its schedule starts again
        scheduler.apply({"a": 15.0}, added=(), removed=["b"], updated=())
        seen.clear()
        scheduler.evaluate_scheduled("b")
        assert seen == {"b": None}  # a removed policy has no anchor left
    finally:
        scheduler.stop()
