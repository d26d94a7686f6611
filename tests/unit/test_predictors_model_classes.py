"""`fit_artifact`'s model classes (gradient-boosted trees, logistic regression, the small MLP): each is calibrated,
gets its own cut from its out-of-fold probabilities, is saved and loads through the allow-list; a feature subset
is recorded so predictions pick its columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tailguard.controller.core.model import target_key
from tailguard.predictors.artifact import load_artifact, predict_proba, save_artifact
from tailguard.predictors.data import Rows
from tailguard.predictors.features import feature_hash, feature_names
from tailguard.predictors.train import TrainingError, fit_artifact


def _rows(n: int = 360) -> Rows:
    """One target every 15 s; the breach label follows feature 'utilisation' above 1 (with noise elsewhere)."""
    rng = np.random.default_rng(11)
    names = feature_names()
    X = rng.normal(size=(n, len(names)))
    load = 1.0 + 0.4 * np.sin(np.arange(n) / 9.0)
    X[:, names.index("utilisation")] = load
    labels = (load > 1.2).astype(np.float64)
    nan = np.full(n, np.nan)
    return Rows(
        times=1000.0 + 15.0 * np.arange(n),
        target_index=np.zeros(n, dtype=np.int64),
        targets=[target_key({"service": "chat"})],
        X=X,
        sli={"cpu": load, "gpu": nan, "network": nan},
        labels={"cpu": labels, "gpu": nan, "network": nan},
        persistence={"cpu": labels, "gpu": nan, "network": nan},
        step=15.0,
        horizon_s=60.0,
        thresholds={"cpu": 1.0, "gpu": 20.0, "network": 0.5},
    )


@pytest.mark.parametrize("model_class", ["gbm", "logistic", "mlp"])
def test_each_class_trains_saves_and_loads(model_class: str, tmp_path: Path) -> None:
    rows = _rows()
    artifact, skipped = fit_artifact(
        rows, match={}, group_by=["service"], holdout=0.0, folds=3, model_class=model_class
    )
    assert set(skipped) == {"gpu", "network"}
    assert artifact.report["model_class"] == model_class
    assert 0.0 < artifact.decision_thresholds["cpu"] < 1.0
    loaded = load_artifact(save_artifact(artifact, tmp_path / model_class))
    probabilities = predict_proba(loaded, rows.X)["cpu"]
    alarms = probabilities >= loaded.decision_thresholds["cpu"]
    assert (alarms == (rows.labels["cpu"] == 1)).mean() > 0.9


def test_a_feature_subset_is_recorded_and_picked_by_name(tmp_path: Path) -> None:
    rows = _rows()
    subset = ["utilisation", "queue_waiting", "kv_cache_usage"]
    artifact, _ = fit_artifact(rows, match={}, group_by=["service"], holdout=0.0, folds=3, features=subset)
    assert artifact.feature_names == subset
    assert artifact.feature_hash == feature_hash(subset)
    loaded = load_artifact(save_artifact(artifact, tmp_path / "subset"))
    names = feature_names()
    np.testing.assert_allclose(
        predict_proba(loaded, rows.X)["cpu"], predict_proba(loaded, rows.X[:, [names.index(n) for n in subset]])["cpu"]
    )


def test_unknown_class_or_feature_is_refused() -> None:
    with pytest.raises(TrainingError, match="unknown model class 'forest'"):
        fit_artifact(_rows(), match={}, group_by=["service"], model_class="forest")
    with pytest.raises(TrainingError, match="unknown features \\['nope'\\]"):
        fit_artifact(_rows(), match={}, group_by=["service"], features=["nope"])
