"""The metrics port: a PromQL endpoint (Prometheus; the backtest's recorded history) and what it answers.

A range answer on an evaluation grid as arrays (numpy) is the backtest's own type, beside the Prometheus adapter
that produces it (controller/adapters/metrics/grid.py): the core holds no array type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tailguard.controller.core.model import SignalResult, TargetKey


@dataclass(frozen=True)
class RangeResult:
    """A range query's answer: per target, the samples (timestamp -> value), or an error."""

    series: Mapping[TargetKey, Mapping[float, float]] = field(default_factory=dict)
    error: str | None = None
    policy_error: bool = False  # as SignalResult.policy_error: the source refused the query itself

    def at(self, timestamp: float) -> SignalResult:
        if self.error is not None:
            return SignalResult(values={}, error=self.error, policy_error=self.policy_error)
        return SignalResult(
            {target: samples[timestamp] for target, samples in self.series.items() if timestamp in samples}
        )


class MetricsSource(Protocol):
    """A PromQL endpoint. One call is one HTTP request; results are grouped by `group_by` labels."""

    def instant(self, query: str, group_by: Sequence[str], at: float | None = None) -> SignalResult: ...

    def range(self, query: str, group_by: Sequence[str], start: float, end: float, step: float) -> RangeResult: ...
