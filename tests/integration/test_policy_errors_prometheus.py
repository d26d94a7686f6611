"""Issue 12 item 5 against a real Prometheus: a query it refuses (bad_data) is a policy error.

The same refused query is caught by `rules validate --prometheus URL` (file:line of the query), reported at run
time as a policy error on /readyz and in tailguard_policy_errors, and refused on a hot reload (the last good
version of that policy keeps running).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app import cli
from tailguard.controller.core.model import DecisionKind
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDispatcher
from tests.conftest import BackfilledPrometheus
from tests.unit.test_policy_errors import BAD_QUERY, QUERY_LINE, policy_yaml

pytestmark = pytest.mark.integration


def test_rules_validate_with_prometheus_names_the_refused_query_file_and_line(
    backfilled_prometheus: BackfilledPrometheus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "good.yaml").write_text(policy_yaml("lat-good"))
    (tmp_path / "bad.yaml").write_text(policy_yaml("lat-bad", query=BAD_QUERY))
    url = backfilled_prometheus.url
    assert cli.main(["rules", "validate", "--prometheus", url, str(tmp_path)]) == cli.EXIT_INVALID
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(str(tmp_path))]
    assert len(lines) == 1
    assert lines[0].startswith(f"{tmp_path / 'bad.yaml'}:{QUERY_LINE}: signals[1].query: Prometheus refuses")
    assert "bad_data" in lines[0]
    (tmp_path / "bad.yaml").unlink()
    assert cli.main(["rules", "validate", "--prometheus", url, str(tmp_path)]) == cli.EXIT_OK


def test_a_refused_query_at_run_time_and_on_reload_is_a_policy_error(
    backfilled_prometheus: BackfilledPrometheus, tmp_path: Path
) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "bad.yaml").write_text(policy_yaml("lat-bad", query=BAD_QUERY))
    (rules / "good.yaml").write_text(policy_yaml("lat-good"))
    registry = CollectorRegistry()
    clock = ManualClock()
    with PrometheusSource(PrometheusSettings(url=backfilled_prometheus.url, retries=2), clock) as source:
        controller = Controller(
            policy_paths=[rules],
            source=source,
            journal=Journal(tmp_path / "journal.db"),
            dispatcher=FakeDispatcher(),
            clock=clock,
            metrics=ControllerMetrics(registry),
            schedule=False,
        )
        controller.start()
        try:
            before = clock.now()
            outcome = controller.evaluate("lat-bad")
            assert outcome is not None
            assert clock.now() == before  # refused, not retried as an outage (no backoff slept)
            assert not [d for d in outcome.decisions if d.kind is DecisionKind.FIRE]
            controller.evaluate("lat-good")
            readiness = controller.readiness()
            assert len(readiness.policy_errors) == 1
            assert readiness.policy_errors[0].startswith("policy lat-bad: signal p99: ")
            assert "bad_data" in readiness.policy_errors[0]
            assert registry.get_sample_value("tailguard_policy_errors", {"policy": "lat-bad"}) == 1
            assert registry.get_sample_value("tailguard_policy_errors", {"policy": "lat-good"}) == 0

            # A hot reload breaking lat-good's query keeps its last good version.
            (rules / "good.yaml").write_text(policy_yaml("lat-good", query=BAD_QUERY, threshold=9.0))
            reloaded = controller.reload()
            assert reloaded.updated == () and len(reloaded.errors) == 1
            assert str(reloaded.errors[0]).startswith(f"{rules / 'good.yaml'}:{QUERY_LINE}: signals[1].query:")
            assert controller.policies()["lat-good"].conditions[0].when.value == 0.8
        finally:
            controller.stop()
