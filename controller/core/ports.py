"""The small interfaces between the pure core and the outside world.

Each has a real implementation (controller/sources, controller/actuators) and a
fake used by tests (controller/testing/actuators.py, controller/testing/sources.py).
Implementations never raise for expected failures: they return data
(SignalResult with an error, ActionOutcome with status "failed").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from controller.core.model import SignalResult, TargetKey

# The kit's clock protocol (the kit's HTTP call waits through it too), re-exported so every port is found here.
from controller.kit.clock import Clock as Clock  # noqa: PLC0414 - the explicit re-export idiom


@dataclass(frozen=True)
class RangeResult:
    """A range query's answer: per target, the samples (timestamp -> value), or an error."""

    series: Mapping[TargetKey, Mapping[float, float]] = field(default_factory=dict)
    error: str | None = None

    def at(self, timestamp: float) -> SignalResult:
        if self.error is not None:
            return SignalResult.failed(self.error)
        return SignalResult(
            {target: samples[timestamp] for target, samples in self.series.items() if timestamp in samples}
        )


class MetricsSource(Protocol):
    """A PromQL endpoint. One call is one HTTP request; results are grouped by `group_by` labels."""

    def instant(self, query: str, group_by: Sequence[str], at: float | None = None) -> SignalResult: ...

    def range(self, query: str, group_by: Sequence[str], start: float, end: float, step: float) -> RangeResult: ...


class OutcomeStatus(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"  # nothing to do (e.g. already at that weight, no earlier good revision)


@dataclass(frozen=True)
class ActionOutcome:
    status: OutcomeStatus
    detail: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    # Only transient failures (timeouts, 5xx, connection refused) are retried.
    transient: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "detail": dict(self.detail),
            "error": self.error,
            "transient": self.transient,
        }


class Deployer(Protocol):
    """Revisions and replica counts of a service (local tier now; Argo CD / Deployments later)."""

    def rollback(self, service: str, *, idempotency_key: str) -> ActionOutcome:
        """Roll `service` back to its last good revision (never to one recorded as bad)."""
        ...

    def replicas(self, service: str) -> int: ...

    def set_replicas(self, service: str, replicas: int, *, idempotency_key: str) -> ActionOutcome: ...


class TrafficRouter(Protocol):
    def set_weight(self, service: str, version: str, weight: int, *, idempotency_key: str) -> ActionOutcome:
        """Set `version`'s share (percent) of `service`'s traffic, then read it back to verify."""
        ...


@dataclass(frozen=True)
class Annotation:
    time: float
    text: str
    tags: Sequence[str]
    time_end: float | None = None
    decision_id: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


class Annotator(Protocol):
    def annotate(self, annotation: Annotation, *, idempotency_key: str) -> ActionOutcome: ...


class Notifier(Protocol):
    def notify(self, receiver: str, payload: Mapping[str, Any], *, idempotency_key: str) -> ActionOutcome: ...
