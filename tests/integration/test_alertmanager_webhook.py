"""A real Alertmanager posting to the controller's webhook triggers an evaluation of the matching policy only.

Real Prometheus (rule firing on its first 1 s evaluation) -> real Alertmanager (group_wait 0s) ->
POST /api/v1/alerts on the controller's API -> an evaluation with trigger="alert", which itself queries
the same Prometheus through the real PrometheusSource.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controller.actuators.annotations import JsonlAnnotator
from controller.api import ControllerAPI
from controller.clock import SystemClock
from controller.dispatcher import Actuators, Dispatcher, GlobalLimits
from controller.journal import Journal
from controller.metrics import ControllerMetrics
from controller.model import SignalResult
from controller.protocols import RangeResult
from controller.runtime import Controller
from controller.sources.prometheus import PrometheusSettings, PrometheusSource
from serving.promstack import AlertmanagerServer, PrometheusServer, write_prometheus_config

pytestmark = pytest.mark.integration

RULES = """\
groups:
  - name: tailguard-test
    interval: 1s
    rules:
      - alert: CheckoutLatencyHigh
        expr: vector(1)
        labels:
          namespace: llm
          service: checkout
          severity: page
"""


def policy(name: str, namespace: str) -> str:
    return f"""\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: {name}
interval: 1h
targets:
  groupBy: [service]
  match:
    namespace: {namespace}
signals:
  - name: firing-alerts
    query: count by ({{{{ by }}}}) (ALERTS{{ {{{{ selector }}}},alertstate="firing" }})
conditions:
  - name: alert-firing
    signal: firing-alerts
    when: {{op: ">", value: 0}}
    for: 1
    noData: hold
    actions:
      - type: annotate
        text: "{{{{ service }}}} has {{{{ value }}}} firing alert(s)"
"""


class LateSource:
    """The Prometheus port is known only after the Alertmanager (which needs the controller's URL) started."""

    def __init__(self) -> None:
        self.target: PrometheusSource | None = None

    def instant(self, query: str, group_by: Sequence[str], at: float | None = None) -> SignalResult:
        assert self.target is not None
        return self.target.instant(query, group_by, at)

    def range(self, query: str, group_by: Sequence[str], start: float, end: float, step: float) -> RangeResult:
        assert self.target is not None
        return self.target.range(query, group_by, start, end, step)


def evaluations(registry: CollectorRegistry, policy_name: str, trigger: str) -> float:
    return registry.get_sample_value("tailguard_evaluations_total", {"policy": policy_name, "trigger": trigger}) or 0


def test_real_alertmanager_webhook_triggers_an_evaluation_of_the_matching_policy(tmp_path: Path) -> None:
    rules = tmp_path / "policies"
    rules.mkdir()
    (rules / "llm.yaml").write_text(policy("llm-alerts", "llm"))
    (rules / "batch.yaml").write_text(policy("batch-alerts", "batch"))
    clock = SystemClock()
    registry = CollectorRegistry()
    journal = Journal(tmp_path / "journal.db")
    annotations = tmp_path / "annotations.jsonl"
    dispatcher = Dispatcher(journal, Actuators(annotator=JsonlAnnotator(annotations)), clock, GlobalLimits())
    prometheus = PrometheusServer(workdir=tmp_path / "prometheus", extra_args=["--rules.alert.resend-delay=1s"])
    alertmanager: AlertmanagerServer | None = None
    controller: Controller | None = None
    api: ControllerAPI | None = None
    source = LateSource()
    try:
        controller = Controller(
            policy_paths=[rules],
            source=source,
            journal=journal,
            dispatcher=dispatcher,
            clock=clock,
            metrics=ControllerMetrics(registry),
            schedule=False,  # only the webhook evaluates: every evaluation counted below came from an alert
        )
        api = ControllerAPI(controller, "127.0.0.1", 0)
        alertmanager = AlertmanagerServer(webhook_url=f"{api.url}/api/v1/alerts", workdir=tmp_path / "am").start()
        (tmp_path / "rules.yml").write_text(RULES)
        write_prometheus_config(
            prometheus.config,
            evaluation_interval="1s",
            rule_files=[tmp_path / "rules.yml"],
            alertmanagers=[alertmanager.address],
        )
        prometheus.start()
        source.target = PrometheusSource(PrometheusSettings(url=prometheus.url, timeout=5, retries=1), clock)
        controller.start()
        api.start()
        prometheus.wait_alertmanagers_discovered(timeout=60)

        deadline = time.monotonic() + 90
        while evaluations(registry, "llm-alerts", "alert") < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert evaluations(registry, "llm-alerts", "alert") >= 1, alertmanager.log_tail()
        assert controller.wait_for_triggered(timeout=30)
        assert evaluations(registry, "batch-alerts", "alert") == 0
        assert evaluations(registry, "llm-alerts", "schedule") == 0
        # The triggered evaluation read the alert's own ALERTS series from the real Prometheus and fired.
        deadline = time.monotonic() + 30
        while not controller.recent_decisions(5) and time.monotonic() < deadline:
            controller.trigger(["llm-alerts"])
            controller.wait_for_triggered(timeout=30)
        decisions = controller.recent_decisions(5)
        assert [(d["policy"], d["kind"], d["target"]) for d in decisions] == [
            ("llm-alerts", "fire", {"service": "checkout"})
        ]
        assert "checkout has 1 firing alert(s)" in annotations.read_text()
    finally:
        if api is not None:
            api.stop()
        if controller is not None:
            controller.stop()
        else:
            journal.close()
        prometheus.stop()
        if alertmanager is not None:
            alertmanager.stop()
