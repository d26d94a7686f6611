"""The controller evaluates and acts only while its LeaderElector leads (two replicas, one Lease, the fake API)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.lease.leader import LeaderElector
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.handover import HANDOVER_ANNOTATION
from tailguard.controller.core.model import DecisionKind, SignalResult, target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDispatcher, FakeSource
from tests.support.fake_kubernetes import FakeKubernetes

POLICY = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: lat
interval: 15s
targets:
  groupBy: [service]
signals:
  - name: p99
    query: histogram_quantile(0.99, sum by (le, {{ by }}) (rate(lat_bucket[1m])))
conditions:
  - name: p99-high
    signal: p99
    when: {op: ">", value: 0.8}
    for: 2
    noData: hold
    actions:
      - type: annotate
        text: "p99 {{ value }}"
"""


def replica(
    tmp_path: Path, name: str, fake: FakeKubernetes, clock: ManualClock
) -> tuple[Controller, LeaderElector, FakeDispatcher]:
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "lat.yaml").write_text(POLICY)
    elector = LeaderElector(k8s.CoordinationV1Api(fake.api_client()), "tailguard", "llm", name, 15, clock)
    dispatcher = FakeDispatcher()
    controller = Controller(
        policy_paths=[rules],
        source=FakeSource(),
        journal=Journal(tmp_path / f"{name}.db"),
        dispatcher=dispatcher,
        clock=clock,
        metrics=ControllerMetrics(CollectorRegistry()),
        schedule=False,
        leader=elector,
    )
    return controller, elector, dispatcher


def test_only_the_leader_evaluates_and_a_follower_takes_over(tmp_path: Path) -> None:
    clock = ManualClock()
    with FakeKubernetes() as fake:
        first, first_elector, first_dispatcher = replica(tmp_path, "pod-a", fake, clock)
        second, second_elector, second_dispatcher = replica(tmp_path, "pod-b", fake, clock)
        assert first_elector.run_once() and not second_elector.run_once()
        first.start()
        second.start()
        try:
            assert first_dispatcher.resumed == 1 and second_dispatcher.resumed == 0  # a follower resumes nothing
            assert first.evaluate("lat") is not None
            assert second.evaluate("lat") is None
            assert second.skipped_not_leader == {"lat": 1}
            follower_ready = second.readiness()
            assert follower_ready.ready and any("follower" in w for w in follower_ready.warnings)
            # pod-a stops renewing; after expiry pod-b leads, resumes once, and evaluates
            clock.advance(16)
            assert first.evaluate("lat") is None  # its deadline passed: it stops acting on its own
            assert second_elector.run_once() is True  # the record it saw at t0 has not changed for 16 s
            assert second.evaluate("lat") is not None
            assert second_dispatcher.resumed == 1
        finally:
            first.stop()
            second.stop()


SCALE_POLICY = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: queue
interval: 15s
targets:
  groupBy: [service]
signals:
  - name: waiting
    query: sum by ({{ by }}) (vllm:num_requests_waiting)
conditions:
  - name: queue-high
    signal: waiting
    when: {op: ">", value: 20}
    for: 2
    noData: hold
    actions:
      - type: scale
        delta: 1
        max: 8
limits:
  cooldown: 10m
  maxActionsPerHour: 3
"""
QUEUE_QUERY = "sum by (service) (vllm:num_requests_waiting)"
CHAT = target_key({"service": "chat"})


class LeaseReadingDispatcher:
    """Records each dispatched decision with the action times the Lease annotation held at that moment."""

    def __init__(self, leases: k8s.CoordinationV1Api) -> None:
        self.leases = leases
        self.dispatched: list[tuple[Any, dict[str, Any]]] = []

    def dispatch(self, decision: Any) -> Sequence[Any]:
        lease = self.leases.read_namespaced_lease("tailguard", "llm")
        annotation = (lease.metadata.annotations or {}).get(HANDOVER_ANNOTATION, "{}")
        self.dispatched.append((decision, json.loads(annotation)))
        return []

    def resume(self) -> Sequence[Any]:
        return []

    def retry_deferred(self, policy: str, state: Any) -> Sequence[Any]:
        return []

    def deferred_policies(self) -> set[str]:
        return set()


def scaling_replica(
    tmp_path: Path, name: str, fake: FakeKubernetes, clock: ManualClock
) -> tuple[Controller, LeaderElector, LeaseReadingDispatcher]:
    rules = tmp_path / f"rules-{name}"
    rules.mkdir(exist_ok=True)
    (rules / "queue.yaml").write_text(SCALE_POLICY)
    elector = LeaderElector(k8s.CoordinationV1Api(fake.api_client()), "tailguard", "llm", name, 15, clock)
    dispatcher = LeaseReadingDispatcher(k8s.CoordinationV1Api(fake.api_client()))
    controller = Controller(
        policy_paths=[rules],
        source=FakeSource({QUEUE_QUERY: SignalResult({CHAT: 50.0})}),  # the queue stays high throughout
        journal=Journal(tmp_path / f"{name}.db"),
        dispatcher=dispatcher,
        clock=clock,
        metrics=ControllerMetrics(CollectorRegistry()),
        schedule=False,
        leader=elector,
    )
    return controller, elector, dispatcher


def fires(dispatcher: LeaseReadingDispatcher) -> list[Any]:
    return [decision for decision, _ in dispatcher.dispatched if decision.kind == DecisionKind.FIRE]


def evaluate_every_interval(
    controller: Controller, elector: LeaderElector, clock: ManualClock, times: int
) -> list[Any]:
    decisions: list[Any] = []
    for _ in range(times):
        assert elector.run_once()  # what the background loop does between evaluations
        outcome = controller.evaluate("queue")
        assert outcome is not None
        decisions.extend(outcome.decisions)
        clock.advance(15)
    return decisions


Replica = tuple[Controller, LeaderElector, LeaseReadingDispatcher]


@contextmanager
def two_scaling_replicas(tmp_path: Path, clock: ManualClock) -> Iterator[tuple[FakeKubernetes, Replica, Replica]]:
    """pod-a leads, pod-b follows; both started, both stopped at the end."""
    with FakeKubernetes() as fake:
        first = scaling_replica(tmp_path, "pod-a", fake, clock)
        second = scaling_replica(tmp_path, "pod-b", fake, clock)
        assert first[1].run_once() and not second[1].run_once()
        first[0].start()
        second[0].start()
        try:
            yield fake, first, second
        finally:
            first[0].stop()
            second[0].stop()


def take_over(elector: LeaderElector, clock: ManualClock) -> None:
    """pod-a has died without releasing: pod-b leads once the record it saw has not changed for a lease."""
    assert elector.run_once() is False
    clock.advance(16)
    assert elector.run_once()


def test_a_new_leader_inherits_the_cooldown_and_does_not_scale_a_second_time(tmp_path: Path) -> None:
    clock = ManualClock(start=1_000_000.0)
    with two_scaling_replicas(tmp_path, clock) as (_, (first, first_elector, first_dispatcher), second_replica):
        second, second_elector, second_dispatcher = second_replica
        fired = [d for d in evaluate_every_interval(first, first_elector, clock, 3) if d.kind == DecisionKind.FIRE]
        assert len(fired) == 1 and len(first_dispatcher.dispatched) == 1
        # The Lease already carried this action's time when the scale was dispatched (published first).
        decision, annotation = first_dispatcher.dispatched[0]
        assert annotation["policies"]["queue"][0]["times"] == [round(decision.at, 3)]
        take_over(second_elector, clock)  # the queue is still high
        later = evaluate_every_interval(second, second_elector, clock, 6)
        assert fires(second_dispatcher) == []  # no second scale within pod-a's 10-minute cooldown
        suppressed = [d for d in later if d.kind == DecisionKind.SUPPRESSED]
        assert suppressed and "but cooldown: last mutating action 61s ago" in suppressed[0].reason
        # The inherited time is in pod-b's own journal now, so a container restart keeps it too.
        assert Journal(tmp_path / "pod-b.db").load_state("queue").actions_at[CHAT] == (decision.at,)


def test_without_a_handover_annotation_the_new_leader_would_act_again(tmp_path: Path) -> None:
    """The control for the test above: the same failover with the annotation unreadable does scale again."""
    clock = ManualClock(start=1_000_000.0)
    with two_scaling_replicas(tmp_path, clock) as (fake, (first, first_elector, _), second_replica):
        second, second_elector, second_dispatcher = second_replica
        evaluate_every_interval(first, first_elector, clock, 3)
        leases = k8s.CoordinationV1Api(fake.api_client())
        lease = leases.read_namespaced_lease("tailguard", "llm")
        lease.metadata.annotations = {HANDOVER_ANNOTATION: "not json"}  # unreadable: logged, not fatal
        leases.replace_namespaced_lease("tailguard", "llm", lease)
        take_over(second_elector, clock)
        evaluate_every_interval(second, second_elector, clock, 3)
        assert len(fires(second_dispatcher)) == 1


def test_a_leader_that_finds_the_lease_taken_before_acting_does_not_act(tmp_path: Path) -> None:
    clock = ManualClock(start=1_000_000.0)
    with FakeKubernetes() as fake:
        first, first_elector, first_dispatcher = scaling_replica(tmp_path, "pod-a", fake, clock)
        assert first_elector.run_once()
        first.start()
        try:
            evaluate_every_interval(first, first_elector, clock, 1)
            assert first_elector.run_once()
            # Another replica writes the Lease (as after a partition): pod-a's deadline has not passed yet.
            leases = k8s.CoordinationV1Api(fake.api_client())
            lease = leases.read_namespaced_lease("tailguard", "llm")
            lease.spec.holder_identity = "pod-b"
            leases.replace_namespaced_lease("tailguard", "llm", lease)
            outcome = first.evaluate("queue")
            assert outcome is not None and [d.kind for d in outcome.decisions] == [DecisionKind.FIRE]
            assert first_dispatcher.dispatched == []  # the renewal before acting found pod-b's record
            assert not first_elector.is_leader()
        finally:
            first.stop()


class PublishedHandover:
    """The controller of the process before the restart: it had published these action times."""

    def __init__(self, times: Any) -> None:
        self.times = times

    def handover_snapshot(self) -> Any:
        return self.times

    def inherit_handover(self, times: Any) -> None:
        pass


def test_a_restarted_leader_renewing_before_its_journal_is_loaded_keeps_the_published_times(tmp_path: Path) -> None:
    clock = ManualClock(start=1_000_000.0)
    with FakeKubernetes() as fake:
        leases = k8s.CoordinationV1Api(fake.api_client())
        before = LeaderElector(leases, "tailguard", "llm", "pod-a", 15, clock)
        before.attach_handover(PublishedHandover({"queue": {CHAT: (999_990.0,)}}))
        assert before.run_once()
        # The container restarts (same pod name, the Lease still ours): the new process renews once before its
        # controller has started (loaded policies and journal), as `tailguard run` does.
        controller, restarted, _ = scaling_replica(tmp_path, "pod-a", fake, clock)
        clock.advance(2)
        assert restarted.run_once()
        annotation = leases.read_namespaced_lease("tailguard", "llm").metadata.annotations[HANDOVER_ANNOTATION]
        assert json.loads(annotation)["policies"]["queue"][0]["times"] == [999_990.0]
        # Once started, its first evaluation counts that action: the queue is high, but the cooldown holds.
        controller.start()
        try:
            decisions = evaluate_every_interval(controller, restarted, clock, 3)
            assert [d.kind for d in decisions] == [DecisionKind.SUPPRESSED]
        finally:
            controller.stop()
