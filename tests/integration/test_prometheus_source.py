"""PrometheusSource and batched signals against a real Prometheus (backfilled and live-scraped)."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest

from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.core.engine import PolicyState, transition
from tailguard.controller.core.model import DecisionKind, SignalResult, target_key
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.signals import query_signals, render_signal_queries
from tailguard.controller.kit.clock import ManualClock
from tailguard.serving.lab.promstack import PrometheusServer, static_scrape_config, write_prometheus_config
from tests.conftest import BackfilledPrometheus
from tests.support.openmetrics import VLLM_E2E_BUCKETS
from tests.support.scenarios import ESCAPE_METRIC, ESCAPE_SERIES, T0

pytestmark = pytest.mark.integration


def _policy(match: dict[str, str], query: str, group_by: list[str] | None = None) -> Policy:
    return Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": "probe",
            "targets": {"groupBy": group_by or ["service"], "match": match},
            "signals": [{"name": "probe", "query": query}],
            "conditions": [
                {
                    "name": "high",
                    "signal": "probe",
                    "when": {"op": ">", "value": 0.8},
                    "for": 1,
                    "noData": "hold",
                    "actions": [{"type": "annotate", "text": "x"}],
                }
            ],
        }
    )


@pytest.fixture
def source(backfilled_prometheus: BackfilledPrometheus) -> Iterator[PrometheusSource]:
    with PrometheusSource(PrometheusSettings(url=backfilled_prometheus.url, retries=1), ManualClock()) as opened:
        yield opened


@pytest.mark.parametrize("value", sorted(ESCAPE_SERIES))
def test_label_value_with_quote_and_backslash_selects_exactly_its_own_series(
    source: PrometheusSource, value: str
) -> None:
    policy = _policy({"service": value}, f"sum by ({{{{ by }}}}) ({ESCAPE_METRIC}{{ {{{{ selector }}}} }})")
    results = query_signals(source, policy, at=T0 + 600)
    assert results["probe"] == SignalResult({target_key({"service": value}): ESCAPE_SERIES[value]})


def test_bad_query_is_an_error_with_prometheus_message_not_a_breach(source: PrometheusSource) -> None:
    policy = _policy({"namespace": "llm"}, "sum by ({{ by }}) (rate(vllm:e2e_request_latency_seconds_bucket[1m]")
    results = query_signals(source, policy, at=T0 + 600)
    assert results["probe"].error is not None
    assert "HTTP 400" in results["probe"].error and "bad_data" in results["probe"].error
    _, decisions = transition(policy, results, PolicyState(), T0 + 600)
    assert [d for d in decisions if d.kind is DecisionKind.FIRE] == []


def test_series_without_group_by_label_makes_the_signal_an_error(source: PrometheusSource) -> None:
    policy = _policy({"namespace": "llm"}, "sum(tailguard_escape_probe{ {{ selector }} })")
    result = query_signals(source, policy, at=T0 + 600)["probe"]
    assert result.error is not None and "lacks group_by label(s) service" in result.error


def test_one_request_per_signal_for_all_targets(source: PrometheusSource) -> None:
    calls: list[tuple[str, bool]] = []
    counted = PrometheusSource(
        PrometheusSettings(url=source._settings.url),
        ManualClock(),
        on_query=lambda kind, seconds, ok: calls.append((kind, ok)),
    )
    policy = _policy({"namespace": "llm"}, f"max by ({{{{ by }}}}) ({ESCAPE_METRIC}{{ {{{{ selector }}}} }})")
    result = query_signals(counted, policy, at=T0 + 600)["probe"]
    assert len(result.values) == len(ESCAPE_SERIES)
    assert calls == [("query", True)]


def _text_format_handler(registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    """Always the 0.0.4 text format, as vLLM's page is: prometheus_client's OpenMetrics output would
    escape the colons of `vllm:` names to underscores when Prometheus negotiates OpenMetrics."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def test_live_scrape_of_a_vllm_histogram(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    histogram = Histogram(
        "vllm:e2e_request_latency_seconds",
        "e2e",
        ["service", "namespace"],
        buckets=VLLM_E2E_BUCKETS,
        registry=registry,
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), _text_format_handler(registry))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stop_feeding = threading.Event()

    def feed() -> None:
        while not stop_feeding.is_set():
            for _ in range(20):
                histogram.labels("fast", "llm").observe(0.2)
                histogram.labels("slow", "llm").observe(1.2)
            stop_feeding.wait(0.2)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        workdir = tmp_path
        config = write_prometheus_config(
            workdir / "prometheus.yml",
            scrape_interval="1s",
            scrape_configs=[static_scrape_config("vllm", [f"127.0.0.1:{server.server_address[1]}"])],
        )
        with PrometheusServer(config=config, workdir=workdir / "prom").start() as prom:
            prom.wait_target_up("vllm", timeout=30)
            policy = _policy(
                {"namespace": "llm"},
                "histogram_quantile(0.99, sum by (le, {{ by }}) "
                "(rate(vllm:e2e_request_latency_seconds_bucket{ {{ selector }} }[10s])))",
            )
            query = render_signal_queries(policy)["probe"]
            prom.wait_series(query, timeout=30)
            with PrometheusSource(PrometheusSettings(url=prom.url), ManualClock()) as live:
                result = query_signals(live, policy, at=None)["probe"]
    finally:
        stop_feeding.set()
        feeder.join(timeout=5)
        server.shutdown()
        server.server_close()
    assert result.ok
    fast = result.values.get(target_key({"service": "fast"}))
    slow = result.values.get(target_key({"service": "slow"}))
    assert fast is not None and slow is not None and not math.isnan(fast)
    assert 0.0 < fast <= 0.3
    assert 1.0 < slow <= 1.5
