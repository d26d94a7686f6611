"""Every PromQL expression of the dashboards parses in a real Prometheus (its query API answers 400 bad_data if not)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.parse import urlencode
from urllib.request import urlopen

import pytest

from tailguard.controller.tools import dashboards
from tailguard.serving.lab.promstack import PrometheusServer, backfill_openmetrics
from tests.conftest import BackfilledPrometheus
from tests.support.openmetrics import HistogramPoint, OpenMetricsWriter

# What Grafana substitutes before the query reaches Prometheus.
SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$__interval": "30s",
    "$__range": "1h",
    "$namespace": ".*",
    "$service": ".*",
    "$version": ".*",
    "$policy": ".*",
}


def substituted(expr: str) -> str:
    for variable, value in sorted(SUBSTITUTIONS.items(), key=lambda item: -len(item[0])):
        expr = expr.replace(variable, value)
    return expr


def query(url: str, expr: str, at: float) -> tuple[int, dict[str, Any]]:
    address = f"{url}/api/v1/query?{urlencode({'query': expr, 'time': f'{at:.3f}'})}"
    try:
        with urlopen(address, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.integration
def test_every_dashboard_expression_parses_in_real_prometheus(backfilled_prometheus: BackfilledPrometheus) -> None:
    at = backfilled_prometheus.history.end
    checked = 0
    for name, dashboard in dashboards.all_dashboards().items():
        for expr in dashboards.expressions(dashboard):
            if expr.startswith("label_values("):
                # A Grafana function, not PromQL: check the selector inside it.
                match = re.match(r"label_values\((.+),\s*\w+\)$", expr)
                assert match is not None, expr
                expr = match.group(1)
            promql = substituted(expr)
            assert "$" not in promql, f"{name}: unsubstituted variable in {promql!r}"
            status, body = query(backfilled_prometheus.url, promql, at)
            assert status == 200 and body["status"] == "success", f"{name}: {promql!r}: {body}"
            checked += 1
    assert checked >= 25


@pytest.mark.integration
def test_the_parse_check_catches_a_broken_expression(backfilled_prometheus: BackfilledPrometheus) -> None:
    status, body = query(backfilled_prometheus.url, "sum by (service (rate(x[1m]))", 1_700_000_000.0)
    assert status == 400 and body["errorType"] == "bad_data"


def _panel_expr(title: str, index: int = 0) -> str:
    slo = dashboards.slo_dashboard()
    panel = next(p for p in slo["panels"] if p["title"] == title)
    return str(panel["targets"][index]["expr"])


@pytest.mark.integration
def test_renamed_metrics_work_on_old_new_and_mixed_servers(tmp_path: Path) -> None:
    """A pre-rename server, a renamed one, and one exposing both: one answer each, the new name winning."""
    start, step = 1_700_000_000.0, 15.0
    times = [start + i * step for i in range(41)]
    writer = OpenMetricsWriter()
    kv = {"old": {"vllm:gpu_cache_usage_perc": 0.3}, "new": {"vllm:kv_cache_usage_perc": 0.6},
          "both": {"vllm:kv_cache_usage_perc": 0.7, "vllm:gpu_cache_usage_perc": 0.2}}  # fmt: skip
    itl = {"old": "vllm:time_per_output_token_seconds", "new": "vllm:inter_token_latency_seconds"}
    bounds = [0.01, 0.05, 0.1, 0.5]
    for service, metrics in kv.items():
        labels = {"namespace": "llm", "service": service, "version": "r1"}
        for name, value in metrics.items():
            writer.gauge(name, labels, [(t, value) for t in times])
        if service in itl:
            points = [
                HistogramPoint(t, [0, 10 * i, 10 * i, 10 * i], 10 * i, 0.04 * 10 * i) for i, t in enumerate(times)
            ]
            writer.histogram(itl[service], labels, bounds, points)
    backfill_openmetrics(writer.render(), tmp_path / "data", expected_samples=writer.sample_count)
    at = times[-1]
    with PrometheusServer(data_dir=tmp_path / "data", workdir=tmp_path / "run").start() as server:
        status, body = query(server.url, substituted(_panel_expr("KV-cache usage")), at)
        assert status == 200, body
        result = body["data"]["result"]
        values = {r["metric"]["service"]: float(r["value"][1]) for r in result}
        assert values == pytest.approx({"old": 0.3, "new": 0.6, "both": 0.7})
        status, body = query(server.url, substituted(_panel_expr("Inter-token latency", 2)), at)
        assert status == 200, body
        services = sorted(r["metric"]["service"] for r in body["data"]["result"])
        assert services == ["new", "old"]
