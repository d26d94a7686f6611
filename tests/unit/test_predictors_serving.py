"""PredictionProvider: one batched feature fetch per evaluation, and safe model loading.

Every unusable model (missing, stale, feature-hash or sklearn-major mismatch, untrusted types, corrupt)
must make its signals no-data with one log line per state change and a readiness warning.
"""

from __future__ import annotations

import json
import logging
import operator
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sklearn
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

from tailguard.controller.core.model import SignalResult, TargetKey, target_key
from tailguard.controller.core.policy import Policy
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.testing import FakeSource
from tailguard.predictors.artifact import DIMENSIONS, ModelArtifact, save_artifact
from tailguard.predictors.features import FEATURES, feature_hash, feature_names, feature_queries
from tailguard.predictors.serving import (
    ModelSpec,
    ModelStatus,
    PredictionProvider,
    PredictorSettings,
    created_timestamp,
    model_specs,
    usable_rows,
)

DAY = 86400.0
NOW = 1_700_000_000.0
MATCH = {"namespace": "llm"}
GROUP_BY = ["service"]
HOT = target_key({"service": "hot"})
COOL = target_key({"service": "cool"})
# The feature each dimension's synthetic label depends on, and the value above which it breaches.
LABEL_FEATURES = {"cpu": ("queue_time_p99", 10.0), "gpu": ("inference_time_p99", 10.0), "network": ("e2e_p99", 10.0)}
PREDICTOR_LOG = "tailguard.predictors"


def tiny_artifact(created_at: float, *, extra_step: Any = None, **overrides: Any) -> ModelArtifact:
    """Logistic models on synthetic data: each dimension breaches when its label feature is high."""
    fields: dict[str, Any] = {
        "models": fitted_models(extra_step),
        "feature_names": feature_names(),
        "feature_hash": feature_hash(),
        "horizon_s": 60.0,
        "thresholds": {"cpu": 1.0, "gpu": 20.0, "network": 0.5},
        "decision_thresholds": {"cpu": 0.5, "gpu": 0.5, "network": 0.5},
        "sklearn_version": sklearn.__version__,
        "trained_window": (created_at - DAY, created_at),
        "created_at": created_at,
    }
    fields.update(overrides)
    return ModelArtifact(**fields)


_FITTED: dict[str, dict[str, Any]] = {}


def fitted_models(extra_step: Any = None) -> dict[str, Any]:
    """Fitted once per kind of pipeline per test session (the tests only read them)."""
    kind = type(extra_step).__name__
    if kind not in _FITTED:
        _FITTED[kind] = _fit(extra_step)
    return _FITTED[kind]


def _fit(extra_step: Any) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    names = feature_names()
    # Enough rows that the features a label does not depend on get coefficients near 0 (with a few hundred,
    # chance correlations over ~60 features move a probability by tenths).
    x = rng.uniform(0.0, 20.0, size=(3000, len(names)))
    models: dict[str, Any] = {}
    for dimension in DIMENSIONS:
        feature, threshold = LABEL_FEATURES[dimension]
        y = (x[:, names.index(feature)] > threshold).astype(np.int64)
        steps: list[tuple[str, Any]] = [("impute", SimpleImputer()), ("scale", StandardScaler())]
        if extra_step is not None:
            steps.append(("extra", extra_step))
        steps.append(("classify", LogisticRegression(max_iter=500)))
        models[dimension] = Pipeline(steps).fit(x, y)
    return models


def policy(*signals: Mapping[str, Any]) -> Policy:
    return Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": "predicted",
            "targets": {"groupBy": GROUP_BY, "match": MATCH},
            "signals": list(signals),
            "conditions": [
                {
                    "name": "breach-predicted",
                    "signal": signals[0]["name"],
                    "when": {"op": ">", "value": 0.8},
                    "for": 2,
                    "noData": "hold",
                    "actions": [{"type": "scale", "delta": 1, "max": 8}],
                }
            ],
        }
    )


def predict_signal(name: str, dimension: str, model: str = "sla") -> dict[str, Any]:
    return {"name": name, "predict": {"model": model, "dimension": dimension}}


GPU_POLICY = policy(predict_signal("gpu-p", "gpu"), predict_signal("cpu-p", "cpu"))


def feature_source(rows: Mapping[TargetKey, Mapping[str, float]], errors: Sequence[str] = ()) -> FakeSource:
    """Answers each feature query with the given per-target values (a feature absent from a row is missing)."""
    answers: dict[str, Any] = {}
    for feature, query in feature_queries(MATCH, GROUP_BY).items():
        if feature in errors:
            answers[query] = SignalResult.failed("503 Service Unavailable")
        else:
            answers[query] = SignalResult({target: row[feature] for target, row in rows.items() if feature in row})
    return FakeSource(instant_answers=answers)


def full_row(**values: float) -> dict[str, float]:
    row = dict.fromkeys(feature_names(), 2.0)
    row.update(values)
    return row


HOT_AND_COOL = {
    HOT: full_row(inference_time_p99=19.0, queue_time_p99=0.1),
    COOL: full_row(inference_time_p99=0.5, queue_time_p99=0.1),
}


def provider(directory: Path, clock: ManualClock, **spec: Any) -> PredictionProvider:
    return PredictionProvider({"sla": ModelSpec("sla", directory, **spec)}, clock)


def predictor_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == PREDICTOR_LOG]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return save_artifact(tiny_artifact(NOW - DAY), tmp_path / "sla")


def test_probabilities_per_target_from_one_query_per_feature(model_dir: Path, clock: ManualClock) -> None:
    source = feature_source(HOT_AND_COOL)
    results = provider(model_dir, clock).predict(source, GPU_POLICY)

    assert set(results) == {"gpu-p", "cpu-p"}
    gpu = results["gpu-p"].values
    assert set(gpu) == {HOT, COOL}
    assert gpu[HOT] > 0.8
    assert gpu[COOL] < 0.2
    assert all(0.0 <= p <= 0.2 for p in results["cpu-p"].values.values())
    # Both prediction signals share ONE fetch: exactly one instant query per feature, all grouped by target.
    assert sorted(source.queries("instant")) == sorted(feature_queries(MATCH, GROUP_BY).values())
    assert len(source.sent) == len(FEATURES)
    assert all(sent.group_by == ("service",) for sent in source.sent)


def test_missing_model_is_no_data_without_queries_logged_once_and_a_warning(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=PREDICTOR_LOG)
    source = feature_source(HOT_AND_COOL)
    serving = provider(tmp_path / "nowhere", clock)
    for _ in range(3):
        results = serving.predict(source, GPU_POLICY)
        assert results == {"gpu-p": SignalResult(values={}), "cpu-p": SignalResult(values={})}
        assert all(result.ok for result in results.values())  # no-data, never an error or a breach
    assert source.sent == []
    lines = predictor_lines(caplog)
    assert len(lines) == 1 and "missing" in lines[0] and "nowhere" in lines[0]
    warnings = serving.warnings()
    assert len(warnings) == 1 and "model sla: missing" in warnings[0]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"feature_hash": "0" * 64}, "feature hash"),
        ({"sklearn_version": "0.24.2"}, "scikit-learn 0.24.2"),
    ],
    ids=["feature-hash-mismatch", "sklearn-major-mismatch"],
)
def test_incompatible_model_is_no_data_with_one_log_line_and_a_warning(
    tmp_path: Path,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
    overrides: dict[str, Any],
    expected: str,
) -> None:
    caplog.set_level(logging.INFO, logger=PREDICTOR_LOG)
    directory = save_artifact(tiny_artifact(NOW - DAY, **overrides), tmp_path / "sla")
    serving = provider(directory, clock)
    for _ in range(2):
        results = serving.predict(feature_source(HOT_AND_COOL), GPU_POLICY)
        assert all(result.values == {} and result.ok for result in results.values())
    assert serving.states()["sla"].status is ModelStatus.INCOMPATIBLE
    lines = predictor_lines(caplog)
    assert len(lines) == 1 and expected in lines[0]
    assert any(expected in warning for warning in serving.warnings())


def test_untrusted_type_is_refused_unless_trusted_or_explicitly_allowed(tmp_path: Path, clock: ManualClock) -> None:
    # A function reference is the kind of thing that runs code when loaded: skops reports it as untrusted.
    negate = FunctionTransformer(func=operator.neg)
    directory = save_artifact(tiny_artifact(NOW - DAY, extra_step=negate), tmp_path / "sla")
    refused = provider(directory, clock)
    assert all(r.values == {} for r in refused.predict(feature_source(HOT_AND_COOL), GPU_POLICY).values())
    state = refused.states()["sla"]
    assert state.status is ModelStatus.INCOMPATIBLE and "_operator.neg" in state.reason

    trusted = provider(directory, clock, trusted_types=("_operator.neg",))
    assert trusted.predict(feature_source(HOT_AND_COOL), GPU_POLICY)["gpu-p"].values[HOT] > 0.8

    allowed = provider(directory, clock, allow_untrusted=True)
    assert allowed.predict(feature_source(HOT_AND_COOL), GPU_POLICY)["gpu-p"].values[HOT] > 0.8


def test_corrupt_model_file_is_incompatible(model_dir: Path, clock: ManualClock) -> None:
    with open(model_dir / "model.skops", "ab") as model_file:
        model_file.write(b"tampered")
    serving = provider(model_dir, clock)
    assert serving.predict(feature_source(HOT_AND_COOL), GPU_POLICY)["gpu-p"].values == {}
    assert serving.states()["sla"].status is ModelStatus.INCOMPATIBLE


def test_model_turns_stale_once_older_than_max_age(
    model_dir: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=PREDICTOR_LOG)
    serving = provider(model_dir, clock, max_age=2 * DAY)
    assert serving.predict(feature_source(HOT_AND_COOL), GPU_POLICY)["gpu-p"].values
    clock.advance(1.5 * DAY)
    for _ in range(2):
        assert serving.predict(feature_source(HOT_AND_COOL), GPU_POLICY)["gpu-p"].values == {}
    lines = predictor_lines(caplog)
    assert len(lines) == 2 and "ready" in lines[0] and "stale" in lines[1]
    assert serving.states()["sla"].status is ModelStatus.STALE


def test_reloads_when_the_files_change_and_removal_is_no_data(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=PREDICTOR_LOG)
    directory = tmp_path / "sla"
    serving = provider(directory, clock)
    assert serving.predict(feature_source(HOT_AND_COOL), GPU_POLICY)["gpu-p"].values == {}

    save_artifact(tiny_artifact(NOW - DAY), directory)
    assert serving.predict(feature_source(HOT_AND_COOL), GPU_POLICY)["gpu-p"].values[HOT] > 0.8
    assert serving.warnings() == []

    # A replacement that does not load is not papered over with the previous model.
    save_artifact(tiny_artifact(NOW - DAY, feature_hash="f" * 64), directory)
    assert serving.predict(feature_source(HOT_AND_COOL), GPU_POLICY)["gpu-p"].values == {}

    shutil.rmtree(directory)
    assert serving.predict(feature_source(HOT_AND_COOL), GPU_POLICY)["gpu-p"].values == {}
    statuses = [line.split(": ")[1].split(" ")[0] for line in predictor_lines(caplog)]
    assert statuses == ["missing", "ready", "incompatible", "missing"]


def test_target_missing_too_many_features_gets_no_prediction(model_dir: Path, clock: ManualClock) -> None:
    names = feature_names()
    sparse = {name: 30.0 for name in names[: len(names) // 3]}  # two thirds missing
    mostly_there = full_row(inference_time_p99=19.0)
    for name in names[:3]:
        mostly_there.pop(name)
    rows = {HOT: mostly_there, COOL: sparse}
    results = provider(model_dir, clock).predict(feature_source(rows), GPU_POLICY)
    assert set(results["gpu-p"].values) == {HOT}

    strict = provider(model_dir, clock, max_missing_fraction=0.0)
    assert strict.predict(feature_source(rows), GPU_POLICY)["gpu-p"].values == {}


def test_failing_feature_queries_are_a_source_error_never_a_breach(model_dir: Path, clock: ManualClock) -> None:
    everything = feature_names()
    results = provider(model_dir, clock).predict(feature_source(HOT_AND_COOL, errors=everything), GPU_POLICY)
    assert all(result.error is not None and result.values == {} for result in results.values())
    assert "503" in (results["gpu-p"].error or "")

    # A few failed features are only missing values: the targets still get predictions.
    results = provider(model_dir, clock).predict(feature_source(HOT_AND_COOL, errors=everything[:2]), GPU_POLICY)
    assert results["gpu-p"].ok and set(results["gpu-p"].values) == {HOT, COOL}


def test_unconfigured_model_is_no_data_and_a_warning(model_dir: Path, clock: ManualClock) -> None:
    serving = provider(model_dir, clock)
    other = policy(predict_signal("gpu-p", "gpu", model="other"))
    assert serving.predict(feature_source(HOT_AND_COOL), other) == {"gpu-p": SignalResult(values={})}
    assert any("model other: unconfigured" in warning for warning in serving.warnings())


def test_a_model_that_fails_to_predict_is_no_data_for_that_evaluation_only(
    model_dir: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=PREDICTOR_LOG)
    calls: list[int] = []

    def flaky(artifact: Any, x: Any) -> Mapping[str, Any]:
        calls.append(len(x))
        if len(calls) == 1:
            raise ValueError("Input X contains NaN")
        return {"gpu": np.full(len(x), 0.9)}

    serving = PredictionProvider({"sla": ModelSpec("sla", model_dir)}, clock, probabilities=flaky)
    assert serving.predict(feature_source(HOT_AND_COOL), GPU_POLICY)["gpu-p"].values == {}
    assert any("NaN" in warning for warning in serving.warnings())
    again = serving.predict(feature_source(HOT_AND_COOL), GPU_POLICY)
    assert again["gpu-p"].values == {HOT: 0.9, COOL: 0.9}
    assert again["cpu-p"].values == {}  # this model answered no cpu dimension
    assert any("no cpu model" in warning for warning in serving.warnings())
    assert not any("NaN" in warning for warning in serving.warnings())


def test_policy_without_prediction_signals_sends_nothing(model_dir: Path, clock: ManualClock) -> None:
    source = FakeSource()
    plain = policy({"name": "p99", "query": "up"})
    assert provider(model_dir, clock).predict(source, plain) == {}
    assert source.sent == []


def test_settings_resolve_paths_and_defaults(tmp_path: Path) -> None:
    settings = {
        "sla": PredictorSettings.model_validate(
            {"path": "models/sla", "trustedTypes": ["x.Y"], "maxAge": "7d", "maxMissingFeatures": 0.25}
        )
    }
    specs = model_specs(settings, lambda raw: tmp_path / raw)
    assert specs["sla"] == ModelSpec("sla", tmp_path / "models/sla", ("x.Y",), False, 7 * DAY, 0.25)
    defaults = PredictorSettings.model_validate({"path": "m"})
    assert defaults.maxAge == 30 * DAY and not defaults.allowUntrusted and defaults.trustedTypes == []
    with pytest.raises(ValueError, match="Extra inputs"):
        PredictorSettings.model_validate({"path": "m", "trusted": True})


def test_created_timestamp_and_usable_rows() -> None:
    assert created_timestamp(12.5) == 12.5
    assert created_timestamp("2023-11-14T22:13:20+00:00") == NOW
    assert created_timestamp("2023-11-14T22:13:20") is None  # no time zone: unknown age
    assert created_timestamp(None) is None and created_timestamp(True) is None
    matrix = np.array([[1.0, np.nan, np.nan, np.nan], [1.0, 2.0, np.nan, 4.0], [1.0, 2.0, 3.0, 4.0]])
    assert usable_rows(matrix, 0.5).tolist() == [False, True, True]
    assert usable_rows(matrix, 0.0).tolist() == [False, False, True]
    assert usable_rows(np.zeros((0, 4)), 0.5).tolist() == []


def test_metadata_json_is_what_load_artifact_reads(model_dir: Path) -> None:
    # Guards the fixture: the artifact really is on disk in the format the controller loads.
    metadata = json.loads((model_dir / "metadata.json").read_text())
    assert metadata["feature_hash"] == feature_hash() and metadata["created_at"] == NOW - DAY
