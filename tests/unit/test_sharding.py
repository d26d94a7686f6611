"""The pure shard assignment (controller/core/sharding.py): which shard a policy belongs to (stable, balanced,
minimal movement when the shard count changes) and which shards each replica holds (every shard held once,
balanced, minimal movement when a replica joins or leaves), simulated over rounds without any I/O."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field

import pytest

from tailguard.controller.core.sharding import (
    LeaseSeen,
    fair_share,
    live_members,
    plan_round,
    preference,
    shard_of,
)

NAMES = [f"policy-{n}" for n in range(4000)]


def test_shard_of_is_pinned_and_the_same_in_another_process() -> None:
    # Pinned: a change of the hash would move every policy of a running deployment at the next upgrade.
    assert [shard_of(n, 4) for n in ("p99-rollback", "queue-scale", "error-ratio", "hbm-pressure")] == [0, 3, 1, 3]
    code = (
        "from tailguard.controller.core.sharding import shard_of; "
        "print([shard_of(f'policy-{n}', 7) for n in range(50)])"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert other.strip() == str([shard_of(f"policy-{n}", 7) for n in range(50)])
    assert {shard_of(name, 1) for name in NAMES} == {0}


def test_policies_spread_evenly_over_the_shards() -> None:
    counts = Counter(shard_of(name, 4) for name in NAMES)
    assert sorted(counts) == [0, 1, 2, 3]
    assert all(850 <= count <= 1150 for count in counts.values()), counts  # 1000 each, within 15%


def test_adding_a_shard_moves_only_the_policies_the_new_shard_takes() -> None:
    before = {name: shard_of(name, 4) for name in NAMES}
    after = {name: shard_of(name, 5) for name in NAMES}
    moved = [name for name in NAMES if before[name] != after[name]]
    assert moved and all(after[name] == 4 for name in moved)
    assert 0.15 <= len(moved) / len(NAMES) <= 0.25  # about 1/5
    # and removing it again moves exactly those back
    assert all(shard_of(name, 4) == before[name] for name in moved)


def test_bad_shard_count() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        shard_of("p", 0)


def test_fair_share_and_preference() -> None:
    assert [fair_share(8, live) for live in (0, 1, 2, 3, 4, 8, 9)] == [8, 8, 4, 3, 2, 1, 1]
    assert sorted(preference("tailguard-a", 6)) == list(range(6))
    assert preference("tailguard-a", 6) != preference("tailguard-b", 6)


def test_live_members_counts_distinct_unexpired_holders() -> None:
    seen = [LeaseSeen("b", False), LeaseSeen("c", True), LeaseSeen("", False), LeaseSeen("b", False)]
    assert live_members(seen, "a", mine=True) == 2
    assert live_members(seen, "a", mine=False) == 1


def test_a_replica_without_a_member_slot_releases_everything_and_takes_nothing() -> None:
    plan = plan_round("a", {0, 1}, {2: LeaseSeen("", False)}, 3, 1, member=False)
    assert (plan.keep, sorted(plan.release), plan.take, plan.room) == ((), [0, 1], (2,), 0)


@dataclass
class World:
    """Shard and member Leases as holder names ("" free); `dead` replicas stopped renewing (seen expired)."""

    shards: int
    holders: dict[int, str] = field(default_factory=dict)
    members: dict[int, str] = field(default_factory=dict)
    dead: set[str] = field(default_factory=set)
    moves: list[tuple[int, str, str]] = field(default_factory=list)  # (shard, from, to) when a holder changes

    def seen(self, holder: str) -> LeaseSeen:
        return LeaseSeen(holder, holder in self.dead)

    def round(self, identity: str) -> None:
        if identity not in self.members.values():
            for slot in preference(identity, self.shards):
                if self.seen(self.members.get(slot, "")).available_to(identity):
                    self.members[slot] = identity
                    break
        member = identity in self.members.values()
        live = live_members([self.seen(h) for h in self.members.values()], identity, mine=member)
        held = {i for i in range(self.shards) if self.holders.get(i) == identity}
        seen = {i: self.seen(self.holders.get(i, "")) for i in range(self.shards) if i not in held}
        plan = plan_round(identity, held, seen, self.shards, live, member=member)
        for index in plan.release:
            self.holders[index] = ""
        room = plan.room
        for index in plan.take:
            if room == 0:
                break
            self.moves.append((index, self.holders.get(index, ""), identity))
            self.holders[index] = identity
            room -= 1

    def settle(self, replicas: list[str], rounds: int = 6) -> None:
        for _ in range(rounds):
            for identity in replicas:
                self.round(identity)

    def counts(self) -> Counter[str]:
        return Counter(self.holders.values())


def test_every_shard_is_held_once_and_balanced() -> None:
    world = World(8)
    world.settle(["a", "b", "c"])
    assert sorted(world.holders) == list(range(8)) and "" not in world.holders.values()
    assert sorted(world.counts().values()) == [2, 3, 3]


def test_a_joining_replica_takes_only_the_others_excess() -> None:
    world = World(8)
    world.settle(["a", "b"])
    assert world.counts() == Counter({"a": 4, "b": 4})
    before = dict(world.holders)
    world.moves.clear()
    world.settle(["a", "b", "c"])
    assert sorted(world.counts().values()) == [2, 3, 3]
    changed = {index for index in range(8) if world.holders[index] != before[index]}
    # Only shards that went to the newcomer moved, each once: nothing moved between a and b.
    assert changed == {index for index, holder in world.holders.items() if holder == "c"}
    assert len(world.moves) == len(changed) == world.counts()["c"]


def test_a_dead_replicas_shards_go_to_the_others_and_nothing_else_moves() -> None:
    world = World(6)
    world.settle(["a", "b", "c"])
    assert world.counts() == Counter({"a": 2, "b": 2, "c": 2})
    before = dict(world.holders)
    world.dead.add("b")
    world.moves.clear()
    world.settle(["a", "c"], rounds=1)  # takeover in the first round that sees b expired
    assert world.counts() == Counter({"a": 3, "c": 3})
    assert {index for index in range(6) if world.holders[index] != before[index]} == {
        index for index, holder in before.items() if holder == "b"
    }
    assert [source for _index, source, _to in world.moves] == ["b", "b"]


def test_more_replicas_than_shards_leave_standbys_that_take_over() -> None:
    world = World(2)
    world.settle(["a", "b", "c"])
    holders = set(world.holders.values())
    assert len(holders) == 2 and world.counts().most_common(1)[0][1] == 1  # one shard each, one standby
    (standby,) = {"a", "b", "c"} - holders
    (victim, *_) = sorted(holders)
    world.dead.add(victim)
    world.settle(sorted({"a", "b", "c"} - {victim}))
    assert set(world.holders.values()) == {"a", "b", "c"} - {victim}
    assert standby in world.holders.values()
