"""`tailguard train`: fit the SLA-breach model from Prometheus history and write a versioned artifact.

    tailguard train --prometheus URL --policy NAME --start T --end T --out DIR [--horizon 60s]
        [--rules PATH] [--step 15s] [--threshold cpu=1.0] [--seed 0] [--holdout 0.2] [--folds 5]
        [--model-class gbm|logistic|mlp]

The policy NAME (read from --rules, default rules/) gives the targets: its `targets.groupBy` and
`targets.match`. SLI thresholds (seconds; breach = SLI > threshold) come from the policy's vars
`sla_cpu_seconds`, `sla_gpu_seconds`, `sla_network_seconds` where present, else the defaults of
tailguard.predictors.features, and `--threshold DIM=SECONDS` overrides both.

The rows (one per evaluation time and target, from one range query per feature) are split by TIME, never
shuffled: the last --holdout share (default 20%) is held out and only scored (0: fit on everything and
evaluate on another window). On the rest, blocked time-series cross-validation (--folds contiguous time
blocks, one horizon of embargo around each) gives every row an out-of-fold prediction; per dimension a
gradient-boosted model (HistGradientBoostingClassifier; --model-class logistic or mlp: logistic regression
or the small MLP instead) and a logistic-regression baseline are fitted on all of it, calibrated (sigmoid)
on the out-of-fold decisions, and each decision threshold is picked on the calibrated out-of-fold
probabilities: among the cuts whose precision's 95% lower bound is >= 0.9, the best accuracy for cpu (its
target is accuracy) and the most recall (earliest alarms) for gpu and network.
The held-out scores go into the artifact's report.
Exit codes: 0 written, 1 the data or the source failed, 2 usage (bad arguments or policy).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import sklearn

from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.core.ports import MetricsSource
from tailguard.controller.kit.cli_args import UsageError, parse_command, time_window
from tailguard.controller.kit.durations import parse_duration
from tailguard.controller.kit.errors import InputError
from tailguard.predictors.artifact import DIMENSIONS, ModelArtifact, save_artifact, single_threaded
from tailguard.predictors.data import DataError, OpenSource, Rows, build_rows, policy_thresholds, time_split
from tailguard.predictors.evaluate import evaluate_rows, public_report, render_markdown
from tailguard.predictors.features import feature_hash, feature_names
from tailguard.predictors.modeling import (
    MODEL_CLASSES,
    choose_threshold,
    estimator,
    fit_calibrated_cv,
    logistic_estimator,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_HORIZON_S = 60.0
DEFAULT_HOLDOUT = 0.2
DEFAULT_FOLDS = 5
# The decision threshold must reach precision 0.9 at the one-sided 95% Wilson lower bound on the out-of-fold
# rows, not just on average: a cut chosen at the edge fell below 0.9 on a separate validation seed.
PRECISION_CONFIDENCE_Z = 1.645
# Among the cuts that reach that precision, each dimension's operating point serves its target in the issue:
# CPU is judged by accuracy (the cut with the best out-of-fold accuracy), GPU by F1 and all of them by lead
# time (the lowest cut: most recall, earliest alarms). On the validation seed the accuracy cut raised CPU
# accuracy by 0.005-0.02 over the recall cut; for GPU it lowered F1 and lead time (docs/sla-model.md).
THRESHOLD_OBJECTIVES = {"cpu": "accuracy", "gpu": "recall", "network": "recall"}


class TrainingError(InputError, ValueError):
    pass


def _known(rows: Rows, dimension: str) -> tuple[Any, Any]:
    labels = rows.labels[dimension]
    known = np.isfinite(labels)
    return rows.X[known], labels[known].astype(np.int64)


def fit_artifact(
    rows: Rows,
    *,
    match: Mapping[str, str],
    group_by: Sequence[str],
    seed: int = 0,
    now: float | None = None,
    holdout: float = DEFAULT_HOLDOUT,
    folds: int = DEFAULT_FOLDS,
    model_class: str = "gbm",
    features: Sequence[str] | None = None,
) -> tuple[ModelArtifact, dict[str, str]]:
    """Fit every dimension that has both classes in every cross-validation fold; returns (artifact, skipped).

    The last `holdout` share of the window (by time) is only scored. On the rest, blocked time-series
    cross-validation gives every row an out-of-fold probability: the sigmoid calibration and the decision
    threshold are chosen on those, and the model itself is fitted on all of it. `model_class` is one of
    tailguard.predictors.modeling.MODEL_CLASSES (the gradient-boosted trees by default); `features` a subset of the
    features (all by default), recorded in the artifact so that predictions pick those columns by name.
    """
    if model_class not in MODEL_CLASSES:
        raise TrainingError(f"unknown model class {model_class!r}; expected one of {', '.join(MODEL_CLASSES)}")
    every = feature_names()
    chosen = list(features) if features is not None else every
    unknown = [name for name in chosen if name not in every]
    if unknown or not chosen:
        raise TrainingError(f"unknown features {unknown} (expected some of the {len(every)} features)")
    if chosen != every:
        rows = dataclasses.replace(rows, X=rows.X[:, [every.index(name) for name in chosen]])
    split = time_split(rows, train=1.0 - holdout, validation=0.0)
    models: dict[str, Any] = {}
    baselines: dict[str, Any] = {}
    decision: dict[str, float] = {}
    baseline_cuts: dict[str, float] = {}
    skipped: dict[str, str] = {}
    train_times = split.train.times
    for dimension in DIMENSIONS:
        known = np.isfinite(split.train.labels[dimension])
        x_train, y_train = _known(split.train, dimension)
        if y_train.shape[0] == 0 or y_train.min() == y_train.max():
            skipped[dimension] = (
                f"the training part has only one class ({int(y_train.sum())} breaches in {y_train.shape[0]} rows)"
            )
            continue
        try:
            with single_threaded():
                gbm, gbm_oof = fit_calibrated_cv(
                    estimator(model_class, seed, x_train.shape[0]),
                    x_train,
                    y_train,
                    train_times[known],
                    rows.horizon_s,
                    folds,
                )
                logistic, logistic_oof = fit_calibrated_cv(
                    logistic_estimator(), x_train, y_train, train_times[known], rows.horizon_s, folds
                )
        except ValueError as failed:
            skipped[dimension] = str(failed)
            continue
        objective = THRESHOLD_OBJECTIVES[dimension]
        decision[dimension] = choose_threshold(
            gbm_oof, y_train, confidence_z=PRECISION_CONFIDENCE_Z, objective=objective
        )
        baseline_cuts[dimension] = choose_threshold(
            logistic_oof, y_train, confidence_z=PRECISION_CONFIDENCE_Z, objective=objective
        )
        models[dimension] = gbm
        baselines[dimension] = logistic
    if not models:
        raise TrainingError("no dimension could be trained: " + "; ".join(f"{d}: {r}" for d, r in skipped.items()))
    artifact = ModelArtifact(
        models=models,
        feature_names=chosen,
        feature_hash=feature_hash(chosen),
        horizon_s=rows.horizon_s,
        thresholds=dict(rows.thresholds),
        decision_thresholds=decision,
        sklearn_version=sklearn.__version__,
        trained_window=(float(rows.times.min()), float(split.boundaries[0])),
        created_at=time.time() if now is None else now,
        report={},
        baselines=baselines,
    )
    held_out = evaluate_rows(artifact, split.test, latency_repeats=20) if len(split.test) else None
    artifact.report = {
        "targets": {"match": dict(match), "groupBy": list(group_by)},
        "model_class": model_class,
        "step_s": rows.step,
        "baseline_thresholds": baseline_cuts,
        "threshold_objectives": {d: THRESHOLD_OBJECTIVES[d] for d in decision},
        "split": {
            "train_end": split.boundaries[0],
            "folds": folds,
            "rows": {"train": len(split.train), "test": len(split.test)},
        },
        "skipped": skipped,
        "held_out": _strip_rows(public_report(held_out)) if held_out is not None else None,
    }
    return artifact, skipped


def _strip_rows(report: dict[str, Any]) -> dict[str, Any]:
    for entry in report.get("dimensions", {}).values():
        for scores in entry["methods"].values():
            scores.pop("lead_times", None)
    return report


def _threshold(text: str) -> tuple[str, float]:
    dimension, _, value = text.partition("=")
    if dimension not in DIMENSIONS:
        raise argparse.ArgumentTypeError(f"expected DIM=SECONDS with DIM one of {', '.join(DIMENSIONS)}, got {text!r}")
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected DIM=SECONDS (a number), got {text!r}") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"threshold must be positive, got {text!r}")
    return dimension, seconds


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tailguard train", description="Train the SLA-breach model.")
    parser.add_argument("--prometheus", required=True, metavar="URL")
    parser.add_argument("--policy", required=True, metavar="NAME", help="policy whose targets define the rows")
    parser.add_argument("--rules", action="append", default=None, metavar="PATH", help="policies (default: rules/)")
    parser.add_argument("--start", required=True, metavar="T", help="epoch seconds or RFC3339")
    parser.add_argument("--end", required=True, metavar="T", help="epoch seconds or RFC3339")
    parser.add_argument("--out", required=True, type=Path, metavar="DIR")
    parser.add_argument("--horizon", default="60s", metavar="DURATION", help="label horizon H (default 60s)")
    parser.add_argument("--step", default="15s", metavar="DURATION", help="evaluation step (default 15s)")
    parser.add_argument("--threshold", action="append", type=_threshold, default=[], metavar="DIM=SECONDS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--holdout",
        type=float,
        default=DEFAULT_HOLDOUT,
        help="share of the window (last, by time) only scored, never fitted (default 0.2; 0 = fit on all)",
    )
    parser.add_argument("--folds", type=int, default=DEFAULT_FOLDS, help="blocked cross-validation folds (default 5)")
    parser.add_argument(
        "--model-class",
        choices=MODEL_CLASSES,
        default="gbm",
        help="gradient-boosted trees (default), logistic regression or the small MLP (docs/sla-model.md)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per Prometheus request")
    return parser


def main(argv: Sequence[str], open_source: OpenSource) -> int:
    """`tailguard train`; `open_source` opens the metrics source to read (the app's: controller/app/ml_commands.py)."""
    args = parse_command(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        start, end = time_window(args)
        try:
            horizon, step = parse_duration(args.horizon), parse_duration(args.step)
        except ValueError as bad:
            raise UsageError(f"--horizon/--step: {bad}") from None
        if not 0 <= args.holdout < 1 or args.folds < 2:
            raise UsageError(f"--holdout must be in [0, 1) and --folds at least 2 (got {args.holdout}, {args.folds})")
        if step <= 0 or horizon < step:
            raise UsageError(f"--horizon ({args.horizon}) must be at least one --step ({args.step}) > 0")
        opened = open_source(args.prometheus, args.timeout)
    except UsageError as bad:
        print(f"tailguard train: error: {bad}", file=sys.stderr)
        return EXIT_USAGE
    with opened as source:
        return _train(args, source, start, end, horizon, step)


def _train(
    args: argparse.Namespace, source: MetricsSource, start: float, end: float, horizon: float, step: float
) -> int:
    rules = args.rules or ["rules"]
    loaded, errors = load_policies(rules)
    for error in errors:
        print(f"tailguard train: {error}", file=sys.stderr)
    chosen = [p for p in loaded if p.policy.name == args.policy]
    if errors or not chosen:
        if not errors:
            names = ", ".join(sorted(p.policy.name for p in loaded)) or "none"
            print(
                f"tailguard train: error: no policy named {args.policy!r} under {', '.join(rules)} (found: {names})",
                file=sys.stderr,
            )
        return EXIT_USAGE
    policy = chosen[0].policy
    try:
        thresholds = policy_thresholds(policy, dict(args.threshold))
    except DataError as bad:
        print(f"tailguard train: error: {bad}", file=sys.stderr)
        return EXIT_USAGE
    try:
        rows = build_rows(
            source, policy.targets.match, policy.targets.groupBy, start, end, step, horizon, thresholds, progress=True
        )
        artifact, skipped = fit_artifact(
            rows,
            match=policy.targets.match,
            group_by=policy.targets.groupBy,
            seed=args.seed,
            holdout=args.holdout,
            folds=args.folds,
            model_class=args.model_class,
        )
    except (DataError, TrainingError) as bad:
        print(f"tailguard train: error: {bad}", file=sys.stderr)
        return EXIT_FAILED
    directory = save_artifact(artifact, args.out)
    for dimension, reason in skipped.items():
        print(f"tailguard train: {dimension}: not trained: {reason}", file=sys.stderr)
    held_out = artifact.report.get("held_out")
    if held_out:
        print(render_markdown(held_out, "Held-out slice of the training window"))
    print(f"wrote {directory} (dimensions {', '.join(artifact.dimensions)}; features {artifact.feature_hash[:12]})")
    return EXIT_OK
