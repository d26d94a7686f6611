"""Sharded leader election (controller/adapters/lease/shards.py) with several electors on the spec-validating fake
Kubernetes API and a manual clock: every shard led by exactly one replica at every moment, balanced; rebalanced
when a replica joins, stops (release) or dies (expiry within one lease duration plus one round); action times
of a shard's policies (only those) and the operator controls move with the shard Leases."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tailguard.controller.adapters.lease.settings import LeaderElectionSettings
from tailguard.controller.adapters.lease.shards import ShardedElector, member_lease_name, shard_lease_name
from tailguard.controller.app.settings import SettingsError, load_settings
from tailguard.controller.core.controls import ALL, Control, Controls
from tailguard.controller.core.handover import HANDOVER_ANNOTATION, ActionTimes, decode_action_times, merge_action_times
from tailguard.controller.core.model import TargetKey, target_key
from tailguard.controller.core.ports import ShardedLeaderPort
from tailguard.controller.core.sharding import shard_of
from tailguard.controller.kit.clock import ManualClock
from tests.support.fake_kubernetes import FakeKubernetes

NAMESPACE = "tailguard"
BASE = "tailguard-leader"
LEASE = 15.0
ROUND = 5.0  # retryPeriod
SHARDS = 6


class RecordingHandover:
    """The controller's side of the handover (HandoverPort + ControlsHandoverPort), recording what it inherits."""

    def __init__(self) -> None:
        self.own: dict[str, dict[TargetKey, tuple[float, ...]]] = {}
        self.inherited: dict[str, dict[TargetKey, tuple[float, ...]]] = {}
        self.controls = Controls()

    def handover_snapshot(self) -> ActionTimes:
        return merge_action_times(self.own, self.inherited)

    def inherit_handover(self, times: ActionTimes) -> None:
        self.inherited = merge_action_times(self.inherited, times)

    def controls_snapshot(self) -> Controls:
        return self.controls

    def inherit_controls(self, controls: Controls) -> None:
        self.controls = self.controls.merged(controls)


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        yield server


def replica(
    fake: FakeKubernetes,
    identity: str,
    clock: ManualClock,
    changes: list[tuple[str, str, int]] | None = None,
    *,
    shards: int = SHARDS,
) -> ShardedElector:
    elector = ShardedElector(
        k8s.CoordinationV1Api(fake.api_client()),
        BASE,
        NAMESPACE,
        identity,
        shards,
        LEASE,
        clock,
        renew_deadline=10.0,
        on_change=(lambda event, index, _why: changes.append((identity, event, index)))
        if changes is not None
        else None,
    )
    elector.attach_handover(RecordingHandover())
    return elector


def leaders(replicas: list[ShardedElector]) -> dict[int, str]:
    """shard -> the one replica leading it; fails if two lead the same shard."""
    out: dict[int, str] = {}
    for elector in replicas:
        for index in elector.held_shards():
            assert index not in out, f"shard {index} led by {out[index]} and {elector.identity}"
            out[index] = elector.identity
    return out


def rounds(clock: ManualClock, replicas: list[ShardedElector], count: int, everyone: list[ShardedElector]) -> None:
    """`count` rounds of `replicas` (one retry period apart), checking after every single round that no shard
    has two leaders among `everyone` (the dead too: their own deadline must have ended their leadership)."""
    for _ in range(count):
        for elector in replicas:
            elector.run_once()
            leaders(everyone)
        clock.advance(ROUND)


def holder(fake: FakeKubernetes, name: str) -> str:
    lease = fake.get_object("leases", NAMESPACE, name)  # None: never created (a member slot nobody needed)
    return "" if lease is None else str(lease["spec"].get("holderIdentity") or "")


def transitions_of(fake: FakeKubernetes, index: int) -> int:
    lease = fake.get_object("leases", NAMESPACE, shard_lease_name(BASE, index))
    assert lease is not None
    return int(lease["spec"]["leaseTransitions"])


def test_three_replicas_split_the_shards_evenly_and_agree_with_the_leases(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    replicas = [replica(fake, name, clock) for name in ("pod-a", "pod-b", "pod-c")]
    rounds(clock, replicas, 4, replicas)
    led = leaders(replicas)
    assert sorted(led) == list(range(SHARDS))
    assert Counter(led.values()) == Counter({"pod-a": 2, "pod-b": 2, "pod-c": 2})
    assert {index: holder(fake, shard_lease_name(BASE, index)) for index in range(SHARDS)} == led
    assert sorted(holder(fake, member_lease_name(BASE, j)) for j in range(SHARDS)) == ["", "", "", *sorted(
        ("pod-a", "pod-b", "pod-c"))]  # fmt: skip
    assert all(r.live_replicas == 3 for r in replicas)
    # The controller's view: a policy is led by exactly the replica holding its shard.
    for name in ("p99-rollback", "queue-scale", "error-ratio", "hbm-pressure"):
        assert [r.identity for r in replicas if r.leads(name)] == [led[shard_of(name, SHARDS)]]
    assert all(isinstance(r, ShardedLeaderPort) and r.is_leader() for r in replicas)


def test_a_joining_replica_takes_over_only_the_others_excess(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    changes: list[tuple[str, str, int]] = []
    first = [replica(fake, name, clock, changes) for name in ("pod-a", "pod-b")]
    rounds(clock, first, 3, first)
    before = leaders(first)
    assert Counter(before.values()) == Counter({"pod-a": 3, "pod-b": 3})
    transitions = {index: transitions_of(fake, index) for index in range(SHARDS)}
    changes.clear()
    late = replica(fake, "pod-c", clock, changes)
    everyone = [*first, late]
    rounds(clock, everyone, 4, everyone)
    after = leaders(everyone)
    assert Counter(after.values()) == Counter({"pod-a": 2, "pod-b": 2, "pod-c": 2})
    moved = {index for index in range(SHARDS) if after[index] != before[index]}
    assert moved == set(late.held_shards())  # nothing moved between pod-a and pod-b
    # Each moved shard: released once by its old holder, acquired once by the newcomer (journaled by the app).
    assert sorted(changes) == sorted(
        [(before[index], "released", index) for index in moved] + [("pod-c", "acquired", index) for index in moved]
    )
    # Each moved shard changed hands once; the others not at all.
    assert {index: transitions_of(fake, index) - transitions[index] for index in range(SHARDS)} == {
        index: 1 if index in moved else 0 for index in range(SHARDS)
    }


def test_a_dead_replicas_shards_are_taken_over_within_one_lease_duration_and_a_round(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    replicas = [replica(fake, name, clock) for name in ("pod-a", "pod-b", "pod-c")]
    rounds(clock, replicas, 4, replicas)
    before = leaders(replicas)
    victim = replicas[1]
    orphaned = set(victim.held_shards())
    last_renewal = clock.now() - ROUND  # its last round ran one retry period ago
    survivors = [replicas[0], replicas[2]]
    taken_at = None
    while taken_at is None:
        rounds(clock, survivors, 1, replicas)  # also checks that the victim stopped leading before anyone took over
        if orphaned <= {i for r in survivors for i in r.held_shards()}:
            taken_at = clock.now() - ROUND
        assert clock.now() - last_renewal < 60, "never taken over"
    assert taken_at - last_renewal <= LEASE + ROUND
    assert not victim.is_leader()
    after = leaders(survivors)
    assert Counter(after.values()) == Counter({"pod-a": 3, "pod-c": 3})
    assert {index for index in range(SHARDS) if after[index] != before[index]} == orphaned


def test_a_stopped_replica_hands_its_shards_over_in_the_next_round(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    replicas = [replica(fake, name, clock) for name in ("pod-a", "pod-b", "pod-c")]
    rounds(clock, replicas, 4, replicas)
    replicas[2].stop()  # releases its shards and member slot
    assert not replicas[2].is_leader()
    rounds(clock, replicas[:2], 1, replicas)
    assert Counter(leaders(replicas).values()) == Counter({"pod-a": 3, "pod-b": 3})


def test_more_replicas_than_shards_leaves_a_standby(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    replicas = [replica(fake, f"pod-{n}", clock, shards=2) for n in range(3)]
    rounds(clock, replicas, 3, replicas)
    led = leaders(replicas)
    assert sorted(led) == [0, 1] and len(set(led.values())) == 2
    (standby,) = [r for r in replicas if not r.is_leader()]
    # It sees the others' member slots, but holds none (both taken), so its fair share is nothing.
    assert standby.live_replicas == 2 and standby.held_shards() == []
    victim = next(r for r in replicas if r.is_leader())
    rounds(clock, [r for r in replicas if r is not victim], 5, replicas)  # 25 s > one lease duration
    assert standby.is_leader() and not victim.is_leader()


def test_action_times_of_a_shards_policies_move_with_its_lease_and_only_those(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    names = [f"policy-{n}" for n in range(24)]
    a, b = replica(fake, "pod-a", clock), replica(fake, "pod-b", clock)
    handover_a, handover_b = RecordingHandover(), RecordingHandover()
    a.attach_handover(handover_a)
    b.attach_handover(handover_b)
    rounds(clock, [a, b], 3, [a, b])
    target = target_key({"service": "chat"})
    handover_a.own = {name: {target: (clock.now() - 30,)} for name in names}  # pod-a acted for every policy
    a.publish()
    for index in a.held_shards():
        lease = fake.get_object("leases", NAMESPACE, shard_lease_name(BASE, index))
        assert lease is not None
        carried = decode_action_times(lease["metadata"]["annotations"][HANDOVER_ANNOTATION])
        assert set(carried) == {name for name in names if shard_of(name, SHARDS) == index}
    taken = set(a.held_shards())
    rounds(clock, [b], 5, [a, b])  # pod-a dies; pod-b takes its shards and inherits their times
    assert set(b.held_shards()) == set(range(SHARDS))
    assert set(handover_b.inherited) == {name for name in names if shard_of(name, SHARDS) in taken}
    # publish_for never takes a shard: pod-a (dead, its leadership over) cannot renew anything
    assert a.publish_for(names[0]) is False and not a.is_leader()


def test_a_pause_set_on_one_replica_reaches_the_others_within_a_round(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    replicas = [replica(fake, name, clock) for name in ("pod-a", "pod-b", "pod-c")]
    handovers = [RecordingHandover() for _ in replicas]
    for elector, handover in zip(replicas, handovers, strict=True):
        elector.attach_handover(handover)
    rounds(clock, replicas, 3, replicas)
    kill = Control(True, "oncall", "incident 42", clock.now())
    handovers[0].controls = handovers[0].controls.with_control(ALL, kill)
    replicas[0].publish()
    rounds(clock, replicas[1:], 1, replicas)
    assert all(h.controls.latest.get(ALL) == kill for h in handovers)


def test_settings_and_from_settings(fake: FakeKubernetes) -> None:
    settings = LeaderElectionSettings(namespace=NAMESPACE, leaseName=BASE, identity="pod-a", shards=4)
    elector = ShardedElector.from_settings(settings, k8s.CoordinationV1Api(fake.api_client()), ManualClock())
    assert [e.name for e in elector.electors] == [f"{BASE}-shard-{i}" for i in range(4)]
    assert [e.name for e in elector.members] == [f"{BASE}-member-{i}" for i in range(4)]
    assert LeaderElectionSettings(namespace=NAMESPACE).shards == 1
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        LeaderElectionSettings(namespace=NAMESPACE, shards=0)


def test_bad_shards_in_a_config_file_is_a_located_error(tmp_path: Path) -> None:
    config = tmp_path / "tailguard.yaml"
    config.write_text("tier: {url: http://127.0.0.1:9}\nleaderElection:\n  namespace: t\n  shards: 0\n")
    with pytest.raises(SettingsError, match="leaderElection.shards"):
        load_settings(config)
