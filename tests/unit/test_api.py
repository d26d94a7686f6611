"""The controller's HTTP API, served for real on a loopback port, with a fake source and dispatcher."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.api import ControllerAPI, PayloadError, parse_alertmanager_payload
from tailguard.controller.core.alerts import policies_for_alert
from tailguard.controller.core.model import SignalResult, target_key
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDispatcher

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "alertmanager"
TIMEOUT = 10


def policy_yaml(name: str, match: dict[str, str], group_by: Sequence[str] = ("service",)) -> str:
    matchers = "".join(f"\n    {key}: {value}" for key, value in match.items())
    return f"""\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: {name}
targets:
  groupBy: [{", ".join(group_by)}]
  match:{matchers or " {}"}
signals:
  - name: p99
    query: max by ({{{{ by }}}}) (lat{{ {{{{ selector }}}} }})
conditions:
  - name: p99-high
    signal: p99
    when: {{op: ">", value: 0.8}}
    for: 1
    noData: hold
    actions:
      - type: annotate
        text: "p99 {{{{ value }}}}"
"""


class Served:
    def __init__(self, controller: Controller, api: ControllerAPI, registry: CollectorRegistry) -> None:
        self.controller = controller
        self.api = api
        self.registry = registry

    def get(self, path: str) -> requests.Response:
        return requests.get(self.api.url + path, timeout=TIMEOUT)

    def post(self, path: str, body: bytes) -> requests.Response:
        return requests.post(
            self.api.url + path, data=body, timeout=TIMEOUT, headers={"Content-Type": "application/json"}
        )

    def evaluations(self, policy: str, trigger: str) -> float:
        return (
            self.registry.get_sample_value("tailguard_evaluations_total", {"policy": policy, "trigger": trigger}) or 0.0
        )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "checkout.yaml").write_text(policy_yaml("checkout-p99", {"service": "checkout"}))
    (rules / "llm.yaml").write_text(policy_yaml("llm-p99", {"namespace": "llm"}))
    registry = CollectorRegistry()
    controller = Controller(
        policy_paths=[rules],
        source=_source(),
        journal=Journal(tmp_path / "journal.db"),
        dispatcher=FakeDispatcher(),
        clock=ManualClock(),
        metrics=ControllerMetrics(registry),
        schedule=False,
    )
    api = ControllerAPI(controller, "127.0.0.1", 0)
    api.start()
    try:
        yield Served(controller, api, registry)
    finally:
        api.stop()
        controller.stop()


def _source() -> Any:
    from tailguard.controller.testing import FakeSource

    return FakeSource(default=SignalResult({target_key({"service": "checkout"}): 0.95}))


def test_healthz_answers_while_the_process_lives(served: Served) -> None:
    answer = served.get("/healthz")
    assert answer.status_code == 200 and answer.json() == {"status": "ok"}


def test_readyz_is_503_until_started_then_200_with_late_evaluations_as_warnings(served: Served) -> None:
    answer = served.get("/readyz")
    assert answer.status_code == 503 and answer.json()["reasons"] == ["controller not started"]
    served.controller.start()
    answer = served.get("/readyz")
    assert answer.status_code == 200  # readiness: it serves its API (issue 24), evaluated or not
    assert answer.json()["warnings"] == [
        "policy checkout-p99: not evaluated yet",
        "policy llm-p99: not evaluated yet",
    ]
    served.controller.evaluate("checkout-p99")
    served.controller.evaluate("llm-p99")
    answer = served.get("/readyz")
    assert answer.status_code == 200 and answer.json()["ready"] is True


def test_metrics_exposes_the_injected_registry(served: Served) -> None:
    served.controller.start()
    served.controller.evaluate("checkout-p99")
    answer = served.get("/metrics")
    assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("text/plain")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }
    assert samples[("tailguard_evaluations_total", (("policy", "checkout-p99"), ("trigger", "schedule")))] == 1
    assert (
        samples[
            (
                "tailguard_decisions_total",
                (("condition", "p99-high"), ("kind", "fire"), ("policy", "checkout-p99")),
            )
        ]
        == 1
    )
    assert samples[("tailguard_policies_loaded", ())] == 2


def test_alertmanager_payload_triggers_exactly_the_matching_policies(served: Served) -> None:
    served.controller.start()
    answer = served.post("/api/v1/alerts", (FIXTURES / "firing.json").read_bytes())
    assert answer.status_code == 202
    assert answer.json() == {"triggered": ["checkout-p99"], "alerts": 1}
    assert served.controller.wait_for_triggered(timeout=30)
    assert served.evaluations("checkout-p99", "alert") == 1
    assert served.evaluations("llm-p99", "alert") == 0

    answer = served.post("/api/v1/alerts", (FIXTURES / "resolved.json").read_bytes())
    assert answer.status_code == 202 and answer.json()["triggered"] == ["checkout-p99"]
    assert served.controller.wait_for_triggered(timeout=30)
    assert served.evaluations("checkout-p99", "alert") == 2

    decisions = served.get("/api/v1/decisions?limit=5")
    assert decisions.status_code == 200
    assert [(d["policy"], d["kind"]) for d in decisions.json()] == [("checkout-p99", "fire")]


def test_an_alert_matching_no_policy_triggers_nothing(served: Served) -> None:
    served.controller.start()
    payload = json.loads((FIXTURES / "firing.json").read_text())
    payload["alerts"][0]["labels"]["service"] = "search"
    answer = served.post("/api/v1/alerts", json.dumps(payload).encode())
    assert answer.status_code == 202 and answer.json() == {"triggered": [], "alerts": 1}


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda p: p.update(version="3"), "unsupported payload version '3': expected \"4\""),
        (lambda p: p.pop("version"), "unsupported payload version missing"),
        (lambda p: p["alerts"][0].update(status="pending"), "alerts.0.status"),
        (lambda p: p["alerts"][0].pop("labels"), "alerts.0.labels: Field required"),
    ],
)
def test_invalid_payloads_get_a_clear_400(served: Served, mutate: Any, expected: str) -> None:
    payload = json.loads((FIXTURES / "firing.json").read_text())
    payload["alerts"][0]["annotations"]["secret"] = "s3cr3t-token"
    mutate(payload)
    answer = served.post("/api/v1/alerts", json.dumps(payload).encode())
    assert answer.status_code == 400
    assert expected in answer.json()["error"]
    assert "s3cr3t-token" not in answer.text


def test_bodies_that_are_not_json_or_too_large_are_refused(served: Served) -> None:
    assert served.post("/api/v1/alerts", b"{not json").status_code == 400
    served.api.max_body_bytes = 100
    answer = served.post("/api/v1/alerts", b"x" * 101)
    assert answer.status_code == 413 and "exceeds the limit of 100" in answer.json()["error"]
    assert served.get("/healthz").status_code == 200


def test_unknown_paths_and_bad_limits(served: Served) -> None:
    assert served.get("/nope").status_code == 404
    assert served.get("/api/v1/alerts").status_code == 405
    assert served.get("/api/v1/decisions?limit=zero").status_code == 400
    assert served.get("/api/v1/decisions?limit=0").status_code == 400


def test_matching_rule_table(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(
        policy_yaml("svc", {"namespace": "llm"})
        + "---\n"
        + policy_yaml("svc-version", {"namespace": "llm"}, ("service", "version"))
        + "---\n"
        + policy_yaml("anything", {})
    )
    loaded, errors = load_policies([tmp_path / "p.yaml"])
    assert not errors
    policies = {entry.policy.name: entry.policy for entry in loaded}
    assert policies_for_alert(policies, {"namespace": "llm", "service": "chat"}) == ["anything", "svc"]
    assert policies_for_alert(policies, {"namespace": "llm", "service": "chat", "version": "r2"}) == [
        "anything",
        "svc",
        "svc-version",
    ]
    assert policies_for_alert(policies, {"namespace": "batch", "service": "chat"}) == ["anything"]
    assert policies_for_alert(policies, {"namespace": "llm"}) == []  # cannot name a target
    assert policies_for_alert(policies, {"namespace": "llm", "service": "chat", "tailguard_policy": "svc"}) == ["svc"]


def test_payload_parser_accepts_both_real_fixtures() -> None:
    firing = parse_alertmanager_payload((FIXTURES / "firing.json").read_bytes())
    resolved = parse_alertmanager_payload((FIXTURES / "resolved.json").read_bytes())
    assert firing.status == "firing" and firing.alerts[0].labels["service"] == "checkout"
    assert resolved.alerts[0].status == "resolved"
    with pytest.raises(PayloadError, match="expected a JSON object"):
        parse_alertmanager_payload(b"[]")
