"""From Prometheus history to labelled rows, and the scores both `train` and `evaluate` report.

Rows are (evaluation time t, target). Features at t come from range queries evaluated at t, so they only
use samples at or before t. The label of dimension d at t is 1 when d's SLI exceeds its threshold at ANY
evaluation in (t, t + H] (the next horizon), 0 when it never does and at least half of those evaluations
have a value, unknown (NaN, the row is not used for d) otherwise or when t + H is past the data.
Baselines, computed from data known at t only:
- reactive: alarm when the current SLI(t) is over the threshold (what HPA/KEDA-style rules do);
- persistence: the label at t is predicted to be the state of (t - H, t] (the last horizon repeats).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.metrics import brier_score_loss, roc_auc_score
from tqdm import tqdm

from tailguard.controller.core.model import TargetKey
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.ports import MetricsSource
from tailguard.controller.core.signals import range_chunks
from tailguard.controller.kit.durations import parse_duration
from tailguard.controller.kit.errors import InputError
from tailguard.predictors.artifact import DIMENSIONS
from tailguard.predictors.features import DEFAULT_SLI_THRESHOLDS, feature_queries, sli_queries

Array = npt.NDArray[np.float64]
# (Prometheus URL, seconds per request) -> the metrics source `train` and `evaluate` read, used in a `with` block;
# raises tailguard.controller.kit.cli_args.UsageError when the URL is unusable. The app passes one
# (controller/app/ml_commands.py: a PrometheusSource); predictors never import an adapter.
OpenSource = Callable[[str, float], AbstractContextManager[MetricsSource]]
THRESHOLD_VARS = {d: f"sla_{d}_seconds" for d in DIMENSIONS}


class DataError(InputError, ValueError):
    """The history cannot make a dataset (a query failed, no targets, ...); one clear sentence."""


@dataclass
class Rows:
    times: Array  # (n,)
    target_index: npt.NDArray[np.int64]  # (n,) index into `targets`
    targets: list[TargetKey]
    X: Array  # (n, n_features)
    sli: dict[str, Array]  # dimension -> (n,)
    labels: dict[str, Array]  # dimension -> (n,) 1/0/NaN
    persistence: dict[str, Array]  # dimension -> (n,) 1/0/NaN
    step: float
    horizon_s: float
    thresholds: dict[str, float]

    def select(self, mask: npt.NDArray[np.bool_]) -> Rows:
        return Rows(
            self.times[mask],
            self.target_index[mask],
            self.targets,
            self.X[mask],
            {d: v[mask] for d, v in self.sli.items()},
            {d: v[mask] for d, v in self.labels.items()},
            {d: v[mask] for d, v in self.persistence.items()},
            self.step,
            self.horizon_s,
            self.thresholds,
        )

    def __len__(self) -> int:
        return int(self.times.shape[0])


def horizon_steps(horizon_s: float, step: float) -> int:
    steps = round(horizon_s / step)
    if steps < 1:
        raise DataError(f"horizon {horizon_s:g}s is shorter than the step {step:g}s")
    return steps


def breach_labels(sli: Array, threshold: float, steps: int) -> Array:
    """1 if sli > threshold at any of the next `steps` evaluations, 0 if never (with >= half present), else NaN."""
    n = sli.shape[0]
    labels = np.full(n, np.nan)
    for i in range(n):
        future = sli[i + 1 : i + 1 + steps]
        if future.shape[0] < steps:
            continue
        present = future[np.isfinite(future)]
        if np.any(present > threshold):
            labels[i] = 1.0
        elif present.shape[0] * 2 >= steps:
            labels[i] = 0.0
    return labels


def persistence_forecast(sli: Array, threshold: float, steps: int) -> Array:
    """The state of the last horizon (t - H, t], which is what persistence predicts for (t, t + H]."""
    n = sli.shape[0]
    forecast = np.full(n, np.nan)
    for i in range(n):
        past = sli[max(0, i - steps + 1) : i + 1]
        if past.shape[0] < steps:
            continue
        present = past[np.isfinite(past)]
        if np.any(present > threshold):
            forecast[i] = 1.0
        elif present.shape[0] * 2 >= steps:
            forecast[i] = 0.0
    return forecast


def policy_thresholds(policy: Policy | None, overrides: Mapping[str, float] | None = None) -> dict[str, float]:
    """SLI thresholds: defaults, then the policy's vars sla_<dimension>_seconds, then explicit overrides."""
    thresholds = dict(DEFAULT_SLI_THRESHOLDS)
    if policy is not None:
        for dimension, var in THRESHOLD_VARS.items():
            raw = policy.vars.get(var)
            if raw is None:
                continue
            try:
                thresholds[dimension] = float(raw)
            except ValueError:
                try:
                    thresholds[dimension] = parse_duration(raw)
                except ValueError:
                    raise DataError(
                        f"policy {policy.name}: vars.{var}: expected seconds or a duration such as 500ms, got {raw!r}"
                    ) from None
    thresholds.update(overrides or {})
    return thresholds


def fetch_range(
    source: MetricsSource,
    queries: Mapping[str, str],
    group_by: Sequence[str],
    start: float,
    end: float,
    step: float,
    *,
    progress: bool = False,
) -> dict[str, dict[TargetKey, dict[int, float]]]:
    """One range query per name (per chunk of Prometheus' points limit); samples indexed by grid step."""
    chunks = range_chunks(start, end, step)
    out: dict[str, dict[TargetKey, dict[int, float]]] = {}
    with tqdm(total=len(queries) * len(chunks), unit="query", desc="range queries", disable=not progress) as bar:
        for name, query in queries.items():
            series: dict[TargetKey, dict[int, float]] = {}
            for chunk_start, chunk_end in chunks:
                result = source.range(query, group_by, chunk_start, chunk_end, step)
                if result.error is not None:
                    raise DataError(f"range query for {name!r} failed: {result.error}")
                for target, samples in result.series.items():
                    into = series.setdefault(target, {})
                    for timestamp, value in samples.items():
                        into[round((timestamp - start) / step)] = value
                bar.update(1)
            out[name] = series
    return out


def build_rows(
    source: MetricsSource,
    match: Mapping[str, str],
    group_by: Sequence[str],
    start: float,
    end: float,
    step: float,
    horizon_s: float,
    thresholds: Mapping[str, float],
    *,
    progress: bool = False,
) -> Rows:
    features = feature_queries(match, group_by)
    slis = {f"sli:{d}": q for d, q in sli_queries(match, group_by).items()}
    fetched = fetch_range(source, {**features, **slis}, group_by, start, end, step, progress=progress)
    targets = sorted({t for series in fetched.values() for t in series})
    if not targets:
        raise DataError(f"no target has any data between {start:.0f} and {end:.0f} (check --start/--end and match)")
    return rows_from_series(fetched, list(features), targets, start, end, step, horizon_s, thresholds)


def rows_from_series(
    fetched: Mapping[str, Mapping[TargetKey, Mapping[int, float]]],
    names: Sequence[str],
    targets: Sequence[TargetKey],
    start: float,
    end: float,
    step: float,
    horizon_s: float,
    thresholds: Mapping[str, float],
) -> Rows:
    """Pure: fetched series (indexed by grid step) -> rows, labels and persistence forecasts."""
    steps = horizon_steps(horizon_s, step)
    n_times = math.floor((end - start) / step + 1e-9) + 1
    grid = start + step * np.arange(n_times)
    blocks_x, blocks_t, blocks_i = [], [], []
    sli: dict[str, list[Array]] = {d: [] for d in DIMENSIONS}
    labels: dict[str, list[Array]] = {d: [] for d in DIMENSIONS}
    persist: dict[str, list[Array]] = {d: [] for d in DIMENSIONS}
    for index, target in enumerate(targets):
        matrix = np.full((n_times, len(names)), np.nan)
        for column, name in enumerate(names):
            for k, value in fetched.get(name, {}).get(target, {}).items():
                if 0 <= k < n_times and math.isfinite(value):
                    matrix[k, column] = value
        blocks_x.append(matrix)
        blocks_t.append(grid)
        blocks_i.append(np.full(n_times, index, dtype=np.int64))
        for dimension in DIMENSIONS:
            series = np.full(n_times, np.nan)
            for k, value in fetched.get(f"sli:{dimension}", {}).get(target, {}).items():
                if 0 <= k < n_times and math.isfinite(value):
                    series[k] = value
            sli[dimension].append(series)
            labels[dimension].append(breach_labels(series, thresholds[dimension], steps))
            persist[dimension].append(persistence_forecast(series, thresholds[dimension], steps))
    return Rows(
        np.concatenate(blocks_t),
        np.concatenate(blocks_i),
        list(targets),
        np.vstack(blocks_x),
        {d: np.concatenate(v) for d, v in sli.items()},
        {d: np.concatenate(v) for d, v in labels.items()},
        {d: np.concatenate(v) for d, v in persist.items()},
        step,
        horizon_s,
        dict(thresholds),
    )


@dataclass(frozen=True)
class Split:
    train: Rows
    validation: Rows
    test: Rows
    boundaries: tuple[float, float]  # (end of train period, end of validation period)


def time_split(rows: Rows, train: float = 0.6, validation: float = 0.2) -> Split:
    """Split by time, never shuffled: train < validation < test. The last horizon before each boundary is
    dropped from the earlier part (its labels would look across the boundary into the later part).

    The boundaries are quantiles of the times of rows with a known label, so a window made of several
    recorded stretches with gaps between them (no data, no labels) is split by its data, not its span."""
    labelled = np.zeros(len(rows), dtype=bool)
    for values in rows.labels.values():
        labelled |= np.isfinite(values)
    times = rows.times[labelled] if labelled.any() else rows.times
    last = float(rows.times.max())
    train_end = float(np.quantile(times, train)) if train < 1 else last
    val_end = float(np.quantile(times, train + validation)) if train + validation < 1 else last
    embargo = rows.horizon_s
    t = rows.times
    return Split(
        rows.select(t <= train_end - embargo),
        rows.select((t > train_end) & (t <= val_end - embargo)),
        rows.select(t > val_end),
        (train_end, val_end),
    )


# -- scores -----------------------------------------------------------------------------------------


def classification_scores(y: Array, alarm: npt.NDArray[np.bool_], probability: Array | None) -> dict[str, Any]:
    positives = y == 1
    tp = int(np.sum(alarm & positives))
    fp = int(np.sum(alarm & ~positives))
    fn = int(np.sum(~alarm & positives))
    tn = int(np.sum(~alarm & ~positives))
    n = max(1, tp + fp + fn + tn)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    scores: dict[str, Any] = {
        "rows": int(y.shape[0]),
        "positives": int(positives.sum()),
        "accuracy": (tp + tn) / n,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "roc_auc": None,
        "brier": None,
    }
    if probability is not None and 0 < positives.sum() < y.shape[0]:
        scores["roc_auc"] = float(roc_auc_score(y, probability))
    if probability is not None and y.shape[0]:
        scores["brier"] = float(brier_score_loss(y, probability))
    return scores


def breach_onsets(sli: Array, threshold: float) -> list[int]:
    """Indexes where the SLI starts breaching (over the threshold after a value at or under it)."""
    onsets = []
    previous_ok = False
    for i, value in enumerate(sli):
        if not math.isfinite(value):
            continue
        if value > threshold and previous_ok:
            onsets.append(i)
        previous_ok = value <= threshold
    return onsets


def lead_times(rows: Rows, dimension: str, alarm: npt.NDArray[np.bool_]) -> tuple[list[float], int]:
    """For each breach onset: how long before it the first alarm in the preceding horizon came (0 = at the
    onset); onsets with no alarm in [onset - H, onset] are misses. Returns (lead times, misses)."""
    steps = horizon_steps(rows.horizon_s, rows.step)
    leads: list[float] = []
    misses = 0
    for index in range(len(rows.targets)):
        mine = np.flatnonzero(rows.target_index == index)
        if mine.shape[0] == 0:
            continue
        order = mine[np.argsort(rows.times[mine])]
        series = rows.sli[dimension][order]
        alarms = alarm[order]
        for onset in breach_onsets(series, rows.thresholds[dimension]):
            window = alarms[max(0, onset - steps) : onset + 1]
            hits = np.flatnonzero(window)
            if hits.shape[0] == 0:
                misses += 1
                continue
            first = max(0, onset - steps) + int(hits[0])
            leads.append(float((onset - first) * rows.step))
    return leads, misses


def false_alarms_per_hour(rows: Rows, dimension: str, alarm: npt.NDArray[np.bool_]) -> float:
    """Alarm episodes (runs of alarms per target) with no breach from their start to H after their end."""
    steps = horizon_steps(rows.horizon_s, rows.step)
    false = 0
    hours = 0.0
    for index in range(len(rows.targets)):
        mine = np.flatnonzero(rows.target_index == index)
        if mine.shape[0] == 0:
            continue
        order = mine[np.argsort(rows.times[mine])]
        series = rows.sli[dimension][order]
        breaching = np.isfinite(series) & (series > rows.thresholds[dimension])
        alarms = alarm[order]
        hours += mine.shape[0] * rows.step / 3600.0
        i = 0
        while i < alarms.shape[0]:
            if not alarms[i]:
                i += 1
                continue
            j = i
            while j + 1 < alarms.shape[0] and alarms[j + 1]:
                j += 1
            if not np.any(breaching[i : j + steps + 1]):
                false += 1
            i = j + 1
    return false / hours if hours else 0.0


def summarize(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0, "p10": None, "p50": None, "p90": None, "mean": None}
    array = np.asarray(values)
    return {
        "count": int(array.shape[0]),
        "p10": float(np.percentile(array, 10)),
        "p50": float(np.percentile(array, 50)),
        "p90": float(np.percentile(array, 90)),
        "mean": float(array.mean()),
    }


def score_dimension(
    rows: Rows, dimension: str, alarm: npt.NDArray[np.bool_], probability: Array | None
) -> dict[str, Any]:
    """Scores over the rows whose label is known, lead times and false alarms over the whole timeline."""
    known = np.isfinite(rows.labels[dimension])
    y = rows.labels[dimension][known]
    scores = classification_scores(y, alarm[known], probability[known] if probability is not None else None)
    leads, misses = lead_times(rows, dimension, alarm)
    scores["lead_time_s"] = summarize(leads)
    scores["lead_times"] = leads
    scores["missed_breaches"] = misses
    scores["false_alarms_per_hour"] = false_alarms_per_hour(rows, dimension, alarm)
    return scores


def baseline_alarms(rows: Rows, dimension: str) -> dict[str, npt.NDArray[np.bool_]]:
    current = rows.sli[dimension]
    return {
        "reactive": np.isfinite(current) & (current > rows.thresholds[dimension]),
        "persistence": rows.persistence[dimension] == 1.0,
    }


@dataclass
class LatencyReport:
    per_target_p50_us: float
    per_target_p99_us: float
    batch_p50_ms: float
    batch_p99_ms: float
    batch_size: int
    single_p50_ms: float
    single_p99_ms: float
    extra: dict[str, Any] = field(default_factory=dict)


def prediction_latency(
    predict: Callable[[Array], Any], n_features: int, *, batch_size: int = 1000, repeats: int = 100, seed: int = 0
) -> LatencyReport:
    """Wall time of `predict` on a batch of `batch_size` targets (all dimensions) and on one target."""
    rng = np.random.default_rng(seed)
    batch = rng.normal(size=(batch_size, n_features))
    single = batch[:1]
    predict(batch)  # warm caches
    batches, singles = [], []
    for _ in range(repeats):
        began = time.perf_counter()
        predict(batch)
        batches.append(time.perf_counter() - began)
        began = time.perf_counter()
        predict(single)
        singles.append(time.perf_counter() - began)
    b50, b99 = np.percentile(batches, [50, 99])
    s50, s99 = np.percentile(singles, [50, 99])
    return LatencyReport(
        float(b50 / batch_size * 1e6),
        float(b99 / batch_size * 1e6),
        float(b50 * 1e3),
        float(b99 * 1e3),
        batch_size,
        float(s50 * 1e3),
        float(s99 * 1e3),
    )
