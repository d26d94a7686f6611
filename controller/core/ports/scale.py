"""The scale ports: a service's replica floor or count (an HPA; the local tier) and an HPA's ceiling and metric
targets (controller/adapters/scale/, tier/)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from controller.core.ports.outcomes import ActionOutcome


class ScalePort(Protocol):
    """Reads and sets a service's replica count (the HPA's floor; the local tier)."""

    def replicas(self, service: str) -> int:
        """The current count; raises (an exception with `transient`) when it cannot be read."""
        ...

    def set_replicas(self, service: str, replicas: int, *, idempotency_key: str) -> ActionOutcome: ...

    def scale_state(self, service: str) -> Mapping[str, Any]:
        """Everything a scale may change, as JSON (an HPA: minReplicas, maxReplicas, metric targets; the local
        tier: replicas), plus the current `replicas` for the record. Raises (with `transient`) when unreadable."""
        ...

    def restore_scale(
        self,
        service: str,
        state: Mapping[str, Any],
        *,
        expected: Mapping[str, Any] | None,
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
