"""The rollback port: Argo CD, a Deployment's own history, the local tier (controller/adapters/rollback/, tier/)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from controller.core.ports.outcomes import AbortSignal, ActionOutcome


class RollbackPort(Protocol):
    """Rolls a service back to its last good revision (Argo CD; the local tier)."""

    def plan_rollback(self, service: str, *, rollout_revision: str | None = None) -> Mapping[str, Any] | ActionOutcome:
        """The rollback to make, as JSON the dispatcher journals before acting: at least `service`,
        `from_revision` (what runs now) and `to_revision` (the revision before `rollout_revision`, the one the
        breach is attributed to, None: the current one; never one recorded as bad). An outcome (SKIPPED: nothing
        to roll back to; FAILED, maybe transient: unreadable) when there is none."""
        ...

    def rollback(
        self,
        service: str,
        *,
        idempotency_key: str,
        rollout_revision: str | None = None,
        plan: Mapping[str, Any] | None = None,
        abort: AbortSignal | None = None,
    ) -> ActionOutcome:
        """Make the rollback `plan` describes (None: plan it now). Idempotent against the world: SUCCEEDED without
        acting when the service already runs `to_revision`; WORLD_CHANGED, writing nothing, when it runs neither
        `from_revision` nor `to_revision` (changed by someone else since the plan); never a new target. One that
        waits for the rollback to finish stops waiting on `abort` (ABORTED, saying what was sent)."""
        ...
