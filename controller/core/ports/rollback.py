"""The rollback port: Argo CD, a Deployment's own history, the local tier (controller/adapters/rollback/, tier/).

Every implementation takes one request, `RollbackRequest` (the rendered action's service and attributed revision,
its idempotency key, and its journaled, typed plan), and plans with `plan_rollback`, whose `RollbackPlan` the
dispatcher journals before acting. The plan's JSON is the journal's `plan` column: `RollbackPlan.to_json()` writes
exactly the keys an adapter set (the shape rows have had since issue 16), `from_json` reads them back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from tailguard.controller.core.actions import RenderedRollback
from tailguard.controller.core.ports.outcomes import AbortSignal, ActionOutcome

# A revision: the local tier's and a Deployment's are numbers, Argo CD's are git revisions (strings).
Revision = int | str
HelmValue = str | int | bool | None


class RollbackPlan(BaseModel):
    """The rollback to make, fixed before the first start and journaled: at least `service`, `from_revision` (what
    runs now: the precondition) and `to_revision`; each adapter adds what it checks on a resume."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    service: str
    from_revision: Revision | None = None
    to_revision: Revision | None = None
    # the revision the breach is blamed on (the attributed rollout, else the one running at the plan)
    bad_revision: Revision | None = None
    # when what runs now was deployed: a rollout after the decision is not the world it saw
    from_deployed_at: float | None = None
    # Argo CD: the application and the history entry rolled back to
    application: str | None = None
    history_id: int | None = None
    # a Deployment: where, and the pod-template hashes of the revisions (Helm: what its history will say)
    deployment: str | None = None
    from_hash: str | None = None
    bad_hash: str | None = None
    to_hash: str | None = None
    helm: dict[str, HelmValue] | None = None
    # the dispatcher's: when it was planned, and until when it may start (controller/loop/preconditions.py)
    decided_at: float | None = None
    deadline: float | None = None

    def to_json(self) -> dict[str, object]:
        """The journal's JSON: exactly the keys that were set (a row read back writes the same keys)."""
        return self.model_dump(mode="json", exclude_unset=True)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> RollbackPlan:
        """A journaled plan (rows written since issue 16 included); pydantic's ValidationError when it is not one."""
        return cls.model_validate(dict(data))


@dataclass(frozen=True)
class RollbackRequest:
    """One rollback, as every RollbackPort takes it: the service, the revision the breach is attributed to (None:
    the running one), the action's idempotency key and its journaled plan (None: plan it now)."""

    service: str
    idempotency_key: str
    rollout_revision: str | None = None
    plan: RollbackPlan | None = None

    @classmethod
    def of(cls, action: RenderedRollback, idempotency_key: str, plan: RollbackPlan | None) -> RollbackRequest:
        return cls(action.service, idempotency_key, action.rollout_revision, plan)


class RollbackPort(Protocol):
    """Rolls a service back to its last good revision (Argo CD; a Deployment; the local tier)."""

    def plan_rollback(self, service: str, *, rollout_revision: str | None = None) -> RollbackPlan | ActionOutcome:
        """The rollback to make, which the dispatcher journals before acting: at least `service`, `from_revision`
        (what runs now) and `to_revision` (the revision before `rollout_revision`, the one the breach is attributed
        to, None: the current one; never one recorded as bad). An outcome (SKIPPED: nothing to roll back to;
        FAILED, maybe transient: unreadable) when there is none."""
        ...

    def rollback(self, request: RollbackRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        """Make the rollback `request.plan` describes (None: plan it now). Idempotent against the world: SUCCEEDED
        without acting when the service already runs `to_revision`; WORLD_CHANGED, writing nothing, when it runs
        neither `from_revision` nor `to_revision` (changed by someone else since the plan); never a new target. One
        that waits for the rollback to finish stops waiting on `abort` (ABORTED, saying what was sent)."""
        ...
