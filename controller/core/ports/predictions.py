"""The prediction ports: the SLA model's signals, live and over history
(implemented in predictors/, wired by the app).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from tailguard.controller.core.model import SignalResult
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.ports.metrics import MetricsSource, RangeResult


class PredictionPort(Protocol):
    """What the controller needs of tailguard.predictors.serving.PredictionProvider (the SLA model's signals)."""

    def predict(self, source: MetricsSource, policy: Policy, at: float | None = None) -> Mapping[str, SignalResult]: ...

    def warnings(self) -> list[str]: ...


class HistoricalPredictionPort(Protocol):
    """What the backtest needs of tailguard.predictors.history.HistoricalPredictions (the SLA model over history)."""

    def predict_range(
        self, source: MetricsSource, policy: Policy, times: Sequence[float], step: float
    ) -> tuple[dict[str, RangeResult], list[str]]:
        """Every prediction signal of `policy` at every time of `times`, and why any is no-data."""
        ...
