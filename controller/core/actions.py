"""Actions: what a policy asks for (its action models), what the engine renders (`ActionRequest`), and what the
journal records about each one (`ActionRecord`, `ActionStatus`).

The action models are the policy YAML's (controller/core/policy.py puts them in conditions, branches and
recoveries). The engine renders their templates with a target's labels and the observed value, and the rendered
model travels, typed, in an `ActionRequest` from the engine through the journal to the dispatcher, which hands
its fields to the port of that action type. `params` is its JSON form, the only form that leaves the process
(the journal's `actions.params`, the decision JSON of the API and the webhooks).

The bottom of the core: it imports nothing of the controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ActionType(StrEnum):
    ROLLBACK = "rollback"
    SCALE = "scale"
    SHIFT_TRAFFIC = "shift_traffic"
    RESTORE = "restore"  # recovery only: undo exactly what the incident's own actions changed
    ANNOTATE = "annotate"
    NOTIFY = "notify"


# Actions that change the serving tier; these are what cooldown and budget limit.
MUTATING_ACTIONS = frozenset({ActionType.ROLLBACK, ActionType.SCALE, ActionType.SHIFT_TRAFFIC, ActionType.RESTORE})
# What a `restore` undoes: the actions that journal the state they replace (their plan's `before`).
RESTORABLE_ACTIONS = frozenset({ActionType.SCALE, ActionType.SHIFT_TRAFFIC})


# ----- the policy's action models ------------------------------------------------------------------------


class _ActionBase(BaseModel):
    # The configuration of the policy's StrictModel: unknown fields are errors, never ignored.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class RollbackAction(_ActionBase):
    type: Literal["rollback"]
    service: str = Field(default="{{ service }}", description="service to roll back to its last good revision")


class ScaleAction(_ActionBase):
    # Additive fields left out of the rendered params when not given, so a scale without them journals the
    # same params as before they existed.
    OMITTED_WHEN_NONE: ClassVar[frozenset[str]] = frozenset({"ceiling", "metricTargets"})

    type: Literal["scale"]
    service: str = Field(default="{{ service }}")
    replicas: int | None = Field(default=None, ge=0, description="absolute replica count")
    delta: int | None = Field(default=None, description="add (or remove) this many replicas")
    targetPerReplica: float | None = Field(
        default=None, gt=0, description="proportional: replicas = ceil(current * observed / targetPerReplica)"
    )
    min: int = Field(default=1, ge=0)
    max: int = Field(ge=1)
    ceiling: int | None = Field(
        default=None,
        ge=1,
        description="an HPA's maxReplicas: set to this (never below its minReplicas, never above the controller's "
        "kubernetes.hpa.maxReplicas); restored by the recovery's `restore`",
    )
    metricTargets: dict[str, float] | None = Field(
        default=None,
        min_length=1,
        description="an HPA's Pods/External metric -> its AverageValue target (e.g. vllm_num_requests_waiting: 10), "
        "within the controller's kubernetes.hpa.metricTargets bounds; restored by the recovery's `restore`",
    )

    @model_validator(mode="after")
    def _one_mode(self) -> ScaleAction:
        modes = [m for m in (self.replicas, self.delta, self.targetPerReplica) if m is not None]
        hpa_only = self.ceiling is not None or self.metricTargets is not None
        if len(modes) > 1 or (not modes and not hpa_only):
            # Without a mode, `ceiling` or `metricTargets` alone is a scale of the HPA's limits only.
            raise ValueError("scale needs exactly one of replicas, delta or targetPerReplica")
        if self.metricTargets is not None and any(not value > 0 for value in self.metricTargets.values()):
            raise ValueError("metricTargets values are AverageValue targets: expected > 0")
        if self.min > self.max:
            raise ValueError(f"scale min ({self.min}) is above max ({self.max})")
        return self


class ShiftTrafficAction(_ActionBase):
    type: Literal["shift_traffic"]
    service: str = Field(default="{{ service }}")
    version: str = Field(default="{{ version }}", description="the version whose weight is set")
    weight: int = Field(ge=0, le=100, description="percent of the service's traffic")


class RestoreAction(_ActionBase):
    """Recovery only: put back, per resource of `service` the incident changed (its route weights, its scale),
    exactly the state journaled before the incident's first change; never more (see rules/README.md)."""

    type: Literal["restore"]
    service: str = Field(default="{{ service }}", description="the service whose pre-incident state is restored")


class AnnotateAction(_ActionBase):
    type: Literal["annotate"]
    text: str = Field(min_length=1)
    tags: list[str] = Field(default_factory=list)


class NotifyAction(_ActionBase):
    type: Literal["notify"]
    receiver: str = Field(min_length=1, description="a receiver named in the controller configuration")
    message: str = Field(default="{{ policy }}/{{ condition }} on {{ target }}: {{ value }}")


Action = Annotated[
    RollbackAction | ScaleAction | ShiftTrafficAction | RestoreAction | AnnotateAction | NotifyAction,
    Field(discriminator="type"),
]


# ----- rendered actions ------------------------------------------------------------------------------------


class RenderedRollback(RollbackAction):
    """A rollback with what the engine adds: the revision the breach is attributed to (when attributed)."""

    rollout_revision: str | None = None


class RenderedScale(ScaleAction):
    """A scale with what the engine adds: the decision's value (proportional scaling divides it)."""

    observed: float | None = None


RenderedAction = RenderedRollback | RenderedScale | ShiftTrafficAction | RestoreAction | AnnotateAction | NotifyAction

_RENDERED: dict[ActionType, type[RenderedAction]] = {
    ActionType.ROLLBACK: RenderedRollback,
    ActionType.SCALE: RenderedScale,
    ActionType.SHIFT_TRAFFIC: ShiftTrafficAction,
    ActionType.RESTORE: RestoreAction,
    ActionType.ANNOTATE: AnnotateAction,
    ActionType.NOTIFY: NotifyAction,
}


@dataclass(frozen=True)
class ActionRequest:
    """A rendered action: templates already substituted with the target's labels and the observed value.

    `action` holds exactly the fields that were given (a rendered policy action has them all; a journaled one
    has those its JSON carried), so `params` gives back the JSON it was made from, key for key.
    """

    action: RenderedAction
    idempotency_key: str

    @staticmethod
    def of(action_type: ActionType, params: Mapping[str, Any], idempotency_key: str) -> ActionRequest:
        """From the JSON form (`params`, without `type`): what the engine renders and the journal keeps.

        Not validated again: the policy's models validated the action before its templates were rendered, and a
        journaled action is one the engine rendered. A field that is absent stays absent (reading it raises
        AttributeError, which the dispatcher reports as a missing parameter).
        """
        model = _RENDERED[ActionType(action_type)]
        fields: dict[str, Any] = {name: value for name, value in params.items() if name in model.model_fields}
        fields["type"] = ActionType(action_type).value
        return ActionRequest(model.model_construct(**fields), idempotency_key)

    @property
    def type(self) -> ActionType:
        return ActionType(self.action.type)

    @property
    def params(self) -> dict[str, Any]:
        """The JSON form: the fields that were given, in the model's order, `type` left out."""
        given = self.action.model_fields_set
        return {
            name: getattr(self.action, name)
            for name in type(self.action).model_fields
            if name != "type" and name in given
        }

    @property
    def mutating(self) -> bool:
        return self.type in MUTATING_ACTIONS

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type.value, "params": self.params, "idempotency_key": self.idempotency_key}


# ----- what the journal records ----------------------------------------------------------------------------


class ActionStatus(StrEnum):
    PLANNED = "planned"  # journaled with its decision, not yet attempted
    STARTED = "started"  # an attempt began: the actuator may or may not have acted
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"  # nothing to do (e.g. already at the desired replica count)
    DEFERRED = "deferred"  # the global cooldown or budget refused it for now: retried while its condition holds
    SUPPRESSED = "suppressed"  # never run: e.g. its condition resolved while it was deferred (the error says why)
    DRY_RUN = "dry_run"  # the policy is in dry-run: recorded, never executed
    # An operator aborted its decision (`tailguard abort`): never ran, or stopped at a step; the result says what
    # state it left behind. Never retried.
    ABORTED = "aborted"
    # Its precondition (the world its decision saw: controller/loop/preconditions.py) no longer held right before
    # the write: nothing written, never retried blindly.
    WORLD_CHANGED = "world-changed"
    # Past its deadline (the policy's `actionDeadline`) before it could run: never run, at resume or ever.
    EXPIRED = "expired"
    # Its condition no longer holds (the journal's latest engine state): never run.
    NO_LONGER_NEEDED = "no-longer-needed"


TERMINAL_STATUSES = frozenset(
    {
        ActionStatus.WORLD_CHANGED,
        ActionStatus.EXPIRED,
        ActionStatus.NO_LONGER_NEEDED,
        ActionStatus.SUCCEEDED,
        ActionStatus.FAILED,
        ActionStatus.SKIPPED,
        ActionStatus.SUPPRESSED,
        ActionStatus.DRY_RUN,
        ActionStatus.ABORTED,
    }
)
# What resume() finishes at start-up. A deferred action is not among them: it runs only after an evaluation of its
# policy finds its condition still holding (Dispatcher.retry_deferred).
PENDING_STATUSES = frozenset({ActionStatus.PLANNED, ActionStatus.STARTED})


@dataclass(frozen=True)
class ActionRecord:
    idempotency_key: str
    decision_id: str
    decision_kind: str
    policy: str
    # What the global limiter counts against: the service the action changes.
    resource: str
    type: ActionType
    params: Mapping[str, Any]
    dry_run: bool
    status: ActionStatus
    attempts: int
    result: Mapping[str, Any] | None
    error: str | None
    # Facts fixed before the first attempt (e.g. a scale's from/to), reused on resume.
    plan: Mapping[str, Any] | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    updated_at: float

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def mutating(self) -> bool:
        return self.type in MUTATING_ACTIONS

    def request(self) -> ActionRequest:
        return ActionRequest.of(self.type, self.params, self.idempotency_key)

    def to_json(self) -> dict[str, Any]:
        return {
            "idempotency_key": self.idempotency_key,
            "decision_id": self.decision_id,
            "decision_kind": self.decision_kind,
            "policy": self.policy,
            "resource": self.resource,
            "type": self.type.value,
            "params": dict(self.params),
            "dry_run": self.dry_run,
            "status": self.status.value,
            "attempts": self.attempts,
            "result": dict(self.result) if self.result is not None else None,
            "error": self.error,
            "plan": dict(self.plan) if self.plan is not None else None,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "updated_at": self.updated_at,
        }
