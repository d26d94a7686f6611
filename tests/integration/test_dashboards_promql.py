"""Every PromQL expression of the dashboards parses in a real Prometheus (its query API answers 400 bad_data if not)."""

from __future__ import annotations

import json
import re
from urllib.error import HTTPError
from urllib.parse import urlencode
from urllib.request import urlopen

import pytest

from controller import dashboards
from tests.conftest import BackfilledPrometheus

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


def query(url: str, expr: str, at: float) -> tuple[int, dict[str, object]]:
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
