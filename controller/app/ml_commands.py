"""The commands that read Prometheus history for the SLA model: `tailguard backtest`, `train`, `evaluate`.

The app wires them (controller/app/cli.py DELEGATED): predictors depend on the controller's kit and core only,
so the app opens the PrometheusSource they read; the backtest (controller/tools) never imports predictors, so the
app hands it a factory for the SLA model over history (predictors.history.HistoricalPredictions).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pydantic import ValidationError

from controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from controller.app.extras import ML, missing_extra_message
from controller.kit.cli_args import EXIT_USAGE, UsageError
from controller.kit.clock import SystemClock
from controller.tools import backtest
from controller.tools.backtest import ModelOptions
from predictors.history import HistoricalPredictions, predictor_specs


def open_prometheus(url: str, timeout: float) -> PrometheusSource:
    """The source `train` and `evaluate` read (predictors.data.OpenSource); UsageError for a URL it cannot use."""
    try:
        settings = PrometheusSettings(url=url, timeout=timeout)
    except ValidationError:
        raise UsageError(f"--prometheus: expected an http(s):// URL, got {url!r}") from None
    return PrometheusSource(settings, SystemClock())


def historical_predictions(options: ModelOptions, at: float) -> HistoricalPredictions:
    """The backtest's SLA model over history (controller.tools.backtest.PredictionsFactory)."""
    return HistoricalPredictions(
        predictor_specs(options.predictors, options.trusted_types, options.allow_untrusted), at
    )


def backtest_main(argv: Sequence[str]) -> int:
    return backtest.backtest_main(argv, historical_predictions)


def train_main(argv: Sequence[str]) -> int:
    try:
        from predictors import train  # the ml extra (scikit-learn, skops): imported only for this command
    except ModuleNotFoundError as missing:
        message = missing_extra_message(missing, ML, "tailguard train")
        if message is None:
            raise
        print(f"tailguard train: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    return train.main(argv, open_prometheus)


def evaluate_main(argv: Sequence[str]) -> int:
    try:
        from predictors import evaluate  # the ml extra (scikit-learn, skops): imported only for this command
    except ModuleNotFoundError as missing:
        message = missing_extra_message(missing, ML, "tailguard evaluate")
        if message is None:
            raise
        print(f"tailguard evaluate: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    return evaluate.main(argv, open_prometheus)
