"""The load-against-capacity features (issue 27) on a real Prometheus: values on hand-computed series, and a missing
metric gives no value (no-data), never a number a model could read as load."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.core.model import target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.predictors.features import CAPACITY_FEATURES, feature_matrix, feature_names, feature_queries
from tailguard.serving.lab.promstack import PrometheusServer, write_prometheus_config
from tailguard.serving.lab.surge import RemoteWriter

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, a multiple of 15 s
END = T0 + 600.0
CURVE = 2e-5  # running per replica = 5 + CURVE * s^2 (s seconds since T0): arrivals accelerate
SEQ_LIMIT = 16.0
ENGINE_TIME = 10.0  # every request runs 10 s: capacity 16 / 10 = 1.6 requests/s per replica
FINISHED_PER_REPLICA = 2.0  # requests/s


def _scrape(s: float) -> list[tuple[dict[str, str], float]]:
    """Two replicas of service chat, and service idle whose tier exports no engine args and finishes nothing."""
    series: list[tuple[dict[str, str], float]] = []
    for replica in ("a", "b"):
        labels = {"namespace": "llm", "service": "chat", "replica": replica}
        series += [
            ({"__name__": "vllm:request_success_total", **labels}, FINISHED_PER_REPLICA * s),
            ({"__name__": "vllm:num_requests_running", **labels}, 5.0 + CURVE * s * s),
            ({"__name__": "vllm:num_requests_waiting", **labels}, 2.0),
            ({"__name__": "vllm:request_inference_time_seconds_sum", **labels}, ENGINE_TIME * FINISHED_PER_REPLICA * s),
            ({"__name__": "vllm:request_inference_time_seconds_count", **labels}, FINISHED_PER_REPLICA * s),
            (
                {"__name__": "tailguard_serving_engine_arg", "arg": "max_num_seqs", **labels},
                SEQ_LIMIT,
            ),
        ]
    idle = {"namespace": "llm", "service": "idle", "replica": "c"}
    series += [
        ({"__name__": "vllm:num_requests_running", **idle}, 0.0),
        ({"__name__": "vllm:num_requests_waiting", **idle}, 0.0),
        ({"__name__": "vllm:request_success_total", **idle}, 0.0),
    ]
    return series


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work: Path = tmp_path_factory.mktemp("capacity")
    config = write_prometheus_config(work / "prometheus.yml", scrape_configs=[])
    server = PrometheusServer(
        config, work / "data", workdir=work / "run", extra_args=["--web.enable-remote-write-receiver"]
    )
    with server.start():
        writer = RemoteWriter(server.url)
        for step in range(int((END - T0) / 15.0) + 1):
            writer.write(_scrape(step * 15.0), T0 + step * 15.0)
        yield server.url


def _values(url: str) -> dict[str, dict[str, float]]:
    source = PrometheusSource(PrometheusSettings(url=url, timeout=10.0), ManualClock(END))
    out: dict[str, dict[str, float]] = {}
    queries = feature_queries({"namespace": "llm"}, ["service"])
    for spec in CAPACITY_FEATURES:
        result = source.instant(queries[spec.name], ["service"], END)
        assert result.error is None, (spec.name, result.error)
        out[spec.name] = {dict(target)["service"]: value for target, value in result.values.items()}
    return out


def test_capacity_features_on_hand_computed_series(prometheus: str) -> None:
    got = _values(prometheus)
    chat = {name: values["chat"] for name, values in got.items()}
    # in engine = 2 x (5 + c s^2 + 2): its least-squares slope over the minute's evaluations is 4 c x their mean
    # time, between 570 s (5 points) and 577.5 s (4 points, a left-open window); completions 2 x 2 per second.
    low, high = 4.0 + 4 * CURVE * 570.0, 4.0 + 4 * CURVE * 577.5
    arrival = chat["arrival_rate"]
    assert low - 1e-9 <= arrival <= high + 1e-9
    # The arrival rate grows 4 c per second: one minute ahead it is 240 c higher (a straight line, exactly).
    assert chat["arrival_rate_forecast_60s"] == pytest.approx(arrival + 60 * 4 * CURVE, abs=1e-9)
    capacity = SEQ_LIMIT / ENGINE_TIME
    assert chat["replica_capacity_rps"] == pytest.approx(capacity)
    assert chat["utilisation"] == pytest.approx(arrival / (2 * capacity))
    forecast = chat["arrival_rate_forecast_60s"]
    assert chat["utilisation_forecast_60s"] == pytest.approx(forecast / (2 * capacity))
    assert chat["batch_fill"] == pytest.approx((5.0 + CURVE * 600.0**2) / SEQ_LIMIT)
    # Waiting 4 now, and 60 s of arrivals beyond the tier's 3.2 requests/s, drained at 3.2 per second.
    assert chat["expected_wait_forecast_60s"] == pytest.approx((4.0 + 60 * (forecast - 2 * capacity)) / (2 * capacity))


def test_missing_engine_args_or_no_finished_request_give_no_value(prometheus: str) -> None:
    """Service idle exports no max_num_seqs and finishes nothing: every capacity feature is absent (NaN in the
    matrix, as the prediction provider sees it), never 0 (an idle tier) or infinite (an overloaded one)."""
    got = _values(prometheus)
    assert got["arrival_rate"]["idle"] == 0.0  # the counters exist: nothing arrives
    for name in ("replica_capacity_rps", "utilisation", "utilisation_forecast_60s", "batch_fill"):
        assert "idle" not in got[name] or not math.isfinite(got[name]["idle"]), name
    from tailguard.controller.core.model import SignalResult

    results = {
        name: SignalResult({target_key({"service": s}): v for s, v in values.items()}) for name, values in got.items()
    }
    matrix = feature_matrix(results, [target_key({"service": "chat"}), target_key({"service": "idle"})])
    names = feature_names()
    for name in ("replica_capacity_rps", "utilisation", "expected_wait_forecast_60s"):
        assert math.isfinite(matrix[0, names.index(name)]), name
        assert math.isnan(matrix[1, names.index(name)]), name
