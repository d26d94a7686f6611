"""The data the engine consumes and produces.

Measurements are data, not exceptions: a signal query either returns values per
target or an error value, and every (condition, target) observation is one of
ok / breach / no-data / error. Decisions carry their evidence so the journal,
annotations and reports can show *why* an action was taken.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tailguard.controller.core.actions import ActionRequest

# A target is identified by the values of the policy's `targets.groupBy` labels,
# kept as a sorted tuple so it is hashable and has one canonical order.
TargetKey = tuple[tuple[str, str], ...]


def target_key(labels: Mapping[str, str]) -> TargetKey:
    return tuple(sorted(labels.items()))


def target_labels(key: TargetKey) -> dict[str, str]:
    return dict(key)


def format_target(key: TargetKey) -> str:
    return "{" + ",".join(f'{name}="{value}"' for name, value in key) + "}"


class ObservationKind(StrEnum):
    OK = "ok"
    BREACH = "breach"
    NO_DATA = "no-data"
    ERROR = "error"


@dataclass(frozen=True)
class SignalResult:
    """One signal's answer at one evaluation: values by target, or an error.

    `values` may hold NaN (e.g. histogram_quantile over zero traffic); the
    engine treats NaN and absent targets alike as no-data, never as a breach.
    """

    values: Mapping[TargetKey, float] = field(default_factory=dict)
    error: str | None = None
    # The error is the POLICY's, not an outage: Prometheus refused the query itself as bad data (HTTP 400,
    # errorType bad_data: a PromQL syntax error). Retrying cannot help; the policy must be fixed.
    policy_error: bool = False

    @staticmethod
    def failed(message: str) -> SignalResult:
        return SignalResult(values={}, error=message)

    @staticmethod
    def refused(message: str) -> SignalResult:
        """A policy error: the source refuses the query itself (see `policy_error`)."""
        return SignalResult(values={}, error=message, policy_error=True)

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Observation:
    kind: ObservationKind
    at: float
    value: float | None = None
    error: str | None = None


def classify(
    result: SignalResult | None, target: TargetKey, at: float
) -> tuple[ObservationKind, float | None, str | None]:
    """The raw classification of a signal result for one target, before any threshold."""
    if result is None:
        return ObservationKind.ERROR, None, "signal was not queried"
    if result.error is not None:
        return ObservationKind.ERROR, None, result.error
    value = result.values.get(target)
    if value is None or math.isnan(value):
        return ObservationKind.NO_DATA, None, None
    return ObservationKind.OK, value, None


class DecisionKind(StrEnum):
    FIRE = "fire"  # the condition fired: run its actions
    RESOLVE = "resolve"  # the condition recovered: run its recovery actions
    SUPPRESSED = "suppressed"  # would fire, but cooldown or budget forbids acting now
    ERRORED = "errored"  # the source failed more often in a row than the condition allows


@dataclass(frozen=True)
class Decision:
    id: str
    kind: DecisionKind
    policy: str
    condition: str
    target: TargetKey
    onset: float
    at: float
    fired_at: float | None
    resolved_at: float | None
    value: float | None
    threshold: float
    evidence: tuple[tuple[float, float], ...]
    actions: tuple[ActionRequest, ...]
    dry_run: bool
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "policy": self.policy,
            "condition": self.condition,
            "target": target_labels(self.target),
            "onset": self.onset,
            "at": self.at,
            "fired_at": self.fired_at,
            "resolved_at": self.resolved_at,
            "value": self.value,
            "threshold": self.threshold,
            "evidence": [[t, v] for t, v in self.evidence],
            "actions": [action.to_json() for action in self.actions],
            "dry_run": self.dry_run,
            "reason": self.reason,
        }


def decision_id(policy: str, condition: str, target: TargetKey, onset: float) -> str:
    """Deterministic, so a replayed evaluation (restart, backtest) names the same incident the same way."""
    # float(): an int onset (e.g. a Prometheus timestamp) must name the same incident as the same float.
    material = json.dumps([policy, condition, list(target), round(float(onset), 3)], separators=(",", ":"))
    return hashlib.sha256(material.encode()).hexdigest()[:16]
