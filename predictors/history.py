"""The SLA model over history: prediction signals answered for a backtest (`tailguard backtest --predictors`).

The app (controller/app/ml_commands.py) builds a HistoricalPredictions from the command's `--predictors NAME=DIR`,
`--trusted-type NAME=TYPE` and `--allow-untrusted NAME` options and hands it to the backtest
(controller/tools/backtest.py) as its HistoricalPredictionPort: the backtest never imports predictors.

One range query per feature (grouped by the policy's target labels, so all targets in one request), then the
model once over every (timestamp, target) row in blocks (vectorised). Models are loaded and checked by the
controller's own PredictionProvider (skops allow-list plus `--trusted-type`, feature hash, sklearn version);
staleness (maxAge) is judged at the backtest's end, the time the controller would have evaluated last. A
missing or incompatible model makes its signals no-data for the whole backtest and the notes say why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tailguard.controller.core.model import TargetKey
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.ports import MetricsSource, RangeResult
from tailguard.controller.core.signals import range_chunks
from tailguard.controller.kit.cli_args import UsageError
from tailguard.controller.kit.clock import ManualClock
from tailguard.predictors.features import FEATURES, feature_queries
from tailguard.predictors.serving import (
    ArtifactLoader,
    ModelSpec,
    PredictionProvider,
    ProbabilityFunction,
    single_threaded,
    usable_rows,
)

# Rows (timestamp x target) per model call: bounds the feature tensor's memory on long, wide backtests.
PREDICTION_BLOCK_CELLS = 2_000_000


def query_range_chunked(
    source: MetricsSource, query: str, group_by: Sequence[str], start: float, end: float, step: float
) -> RangeResult:
    """One range query (more past Prometheus' points limit); a source that raises is an error result."""
    merged: dict[TargetKey, dict[float, float]] = {}
    for chunk_start, chunk_end in range_chunks(start, end, step):
        try:
            part = source.range(query, group_by, chunk_start, chunk_end, step)
        except Exception as unexpected:  # noqa: BLE001 - sources should not raise; one that does is an error
            return RangeResult(error=f"source raised {type(unexpected).__name__}: {unexpected}")
        if part.error is not None:
            return RangeResult(error=part.error)
        for target, samples in part.series.items():
            merged.setdefault(target, {}).update(samples)
    return RangeResult(series=merged)


class HistoricalPredictions:
    """Answers prediction signals over history with the controller's loading and trust rules.

    The models are loaded once for the whole backtest by a PredictionProvider (the same checks as the
    live controller: missing, untrusted types, feature hash, sklearn version, maxAge judged at `at`).
    """

    def __init__(
        self,
        specs: Mapping[str, ModelSpec],
        at: float,
        *,
        loader: ArtifactLoader | None = None,
        probabilities: ProbabilityFunction | None = None,
    ) -> None:
        self._specs = dict(specs)
        self._loader = loader
        self._probabilities = probabilities
        self._artifacts: dict[Path, Any] = {}
        # The provider decides whether a model may be used; the artifact it accepted is kept by `_load`.
        self._provider = PredictionProvider(self._specs, ManualClock(at), loader=self._load)

    def _load(self, directory: Path, **trust: Any) -> Any:
        if self._loader is not None:
            loader = self._loader
        else:
            from tailguard.predictors.artifact import (
                load_artifact,  # the ml extra (scikit-learn, skops): only with a model
            )

            loader = load_artifact
        artifact = loader(directory, **trust)
        self._artifacts[Path(directory)] = artifact
        return artifact

    def predict_range(
        self, source: MetricsSource, policy: Policy, times: Sequence[float], step: float
    ) -> tuple[dict[str, RangeResult], list[str]]:
        """Every prediction signal of `policy` at every time of `times` (an evaluation grid), and why any is no-data."""
        signals = [signal for signal in policy.signals if signal.predict is not None]
        if not signals or not times:
            return {}, []
        results: dict[str, RangeResult] = {signal.name: RangeResult() for signal in signals}
        notes: list[str] = []
        states = self._provider.refresh([signal.predict.model for signal in signals if signal.predict is not None])
        usable: dict[str, Any] = {}
        for model, state in states.items():
            if state.usable:
                usable[model] = self._artifacts[self._specs[model].directory]
                continue
            names = ", ".join(s.name for s in signals if s.predict is not None and s.predict.model == model)
            notes.append(f"{policy.name}/{names}: {state.describe()} for the whole backtest")
        if not usable:
            return results, notes  # nothing to predict with: no feature queries either
        group_by = list(policy.targets.groupBy)
        queries = feature_queries(policy.targets.match, group_by)
        ranges = {
            name: query_range_chunked(source, query, group_by, times[0], times[-1], step)
            for name, query in queries.items()
        }
        failures = [f"{name}: {result.error}" for name, result in ranges.items() if result.error is not None]
        targets = sorted({target for result in ranges.values() for target in result.series})
        time_index = {timestamp: row for row, timestamp in enumerate(times)}
        target_index = {target: column for column, target in enumerate(targets)}
        # Sparse columns (time row, target, value) per feature, so a block of the tensor is filled by masks.
        cells: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]] = []
        for feature in FEATURES:
            found = ranges.get(feature.name)
            rows_at: list[int] = []
            columns_at: list[int] = []
            values: list[float] = []
            for target, samples in found.series.items() if found is not None else ():
                for timestamp, value in samples.items():
                    row = time_index.get(timestamp)
                    if row is not None and math.isfinite(value):
                        rows_at.append(row)
                        columns_at.append(target_index[target])
                        values.append(value)
            cells.append(
                (np.asarray(rows_at, dtype=np.int64), np.asarray(columns_at, dtype=np.int64), np.asarray(values))
            )
        width = len(FEATURES)
        for model, artifact in usable.items():
            spec = self._specs[model]
            model_signals = [s for s in signals if s.predict is not None and s.predict.model == model]
            if width and len(failures) / width > spec.max_missing_fraction:
                failed = RangeResult(error=f"feature queries failed: {'; '.join(failures[:3])}")
                results.update({signal.name: failed for signal in model_signals})
                continue
            series, note = self._predict_model(model, artifact, spec, cells, times, targets, model_signals)
            if note:
                notes.append(f"{policy.name}: {note}")
            for signal in model_signals:
                if signal.name in series:
                    results[signal.name] = RangeResult(series=series[signal.name])
        return results, notes

    def _predict_model(
        self,
        model: str,
        artifact: Any,
        spec: ModelSpec,
        cells: Sequence[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]],
        times: Sequence[float],
        targets: Sequence[TargetKey],
        model_signals: Sequence[Any],
    ) -> tuple[dict[str, dict[TargetKey, dict[float, float]]], str]:
        if self._probabilities is not None:
            predict_proba = self._probabilities
        else:
            from tailguard.predictors.artifact import (
                predict_proba,  # the ml extra (scikit-learn, skops): only with a model
            )
        series: dict[str, dict[TargetKey, dict[float, float]]] = {signal.name: {} for signal in model_signals}
        if not targets:
            return series, ""
        width = len(cells)
        block = max(1, PREDICTION_BLOCK_CELLS // max(1, len(targets) * width))
        gaps: set[str] = set()
        for first in range(0, len(times), block):
            last = min(len(times), first + block)
            tensor = np.full((last - first, len(targets), width), np.nan, dtype=np.float64)
            for column, (rows_at, columns_at, values) in enumerate(cells):
                inside = (rows_at >= first) & (rows_at < last)
                tensor[rows_at[inside] - first, columns_at[inside], column] = values[inside]
            # A target exists at a time when it has any feature then (as a live evaluation sees it).
            present = ~np.isnan(tensor).all(axis=2)
            flat = tensor.reshape(-1, width)
            keep = present.reshape(-1) & usable_rows(flat, spec.max_missing_fraction)
            if not keep.any():
                continue
            try:
                probabilities = single_threaded(predict_proba, artifact, flat[keep])
            except Exception as failure:  # noqa: BLE001 - a model that cannot predict gives no-data, not a crash
                return {}, f"model {model}: prediction failed: {type(failure).__name__}: {failure}; no-data"
            row_of, target_of = np.divmod(np.flatnonzero(keep), len(targets))
            for signal in model_signals:
                dimension = signal.predict.dimension.value
                column_values = probabilities.get(dimension)
                if column_values is None:
                    gaps.add(dimension)
                    continue
                into = series[signal.name]
                for row, target, value in zip(row_of, target_of, np.asarray(column_values, dtype=float), strict=True):
                    into.setdefault(targets[target], {})[times[first + row]] = float(value)
        note = "; ".join(f"model {model} has no {d} model: those signals are no-data" for d in sorted(gaps))
        return series, note


def predictor_specs(
    predictors: Sequence[str], trusted: Sequence[str], untrusted: Sequence[str]
) -> dict[str, ModelSpec]:
    """`--predictors NAME=DIR`, `--trusted-type NAME=TYPE`, `--allow-untrusted NAME` as the controller's specs."""
    directories: dict[str, Path] = {}
    for raw in predictors:
        name, separator, directory = raw.partition("=")
        if not separator or not name.strip() or not directory.strip():
            raise UsageError(f"--predictors: expected NAME=DIR such as sla=models/sla, got {raw!r}")
        if name.strip() in directories:
            raise UsageError(f"--predictors: model {name.strip()!r} is given twice")
        directories[name.strip()] = Path(directory.strip()).expanduser().absolute()
    types: dict[str, list[str]] = {}
    for raw in trusted:
        name, separator, type_name = raw.partition("=")
        if not separator or name.strip() not in directories or not type_name.strip():
            raise UsageError(f"--trusted-type: expected NAME=TYPE for a model given with --predictors, got {raw!r}")
        types.setdefault(name.strip(), []).append(type_name.strip())
    for name in untrusted:
        if name not in directories:
            raise UsageError(f"--allow-untrusted: {name!r} is not a model given with --predictors")
    return {
        name: ModelSpec(
            name=name,
            directory=directory,
            trusted_types=tuple(types.get(name, ())),
            allow_untrusted=name in untrusted,
        )
        for name, directory in directories.items()
    }
