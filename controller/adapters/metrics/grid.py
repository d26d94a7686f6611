"""A range query's answer on an evaluation grid, as arrays: what the backtest streams into the engine.

Here, beside the Prometheus adapter that parses range answers straight into it, and not in the core: the core holds
no array type (numpy stays out of it: the import-linter contract `core-without-io-types`).

`RangeResult` (core/ports/metrics.py) holds a dict per target of timestamp -> value: fine for a few hundred points, but
7 days x 100 targets x 4 signals at 15 s is 16 million entries (hundreds of MiB, and a dict lookup per target per
signal per evaluation). A `RangeGrid` holds the same answer for one chunk of evaluation times as two arrays,
time-major: `present[i, k]` (target k answered at time i) and `values[i, k]` (its value; NaN where absent, or where
Prometheus answered NaN). `at(i)` is exactly `RangeResult.at(times[i])` (a SignalResult, built only when asked;
`on_grid` converts one), and `healthy(...)` says, per time, which cells a condition would see as
"present, a number, not breaching": what lets the backtest skip the evaluations in which nothing can happen
(controller/tools/backtest_feed.py).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from tailguard.controller.core.model import SignalResult, TargetKey
from tailguard.controller.core.policy import Comparison, Threshold
from tailguard.controller.core.ports.metrics import RangeResult

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

_OPS: dict[Comparison, Callable[[Any, float], Any]] = {
    Comparison.GT: operator.gt,
    Comparison.GE: operator.ge,
    Comparison.LT: operator.lt,
    Comparison.LE: operator.le,
}


@dataclass(frozen=True)
class RangeGrid:
    """One signal's answer over `times` (one chunk of the evaluation grid, in order), by target."""

    times: tuple[float, ...]
    targets: tuple[TargetKey, ...] = ()
    present: BoolArray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.bool_))
    values: FloatArray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float64))
    error: str | None = None
    policy_error: bool = False

    @staticmethod
    def failed(times: Sequence[float], error: str, policy_error: bool = False) -> RangeGrid:
        return RangeGrid(tuple(times), error=error, policy_error=policy_error)

    @staticmethod
    def from_columns(
        times: Sequence[float], step: float, series: Iterable[tuple[TargetKey, FloatArray, FloatArray]]
    ) -> RangeGrid:
        """The grid from per-target (timestamps, values) arrays (a source's parsed answer): a sample counts where
        its timestamp, rounded to the millisecond as RangeResult's keys are, is one of `times` (in order, one
        `step` apart); other samples are ignored, as RangeResult.at ignores them."""
        grid_times = np.asarray(times, dtype=np.float64)
        columns = list(series)
        present = np.zeros((len(times), len(columns)), dtype=np.bool_)
        values = np.full((len(times), len(columns)), np.nan, dtype=np.float64)
        if len(times):
            for k, (_target, stamps, samples) in enumerate(columns):
                rounded = np.round(stamps, 3)
                slots = np.rint((rounded - grid_times[0]) / step).astype(np.int64)
                inside = (slots >= 0) & (slots < len(times))
                slots, rounded, samples = slots[inside], rounded[inside], samples[inside]
                exact = grid_times[slots] == rounded
                present[slots[exact], k] = True
                values[slots[exact], k] = samples[exact]
        return RangeGrid(tuple(times), tuple(target for target, _, _ in columns), present, values)

    def at(self, i: int) -> SignalResult:
        """Exactly RangeResult.at(times[i])."""
        if self.error is not None:
            return SignalResult(values={}, error=self.error, policy_error=self.policy_error)
        row_present = self.present[i]
        row_values = self.values[i].tolist()
        return SignalResult({self.targets[k]: row_values[k] for k in np.flatnonzero(row_present).tolist()})

    def healthy(self, when: Threshold) -> BoolArray:
        """[time, target]: present, a number (not NaN) and not breaching `when`: what engine.transition sees as an
        OK observation of a target in phase OK that stays OK (its fast path)."""
        with np.errstate(invalid="ignore"):
            breaching = _OPS[when.op](self.values, when.value)
        healthy: BoolArray = self.present & ~np.isnan(self.values) & ~breaching
        return healthy


def on_grid(result: RangeResult, times: Sequence[float]) -> RangeGrid:
    """The samples of `result` at exactly `times` (one chunk of an evaluation grid) as arrays: `grid.at(i)` is
    `result.at(times[i])`."""
    if result.error is not None:
        return RangeGrid.failed(times, result.error, result.policy_error)
    index = {at: i for i, at in enumerate(times)}
    targets = tuple(result.series)
    present = np.zeros((len(times), len(targets)), dtype=np.bool_)
    values = np.full((len(times), len(targets)), np.nan, dtype=np.float64)
    for k, target in enumerate(targets):
        for at, value in result.series[target].items():
            i = index.get(at)
            if i is not None:
                present[i, k] = True
                values[i, k] = value
    return RangeGrid(tuple(times), targets, present, values)


@runtime_checkable
class RangeGridSource(Protocol):
    """A MetricsSource that can answer a range query straight onto an evaluation grid, without a dict per sample
    (the backtest's fast path; PrometheusSource). Sources without it are read through range() + on_grid()."""

    def range_grid(self, query: str, group_by: Sequence[str], times: Sequence[float], step: float) -> RangeGrid:
        """One range request over [times[0], times[-1]] at `step`; exactly on_grid(range(...), times)."""
        ...
