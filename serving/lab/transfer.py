"""The SLA model on recorded real-vLLM history: trained elsewhere (transfer) or on the recording's first part.

Two experiments, each scored side by side with the baselines on the same rows:
- transfer: fit on the simulator's history (tailguard.serving.lab.dataset generate, other seeds), evaluate on the whole
  real recording;
- in-recording: fit on the first `train_share` of the recording (by time, the last horizon before the split
  dropped: its labels look across it), evaluate on the rest.

Per experiment and dimension (the queue-time SLI `cpu`, and the end-to-end P99 as a second view): precision,
recall, F1 and lead time before each breach onset for
- model: the gradient-boosted model at the decision threshold it chose on its own training data;
- model@p>=0.9 (oracle cut): the lowest probability cut that reaches precision 0.9 on the evaluated rows
  themselves, i.e. the best lead time the model's ranking allows at that precision (an upper bound: the
  cut is picked on the answers);
- reactive: the current SLI over its threshold (what an alert rule does);
- reactive queue>20: the `queue-scale` example's rule, requests waiting (all replicas) over 20;
- persistence: the last horizon's state repeats.
For the e2e view the model's alarm is its queue-time (cpu) alarm, scored against e2e P99 breaches: the model
has no e2e dimension, so this asks whether the queue alarm warns of the latency users see.

Pure apart from the metrics sources it is given (predictors use only the controller's kit and core).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tailguard.controller import MetricsSource
from tailguard.predictors.artifact import ModelArtifact, predict_proba
from tailguard.predictors.data import (
    Rows,
    baseline_alarms,
    breach_labels,
    build_rows,
    fetch_range,
    horizon_steps,
    persistence_forecast,
    score_dimension,
    time_split,
)
from tailguard.predictors.evaluate import public_report
from tailguard.predictors.features import _quantile, feature_names, render
from tailguard.predictors.train import fit_artifact

Array = npt.NDArray[np.float64]
E2E_SLI = _quantile(0.99, "vllm:e2e_request_latency_seconds")
QUEUE_RULE_WAITING = 20.0
TARGET_PRECISION = 0.9
METHOD_ORDER = ("model", "model@p>=0.9 (oracle cut)", "reactive", "reactive queue>20", "persistence")


@dataclass(frozen=True)
class Window:
    """A stretch of history in one metrics source."""

    source: MetricsSource
    start: float
    end: float


@dataclass(frozen=True)
class Settings:
    match: Mapping[str, str]
    group_by: Sequence[str]
    step_s: float
    horizon_s: float
    thresholds: Mapping[str, float]  # SLI thresholds per model dimension (cpu = queue time)
    e2e_threshold_s: float
    seed: int = 0
    folds: int = 5


def read_rows(window: Window, settings: Settings) -> tuple[Rows, Array]:
    """The labelled rows of a window and, aligned with them, the e2e P99 SLI (NaN where absent)."""
    rows = build_rows(
        window.source,
        settings.match,
        settings.group_by,
        window.start,
        window.end,
        settings.step_s,
        settings.horizon_s,
        settings.thresholds,
    )
    query = render(E2E_SLI, settings.match, settings.group_by)
    fetched = fetch_range(window.source, {"e2e": query}, settings.group_by, window.start, window.end, settings.step_s)
    e2e = np.full(len(rows), np.nan)
    for index, target in enumerate(rows.targets):
        mine = np.flatnonzero(rows.target_index == index)
        for k, value in fetched["e2e"].get(target, {}).items():
            position = mine[(np.round((rows.times[mine] - window.start) / settings.step_s)).astype(np.int64) == k]
            e2e[position] = value
    return rows, e2e


def with_sli(rows: Rows, dimension: str, series: Array, threshold: float) -> Rows:
    """The rows with `dimension`'s SLI replaced by `series` (labels and persistence recomputed per target)."""
    steps = horizon_steps(rows.horizon_s, rows.step)
    labels = np.full(len(rows), np.nan)
    persistence = np.full(len(rows), np.nan)
    for index in range(len(rows.targets)):
        mine = np.flatnonzero(rows.target_index == index)
        order = mine[np.argsort(rows.times[mine])]
        labels[order] = breach_labels(series[order], threshold, steps)
        persistence[order] = persistence_forecast(series[order], threshold, steps)
    return Rows(
        rows.times,
        rows.target_index,
        rows.targets,
        rows.X,
        {**rows.sli, dimension: series},
        {**rows.labels, dimension: labels},
        {**rows.persistence, dimension: persistence},
        rows.step,
        rows.horizon_s,
        {**rows.thresholds, dimension: threshold},
    )


def oracle_cut(probability: Array, labels: Array, precision: float = TARGET_PRECISION) -> float | None:
    """The lowest cut whose alarms reach `precision` on these rows (None when no cut does)."""
    known = np.isfinite(labels)
    p, y = probability[known], labels[known] == 1
    for cut in np.unique(np.round(p, 4)):
        alarm = p >= cut
        if alarm.sum() and (alarm & y).sum() / alarm.sum() >= precision:
            return float(cut)
    return None


def score_methods(rows: Rows, dimension: str, probability: Array | None, decision: float | None) -> dict[str, Any]:
    """Every method's scores on `dimension` of these rows (the model's only when it has a probability)."""
    methods: dict[str, Any] = {}
    if probability is not None and decision is not None:
        methods["model"] = score_dimension(rows, dimension, probability >= decision, probability)
        methods["model"]["cut"] = decision
        cut = oracle_cut(probability, rows.labels[dimension])
        if cut is not None:
            name = METHOD_ORDER[1]
            methods[name] = score_dimension(rows, dimension, probability >= cut, probability)
            methods[name]["cut"] = cut
    baselines = baseline_alarms(rows, dimension)
    methods["reactive"] = score_dimension(rows, dimension, baselines["reactive"], None)
    waiting = rows.X[:, feature_names().index("queue_waiting")]
    methods["reactive queue>20"] = score_dimension(
        rows, dimension, np.isfinite(waiting) & (waiting > QUEUE_RULE_WAITING), None
    )
    methods["persistence"] = score_dimension(rows, dimension, baselines["persistence"], None)
    for scores in methods.values():
        scores.pop("lead_times", None)
    return methods


def evaluate_experiment(
    name: str, artifact: ModelArtifact, rows: Rows, e2e: Array, settings: Settings, skipped: Mapping[str, str]
) -> dict[str, Any]:
    """Scores of the fitted model and the baselines on the evaluated rows: queue time (cpu) and e2e P99."""
    probabilities = predict_proba(artifact, rows.X) if len(rows) else {}
    dimensions: dict[str, Any] = {}
    cpu_p = probabilities.get("cpu")
    cpu_cut = artifact.decision_thresholds.get("cpu")
    views = {
        "queue time P99 (cpu)": (rows, "cpu", settings.thresholds["cpu"]),
        "e2e P99": (with_sli(rows, "cpu", e2e, settings.e2e_threshold_s), "cpu", settings.e2e_threshold_s),
    }
    for view, (view_rows, dimension, threshold) in views.items():
        known = np.isfinite(view_rows.labels[dimension])
        dimensions[view] = {
            "sli_threshold_s": threshold,
            "labelled_rows": int(known.sum()),
            "positives": int(np.nansum(view_rows.labels[dimension])),
            "onsets": None,
            "methods": score_methods(view_rows, dimension, cpu_p, cpu_cut),
        }
    return {
        "experiment": name,
        "window": [float(rows.times.min()), float(rows.times.max())] if len(rows) else None,
        "rows": len(rows),
        "trained_dimensions": artifact.dimensions,
        "trained_window": list(artifact.trained_window),
        "decision_thresholds": dict(artifact.decision_thresholds),
        "skipped": dict(skipped),
        "dimensions": dimensions,
    }


def fit(rows: Rows, settings: Settings) -> tuple[ModelArtifact, dict[str, str]]:
    """Fit on all of `rows` (no held-out slice: the experiment's evaluation rows are the held-out data)."""
    return fit_artifact(
        rows, match=settings.match, group_by=settings.group_by, seed=settings.seed, holdout=0.0, folds=settings.folds
    )


def transfer(
    train: Sequence[Rows], rows: Rows, e2e: Array, settings: Settings, name: str = "transfer: simulator -> real vLLM"
) -> dict[str, Any]:
    """Fit on the training rows (the simulator's, or a whole other recording), evaluate on all of `rows`."""
    artifact, skipped = fit(concat_rows(train), settings)
    return evaluate_experiment(name, artifact, rows, e2e, settings, skipped)


def in_recording(rows: Rows, e2e: Array, settings: Settings, train_share: float = 0.6) -> dict[str, Any]:
    """Fit on the recording's first `train_share` (by time), evaluate on the rest."""
    split = time_split(rows, train=train_share, validation=0.0)
    artifact, skipped = fit(split.train, settings)
    test_mask = rows.times > split.boundaries[0]
    name = f"real: first {train_share:.0%} -> last {1 - train_share:.0%}"
    return evaluate_experiment(name, artifact, rows.select(test_mask), e2e[test_mask], settings, skipped)


def concat_rows(parts: Sequence[Rows]) -> Rows:
    """Rows of several windows as one set (targets renumbered: the same service in two windows is two targets)."""
    if len(parts) == 1:
        return parts[0]
    offsets = np.cumsum([0] + [len(p.targets) for p in parts[:-1]])
    first = parts[0]
    return Rows(
        np.concatenate([p.times for p in parts]),
        np.concatenate([p.target_index + o for p, o in zip(parts, offsets, strict=True)]),
        [t for p in parts for t in p.targets],
        np.vstack([p.X for p in parts]),
        {d: np.concatenate([p.sli[d] for p in parts]) for d in first.sli},
        {d: np.concatenate([p.labels[d] for p in parts]) for d in first.labels},
        {d: np.concatenate([p.persistence[d] for p in parts]) for d in first.persistence},
        first.step,
        first.horizon_s,
        first.thresholds,
    )


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render_markdown(experiments: Sequence[Mapping[str, Any]]) -> str:
    lines: list[str] = []
    for experiment in experiments:
        lines += [f"### {experiment['experiment']}", ""]
        lines.append(
            f"{experiment['rows']} evaluated rows; model dimensions {', '.join(experiment['trained_dimensions'])}; "
            f"decision cut (cpu) {_fmt(experiment['decision_thresholds'].get('cpu'))}"
            + (f"; not trained: {experiment['skipped']}" if experiment["skipped"] else "")
        )
        lines.append("")
        lines.append(
            "| SLI | method | precision | recall | F1 | lead p50 (s) | lead p10 (s) | onsets warned | missed "
            "| false alarms/h |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for view, entry in experiment["dimensions"].items():
            label = f"{view} > {entry['sli_threshold_s']:g}s ({entry['positives']}/{entry['labelled_rows']} rows +)"
            for method in METHOD_ORDER:
                s = entry["methods"].get(method)
                if s is None:
                    continue
                lead = s["lead_time_s"]
                lines.append(
                    f"| {label} | {method} | {_fmt(s['precision'])} | {_fmt(s['recall'])} | {_fmt(s['f1'])} "
                    f"| {_fmt(lead['p50'], 0)} | {_fmt(lead['p10'], 0)} | {lead['count']} | {s['missed_breaches']} "
                    f"| {_fmt(s['false_alarms_per_hour'], 1)} |"
                )
        lines.append("")
    return "\n".join(lines)


def report_json(experiments: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [public_report(dict(e)) for e in experiments]
