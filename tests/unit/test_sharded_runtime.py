"""The controller with sharded leader election (controller/adapters/lease/shards.py) on the fake Kubernetes API:
each policy is evaluated by exactly the replica holding its shard's Lease, readiness counts only those, and
when a replica dies the survivor evaluates every policy once the shard Leases expired."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client as k8s
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.lease.shards import ShardedElector
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.sharding import shard_of
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDispatcher, FakeSource
from tests.support.fake_kubernetes import FakeKubernetes

SHARDS = 3
NAMES = [f"policy-{n}" for n in range(6)]

POLICY = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: {name}
interval: 15s
targets:
  groupBy: [service]
signals:
  - name: p99
    query: p99_{n}
conditions:
  - name: p99-high
    signal: p99
    when: {{op: ">", value: 0.8}}
    for: 2
    noData: hold
    actions:
      - type: annotate
        text: "p99 {{{{ value }}}}"
"""


def replica(tmp_path: Path, name: str, fake: FakeKubernetes, clock: ManualClock) -> tuple[Controller, ShardedElector]:
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    for n, policy in enumerate(NAMES):
        (rules / f"{policy}.yaml").write_text(POLICY.format(name=policy, n=n))
    elector = ShardedElector(
        k8s.CoordinationV1Api(fake.api_client()), "tailguard", "llm", name, SHARDS, 15, clock, renew_deadline=10
    )
    controller = Controller(
        policy_paths=[rules],
        source=FakeSource(),
        journal=Journal(tmp_path / f"{name}.db"),
        dispatcher=FakeDispatcher(),
        clock=clock,
        metrics=ControllerMetrics(CollectorRegistry()),
        schedule=False,
        leader=elector,
    )
    return controller, elector


def evaluated_by(controllers: dict[str, Controller]) -> dict[str, list[str]]:
    return {
        policy: [name for name, controller in controllers.items() if controller.evaluate(policy) is not None]
        for policy in NAMES
    }


def test_each_policy_is_evaluated_by_the_holder_of_its_shard_and_the_survivor_takes_all(tmp_path: Path) -> None:
    clock = ManualClock()
    assert len({shard_of(name, SHARDS) for name in NAMES}) == SHARDS  # every shard has a policy
    with FakeKubernetes() as fake:
        a, a_elector = replica(tmp_path, "pod-a", fake, clock)
        b, b_elector = replica(tmp_path, "pod-b", fake, clock)
        for _ in range(3):
            a_elector.run_once()
            b_elector.run_once()
            clock.advance(3)
        a.start()
        b.start()
        try:
            held = {"pod-a": set(a_elector.held_shards()), "pod-b": set(b_elector.held_shards())}
            assert held["pod-a"] | held["pod-b"] == set(range(SHARDS)) and not held["pod-a"] & held["pod-b"]
            assert sorted(len(shards) for shards in held.values()) == [1, 2]
            owner = {policy: next(n for n, s in held.items() if shard_of(policy, SHARDS) in s) for policy in NAMES}
            assert evaluated_by({"pod-a": a, "pod-b": b}) == {policy: [owner[policy]] for policy in NAMES}
            assert sum(b.skipped_not_leader.values()) == sum(1 for p in NAMES if owner[p] == "pod-a")
            for controller, name in ((a, "pod-a"), (b, "pod-b")):
                ready = controller.readiness()
                elsewhere = sum(1 for p in NAMES if owner[p] != name)
                assert ready.ready, ready.reasons  # the other replica's policies are not "not evaluated yet"
                assert f"sharded: {elsewhere} policies belong to shards other replicas hold" in ready.warnings
            # pod-a dies (stops renewing); pod-b's rounds see its Leases expire and take its shards.
            for _ in range(5):
                clock.advance(4)
                b_elector.run_once()
            assert b_elector.held_shards() == list(range(SHARDS)) and not a_elector.is_leader()
            assert evaluated_by({"pod-a": a, "pod-b": b}) == {policy: ["pod-b"] for policy in NAMES}
        finally:
            a.stop()
            b.stop()
