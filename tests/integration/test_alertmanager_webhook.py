"""A real Alertmanager posting to the controller's webhook triggers an evaluation of the matching policy only.

Real Prometheus (rule firing on its first 1 s evaluation) -> real Alertmanager (group_wait 0s) ->
POST /api/v1/alerts on the controller's API -> an evaluation with trigger="alert", which itself queries
the same Prometheus through the real PrometheusSource.

The webhook is authenticated as in deploy/base: Alertmanager reads the bearer token from a file
(`http_config.authorization.credentials_file`) and the controller requires it. With another token in that
file, Alertmanager's delivery fails (403) and nothing is evaluated.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.annotations.jsonl import JsonlAnnotator
from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.core.model import SignalResult
from tailguard.controller.core.ports import RangeResult
from tailguard.controller.kit.clock import SystemClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.serving.lab.promstack import (
    AlertmanagerServer,
    PrometheusServer,
    write_alertmanager_config,
    write_prometheus_config,
)

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


TOKEN = "tailguard-webhook-token-1f0c"


@dataclass
class Stack:
    controller: Controller
    registry: CollectorRegistry
    alertmanager: AlertmanagerServer
    annotations: Path


def authenticated_alertmanager_config(path: Path, webhook_url: str, token_file: Path) -> Path:
    """promstack's test configuration plus the deploy example's authorization block (credentials_file)."""
    write_alertmanager_config(path, webhook_url)
    config = yaml.safe_load(path.read_text())
    (receiver,) = config["receivers"]
    receiver["webhook_configs"][0]["http_config"] = {
        "authorization": {"type": "Bearer", "credentials_file": str(token_file)}
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@contextmanager
def running_stack(tmp_path: Path, alertmanager_token: str) -> Iterator[Stack]:
    """Prometheus firing one alert -> Alertmanager (sending `alertmanager_token`) -> the API requiring TOKEN."""
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
        api = ControllerAPI(controller, "127.0.0.1", 0, webhook_token=TOKEN)
        token_file = tmp_path / "am-secret" / "token"
        token_file.parent.mkdir()
        token_file.write_text(alertmanager_token + "\n")
        (tmp_path / "am").mkdir()
        am_config = authenticated_alertmanager_config(
            tmp_path / "am" / "alertmanager.yml", f"{api.url}/api/v1/alerts", token_file
        )
        alertmanager = AlertmanagerServer(am_config, workdir=tmp_path / "am").start()
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
        yield Stack(controller, registry, alertmanager, annotations)
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


def failed_webhook_notifications(alertmanager: AlertmanagerServer) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"http://{alertmanager.address}/metrics", timeout=5).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "alertmanager_notifications_failed_total" and sample.labels.get("integration") == "webhook"
    )


def test_real_alertmanager_webhook_triggers_an_evaluation_of_the_matching_policy(tmp_path: Path) -> None:
    with running_stack(tmp_path, TOKEN) as stack:
        controller, registry = stack.controller, stack.registry
        deadline = time.monotonic() + 90
        while evaluations(registry, "llm-alerts", "alert") < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert evaluations(registry, "llm-alerts", "alert") >= 1, stack.alertmanager.log_tail()
        assert controller.wait_for_triggered(timeout=30)
        assert evaluations(registry, "batch-alerts", "alert") == 0
        assert evaluations(registry, "llm-alerts", "schedule") == 0
        assert failed_webhook_notifications(stack.alertmanager) == 0
        # The triggered evaluation read the alert's own ALERTS series from the real Prometheus and fired.
        deadline = time.monotonic() + 30
        while not controller.recent_decisions(5) and time.monotonic() < deadline:
            controller.trigger(["llm-alerts"])
            controller.wait_for_triggered(timeout=30)
        decisions = controller.recent_decisions(5)
        assert [(d["policy"], d["kind"], d["target"]) for d in decisions] == [
            ("llm-alerts", "fire", {"service": "checkout"})
        ]
        assert "checkout has 1 firing alert(s)" in stack.annotations.read_text()


def test_real_alertmanager_with_a_wrong_token_fails_delivery_and_evaluates_nothing(tmp_path: Path) -> None:
    with running_stack(tmp_path, "not-the-token") as stack:
        deadline = time.monotonic() + 90
        while failed_webhook_notifications(stack.alertmanager) < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert failed_webhook_notifications(stack.alertmanager) >= 1, stack.alertmanager.log_tail()
        assert "403" in stack.alertmanager.log_tail()
        assert evaluations(stack.registry, "llm-alerts", "alert") == 0
        assert evaluations(stack.registry, "batch-alerts", "alert") == 0
        assert stack.controller.recent_decisions(5) == []
        assert TOKEN not in stack.alertmanager.log_tail()
