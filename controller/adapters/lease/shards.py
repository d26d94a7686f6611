"""Sharded leader election: the policies split into N shards, each owned through its own Lease.

Shard i is the Lease `<leaseName>-shard-<i>`; each is run by a LeaderElector (leader.py) exactly as the single
Lease is: acquired only when free or expired (client-go's rule, judged on the local clock), renewed with a PUT on
the resourceVersion just read (two replicas racing get one 200 and one 409), led only until `renew_deadline`
after the last renewal, and carrying the mutating-action times (`tailguard.io/action-times`) and the operator
controls (`tailguard.io/controls`) to its next holder. A policy belongs to shard `shard_of(name, N)`
(controller/core/sharding.py); this replica evaluates and acts on it only while it leads that shard's Lease,
so the no-duplicate guarantee of one leader holds per policy.

Balance: each replica also holds one member slot, the Lease `<leaseName>-member-<j>` (j < N; a replica finding
no free slot is a standby: it holds no shard and takes a slot when one expires). The live replicas are the
distinct holders of unexpired member slots; each holds at most ceil(N / live) shards, preferring the ones ranked
highest for its identity. A replica that joins takes a slot; the others' fair share shrinks, so they release
their least preferred excess shards (release hands the annotations over at once) and the newcomer takes them.
A replica that dies stops renewing: its slot and shards expire after one lease duration (as seen by the
others), their fair share grows, and they take the shards over in the same round.

Each round (every retryPeriod) reads every member and shard Lease (2N GETs) and renews what it holds. The
controls of Leases held by others are merged too, so a pause or the kill switch set on any replica reaches the
others within one round. Ownership changes are reported through `on_change` (the app journals them).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kubernetes import client as k8s

from tailguard.controller.adapters.kube.calls import KubeError
from tailguard.controller.adapters.lease.leader import LeaderElector, RoundLoop, _view
from tailguard.controller.adapters.lease.settings import LeaderElectionSettings
from tailguard.controller.core.controls import CONTROLS_ANNOTATION, Controls, ControlsError
from tailguard.controller.core.handover import ActionTimes
from tailguard.controller.core.ports import Clock, ControlsHandoverPort, HandoverPort
from tailguard.controller.core.sharding import LeaseSeen, live_members, plan_round, preference, shard_of

log = logging.getLogger(__name__)

# (event, shard index, reason): "acquired" / "released" / "lost"
ShardChange = Callable[[str, int, str], None]


class ObservingElector(LeaderElector):
    """A LeaderElector that can also just look at its Lease: the holder, and whether it expired (the same
    observation the elector's own acquire uses, so a shard is taken the moment it may be)."""

    def observe(self) -> LeaseSeen | None:
        """The Lease as seen now (a missing Lease is free); None when it could not be read. Merges the controls it
        carries when a controls handover is attached."""
        found = self._call(
            lambda: self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self.timeout),
            "reading",
        )
        if isinstance(found, KubeError):
            return LeaseSeen("", False) if found.status == 404 else None
        view = _view(found)
        self._merge_controls(found)
        if not view.holder or view.holder == self.identity:
            return LeaseSeen(view.holder, False)
        return LeaseSeen(view.holder, self._expired(view, self.clock.now()))

    def renew(self) -> bool:
        """Renew (writing the current action times) only if we lead: never takes the Lease, even a free one. The
        check and the write are one round, so a release by the sharding round cannot slip in between."""
        with self._round:
            return self.is_leader() and self._round_unlocked()

    def _merge_controls(self, lease: k8s.V1Lease) -> None:
        text = ((lease.metadata.annotations if lease.metadata else None) or {}).get(CONTROLS_ANNOTATION)
        if not text or not isinstance(self._handover, ControlsHandoverPort):
            return
        try:
            self._handover.inherit_controls(Controls.decode(text))
        except ControlsError as unreadable:
            log.warning("lease %s/%s: annotation %s is unreadable (%s)", self.namespace, self.name,
                        CONTROLS_ANNOTATION, unreadable)  # fmt: skip


class _ShardTimes:
    """The controller's handover seen through one shard: only that shard's policies' action times go into (and
    come out of) its Lease, so each annotation stays the size of its shard (index -1: none, a member slot)."""

    def __init__(self, inner: HandoverPort, index: int, shards: int) -> None:
        self._inner = inner
        self._index = index
        self._shards = shards

    def _ours(self, times: ActionTimes) -> ActionTimes:
        return {policy: kept for policy, kept in times.items() if shard_of(policy, self._shards) == self._index}

    def handover_snapshot(self) -> ActionTimes:
        return self._ours(self._inner.handover_snapshot())

    def inherit_handover(self, times: ActionTimes) -> None:
        self._inner.inherit_handover(self._ours(times))


class _ShardHandover(_ShardTimes):
    """_ShardTimes plus the operator controls, whole on every Lease (a kill switch covers all policies)."""

    def __init__(self, inner: HandoverPort, controls: ControlsHandoverPort, index: int, shards: int) -> None:
        super().__init__(inner, index, shards)
        self._controls = controls

    def controls_snapshot(self) -> Controls:
        return self._controls.controls_snapshot()

    def inherit_controls(self, controls: Controls) -> None:
        self._controls.inherit_controls(controls)


class ShardedElector:
    """N shard Leases and N member slots (see the module docstring); the controller's ShardedLeaderPort."""

    def __init__(
        self,
        api: k8s.CoordinationV1Api,
        base_name: str,
        namespace: str,
        identity: str,
        shards: int,
        lease_seconds: float,
        clock: Clock,
        *,
        renew_deadline: float | None = None,
        timeout: float = 5.0,
        on_change: ShardChange | None = None,
    ) -> None:
        if shards < 1:
            raise ValueError(f"shards must be at least 1, got {shards}")
        self.identity = identity
        self.shards = shards
        self.clock = clock
        self.lease_seconds = float(lease_seconds)

        def elector(name: str) -> ObservingElector:
            return ObservingElector(
                api, name, namespace, identity, lease_seconds, clock, renew_deadline=renew_deadline, timeout=timeout
            )

        self.members = [elector(member_lease_name(base_name, j)) for j in range(shards)]
        self.electors = [elector(shard_lease_name(base_name, i)) for i in range(shards)]
        self._on_change = on_change
        self._round = threading.Lock()
        self._held: set[int] = set()  # shards led at the end of the last round (for change reports)
        self.live_replicas = 0  # as counted in the last round
        self._rounds = RoundLoop(self.run_once, "tailguard-shards", join_timeout=30)

    @classmethod
    def from_settings(
        cls,
        settings: LeaderElectionSettings,
        api: k8s.CoordinationV1Api,
        clock: Clock,
        *,
        on_change: ShardChange | None = None,
    ) -> ShardedElector:
        return cls(
            api,
            settings.leaseName,
            settings.namespace,
            settings.resolved_identity(),
            settings.shards,
            settings.leaseDuration,
            clock,
            renew_deadline=settings.renewDeadline,
            on_change=on_change,
        )

    # -- the controller's view (ShardedLeaderPort) -----------------------------------------------------------

    def is_leader(self) -> bool:
        """Whether this replica leads any shard (it evaluates some policies; answers alerts)."""
        return any(elector.is_leader() for elector in self.electors)

    def leads(self, policy: str) -> bool:
        return self.electors[shard_of(policy, self.shards)].is_leader()

    def leads_shard(self, index: int) -> bool:
        return self.electors[index].is_leader()

    def held_shards(self) -> list[int]:
        return [index for index, elector in enumerate(self.electors) if elector.is_leader()]

    def shard_leadership(self) -> dict[int, bool]:
        return {index: elector.is_leader() for index, elector in enumerate(self.electors)}

    def attach_handover(self, handover: HandoverPort) -> None:
        # Member slots carry no action times; with controls, they carry and merge those like the shards.
        for index, elector in [*enumerate(self.electors), *((-1, member) for member in self.members)]:
            if isinstance(handover, ControlsHandoverPort):
                elector.attach_handover(_ShardHandover(handover, handover, index, self.shards))
            elif index >= 0:
                elector.attach_handover(_ShardTimes(handover, index, self.shards))

    def publish_for(self, policy: str) -> bool:
        """Renew the policy's shard Lease now (with the current action times); never takes a shard not held."""
        return self.electors[shard_of(policy, self.shards)].renew()

    def publish(self) -> bool:
        """Renew every held shard now; whether any is still led."""
        for elector in self.electors:
            elector.renew()
        return self.is_leader()

    # -- one round --------------------------------------------------------------------------------------------

    def run_once(self) -> bool:
        """Renew the member slot and the shards held, release the excess, take free or expired shards up to the
        fair share. Errors are logged by the electors, never raised. Returns whether any shard is led."""
        with self._round:
            self._round_unlocked()
        return self.is_leader()

    def _round_unlocked(self) -> None:
        member = self._member_round()
        held: set[int] = set()
        for index, elector in enumerate(self.electors):
            if elector.renew():
                held.add(index)
        seen = {
            index: found
            for index, elector in enumerate(self.electors)
            if index not in held and (found := elector.observe()) is not None
        }
        # The member slots are read after the shards: a replica renews its slot before its shards, so when one of
        # its shards is seen expired, its slot is too, and the fair share that lets us take the shard is current.
        seen_members = [found for m in self.members if not m.is_leader() and (found := m.observe()) is not None]
        self.live_replicas = live_members(seen_members, self.identity, mine=member)
        plan = plan_round(self.identity, held, seen, self.shards, self.live_replicas, member=member)
        for index in plan.release:
            self.electors[index].release()
            held.discard(index)
            log.info("shard %d released by %s (fair share %d of %d shards over %d replicas)",
                     index, self.identity, len(plan.keep), self.shards, self.live_replicas)  # fmt: skip
        room = plan.room
        for index in plan.take:
            if room <= 0:
                break
            if self.electors[index].run_once():
                held.add(index)
                room -= 1
        self._report(held)

    def _member_round(self) -> bool:
        """Renew our member slot, or take a free or expired one (at most one). Whether we hold one now."""
        for member in self.members:
            if member.is_leader() and member.renew():
                return True
        for j in preference(self.identity, len(self.members)):
            seen = self.members[j].observe()
            if seen is not None and seen.available_to(self.identity) and self.members[j].run_once():
                log.info("%s is a sharding member (slot %d of %d)", self.identity, j, len(self.members))
                return True
        return False

    def _report(self, held: set[int]) -> None:
        previous, self._held = self._held, held
        if self._on_change is None:
            return
        for index in sorted(held - previous):
            self._on_change("acquired", index, f"{self.live_replicas} live replica(s)")
        for index in sorted(previous - held):
            self._on_change("released", index, f"{self.live_replicas} live replica(s)")

    # -- background loop ----------------------------------------------------------------------------------------

    def start(self, interval: float | None = None) -> None:
        self._rounds.start(interval if interval is not None else self.lease_seconds / 3)

    @property
    def running(self) -> bool:
        return self._rounds.running

    def stop(self) -> None:
        self._rounds.stop()
        self.release()

    def release(self) -> None:
        """Give up every shard and the member slot, so the others take over at once."""
        with self._round:
            for elector in self.electors:
                elector.release()
            for member in self.members:
                member.release()
            if self._held:
                log.info("%s released shards %s", self.identity, sorted(self._held))
            self._held = set()  # not reported: the journal closes before the elector stops


def shard_lease_name(base: str, index: int) -> str:
    return f"{base}-shard-{index}"


def member_lease_name(base: str, index: int) -> str:
    return f"{base}-member-{index}"
