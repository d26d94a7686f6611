"""Model fitting and threshold choice, shared by `tailguard train` and the tests. Pure: arrays in, models out."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.calibration import CalibratedClassifierCV
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.frozen import FrozenEstimator
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

Array = npt.NDArray[np.float64]
MIN_PRECISION = 0.9


def fit_gbm(X: Array, y: npt.NDArray[np.int64], seed: int = 0) -> HistGradientBoostingClassifier:
    # HGB handles NaN natively (missing DCGM, no traffic); no imputation needed.
    model = HistGradientBoostingClassifier(
        max_iter=200, learning_rate=0.08, max_leaf_nodes=31, l2_regularization=1.0, random_state=seed
    )
    return model.fit(X, y)


def fit_logistic(X: Array, y: npt.NDArray[np.int64]) -> Pipeline:
    model = Pipeline(
        [
            ("impute", SimpleImputer(strategy="median", keep_empty_features=True)),
            ("scale", StandardScaler()),
            ("logistic", LogisticRegression(max_iter=2000, C=1.0)),
        ]
    )
    return model.fit(X, y)


def calibrate(model: Any, X_val: Array, y_val: npt.NDArray[np.int64]) -> CalibratedClassifierCV:
    """Sigmoid (Platt) calibration on the validation slice; the fitted model itself is frozen."""
    calibrated = CalibratedClassifierCV(FrozenEstimator(model), method="sigmoid")
    return calibrated.fit(X_val, y_val)


def choose_threshold(probabilities: Array, y: npt.NDArray[np.int64], min_precision: float = MIN_PRECISION) -> float:
    """The decision threshold picked on validation data: the lowest probability cut whose precision is at
    least `min_precision` (most recall at that precision); if none reaches it, the cut with the best F1."""
    candidates = np.unique(np.round(probabilities, 4))
    best_recall, best_recall_cut = -1.0, None
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
        if precision >= min_precision and recall > best_recall:
            best_recall, best_recall_cut = recall, float(cut)
        if f1 > best_f1:
            best_f1, best_f1_cut = f1, float(cut)
    return best_recall_cut if best_recall_cut is not None else best_f1_cut
