"""The example prediction policy against a real Prometheus backfilled with the features' raw series.

A tiny gradient-boosted model (the shipped kind) learns "GPU breach when P99 inference time > 10 s".
Service `hot` runs at 19 s, `cool` at 0.5 s. The controller's evaluation fetches the features from
Prometheus (one instant query per feature), predicts, fires after two evaluations above 0.8 and
scales `hot` by one replica through the real journal and dispatcher on a FakeDeployer. With the
artifact removed, the same evaluations are no-data and nothing acts.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sklearn
from prometheus_client import CollectorRegistry
from sklearn.ensemble import HistGradientBoostingClassifier

from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.model import DecisionKind, SignalResult, target_key
from tailguard.controller.core.ports import Clock, MetricsSource, RangeResult
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDeployer
from tailguard.predictors.artifact import DIMENSIONS, ModelArtifact, save_artifact
from tailguard.predictors.features import feature_hash, feature_names, feature_queries
from tailguard.predictors.serving import ModelSpec, PredictionProvider, single_threaded
from tests.support.openmetrics import OpenMetricsWriter, latency_histogram_points

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.0
STEP = 15.0
MINUTES = 20
EVALUATE_AT = T0 + 15 * 60
EXAMPLE = Path(__file__).resolve().parents[2] / "rules" / "examples" / "predicted-gpu-breach-scale.yaml"
POLICY = "predicted-gpu-breach-scale"
SERVICES = {"hot": 19.0, "cool": 0.5}  # P99 inference seconds
HOT = target_key({"service": "hot"})
COOL = target_key({"service": "cool"})


def history() -> OpenMetricsWriter:
    """Raw vLLM series for both services, enough of the features for a prediction (the rest are absent)."""
    writer = OpenMetricsWriter()
    times = [T0 + STEP * index for index in range(MINUTES * 4 + 1)]
    for service, inference in SERVICES.items():
        labels = {"namespace": "llm", "service": service, "replica": "r0"}
        per_step = 30.0

        def constant(value: float) -> Any:
            return lambda _t: value

        for metric, latency in (
            ("vllm:request_inference_time_seconds", inference),
            ("vllm:request_queue_time_seconds", 0.05),
            ("vllm:e2e_request_latency_seconds", inference + 0.3),
            ("vllm:request_prefill_time_seconds", inference / 4),
            ("vllm:request_decode_time_seconds", inference * 3 / 4),
            ("vllm:time_to_first_token_seconds", 0.2),
        ):
            writer.histogram(
                metric,
                labels,
                _bounds(),
                latency_histogram_points(times, constant(per_step), constant(latency), _bounds()),
            )
        writer.gauge("vllm:num_requests_waiting", labels, [(t, 2.0) for t in times])
        writer.gauge("vllm:num_requests_running", labels, [(t, 8.0) for t in times])
        writer.gauge("vllm:kv_cache_usage_perc", labels, [(t, 0.4) for t in times])
        writer.gauge("vllm:request_success_total", labels, [(t, per_step * index) for index, t in enumerate(times)])
        writer.gauge("process_cpu_seconds_total", labels, [(t, 0.5 * (t - T0)) for t in times])
    return writer


def _bounds() -> Sequence[float]:
    return (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0)


def train_artifact(directory: Path) -> Path:
    """A small HistGradientBoosting model per dimension: breach when inference_time_p99 > 10 s."""
    rng = np.random.default_rng(11)
    names = feature_names()
    x = rng.lognormal(0.0, 2.0, size=(600, len(names)))
    x[rng.random(x.shape) < 0.3] = np.nan  # the model must cope with absent features
    column = names.index("inference_time_p99")
    x[:, column] = rng.uniform(0.0, 30.0, size=len(x))
    y = (x[:, column] > 10.0).astype(np.int64)
    model = single_threaded(HistGradientBoostingClassifier(max_iter=30, random_state=0).fit, x, y)
    artifact = ModelArtifact(
        models=dict.fromkeys(DIMENSIONS, model),
        feature_names=names,
        feature_hash=feature_hash(),
        horizon_s=60.0,
        thresholds={"cpu": 1.0, "gpu": 10.0, "network": 0.5},
        decision_thresholds=dict.fromkeys(DIMENSIONS, 0.8),
        sklearn_version=sklearn.__version__,
        trained_window=(T0 - 86400, T0),
        created_at=T0,
    )
    return save_artifact(artifact, directory)


class PinnedSource:
    """Prometheus queried at the test clock's time (the backfilled history is in the past)."""

    def __init__(self, source: MetricsSource, clock: Clock) -> None:
        self.source = source
        self.clock = clock
        self.instant_queries: list[str] = []

    def instant(self, query: str, group_by: Sequence[str], at: float | None = None) -> SignalResult:
        self.instant_queries.append(query)
        return self.source.instant(query, group_by, self.clock.now() if at is None else at)

    def range(self, query: str, group_by: Sequence[str], start: float, end: float, step: float) -> RangeResult:
        return self.source.range(query, group_by, start, end, step)


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.fail("prometheus/promtool are not installed: apt-get install prometheus")
    from tailguard.serving.lab.promstack import PrometheusServer, backfill_openmetrics

    work = tmp_path_factory.mktemp("prediction-prometheus")
    writer = history()
    backfill_openmetrics(writer.render(), work / "data", expected_samples=writer.sample_count)
    with PrometheusServer(data_dir=work / "data", workdir=work / "run").start() as server:
        yield server.url


def build(tmp_path: Path, url: str, model_dir: Path) -> tuple[Controller, FakeDeployer, PinnedSource, Any]:
    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(EXAMPLE, rules / EXAMPLE.name)
    clock = ManualClock(EVALUATE_AT)
    source = PinnedSource(PrometheusSource(PrometheusSettings(url=url), clock), clock)
    journal = Journal(tmp_path / "journal.db")
    deployer = FakeDeployer(replicas={"hot": 2, "cool": 2})
    registry = CollectorRegistry()
    controller = Controller(
        policy_paths=[rules],
        source=source,
        journal=journal,
        dispatcher=Dispatcher(journal, Actuators(rollback=deployer, scale=deployer), clock, GlobalLimits()),
        clock=clock,
        metrics=ControllerMetrics(registry),
        schedule=False,
        predictions=PredictionProvider({"sla": ModelSpec("sla", model_dir)}, clock),
    )
    return controller, deployer, source, (clock, registry)


def gpu_probability(registry: CollectorRegistry, service: str) -> float | None:
    return registry.get_sample_value(
        "tailguard_sla_breach_probability",
        {"policy": POLICY, "model": "sla", "dimension": "gpu", "target": f"service={service}"},
    )


def test_predicted_breach_fires_after_two_evaluations_and_scales_hot(prometheus_url: str, tmp_path: Path) -> None:
    model_dir = train_artifact(tmp_path / "models" / "sla")
    controller, deployer, source, (clock, registry) = build(tmp_path, prometheus_url, model_dir)
    controller.start()
    try:
        first = controller.evaluate(POLICY)
        assert first is not None and first.source_errors == () and first.decisions == ()
        hot, cool = gpu_probability(registry, "hot"), gpu_probability(registry, "cool")
        assert hot is not None and hot > 0.8, hot
        assert cool is not None and cool < 0.2, cool
        # One instant query per feature for both services, nothing per target.
        assert sorted(source.instant_queries) == sorted(feature_queries({"namespace": "llm"}, ["service"]).values())
        assert deployer.performed() == []

        clock.advance(STEP)
        second = controller.evaluate(POLICY)
        assert second is not None
        fired = [d for d in second.decisions if d.kind is DecisionKind.FIRE]
        assert [d.target for d in fired] == [HOT]
        scaled = deployer.performed("set_replicas")
        assert [(call.args["service"], call.args["replicas"]) for call in scaled] == [("hot", 3)]
    finally:
        controller.stop()


def test_without_the_artifact_the_same_evaluations_are_no_data_and_nothing_acts(
    prometheus_url: str, tmp_path: Path
) -> None:
    model_dir = train_artifact(tmp_path / "models" / "sla")
    shutil.rmtree(model_dir)
    controller, deployer, source, (clock, registry) = build(tmp_path, prometheus_url, model_dir)
    controller.start()
    try:
        for _ in range(3):
            outcome = controller.evaluate(POLICY)
            assert outcome is not None and outcome.decisions == () and outcome.source_errors == ()
            clock.advance(STEP)
        assert deployer.calls == []
        assert source.instant_queries == []  # no model, no feature queries
        assert gpu_probability(registry, "hot") is None
        readiness = controller.readiness()
        assert readiness.ready and any("model sla: missing" in warning for warning in readiness.warnings)
    finally:
        controller.stop()
