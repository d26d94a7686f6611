"""The scale ports: a service's replica floor or count (an HPA; the local tier) and an HPA's ceiling and metric
targets (controller/adapters/scale/, tier/)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from tailguard.controller.core.ports.outcomes import ActionOutcome


@dataclass(frozen=True)
class ScaleRequest:
    """One change of a service's replica count (the HPA's floor; the local tier's count), as every ScalePort takes
    it: the count its plan fixed and the action's idempotency key."""

    service: str
    replicas: int
    idempotency_key: str


@dataclass(frozen=True)
class ScaleLimits:
    """What a scale sets besides the count: the ceiling (an HPA's maxReplicas) and the metric targets (each
    Pods/External metric's AverageValue). Journaled in the scale's plan as `limits`: `{"maxReplicas": n,
    "metrics": {name: value}}`, each key only when set (the shape plans have had since the scale gained them)."""

    max_replicas: int | None = None
    metric_targets: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of_action(cls, params: Mapping[str, object]) -> ScaleLimits:
        """A scale action's `ceiling` and `metricTargets`."""
        ceiling, targets = params.get("ceiling"), params.get("metricTargets")
        metric_targets = (
            {str(name): float(value) for name, value in targets.items() if isinstance(value, (int, float))}
            if isinstance(targets, Mapping)
            else {}
        )
        return cls(int(ceiling) if isinstance(ceiling, (int, float)) else None, metric_targets)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ScaleLimits:
        return cls.of_action({"ceiling": data.get("maxReplicas"), "metricTargets": data.get("metrics")})

    def to_json(self) -> dict[str, object]:
        """The plan's `limits`; empty when the scale sets neither."""
        out: dict[str, object] = {}
        if self.max_replicas is not None:
            out["maxReplicas"] = self.max_replicas
        if self.metric_targets:
            out["metrics"] = dict(self.metric_targets)
        return out


class ScaleState(BaseModel):
    """Everything a scale may change of a service, plus its current count for the record: an HPA's minReplicas,
    maxReplicas and the AverageValue target of each Pods/External metric (as the API writes quantities); the local
    tier's replicas. Journaled in change and restore plans (`before`, `target`, `expected`): `to_json` writes exactly
    the keys that were set, so a plan read back is written the same."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int | None = None
    minReplicas: int | None = None
    maxReplicas: int | None = None
    metrics: dict[str, str] | None = None

    def to_json(self) -> dict[str, object]:
        return self.model_dump(exclude_unset=True)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ScaleState:
        return cls.model_validate(dict(data))


class ScalePort(Protocol):
    """Reads and sets a service's replica count (the HPA's floor; the local tier)."""

    def replicas(self, service: str) -> int:
        """The current count; raises (an exception with `transient`) when it cannot be read."""
        ...

    def set_replicas(self, request: ScaleRequest) -> ActionOutcome: ...

    def scale_target(self, replicas: int) -> dict[str, int]:
        """The fields of `scale_state` a scale to `replicas` sets, which a plan journals as its target and a resume
        finds done (an HPA: {"minReplicas": n}, its floor; the local tier: {"replicas": n})."""
        ...

    def scale_state(self, service: str) -> ScaleState:
        """Everything a scale may change (an HPA: minReplicas, maxReplicas, metric targets; the local
        tier: replicas), plus the current `replicas` for the record. Raises (with `transient`) when unreadable."""
        ...

    def restore_scale(
        self,
        service: str,
        state: ScaleState,
        *,
        expected: ScaleState | None,
        idempotency_key: str,
    ) -> ActionOutcome:
        """Set exactly `state` (a `scale_state` answer; `replicas` of an HPA is not settable and ignored), never
        below the floor the operator set. SKIPPED, writing nothing, when the current state is not `expected`
        (someone else changed it since tailguard did) or already is `state`."""
        ...


class ScaleLimitsPort(Protocol):
    """Sets an HPA's ceiling and metric targets (a `scale` action's `ceiling` and `metricTargets`; the HPA only)."""

    def set_limits(
        self,
        service: str,
        *,
        max_replicas: int | None,
        metric_targets: Mapping[str, float],
        idempotency_key: str,
    ) -> ActionOutcome:
        """Set maxReplicas (never below minReplicas) and the AverageValue target of each named metric, within the
        bounds the operator configured (clamped; a metric with no configured bounds is refused)."""
        ...
