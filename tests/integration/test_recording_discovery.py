"""Issue 22 (3): the recording's metric-name discovery goes through prometheus-api-client (`all_metrics`), on a
real Prometheus: the names it lists are exactly Prometheus' own label values, filtered to what the SLA model
reads; an unreachable Prometheus is a RecordingError naming the failure, not a traceback."""

from __future__ import annotations

import pytest
import requests

from tailguard.serving.lab.dataset import RECORDED_PREFIXES
from tailguard.serving.lab.recording import RecordingError, recorded_names
from tests.conftest import BackfilledPrometheus

pytestmark = pytest.mark.integration


def test_recorded_names_are_prometheus_own_metric_names(backfilled_prometheus: BackfilledPrometheus) -> None:
    listed = requests.get(f"{backfilled_prometheus.url}/api/v1/label/__name__/values", timeout=30).json()["data"]
    expected = sorted(
        n for n in listed if (n == "up" or n.startswith(RECORDED_PREFIXES)) and not n.endswith("_created")
    )
    assert expected, "the scenario history has vLLM series"
    assert recorded_names(backfilled_prometheus.url) == expected


def test_an_unreachable_prometheus_is_a_recording_error() -> None:
    with pytest.raises(RecordingError, match="could not list metric names"):
        recorded_names("http://127.0.0.1:1")
