"""The call of each action type's port (execution in the dispatcher: controller/loop/dispatcher.py).

Each action type has its port (a table: rollback -> RollbackPort, scale -> ScalePort, ...), and the typed action the
engine rendered (an `ActionRequest`) with its journaled plan gives the port its arguments; a port nobody configured
is a "not configured" implementation (controller/core/unconfigured.py) that answers a permanent failure. One call is
one attempt: the dispatcher alone retries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tailguard.controller.core.actions import (
    ActionRecord,
    ActionRequest,
    ActionType,
    AnnotateAction,
    NotifyAction,
    RenderedRollback,
    RenderedScale,
    ShiftTrafficAction,
)
from tailguard.controller.core.ports import (
    ActionJournalPort,
    ActionOutcome,
    Annotation,
    Annotator,
    Clock,
    Notifier,
    NotifyPayload,
    NotifyRequest,
    OutcomeStatus,
    RollbackPlan,
    RollbackPort,
    RollbackRequest,
    ScaleLimits,
    ScaleLimitsPort,
    ScalePort,
    ScaleRequest,
    TrafficRequest,
    TrafficRouter,
)
from tailguard.controller.core.unconfigured import (
    UnconfiguredAnnotator,
    UnconfiguredNotifier,
    UnconfiguredRollback,
    UnconfiguredRouter,
    UnconfiguredScale,
    UnconfiguredScaleLimits,
)
from tailguard.controller.loop import restore
from tailguard.controller.loop.aborts import ActionAbort


@dataclass(frozen=True)
class Actuators:
    """One port per action type; a port left out is its "not configured" implementation."""

    rollback: RollbackPort = field(default_factory=UnconfiguredRollback)
    scale: ScalePort = field(default_factory=UnconfiguredScale)
    router: TrafficRouter = field(default_factory=UnconfiguredRouter)
    annotator: Annotator = field(default_factory=UnconfiguredAnnotator)
    notifier: Notifier = field(default_factory=UnconfiguredNotifier)
    # A scale's `ceiling` and `metricTargets` (an HPA's maxReplicas and metric targets): the HPA scaler, or None.
    limits: ScaleLimitsPort | None = None


class ActionCalls:
    """One attempt of an action: its port's call, with the typed action's fields and the journaled plan."""

    def __init__(
        self,
        journal: ActionJournalPort,
        actuators: Actuators,
        clock: Clock,
        links_for: Callable[[Mapping[str, Any]], Mapping[str, str]] | None = None,
    ) -> None:
        self.journal = journal
        self._actuators = actuators
        self.clock = clock
        self.links_for = links_for
        # action type -> the call of its port
        self._ports: dict[ActionType, Callable[[ActionRecord, ActionRequest, ActionAbort], ActionOutcome]] = {
            ActionType.ROLLBACK: self._rollback,
            ActionType.SCALE: self._scale,
            ActionType.SHIFT_TRAFFIC: self._shift_traffic,
            ActionType.RESTORE: self._restore,
            ActionType.ANNOTATE: self._annotate,
            ActionType.NOTIFY: self._notify,
        }

    def call(self, record: ActionRecord, signal: ActionAbort) -> ActionOutcome:
        """One attempt: the port of the action's type, with the typed action's fields as its arguments (and the
        action's abort signal, which the ports that work in steps ask between steps)."""
        try:
            return self._ports[record.type](record, record.request(), signal)
        except AttributeError as exc:
            if exc.name is None:
                raise
            return ActionOutcome(
                OutcomeStatus.FAILED, {}, f"{record.type.value} action lacks parameter {exc.name!r}", False
            )
        except Exception as exc:  # noqa: BLE001
            # Ports return outcomes for expected failures; anything raised is a bug or an outage.
            transient = bool(getattr(exc, "transient", isinstance(exc, (ConnectionError, TimeoutError))))
            return ActionOutcome(OutcomeStatus.FAILED, {}, f"{type(exc).__name__}: {exc}", transient)

    def _rollback(self, record: ActionRecord, request: ActionRequest, abort: ActionAbort) -> ActionOutcome:
        action = request.action
        assert isinstance(action, RenderedRollback)
        # The plan journaled before the first start (from- and to-revision): a resume acts on the same one.
        plan = RollbackPlan.from_json(record.plan) if record.plan is not None else None
        return self._actuators.rollback.rollback(RollbackRequest.of(action, request.idempotency_key, plan), abort)

    def _scale(self, record: ActionRecord, request: ActionRequest, abort: ActionAbort) -> ActionOutcome:
        assert isinstance(request.action, RenderedScale) and record.plan is not None
        # The count planned (and journaled) before the first start, so a resume asks for the same one.
        service, plan, key = str(record.plan["service"]), record.plan, request.idempotency_key
        floor = None
        if plan.get("desired") is not None:
            floor = self._actuators.scale.set_replicas(ScaleRequest(service, int(plan["desired"]), key))
            if not plan.get("limits") or floor.status is OutcomeStatus.FAILED:
                return floor
        limits = ScaleLimits.from_json(plan["limits"])
        port = self._actuators.limits
        if port is None:
            if floor is not None:
                # Nothing takes a ceiling or metric targets here (the local tier): its count moved; said so.
                note = UnconfiguredScaleLimits.NOT_APPLIED
                return ActionOutcome(floor.status, {**floor.detail, "limits": note}, floor.error, floor.transient)
            port = UnconfiguredScaleLimits()  # answers which section is missing
        # Its own key: the port records each key once, and the floor's call already recorded this action's.
        hpa = port.set_limits(
            service,
            max_replicas=limits.max_replicas,
            metric_targets=limits.metric_targets,
            idempotency_key=f"{key}#limits",
        )
        if floor is None:
            return hpa
        statuses = {floor.status, hpa.status}
        status = (
            hpa.status
            if hpa.status is OutcomeStatus.FAILED
            else (OutcomeStatus.SKIPPED if statuses == {OutcomeStatus.SKIPPED} else OutcomeStatus.SUCCEEDED)
        )
        detail = {"floor": dict(floor.detail), "limits": dict(hpa.detail)}
        return ActionOutcome(status, detail, hpa.error, hpa.transient)

    def _shift_traffic(self, record: ActionRecord, request: ActionRequest, abort: ActionAbort) -> ActionOutcome:
        action = request.action
        assert isinstance(action, ShiftTrafficAction)
        shift = TrafficRequest(action.service, action.version, int(action.weight), request.idempotency_key)
        return self._actuators.router.set_weight(shift, abort)

    def _restore(self, record: ActionRecord, request: ActionRequest, abort: ActionAbort) -> ActionOutcome:
        assert record.plan is not None
        # The plan journaled before the first start: per state the incident changed, its target and expected state.
        router, scale = self._actuators.router, self._actuators.scale
        return restore.run_restore(record.plan, router, scale, idempotency_key=request.idempotency_key, abort=abort)

    def _annotate(self, record: ActionRecord, request: ActionRequest, abort: ActionAbort) -> ActionOutcome:
        assert isinstance(request.action, AnnotateAction)
        return self._actuators.annotator.annotate(
            self._annotation(record, request.action), idempotency_key=request.idempotency_key
        )

    def _notify(self, record: ActionRecord, request: ActionRequest, abort: ActionAbort) -> ActionOutcome:
        action = request.action
        assert isinstance(action, NotifyAction)
        return self._actuators.notifier.notify(
            NotifyRequest(action.receiver, self._payload(record, action), request.idempotency_key)
        )

    def decision(self, record: ActionRecord) -> dict[str, Any]:
        return self.journal.decision(record.decision_id, record.decision_kind) or {
            "id": record.decision_id,
            "kind": record.decision_kind,
            "policy": record.policy,
        }

    def _annotation(self, record: ActionRecord, action: AnnotateAction) -> Annotation:
        decision = self.decision(record)
        at = float(decision.get("at") or self.clock.now())
        start, end = at, None
        if record.decision_kind == "resolve":
            # A region from the onset (or the firing) to the recovery.
            start = float(decision.get("onset") or decision.get("fired_at") or at)
            end = float(decision.get("resolved_at") or at)
        labels = {str(k): str(v) for k, v in (decision.get("target") or {}).items()}
        tags = [str(tag) for tag in action.tags]
        extra = [f"policy:{record.policy}", f"decision:{record.decision_kind}"]
        text = action.text
        if record.decision_kind == "resolve":
            # A restore of this recovery that found the object changed by a human: the text says what it found.
            text = restore.truthful_annotation(self.journal.actions_for(record.decision_id), record, text)
        return Annotation(
            time=start,
            time_end=end,
            text=text,
            tags=[*tags, *extra],
            decision_id=record.decision_id,
            labels=labels,
        )

    def _payload(self, record: ActionRecord, action: NotifyAction) -> NotifyPayload:
        decision = self.decision(record)
        actions = [
            other.to_json()
            for other in self.journal.actions_for(record.decision_id)
            if other.decision_kind == record.decision_kind
        ]
        return NotifyPayload(
            message=action.message,
            decision=decision,
            evidence=decision.get("evidence", []),
            actions=actions,
            links=dict(self.links_for(decision)) if self.links_for is not None else {},
        )

    def after(self, record: ActionRecord) -> dict[str, Any]:
        """What a change left (its service's weights or scale state, read now) for the action's result."""
        return restore.after_state(record, self._actuators.router, self._actuators.scale)
