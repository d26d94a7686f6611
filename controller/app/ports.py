"""The API's own seams: what the HTTP API needs of the controller and of the Lease (the external ports are in
controller/core/ports/; the loop's seams in controller/loop/ports.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from tailguard.controller.core.controls import AbortResult
from tailguard.controller.core.model import TargetKey
from tailguard.controller.core.policy import Policy
from tailguard.controller.loop.ports import TRIGGER_ALERT, Readiness


@runtime_checkable
class LeaderDirectoryPort(Protocol):
    """Optional next to LeaderPort: who this replica is and where the leader's API answers, so a standby can give
    the leader's answer to a read, a control or an alert (controller/app/forwarding.py). The elector implements it
    from the Lease annotation `tailguard.io/api-url`."""

    identity: str

    def leader_endpoint(self) -> tuple[str, str] | None:
        """(the Lease holder's identity, the API URL it published), read together; None when another replica
        does not hold an unexpired Lease or published no URL."""
        ...


class MetricsExposition(Protocol):
    def exposition(self) -> bytes: ...


class ControllerPort(Protocol):
    """What the API needs of tailguard.controller.loop.runtime.Controller."""

    @property
    def metrics(self) -> MetricsExposition: ...

    def policies(self) -> dict[str, Policy]: ...

    def readiness(self) -> Readiness: ...

    def trigger(
        self,
        policy_names: Sequence[str],
        trigger: str = TRIGGER_ALERT,
        *,
        targets: Mapping[str, Collection[TargetKey]] | None = None,
    ) -> list[str]:
        """Queue evaluations of `policy_names`; `targets`: per policy, the only targets it may touch (an alert's)."""
        ...

    def recent_decisions(self, limit: int = 100, before: int | None = None) -> list[dict[str, Any]]: ...


@runtime_checkable
class OperatorPort(Protocol):
    """What the operator endpoints (status, pause/resume, the kill switch) need of the controller."""

    def status(self, decisions: int = 20) -> dict[str, Any]: ...

    def set_paused(self, policy: str | None, paused: bool, *, by: str, reason: str) -> Any: ...


@runtime_checkable
class AbortControlPort(Protocol):
    """What `POST /api/v1/decisions/ID/abort` needs of the controller: the abort, journaled as a control."""

    def abort_decision(self, decision_id: str, *, by: str, reason: str) -> AbortResult: ...
