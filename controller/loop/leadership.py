"""What the controller asks of the leader elector: may this replica evaluate a policy now, and renew the Lease
before acting. Without an elector every answer is yes.

A follower skips its evaluations (counted) and resumes nothing; leading again later (a failover back) resumes
what is left, the journaled plans making that safe (`take_resume`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from tailguard.controller.core.model import Decision
from tailguard.controller.core.ports import LeaderPort, ShardedLeaderPort

logger = logging.getLogger("tailguard.controller")


class Leadership:
    """The leader elector (or none) as the controller's evaluations and readiness see it."""

    def __init__(self, leader: LeaderPort | None) -> None:
        self._leader = leader
        self._lock = threading.Lock()
        self.skipped_not_leader: dict[str, int] = {}
        self._resume_pending = False

    @property
    def elected(self) -> bool:
        """Whether there is an elector at all (without one, this replica is the only one)."""
        return self._leader is not None

    def shard_leadership(self) -> Callable[[], Mapping[int, bool]] | None:
        """Each shard's leadership for tailguard_shard_leader (None: not sharded)."""
        return self._leader.shard_leadership if isinstance(self._leader, ShardedLeaderPort) else None

    def leads_any(self) -> bool:
        return self._leader is None or self._leader.is_leader()

    def following(self) -> bool:
        """Another replica holds the (only) Lease: this one skips every evaluation on purpose."""
        return self._leader is not None and not self._leader.is_leader()

    def leads(self, policy_name: str) -> bool:
        """Whether this replica evaluates and acts on `policy_name` now: it holds the Lease (with sharding, the
        Lease of the policy's shard: controller/adapters/lease/shards.py)."""
        if self._leader is None:
            return True
        if isinstance(self._leader, ShardedLeaderPort):
            return self._leader.leads(policy_name)
        return self._leader.is_leader()

    def skipped(self, policy_name: str) -> None:
        """An evaluation skipped as a follower: counted, and leading again resumes what is left."""
        with self._lock:
            self.skipped_not_leader[policy_name] = self.skipped_not_leader.get(policy_name, 0) + 1
            self._resume_pending = True

    def resume_later(self) -> None:
        """The unfinished actions are resumed by the first evaluation as leader."""
        with self._lock:
            self._resume_pending = True

    def take_resume(self) -> bool:
        """Whether a resume is due now (once)."""
        with self._lock:
            resume, self._resume_pending = self._resume_pending, False
            return resume

    def publish_before_acting(self, policy_name: str, decisions: Sequence[Decision]) -> bool:
        """With a leader elector and a mutating action to run: renew the Lease with the new action times first,
        so a successor that takes over right after still counts this action. Returns whether to dispatch:
        not when the renewal showed another replica holds the Lease (the actions stay planned in the journal
        and are resumed when this replica leads again); a failed renewal otherwise only warns, as the lease
        deadline still covers acting."""
        if self._leader is None or not any(a.mutating for d in decisions for a in d.actions):
            return True
        leader = self._leader
        if leader.publish_for(policy_name) if isinstance(leader, ShardedLeaderPort) else leader.publish():
            return True
        if self.leads(policy_name):
            logger.warning("%s: could not publish the action times to the Lease before acting", policy_name)
            return True
        logger.warning("%s: lost the Lease before acting; the decided actions stay planned in the journal",
                       policy_name)  # fmt: skip
        self.resume_later()
        return False
