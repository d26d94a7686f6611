"""The "not configured" implementation of each action port: the dispatcher calls it like any other, and it
answers a permanent FAILED outcome that says what is missing (never worth a retry).

The dispatcher's `Actuators` defaults every port to one of these (the message names the `Actuators` field), and
the app wires one with the missing section of the controller configuration (ROLLBACK_MISSING, SCALE_MISSING)
where neither Argo CD nor the tier rolls back, or neither the HPA nor the tier scales.

`ScalePort.replicas()` returns a plain int, so the scale one can only raise: `NoActuatorError`, permanent; the
dispatcher records it as a FAILED scale action (its planning failed, nothing was started).

Pure (no I/O), so it lives in the core, where the loop may take its defaults from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tailguard.controller.core.actions import ActionType
from tailguard.controller.core.ports import (
    AbortSignal,
    ActionOutcome,
    Annotation,
    NotifyRequest,
    OutcomeStatus,
    RollbackPlan,
    RollbackRequest,
    ScaleLimits,
    ScaleRequest,
    ScaleState,
    TrafficRequest,
)
from tailguard.controller.kit.errors import ActuatorError

ROLLBACK_MISSING = "no actuator configured for rollback: add argocd (or tier)"
SCALE_MISSING = "no actuator configured for scale: add kubernetes.hpa (or tier)"


def missing(field: str, action: ActionType) -> str:
    """What an `Actuators` field left at its default answers (its name predates the split of the deployer)."""
    return f"no {field} configured: a {action.value} action needs Actuators.{field}"


class NoActuatorError(ActuatorError):
    """Raised by `UnconfiguredScale.replicas()`: nothing is configured to scale; never worth a retry."""

    transient = False


def _failed(detail: Mapping[str, Any], message: str) -> ActionOutcome:
    return ActionOutcome(OutcomeStatus.FAILED, detail, message, False)


class UnconfiguredRollback:
    """`RollbackPort` where nothing rolls back."""

    def __init__(self, message: str = missing("deployer", ActionType.ROLLBACK)) -> None:
        self.message = message

    def plan_rollback(self, service: str, *, rollout_revision: str | None = None) -> RollbackPlan | ActionOutcome:
        return _failed({"service": service}, self.message)

    def rollback(self, request: RollbackRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        return _failed({"service": request.service}, self.message)


class UnconfiguredScale:
    """`ScalePort` where nothing scales."""

    def __init__(self, message: str = missing("deployer", ActionType.SCALE)) -> None:
        self.message = message

    def replicas(self, service: str) -> int:
        raise NoActuatorError(self.message)

    def scale_target(self, replicas: int) -> dict[str, int]:
        """Nothing scales; the count is what a plan would name."""
        return {"replicas": replicas}

    def set_replicas(self, request: ScaleRequest) -> ActionOutcome:
        return _failed({"service": request.service, "replicas": request.replicas}, self.message)

    def scale_state(self, service: str) -> ScaleState:
        raise NoActuatorError(self.message)

    def restore_scale(
        self,
        service: str,
        state: ScaleState,
        *,
        expected: ScaleState | None,
        idempotency_key: str,
    ) -> ActionOutcome:
        return _failed({"service": service}, self.message)


class UnconfiguredScaleLimits:
    """`ScaleLimitsPort` where nothing sets a ceiling or metric targets (no HPA: the local tier scales counts)."""

    # Said in a scale's outcome when its count moved and nothing here takes its ceiling or metric targets.
    NOT_APPLIED = "no HPA actuator: ceiling and metricTargets not applied"

    def set_limits(
        self,
        service: str,
        *,
        max_replicas: int | None,
        metric_targets: Mapping[str, float],
        idempotency_key: str,
    ) -> ActionOutcome:
        limits = ScaleLimits(max_replicas, metric_targets).to_json()
        error = f"scale of {service!r}: ceiling and metricTargets need an HPA (a `kubernetes.hpa` section)"
        return _failed({"limits": limits}, error)


class UnconfiguredRouter:
    """`TrafficRouter` where no routes are configured."""

    def __init__(self, message: str = missing("router", ActionType.SHIFT_TRAFFIC)) -> None:
        self.message = message

    def set_weight(self, request: TrafficRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        return _failed({"service": request.service, "version": request.version, "weight": request.weight}, self.message)

    def weights(self, service: str) -> Mapping[str, int]:
        raise NoActuatorError(self.message)

    def set_weights(
        self,
        service: str,
        weights: Mapping[str, int],
        *,
        expected: Mapping[str, int] | None,
        idempotency_key: str,
        abort: AbortSignal | None = None,
    ) -> ActionOutcome:
        return _failed({"service": service, "weights": dict(weights)}, self.message)


class UnconfiguredAnnotator:
    """`Annotator` where no annotation sink is configured."""

    def __init__(self, message: str = missing("annotator", ActionType.ANNOTATE)) -> None:
        self.message = message

    def annotate(self, annotation: Annotation, *, idempotency_key: str) -> ActionOutcome:
        return _failed({}, self.message)


class UnconfiguredNotifier:
    """`Notifier` where no receivers are configured."""

    def __init__(self, message: str = missing("notifier", ActionType.NOTIFY)) -> None:
        self.message = message

    def notify(self, request: NotifyRequest) -> ActionOutcome:
        return _failed({"receiver": request.receiver}, self.message)
