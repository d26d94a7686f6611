"""Artifact round trip and every refusal of load_artifact (hash, sklearn major version, untrusted type, files)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import skops.io as sio

from tailguard.predictors.artifact import (
    DIMENSIONS,
    METADATA_FILE,
    MODEL_FILE,
    ArtifactError,
    ModelArtifact,
    load_artifact,
    predict_proba,
    save_artifact,
    single_threaded,
)
from tailguard.predictors.features import feature_hash, feature_names
from tailguard.predictors.modeling import calibrate, fit_gbm, fit_logistic


@functools.cache
def _artifact() -> ModelArtifact:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, len(feature_names())))
    X[::5, 2] = np.nan
    y = (X[:, 0] > 0.2).astype(np.int64)
    with single_threaded():  # OpenMP spinning on a busy 2-core machine makes the fits slow
        models = {d: calibrate(fit_gbm(X, y), X, y) for d in DIMENSIONS}
    return ModelArtifact(
        models=models,
        feature_names=feature_names(),
        feature_hash=feature_hash(),
        horizon_s=60.0,
        thresholds={"cpu": 1.0, "gpu": 20.0, "network": 0.5},
        decision_thresholds={"cpu": 0.5, "gpu": 0.6, "network": 0.7},
        sklearn_version=__import__("sklearn").__version__,
        trained_window=(1000.0, 2000.0),
        created_at=3000.0,
        report={"note": "test"},
        baselines={"cpu": calibrate(fit_logistic(X, y), X, y)},
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_artifact(_artifact(), tmp_path_factory.mktemp("model"))


def _copy(saved: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    target.mkdir()
    for name in (METADATA_FILE, MODEL_FILE):
        (target / name).write_bytes((saved / name).read_bytes())
    return target


def _edit_metadata(directory: Path, **changes: object) -> None:
    path = directory / METADATA_FILE
    metadata = json.loads(path.read_text())
    metadata.update(changes)
    path.write_text(json.dumps(metadata))


def test_round_trip_predicts_the_same(saved: Path) -> None:
    original = _artifact()
    loaded = load_artifact(saved)
    assert loaded.feature_names == feature_names()
    assert loaded.horizon_s == 60.0
    assert loaded.trained_window == (1000.0, 2000.0)
    assert loaded.decision_thresholds == {"cpu": 0.5, "gpu": 0.6, "network": 0.7}
    assert set(loaded.baselines) == {"cpu"}
    X = np.random.default_rng(9).normal(size=(7, len(feature_names())))
    got, want = predict_proba(loaded, X), predict_proba(original, X)
    assert set(got) == set(DIMENSIONS)
    for dimension in DIMENSIONS:
        assert got[dimension].shape == (7,)
        np.testing.assert_allclose(got[dimension], want[dimension])


def test_missing_file(saved: Path, tmp_path: Path) -> None:
    directory = _copy(saved, tmp_path)
    (directory / MODEL_FILE).unlink()
    with pytest.raises(ArtifactError, match="model.skops: model file is missing") as caught:
        load_artifact(directory)
    assert caught.value.reason == "missing"
    with pytest.raises(ArtifactError, match="missing"):
        load_artifact(tmp_path / "nowhere")


def test_feature_hash_mismatch(saved: Path, tmp_path: Path) -> None:
    directory = _copy(saved, tmp_path)
    _edit_metadata(directory, feature_hash="0" * 64)
    with pytest.raises(ArtifactError, match="feature hash 000000000000 does not match") as caught:
        load_artifact(directory)
    assert caught.value.reason == "feature-hash"


def test_sklearn_major_version_mismatch(saved: Path, tmp_path: Path) -> None:
    directory = _copy(saved, tmp_path)
    _edit_metadata(directory, sklearn_version="0.24.2")
    with pytest.raises(ArtifactError, match="scikit-learn 0.24.2") as caught:
        load_artifact(directory)
    assert caught.value.reason == "sklearn-version"


def test_minor_version_difference_is_accepted(saved: Path, tmp_path: Path) -> None:
    directory = _copy(saved, tmp_path)
    major = __import__("sklearn").__version__.split(".")[0]
    _edit_metadata(directory, sklearn_version=f"{major}.0.0")
    assert load_artifact(directory).sklearn_version == f"{major}.0.0"


def test_corrupt_model_file_is_refused_before_loading(saved: Path, tmp_path: Path) -> None:
    directory = _copy(saved, tmp_path)
    (directory / MODEL_FILE).write_bytes(b"not a zip file")
    with pytest.raises(ArtifactError, match="sha256 differs") as caught:
        load_artifact(directory)
    assert caught.value.reason == "corrupt"


def test_corrupt_metadata(saved: Path, tmp_path: Path) -> None:
    directory = _copy(saved, tmp_path)
    (directory / METADATA_FILE).write_text("{not json")
    with pytest.raises(ArtifactError, match="metadata.json: not valid JSON"):
        load_artifact(directory)


class Untrusted:
    """A type no allow-list names: loading it would run its module's code."""

    def predict_proba(self, X: object) -> object:
        return X


def _with_untrusted(saved: Path, tmp_path: Path) -> Path:
    directory = _copy(saved, tmp_path)
    payload = sio.load(saved / MODEL_FILE, trusted=sio.get_untrusted_types(file=saved / MODEL_FILE))
    payload["models"]["cpu"] = Untrusted()
    sio.dump(payload, directory / MODEL_FILE)
    import hashlib

    _edit_metadata(directory, model_sha256=hashlib.sha256((directory / MODEL_FILE).read_bytes()).hexdigest())
    return directory


def test_untrusted_type_is_refused(saved: Path, tmp_path: Path) -> None:
    directory = _with_untrusted(saved, tmp_path)
    with pytest.raises(ArtifactError, match="not allow-listed: .*Untrusted") as caught:
        load_artifact(directory)
    assert caught.value.reason == "untrusted-type"


def test_untrusted_type_loads_only_when_explicitly_trusted(saved: Path, tmp_path: Path) -> None:
    directory = _with_untrusted(saved, tmp_path)
    name = f"{Untrusted.__module__}.{Untrusted.__qualname__}"
    loaded = load_artifact(directory, trusted_types=[name])
    assert type(loaded.models["cpu"]).__name__ == "Untrusted"


def test_predict_proba_checks_the_shape(saved: Path) -> None:
    with pytest.raises(ValueError, match="expected a matrix of shape"):
        predict_proba(load_artifact(saved), np.zeros((2, 3)))


def _old_artifact() -> ModelArtifact:
    """An artifact trained before the capacity features existed: the feature names (and hash) of that version."""
    from tailguard.predictors.features import CAPACITY_FEATURES

    added = {spec.name for spec in CAPACITY_FEATURES}
    names = [name for name in feature_names() if name not in added]
    rng = np.random.default_rng(4)
    X = rng.normal(size=(200, len(names)))
    y = (X[:, 1] > 0.0).astype(np.int64)
    with single_threaded():
        model = calibrate(fit_logistic(X, y), X, y)
    current = _artifact()
    return ModelArtifact(
        models={"cpu": model},
        feature_names=names,
        feature_hash=feature_hash(names),
        horizon_s=60.0,
        thresholds={"cpu": 1.0},
        decision_thresholds={"cpu": 0.5},
        sklearn_version=current.sklearn_version,
        trained_window=(1000.0, 2000.0),
        created_at=3000.0,
    )


def test_an_artifact_from_before_features_were_added_loads_and_predicts_on_its_columns(tmp_path: Path) -> None:
    old = _old_artifact()
    loaded = load_artifact(save_artifact(old, tmp_path / "old"))
    assert loaded.feature_names == old.feature_names
    everything = feature_names()
    assert len(everything) > len(old.feature_names)
    X = np.random.default_rng(5).normal(size=(6, len(everything)))
    own = X[:, [everything.index(name) for name in old.feature_names]]
    # The controller and the backtest fetch every feature: the model gets its own columns, by name.
    np.testing.assert_allclose(predict_proba(loaded, X)["cpu"], predict_proba(loaded, own)["cpu"])


def test_an_artifact_naming_a_feature_this_version_lacks_is_refused_clearly(tmp_path: Path) -> None:
    directory = save_artifact(_old_artifact(), tmp_path / "old")
    metadata = json.loads((directory / METADATA_FILE).read_text())
    _edit_metadata(directory, feature_names=[*metadata["feature_names"], "queue_velocity_v9"])
    with pytest.raises(ArtifactError, match="trained on features this version does not have \\(queue_velocity_v9\\)"):
        load_artifact(directory)
