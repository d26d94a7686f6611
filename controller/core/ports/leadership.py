"""The leadership ports: the Lease (one leader, or one per shard), what it hands over to the next leader, and which
peers a standby may forward to (controller/adapters/lease/)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from tailguard.controller.core.controls import Controls
from tailguard.controller.core.handover import ActionTimes


class HandoverPort(Protocol):
    """What the leader elector needs of the controller (controller/loop/runtime.py implements it)."""

    def handover_snapshot(self) -> ActionTimes: ...

    def inherit_handover(self, times: ActionTimes) -> None: ...


class PendingHandoverPort(Protocol):
    """What the leader elector hands over besides the action times: the leader's unfinished mutating actions (with
    their plans and deadlines), published in the Lease (`tailguard.io/pending-actions`) and adopted by whoever
    acquires it (controller/loop/adoption.py): a successor continues them instead of counting them as done."""

    def pending_snapshot(self) -> list[dict[str, Any]]: ...

    def adopt_pending(self, entries: Sequence[Mapping[str, Any]]) -> int: ...


@runtime_checkable
class ControlsHandoverPort(Protocol):
    """Optional next to HandoverPort: the operator controls (pauses, the kill switch) the Lease carries from one
    leader to the next (annotation `tailguard.io/controls`, controller/core/controls.py)."""

    def controls_snapshot(self) -> Controls: ...

    def inherit_controls(self, controls: Controls) -> None: ...


class LeaderPort(Protocol):
    """What the controller needs of tailguard.controller.adapters.lease.leader.LeaderElector: only the leader evaluates
    and acts, and the Lease carries its mutating-action times to the next leader (controller/core/handover.py)."""

    def is_leader(self) -> bool: ...

    def attach_handover(self, handover: HandoverPort) -> None: ...

    def publish(self) -> bool: ...


@runtime_checkable
class PeerCheckPort(Protocol):
    """Whether `url` may receive what a standby forwards to the Lease holder `identity`: its host must be the IP of
    the pod of that name, a pod of this controller's own Deployment, and its port the API's
    (controller/adapters/lease/peers.py). None: yes; else why not (a sentence for the log and the 503)."""

    def check(self, identity: str, url: str) -> str | None: ...


@runtime_checkable
class ShardedLeaderPort(LeaderPort, Protocol):
    """A LeaderPort whose leadership is per policy: the policies are split into shards, each owned through its
    own Lease (controller/adapters/lease/shards.py, controller/core/sharding.py). `is_leader()` is whether this
    replica holds any shard; a policy is evaluated and acted on only while `leads(policy)`, and `publish_for`
    renews only that policy's shard Lease (never taking a shard this replica does not hold)."""

    def leads(self, policy: str) -> bool: ...

    def publish_for(self, policy: str) -> bool: ...

    def shard_leadership(self) -> dict[int, bool]:
        """Each shard's index -> whether this replica holds its Lease now (tailguard_shard_leader)."""
        ...


# ----- what the HTTP API needs of the controller -----------------------------------------------------------
