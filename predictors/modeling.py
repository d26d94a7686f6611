"""Model fitting and threshold choice, shared by `tailguard train` and the tests. Pure: arrays in, models out."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.base import clone
from sklearn.calibration import CalibratedClassifierCV
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.frozen import FrozenEstimator
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

Array = npt.NDArray[np.float64]
MIN_PRECISION = 0.9


def gbm_estimator(seed: int = 0, rows: int = 2000) -> HistGradientBoostingClassifier:
    """The unfitted gradient-boosted model for a training set of about `rows` rows. HGB handles NaN natively
    (missing DCGM, no traffic)."""
    # Shallow trees and large leaves (2% of the rows, 5..40): a few thousand rows from a handful of targets,
    # strongly autocorrelated in time; deeper trees fit the training services' idiosyncrasies (blocked
    # cross-validation, docs/sla-model.md), while a short window still needs leaves small enough to split.
    return HistGradientBoostingClassifier(
        max_iter=150,
        learning_rate=0.05,
        max_depth=3,
        min_samples_leaf=int(np.clip(rows // 50, 5, 40)),
        l2_regularization=1.0,
        random_state=seed,
    )


def logistic_estimator() -> Pipeline:
    """The unfitted linear baseline: median imputation, standardisation, logistic regression."""
    return Pipeline(
        [
            ("impute", SimpleImputer(strategy="median", keep_empty_features=True)),
            ("scale", StandardScaler()),
            ("logistic", LogisticRegression(max_iter=2000, C=1.0)),
        ]
    )


def mlp_estimator(seed: int = 0) -> Pipeline:
    """The unfitted small MLP of the seed design (000 section 4.1) over the normalised features: median imputation,
    standardisation, one hidden layer of 16 ReLU units, L2 penalty, L-BFGS (the solver for a few hundred rows)."""
    return Pipeline(
        [
            ("impute", SimpleImputer(strategy="median", keep_empty_features=True)),
            ("scale", StandardScaler()),
            (
                "mlp",
                MLPClassifier(hidden_layer_sizes=(16,), alpha=1e-2, solver="lbfgs", max_iter=1000, random_state=seed),
            ),
        ]
    )


# The model classes `fit_artifact` can train (its `model_class`): the shipped gradient-boosted trees, logistic
# regression and the small MLP, each calibrated and with its cut chosen on its own out-of-fold probabilities.
MODEL_CLASSES = ("gbm", "logistic", "mlp")


def estimator(model_class: str, seed: int = 0, rows: int = 2000) -> Any:
    """The unfitted estimator of a model class (MODEL_CLASSES)."""
    if model_class == "gbm":
        return gbm_estimator(seed, rows)
    if model_class == "logistic":
        return logistic_estimator()
    if model_class == "mlp":
        return mlp_estimator(seed)
    raise ValueError(f"unknown model class {model_class!r}; expected one of {', '.join(MODEL_CLASSES)}")


def fit_gbm(X: Array, y: npt.NDArray[np.int64], seed: int = 0) -> HistGradientBoostingClassifier:
    return gbm_estimator(seed, X.shape[0]).fit(X, y)


def fit_logistic(X: Array, y: npt.NDArray[np.int64]) -> Pipeline:
    return logistic_estimator().fit(X, y)


def blocked_folds(
    times: Array, horizon_s: float, folds: int = 5
) -> list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
    """Blocked time-series cross-validation: `folds` contiguous time blocks (equal numbers of rows), each
    tested by a model trained on the other blocks minus an embargo of one horizon on both sides of the test
    block (a label there looks into the test block, or a test label looks into it). The test blocks
    partition the rows, so every row gets exactly one out-of-fold prediction."""
    order = np.argsort(times, kind="stable")
    cuts = [times[order[round(i * len(order) / folds)]] for i in range(1, folds)] if len(order) else []
    edges = [-np.inf, *cuts, np.inf]
    splits = []
    for low, high in itertools.pairwise(edges):
        test = (times >= low) & (times < high)
        if not test.any():
            continue
        first, last = times[test].min(), times[test].max()
        train = ~test & ((times < first - horizon_s) | (times > last + horizon_s))
        splits.append((np.flatnonzero(train).astype(np.int64), np.flatnonzero(test).astype(np.int64)))
    return splits


def fill_empty_columns(X: Array) -> Array:
    """Columns with no value at all (the DCGM features of a host without a GPU) as 0.0; the rest unchanged.

    HistGradientBoostingClassifier's binning fails on a column that is entirely NaN ("window shape cannot be
    larger than input array shape", sklearn 1.9): a real vLLM recording on the CPU has no DCGM series. A
    constant column is never split on, so the fitted trees ignore it and the feature set (and its hash) stays.
    """
    empty = ~np.isfinite(X).any(axis=0)
    if not empty.any():
        return X
    filled = X.copy()
    filled[:, empty] = 0.0
    return filled


def fit_calibrated_cv(
    model: Any, X: Array, y: npt.NDArray[np.int64], times: Array, horizon_s: float, folds: int = 5
) -> tuple[CalibratedClassifierCV, Array]:
    """Fit `model` on all rows, with a sigmoid calibration learnt from blocked out-of-fold decisions.

    Returns (calibrated model, calibrated out-of-fold probabilities). The decision threshold is chosen on
    those probabilities: every row is scored by a model that did not see its time block, so the threshold
    and the calibration come from the whole training window instead of a small validation slice.
    Raises ValueError when a fold's training part has one class only (too few breaches to cross-validate).
    """
    X = fill_empty_columns(X)
    splits = blocked_folds(times, horizon_s, folds)
    for train, _ in splits:
        if train.shape[0] == 0 or y[train].min() == y[train].max():
            raise ValueError(f"a cross-validation fold has one class only ({int(y.sum())} breaches in {len(y)} rows)")
    calibrated = CalibratedClassifierCV(model, method="sigmoid", cv=splits, ensemble=False).fit(X, y)
    # The same folds again for the out-of-fold probabilities (CalibratedClassifierCV does not expose its own).
    raw = np.zeros(y.shape[0])
    for train, test in splits:
        raw[test] = _decision(clone(model).fit(X[train], y[train]), X[test])
    calibrator = calibrated.calibrated_classifiers_[0].calibrators[0]
    return calibrated, np.asarray(calibrator.predict(raw), dtype=np.float64)


def _decision(model: Any, X: Array) -> Array:
    # What CalibratedClassifierCV calibrates: the decision function, or the probability where there is none (MLP).
    if hasattr(model, "decision_function"):
        return np.asarray(model.decision_function(X), dtype=np.float64)
    return np.asarray(model.predict_proba(X)[:, 1], dtype=np.float64)


def calibrate(model: Any, X_val: Array, y_val: npt.NDArray[np.int64]) -> CalibratedClassifierCV:
    """Sigmoid (Platt) calibration on the validation slice; the fitted model itself is frozen."""
    calibrated = CalibratedClassifierCV(FrozenEstimator(model), method="sigmoid")
    return calibrated.fit(X_val, y_val)


OBJECTIVES = ("recall", "accuracy")


def choose_threshold(
    probabilities: Array,
    y: npt.NDArray[np.int64],
    min_precision: float = MIN_PRECISION,
    confidence_z: float = 0.0,
    objective: str = "recall",
) -> float:
    """The decision threshold picked on validation data: among the probability cuts whose precision is at
    least `min_precision`, the one with the most recall (`objective="recall"`: the lowest such cut, hence
    the earliest alarms) or the highest accuracy (`objective="accuracy"`); if none reaches the precision,
    the cut with the best F1.

    With `confidence_z` > 0 the precision that must reach `min_precision` is the Wilson lower bound at that
    many standard deviations: a cut whose precision only just reaches the target on the rows it was picked
    on falls below it on new data about half the time."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    candidates = np.unique(np.round(probabilities, 4))
    best_score, best_cut = -1.0, None
    best_f1, best_f1_cut = -1.0, 0.5
    positives = max(1, int(y.sum()))
    for cut in candidates:
        alarm = probabilities >= cut
        tp = int(np.sum(alarm & (y == 1)))
        fp = int(np.sum(alarm & (y == 0)))
        if tp + fp == 0:
            continue
        precision = tp / (tp + fp)
        recall = tp / positives
        f1 = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
        score = recall if objective == "recall" else float(np.mean(alarm == (y == 1)))
        if _wilson_lower(precision, tp + fp, confidence_z) >= min_precision and score > best_score:
            best_score, best_cut = score, float(cut)
        if f1 > best_f1:
            best_f1, best_f1_cut = f1, float(cut)
    return best_cut if best_cut is not None else best_f1_cut


def _wilson_lower(share: float, n: int, z: float) -> float:
    """Wilson score lower bound of a proportion observed as `share` over `n` trials (`share` when z = 0)."""
    if z <= 0:
        return share
    centre = share + z * z / (2 * n)
    spread = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n))
    return (centre - spread) / (1 + z * z / n)
