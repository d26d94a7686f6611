"""Which shard a policy belongs to, and which shards one replica should hold: pure functions, no I/O.

Sharding splits the policies (not the targets of one policy) across controller replicas. Policies, because one
policy's evaluation is one set of PromQL queries whose `by (...)` result already covers all of its targets: the
query cannot be cut by a hash of the target's labels (PromQL has no hash function), so sharding targets would
mean every replica issues the full queries and throws most of the answer away. A policy is the unit that carries
its own queries, state, cooldowns and budget; giving each policy to exactly one replica keeps the no-duplicate
rule of a single leader per policy. (A policy too big for one replica is split by its author into several
policies with disjoint `targets.match` selectors, e.g. by a shard label; docs/deploy.md "Sharding".)

* `shard_of(policy, shards)`: rendezvous (highest random weight) hashing of the policy name over the shard
  indices, with BLAKE2b (stable across processes and Python versions, unlike `hash()`). Adding a shard moves
  only the policies whose new top score is the new shard (about 1/(N+1) of them); removing one moves only its own.
* `plan_round(...)`: one replica's view of the shard Leases -> which shards to keep, release and try to take.
  Each replica holds at most `fair_share(shards, live)` = ceil(shards / live replicas) shards, preferring those
  ranked highest for its identity (again rendezvous hashing): when a replica joins, the others release only
  their excess (least-preferred first); when one leaves, its shards expire and fall to the others, whose fair
  share grew. So the assignment is balanced and moves as little as possible.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass


def _score(key: str, bucket: int) -> int:
    digest = hashlib.blake2b(f"{key}\x00{bucket}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def shard_of(policy: str, shards: int) -> int:
    """The shard (0 .. shards-1) that evaluates `policy`: rendezvous hashing of its name."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    return max(range(shards), key=lambda index: (_score(policy, index), -index))


def preference(identity: str, count: int) -> list[int]:
    """The indices 0 .. count-1 in the order replica `identity` prefers them (rendezvous hashing)."""
    return sorted(range(count), key=lambda index: (-_score(identity, index), index))


def fair_share(shards: int, live_replicas: int) -> int:
    """How many shards one replica may hold when `live_replicas` replicas share them."""
    return math.ceil(shards / max(1, live_replicas))


@dataclass(frozen=True)
class LeaseSeen:
    """A shard (or member) Lease as one replica sees it at the start of a round."""

    holder: str  # "" when free (released, or not created yet)
    expired: bool  # held by someone else whose record has not changed for a lease duration (client-go's rule)

    def available_to(self, identity: str) -> bool:
        return not self.holder or self.holder == identity or self.expired


@dataclass(frozen=True)
class ShardPlan:
    keep: tuple[int, ...]  # held shards to renew
    release: tuple[int, ...]  # held shards beyond the fair share (least preferred first)
    take: tuple[int, ...]  # free or expired shards to try, in order, until `room` of them are taken
    room: int  # how many more shards this replica may take


def live_members(members: Sequence[LeaseSeen], identity: str, *, mine: bool) -> int:
    """The replicas alive now: distinct holders of unexpired member Leases (ours counts when we hold one)."""
    others = {seen.holder for seen in members if seen.holder and seen.holder != identity and not seen.expired}
    return len(others) + (1 if mine else 0)


def plan_round(
    identity: str,
    held: Collection[int],
    seen: Mapping[int, LeaseSeen],
    shards: int,
    live_replicas: int,
    *,
    member: bool,
) -> ShardPlan:
    """What replica `identity` does with the shard Leases this round.

    `held`: the shards it leads now; `seen`: the others' Leases as read this round; `member`: whether it holds a
    member slot (a replica without one is a standby and holds no shard; docs/deploy.md "Sharding")."""
    cap = fair_share(shards, live_replicas) if member else 0
    order = preference(identity, shards)
    mine = [index for index in order if index in held]
    keep, excess = mine[:cap], mine[cap:]
    take = [index for index in order if index not in held and index in seen and seen[index].available_to(identity)]
    return ShardPlan(tuple(keep), tuple(reversed(excess)), tuple(take), max(0, cap - len(keep)))
