"""The commands that read Prometheus history for the SLA model: `tailguard backtest`, `train`, `evaluate`.

The app wires them (controller/app/cli.py DELEGATED): predictors depend on the controller's kit and core only,
so the app opens the PrometheusSource they read; the backtest (controller/tools) never imports predictors, so the
app hands it a factory for the SLA model over history (tailguard.predictors.history.HistoricalPredictions), and a reader
of `--config CONTROLLER_YAML` (`backtest_config`: the settings' prometheus, policies, global limits and dryRun, and the
change tracker built from the configured change sources).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pydantic import ValidationError

from tailguard.controller.adapters.changes.tracker import build_change_tracker
from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.adapters.tier.local_tier import LocalTierClient
from tailguard.controller.app.extras import CLUSTER, ML, missing_extra_message, require
from tailguard.controller.app.settings import load_settings
from tailguard.controller.kit.cli_args import EXIT_USAGE, UsageError
from tailguard.controller.kit.clock import SystemClock
from tailguard.controller.kit.errors import ConfigError
from tailguard.controller.tools import backtest
from tailguard.controller.tools.backtest import ConfiguredInputs, ModelOptions
from tailguard.predictors.history import HistoricalPredictions, predictor_specs


def open_prometheus(url: str, timeout: float) -> PrometheusSource:
    """The source `train` and `evaluate` read (tailguard.predictors.data.OpenSource); UsageError for a URL it cannot
    use."""
    try:
        settings = PrometheusSettings(url=url, timeout=timeout)
    except ValidationError:
        raise UsageError(f"--prometheus: expected an http(s):// URL, got {url!r}") from None
    return PrometheusSource(settings, SystemClock())


def historical_predictions(options: ModelOptions, at: float) -> HistoricalPredictions:
    """The backtest's SLA model over history (tailguard.controller.tools.backtest.PredictionsFactory)."""
    return HistoricalPredictions(
        predictor_specs(options.predictors, options.trusted_types, options.allow_untrusted), at
    )


def backtest_config(path: str) -> ConfiguredInputs:
    """The backtest's `--config`: the controller configuration's prometheus, policies, global limits and dryRun,
    and the change tracker over its configured sources (as `tailguard run` builds it, controller/app/build.py).
    UsageError, naming the file, for a configuration that cannot be used."""
    try:
        settings = load_settings(path)
        tracking = settings.changeTracking
        tracker = None
        if tracking is not None:
            if "kubernetes" in tracking.sources:
                require(CLUSTER, "changeTracking.sources kubernetes")
            tier = settings.tier
            client = (
                LocalTierClient(tier.url, timeout=tier.timeout, retries=tier.retries, clock=SystemClock())
                if tier is not None
                else None
            )
            try:
                tracker = build_change_tracker(
                    tracking, clock=SystemClock(), argocd=settings.argocd, tier=client, base_dir=settings.base_dir
                )
            except ValueError as missing:
                raise ConfigError(f"changeTracking: {missing}") from missing
    except ConfigError as unusable:  # SettingsError, a missing extra, a change source without its section
        raise UsageError(f"--config {path}: {unusable}") from None
    return ConfiguredInputs(
        prometheus=settings.prometheus,
        policies=tuple(str(p) for p in settings.policy_paths()),
        limits=settings.limits,
        change_tracker=tracker,
        change_window=tracking.window if tracking is not None else 0.0,
        dry_run=settings.dryRun,
    )


def backtest_main(argv: Sequence[str]) -> int:
    return backtest.backtest_main(argv, historical_predictions, backtest_config)


def train_main(argv: Sequence[str]) -> int:
    try:
        from tailguard.predictors import train  # the ml extra (scikit-learn, skops): imported only for this command
    except ModuleNotFoundError as missing:
        message = missing_extra_message(missing, ML, "tailguard train")
        if message is None:
            raise
        print(f"tailguard train: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    return train.main(argv, open_prometheus)


def evaluate_main(argv: Sequence[str]) -> int:
    try:
        from tailguard.predictors import evaluate  # the ml extra (scikit-learn, skops): imported only for this command
    except ModuleNotFoundError as missing:
        message = missing_extra_message(missing, ML, "tailguard evaluate")
        if message is None:
            raise
        print(f"tailguard evaluate: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    return evaluate.main(argv, open_prometheus)
