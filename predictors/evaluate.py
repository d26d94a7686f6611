"""`tailguard evaluate`: score a trained SLA model on a window of Prometheus history, side by side with baselines.

    tailguard evaluate --model DIR --prometheus URL --start T --end T [--out DIR]

Per dimension: accuracy, precision, recall, F1, ROC-AUC and Brier score (rows whose label is known), lead
time before each breach onset as a distribution, false alarms per hour, for the model (at its decision
threshold), the logistic-regression baseline, the reactive threshold rule and persistence; prediction
latency P50/P99 per target and per batch of 1000 targets. Writes OUT/report.md, OUT/report.json and PNG
plots (reliability curve, lead-time histogram, timeline of predicted probability over the real SLI).
Evaluate on a window that was NOT part of the training window to get held-out figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tailguard.controller.kit.cli_args import UsageError, parse_command, time_window
from tailguard.predictors.artifact import (
    DIMENSIONS,
    ArtifactError,
    ModelArtifact,
    load_artifact,
    model_columns,
    predict_proba,
    single_threaded,
)
from tailguard.predictors.data import (
    DataError,
    OpenSource,
    Rows,
    baseline_alarms,
    build_rows,
    prediction_latency,
    score_dimension,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
METHODS = ("model", "logistic", "reactive", "persistence")


def evaluate_rows(artifact: ModelArtifact, rows: Rows, *, latency_repeats: int = 100) -> dict[str, Any]:
    """Scores of the model and every baseline per dimension, plus the per-row probabilities for plots."""
    probabilities = predict_proba(artifact, rows.X) if len(rows) else {}
    baseline_thresholds = artifact.report.get("baseline_thresholds", {})
    dimensions: dict[str, Any] = {}
    for dimension in artifact.dimensions:
        p = probabilities[dimension]
        methods: dict[str, Any] = {
            "model": score_dimension(rows, dimension, p >= artifact.decision_thresholds[dimension], p)
        }
        baseline = artifact.baselines.get(dimension)
        if baseline is not None and len(rows):
            with single_threaded():
                lp = np.asarray(baseline.predict_proba(model_columns(artifact, rows.X))[:, 1], dtype=np.float64)
            cut = float(baseline_thresholds.get(dimension, 0.5))
            methods["logistic"] = score_dimension(rows, dimension, lp >= cut, lp)
        for name, alarm in baseline_alarms(rows, dimension).items():
            methods[name] = score_dimension(rows, dimension, alarm, None)
        dimensions[dimension] = {
            "sli_threshold_s": rows.thresholds[dimension],
            "decision_threshold": artifact.decision_thresholds[dimension],
            "methods": methods,
        }
    latency = prediction_latency(
        lambda X: predict_proba(artifact, X),
        len(artifact.feature_names),
        repeats=latency_repeats,
    )
    return {
        "window": [float(rows.times.min()), float(rows.times.max())] if len(rows) else None,
        "rows": len(rows),
        "targets": len(rows.targets),
        "horizon_s": rows.horizon_s,
        "step_s": rows.step,
        "dimensions": dimensions,
        "latency": latency.__dict__,
        "_probabilities": probabilities,
    }


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render_markdown(report: dict[str, Any], title: str = "SLA model evaluation") -> str:
    lines = [f"# {title}", ""]
    if report.get("window"):
        start, end = report["window"]
        lines.append(
            f"Window {_iso(start)} .. {_iso(end)}; {report['rows']} rows, {report['targets']} target(s), "
            f"horizon {report['horizon_s']:g}s, step {report['step_s']:g}s."
        )
        lines.append("")
    lines += [
        (
            "| dimension | method | accuracy | precision | recall | F1 | ROC-AUC | Brier | lead p50 (s) | lead p10 (s) "
            "| missed | false alarms/h |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dimension, entry in report["dimensions"].items():
        for method in METHODS:
            s = entry["methods"].get(method)
            if s is None:
                continue
            lead = s["lead_time_s"]
            lines.append(
                f"| {dimension} | {method} | {_fmt(s['accuracy'])} | {_fmt(s['precision'])} | {_fmt(s['recall'])} "
                f"| {_fmt(s['f1'])} | {_fmt(s['roc_auc'])} | {_fmt(s['brier'])} | {_fmt(lead['p50'], 0)} "
                f"| {_fmt(lead['p10'], 0)} | {s['missed_breaches']} | {_fmt(s['false_alarms_per_hour'], 2)} |"
            )
    lines.append("")
    lines.append(
        "Labelled rows / positives per dimension: "
        + ", ".join(
            f"{d} {e['methods']['model']['rows']}/{e['methods']['model']['positives']} "
            f"(SLI > {e['sli_threshold_s']:g}s, alarm at p >= {e['decision_threshold']:.3f})"
            for d, e in report["dimensions"].items()
        )
    )
    latency = report["latency"]
    lines += [
        "",
        (
            f"Prediction latency (all dimensions, this machine): batch of {latency['batch_size']} targets "
            f"P50 {latency['batch_p50_ms']:.2f} ms / P99 {latency['batch_p99_ms']:.2f} ms = "
            f"P50 {latency['per_target_p50_us']:.2f} us / P99 {latency['per_target_p99_us']:.2f} us per target; "
            f"one target alone P50 {latency['single_p50_ms']:.2f} ms / P99 {latency['single_p99_ms']:.2f} ms."
        ),
        "",
        (
            "Lead time: for each breach onset, how long before it the first alarm in the preceding horizon came "
            "(0 = alarm at the onset, which is all a reactive rule can do); `missed` = onsets with no alarm in "
            "[onset - H, onset]. False alarms: alarm episodes followed by no breach within H."
        ),
    ]
    return "\n".join(lines) + "\n"


def write_plots(rows: Rows, report: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.calibration import calibration_curve

    probabilities: dict[str, npt.NDArray[np.float64]] = report["_probabilities"]
    written: list[Path] = []
    figure, axes = plt.subplots(figsize=(6, 5))
    axes.plot([0, 1], [0, 1], "k:", label="perfectly calibrated")
    for dimension, p in probabilities.items():
        known = np.isfinite(rows.labels[dimension])
        y = rows.labels[dimension][known]
        if 0 < y.sum() < y.shape[0]:
            true, predicted = calibration_curve(y, p[known], n_bins=10, strategy="quantile")
            axes.plot(predicted, true, "o-", label=dimension)
    axes.set_xlabel("predicted breach probability")
    axes.set_ylabel("observed breach frequency")
    axes.set_title("Reliability (held-out rows)")
    axes.legend()
    written.append(out / "reliability.png")
    figure.savefig(written[-1], dpi=90)
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(6, 4))
    for dimension, entry in report["dimensions"].items():
        leads = entry["methods"]["model"]["lead_times"]
        if leads:
            axes.hist(
                leads, bins=list(np.arange(0, rows.horizon_s + rows.step * 2, rows.step)), alpha=0.5, label=dimension
            )
    axes.set_xlabel("lead time before the breach onset (s)")
    axes.set_ylabel("breaches")
    axes.set_title("Lead time of the first alarm")
    axes.legend()
    written.append(out / "lead-time.png")
    figure.savefig(written[-1], dpi=90)
    plt.close(figure)

    dims = list(probabilities)
    figure, all_axes = plt.subplots(len(dims), 1, figsize=(10, 2.6 * max(1, len(dims))), squeeze=False)
    mine = np.flatnonzero(rows.target_index == 0) if len(rows) else np.zeros(0, dtype=np.int64)
    order = mine[np.argsort(rows.times[mine])]
    minutes = (rows.times[order] - rows.times[order][0]) / 60.0 if order.shape[0] else np.zeros(0)
    for axes, dimension in zip(all_axes[:, 0], dims, strict=True):
        axes.plot(minutes, rows.sli[dimension][order], color="tab:blue", lw=0.8, label=f"{dimension} SLI (s)")
        axes.axhline(rows.thresholds[dimension], color="tab:blue", ls="--", lw=0.8)
        axes.set_ylabel("SLI (s)")
        twin = axes.twinx()
        twin.plot(minutes, probabilities[dimension][order], color="tab:red", lw=0.8, label="P(breach within H)")
        twin.set_ylim(0, 1.05)
        twin.set_ylabel("probability")
        axes.set_title(f"{dimension}: predicted probability (red) over the real SLI (blue, dashed = threshold)")
    all_axes[-1, 0].set_xlabel("minutes")
    figure.tight_layout()
    written.append(out / "timeline.png")
    figure.savefig(written[-1], dpi=80)
    plt.close(figure)
    return written


def public_report(report: dict[str, Any]) -> dict[str, Any]:
    """The JSON-safe report: no per-row arrays."""
    return {k: v for k, v in report.items() if not k.startswith("_")}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tailguard evaluate", description="Evaluate a trained SLA model.")
    parser.add_argument("--model", required=True, type=Path, metavar="DIR")
    parser.add_argument("--prometheus", required=True, metavar="URL")
    parser.add_argument("--start", required=True, metavar="T", help="epoch seconds or RFC3339")
    parser.add_argument("--end", required=True, metavar="T", help="epoch seconds or RFC3339")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR", help="report directory (default: stdout)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per Prometheus request")
    parser.add_argument("--trusted-type", action="append", default=[], help="extra type to trust in the model file")
    return parser


def main(argv: Sequence[str], open_source: OpenSource) -> int:
    """`tailguard evaluate`; `open_source` opens the metrics source (the app's: controller/app/ml_commands.py)."""
    args = parse_command(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        start, end = time_window(args)
    except UsageError as bad:
        print(f"tailguard evaluate: error: {bad}", file=sys.stderr)
        return EXIT_USAGE
    try:
        artifact = load_artifact(args.model, trusted_types=args.trusted_type)
    except ArtifactError as bad:
        print(f"tailguard evaluate: error: {bad}", file=sys.stderr)
        return EXIT_FAILED
    targets = artifact.report.get("targets", {})
    with open_source(args.prometheus, args.timeout) as source:
        try:
            rows = build_rows(
                source,
                targets.get("match", {}),
                targets.get("groupBy", ["service"]),
                start,
                end,
                float(artifact.report.get("step_s", 15.0)),
                artifact.horizon_s,
                artifact.thresholds,
                progress=True,
            )
        except DataError as bad:
            print(f"tailguard evaluate: error: {bad}", file=sys.stderr)
            return EXIT_FAILED
    report = evaluate_rows(artifact, rows)
    markdown = render_markdown(report)
    if args.out is None:
        print(markdown)
        return EXIT_OK
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(markdown, encoding="utf-8")
    (args.out / "report.json").write_text(json.dumps(public_report(report), indent=2) + "\n", encoding="utf-8")
    plots = write_plots(rows, report, args.out)
    print(markdown)
    print(f"wrote {args.out / 'report.md'}, report.json and {', '.join(p.name for p in plots)}")
    return EXIT_OK


__all__ = ["DIMENSIONS", "evaluate_rows", "main", "render_markdown", "write_plots"]
