"""Prediction signals inside the controller: evaluation, the probability gauge, readiness warnings, settings."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sklearn
from prometheus_client import CollectorRegistry
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.settings import SettingsError, parse_settings_text
from tailguard.controller.core.model import Decision, DecisionKind, SignalResult, TargetKey, target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeSource
from tailguard.predictors.artifact import DIMENSIONS, ModelArtifact, save_artifact
from tailguard.predictors.features import feature_hash, feature_names, feature_queries
from tailguard.predictors.serving import ModelSpec, PredictionProvider

NOW = 1_700_000_000.0
HOT = target_key({"service": "hot"})
COOL = target_key({"service": "cool"})
EXAMPLE = Path(__file__).resolve().parents[2] / "rules" / "examples" / "predicted-gpu-breach-scale.yaml"
P99_QUERY = "p99_of_everything"

QUERY_POLICY = f"""\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: p99-notes
targets:
  groupBy: [service]
  match: {{namespace: llm}}
signals:
  - name: p99
    query: {P99_QUERY}
conditions:
  - name: p99-high
    signal: p99
    when: {{op: ">", value: 1}}
    for: 1
    noData: hold
    actions:
      - type: annotate
        text: "p99 {{{{ value }}}}"
"""


def save_gpu_model(directory: Path) -> Path:
    """Logistic models: a dimension breaches when inference_time_p99 > 10 (synthetic)."""
    rng = np.random.default_rng(3)
    names = feature_names()
    x = rng.uniform(0.0, 20.0, size=(3000, len(names)))  # enough rows: the other features get coefficients near 0
    y = (x[:, names.index("inference_time_p99")] > 10.0).astype(np.int64)
    model = Pipeline([("impute", SimpleImputer()), ("classify", LogisticRegression(max_iter=500))]).fit(x, y)
    artifact = ModelArtifact(
        models=dict.fromkeys(DIMENSIONS, model),
        feature_names=names,
        feature_hash=feature_hash(),
        horizon_s=60.0,
        thresholds={"cpu": 1.0, "gpu": 20.0, "network": 0.5},
        decision_thresholds=dict.fromkeys(DIMENSIONS, 0.5),
        sklearn_version=sklearn.__version__,
        trained_window=(NOW - 7200, NOW - 3600),
        created_at=NOW - 3600,
    )
    return save_artifact(artifact, directory)


class Features:
    """A source whose feature answers a test changes between evaluations."""

    def __init__(self, inference_p99: dict[TargetKey, float]) -> None:
        self.inference_p99 = inference_p99
        answers: dict[str, Any] = {P99_QUERY: SignalResult({HOT: 2.0})}
        for feature, query in feature_queries({"namespace": "llm"}, ["service"]).items():
            answers[query] = self._answer(feature)
        self.source = FakeSource(instant_answers=answers)

    def _answer(self, feature: str) -> Any:
        def answer(_query: str, _at: float | None) -> SignalResult:
            if feature == "inference_time_p99":
                return SignalResult(dict(self.inference_p99))
            return SignalResult(dict.fromkeys(self.inference_p99, 2.0))

        return answer


class Dispatched:
    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    def dispatch(self, decision: Decision) -> Sequence[Any]:
        self.decisions.append(decision)
        return []

    def resume(self) -> Sequence[Any]:
        return []

    def retry_deferred(self, policy: str, state: Any) -> Sequence[Any]:
        return []

    def deferred_policies(self) -> set[str]:
        return set()


def controller(
    tmp_path: Path,
    source: FakeSource,
    model_dir: Path,
    registry: CollectorRegistry,
    clock: ManualClock | None = None,
) -> tuple[Controller, Dispatched]:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "predicted.yaml").write_text(EXAMPLE.read_text())
    (rules / "p99.yaml").write_text(QUERY_POLICY)
    clock = clock if clock is not None else ManualClock(NOW)
    dispatched = Dispatched()
    built = Controller(
        policy_paths=[rules],
        source=source,
        journal=Journal(tmp_path / "journal.db"),
        dispatcher=dispatched,
        clock=clock,
        metrics=ControllerMetrics(registry),
        schedule=False,
        predictions=PredictionProvider({"sla": ModelSpec("sla", model_dir)}, clock),
    )
    built.start()
    return built, dispatched


def probability(registry: CollectorRegistry, service: str) -> float | None:
    return registry.get_sample_value(
        "tailguard_sla_breach_probability",
        {"policy": "predicted-gpu-breach-scale", "model": "sla", "dimension": "gpu", "target": f"service={service}"},
    )


def test_example_policy_fires_after_two_predictions_above_080_and_exports_probabilities(tmp_path: Path) -> None:
    features = Features({HOT: 19.0, COOL: 0.5})
    registry = CollectorRegistry()
    model_dir = save_gpu_model(tmp_path / "sla")
    clock = ManualClock(NOW)
    built, dispatched = controller(tmp_path, features.source, model_dir, registry, clock)
    # Evaluations one policy interval apart, as scheduled: `for: 2` spans one interval (rules/README.md).
    interval = built.policies()["predicted-gpu-breach-scale"].interval
    try:
        first = built.evaluate("predicted-gpu-breach-scale")
        assert first is not None and first.decisions == () and first.source_errors == ()
        hot, cool = probability(registry, "hot"), probability(registry, "cool")
        assert hot is not None and hot > 0.8 and cool is not None and cool < 0.2

        clock.advance(interval)
        second = built.evaluate("predicted-gpu-breach-scale")
        assert second is not None
        fired = [d for d in second.decisions if d.kind is DecisionKind.FIRE]
        assert [d.target for d in fired] == [HOT]
        scale = fired[0].actions[0]
        assert scale.type.value == "scale" and scale.params["delta"] == 1 and scale.params["service"] == "hot"
        assert dispatched.decisions == fired
        timed = registry.get_sample_value(
            "tailguard_query_duration_seconds_count",
            {"policy": "predicted-gpu-breach-scale", "signal": "gpu-breach-probability"},
        )
        assert timed == 2.0

        # A target that disappears loses its series (bounded cardinality).
        features.inference_p99 = {HOT: 19.0}
        clock.advance(interval)
        built.evaluate("predicted-gpu-breach-scale")
        assert probability(registry, "cool") is None and probability(registry, "hot") is not None
        # No model warning (the other policy, never evaluated here, is listed as late: a warning since issue 24).
        assert built.readiness().warnings == ("policy p99-notes: not evaluated yet",)
    finally:
        built.stop()


def test_broken_model_is_no_data_and_a_readiness_warning_while_other_policies_keep_working(tmp_path: Path) -> None:
    features = Features({HOT: 19.0, COOL: 0.5})
    registry = CollectorRegistry()
    built, dispatched = controller(tmp_path, features.source, tmp_path / "no-model-here", registry)
    try:
        for _ in range(3):
            outcome = built.evaluate("predicted-gpu-breach-scale")
            assert outcome is not None and outcome.decisions == () and outcome.source_errors == ()
        assert probability(registry, "hot") is None
        # A missing model sends no feature queries.
        assert features.source.sent == []

        other = built.evaluate("p99-notes")
        assert other is not None and [d.kind for d in other.decisions] == [DecisionKind.FIRE]
        assert [d.policy for d in dispatched.decisions] == ["p99-notes"]

        readiness = built.readiness()
        assert readiness.ready
        assert len(readiness.warnings) == 1 and "model sla: missing" in readiness.warnings[0]
        assert readiness.to_json()["warnings"] == list(readiness.warnings)
    finally:
        built.stop()


def test_without_a_provider_prediction_signals_are_no_data_and_warned(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "predicted.yaml").write_text(EXAMPLE.read_text())
    source = FakeSource()
    built = Controller(
        policy_paths=[rules],
        source=source,
        journal=Journal(tmp_path / "journal.db"),
        dispatcher=Dispatched(),
        clock=ManualClock(NOW),
        metrics=ControllerMetrics(CollectorRegistry()),
        schedule=False,
    )
    built.start()
    try:
        outcome = built.evaluate("predicted-gpu-breach-scale")
        assert outcome is not None and outcome.decisions == () and source.sent == []
        assert any("model sla: unconfigured" in warning for warning in built.readiness().warnings)
    finally:
        built.stop()


def test_settings_predictors_section_resolves_paths_and_rejects_unknown_fields(tmp_path: Path) -> None:
    text = """\
prometheus: {url: "http://127.0.0.1:9090"}
policies: [rules]
predictors:
  sla:
    path: models/sla
    maxAge: 7d
    trustedTypes: [_operator.neg]
"""
    settings = parse_settings_text(text, "tailguard.yaml", tmp_path)
    spec = settings.predictor_specs()["sla"]
    assert spec.directory == tmp_path / "models" / "sla"
    assert spec.max_age == 7 * 86400 and spec.trusted_types == ("_operator.neg",) and not spec.allow_untrusted

    with pytest.raises(SettingsError) as invalid:
        parse_settings_text(text + "    allowUntrustd: true\n", "tailguard.yaml", tmp_path)
    message = str(invalid.value)
    assert "tailguard.yaml:8" in message and "allowUntrustd" in message and "unknown field" in message
