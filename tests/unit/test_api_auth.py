"""The Alertmanager webhook with a bearer token: 401 without one, 403 with another, 202 with it; never logged."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.app.settings import WebhookTokenError, parse_settings_text
from tailguard.controller.core.model import SignalResult, target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDispatcher, FakeSource

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "alertmanager"
TOKEN = "s3cret-Token-that-must-not-leak"
TIMEOUT = 10

POLICY = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: checkout-p99
targets:
  groupBy: [service]
  match: {service: checkout}
signals:
  - name: p99
    query: max by ({{ by }}) (lat{ {{ selector }} })
conditions:
  - name: p99-high
    signal: p99
    when: {op: ">", value: 0.8}
    for: 1
    noData: hold
    actions:
      - type: annotate
        text: "p99 {{ value }}"
"""


def controller_for(tmp_path: Path, registry: CollectorRegistry) -> Controller:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "checkout.yaml").write_text(POLICY)
    return Controller(
        policy_paths=[rules],
        source=FakeSource(default=SignalResult({target_key({"service": "checkout"}): 0.95})),
        journal=Journal(tmp_path / "journal.db"),
        dispatcher=FakeDispatcher(),
        clock=ManualClock(),
        metrics=ControllerMetrics(registry),
        schedule=False,
    )


class Authenticated:
    def __init__(self, controller: Controller, api: ControllerAPI, registry: CollectorRegistry) -> None:
        self.controller = controller
        self.api = api
        self.registry = registry

    def post_alert(self, authorization: str | None) -> requests.Response:
        headers = {"Content-Type": "application/json"}
        if authorization is not None:
            headers["Authorization"] = authorization
        return requests.post(
            self.api.url + "/api/v1/alerts",
            data=(FIXTURES / "firing.json").read_bytes(),
            headers=headers,
            timeout=TIMEOUT,
        )

    def alert_evaluations(self) -> float:
        labels = {"policy": "checkout-p99", "trigger": "alert"}
        return self.registry.get_sample_value("tailguard_evaluations_total", labels) or 0.0


@pytest.fixture
def authenticated(tmp_path: Path) -> Iterator[Authenticated]:
    registry = CollectorRegistry()
    controller = controller_for(tmp_path, registry)
    api = ControllerAPI(controller, "127.0.0.1", 0, webhook_token=TOKEN)
    api.start()
    controller.start()
    try:
        yield Authenticated(controller, api, registry)
    finally:
        api.stop()
        controller.stop()


def test_no_bearer_token_is_401_and_triggers_nothing(authenticated: Authenticated) -> None:
    for authorization in (None, "", f"Basic {TOKEN}", "Bearer ", "Bearer"):
        answer = authenticated.post_alert(authorization)
        assert answer.status_code == 401, authorization
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
        assert "Authorization: Bearer" in answer.json()["error"]
    assert authenticated.alert_evaluations() == 0
    assert authenticated.controller.recent_decisions(5) == []


def test_a_wrong_bearer_token_is_403_and_triggers_nothing(authenticated: Authenticated) -> None:
    for wrong in (TOKEN[:-1], TOKEN + "x", TOKEN.upper(), "other"):
        answer = authenticated.post_alert(f"Bearer {wrong}")
        assert answer.status_code == 403
        assert TOKEN not in answer.text and wrong not in answer.text
    assert authenticated.alert_evaluations() == 0
    # Counted for the TailguardWebhookRejects alert (issue 24): by endpoint and code.
    rejected = authenticated.registry.get_sample_value(
        "tailguard_requests_rejected_total", {"endpoint": "alertmanager-webhook", "code": "403"}
    )
    assert rejected == 4


def test_the_right_bearer_token_triggers_the_evaluation(authenticated: Authenticated) -> None:
    answer = authenticated.post_alert(f"Bearer {TOKEN}")
    assert answer.status_code == 202 and answer.json()["triggered"] == ["checkout-p99"]
    assert authenticated.controller.wait_for_triggered(timeout=30)
    assert authenticated.alert_evaluations() == 1
    # The scheme is case-insensitive (RFC 7235); a keep-alive connection after a refusal still works.
    with requests.Session() as session:
        refused = session.post(authenticated.api.url + "/api/v1/alerts", data=b"{}", timeout=TIMEOUT)
        accepted = session.post(
            authenticated.api.url + "/api/v1/alerts",
            data=(FIXTURES / "firing.json").read_bytes(),
            headers={"Authorization": f"bearer {TOKEN}"},
            timeout=TIMEOUT,
        )
    assert refused.status_code == 401 and accepted.status_code == 202


def test_health_readiness_and_metrics_stay_open(authenticated: Authenticated) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        answer = requests.get(authenticated.api.url + path, timeout=TIMEOUT)
        assert answer.status_code in (200, 503), path  # readyz is 503 until every policy was evaluated
        assert answer.status_code != 401


def test_the_token_is_never_logged(authenticated: Authenticated, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    authenticated.post_alert(None)
    authenticated.post_alert(f"Bearer {TOKEN}-wrong")
    authenticated.post_alert(f"Bearer {TOKEN}")
    assert authenticated.controller.wait_for_triggered(timeout=30)
    assert "no bearer token" in caplog.text and "wrong bearer token" in caplog.text
    assert TOKEN not in caplog.text


def test_without_a_token_the_webhook_stays_open(tmp_path: Path) -> None:
    controller = controller_for(tmp_path, CollectorRegistry())
    api = ControllerAPI(controller, "127.0.0.1", 0)
    api.start()
    try:
        answer = requests.post(
            api.url + "/api/v1/alerts", data=(FIXTURES / "firing.json").read_bytes(), timeout=TIMEOUT
        )
        assert answer.status_code == 202
    finally:
        api.stop()
        controller.stop()
    with pytest.raises(ValueError, match="must not be empty"):
        ControllerAPI(controller, "127.0.0.1", 0, webhook_token="")


BASE = "prometheus: {url: 'http://127.0.0.1:9090'}\npolicies: [rules]\n"


def test_settings_read_the_token_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    from_file = parse_settings_text(BASE + "webhook: {bearerTokenFile: token}\n", "c.yaml", tmp_path)
    assert from_file.webhook_token() == TOKEN
    monkeypatch.setenv("TG_WEBHOOK_TOKEN", TOKEN)
    from_env = parse_settings_text(BASE + "webhook: {bearerTokenEnv: TG_WEBHOOK_TOKEN}\n", "c.yaml", tmp_path)
    assert from_env.webhook_token() == TOKEN
    assert parse_settings_text(BASE, "c.yaml", tmp_path).webhook_token() is None

    missing = parse_settings_text(BASE + "webhook: {bearerTokenFile: absent}\n", "c.yaml", tmp_path)
    with pytest.raises(WebhookTokenError, match="webhook.bearerTokenFile: .*absent: cannot read the token"):
        missing.webhook_token()
    monkeypatch.setenv("TG_WEBHOOK_TOKEN", "  \n")
    with pytest.raises(WebhookTokenError, match="TG_WEBHOOK_TOKEN: the token is empty"):
        from_env.webhook_token()


def test_run_refuses_an_unreadable_webhook_token(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tailguard.controller.app.cli import EXIT_CONFIG, main

    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "checkout.yaml").write_text(POLICY)
    config = tmp_path / "controller.yaml"
    config.write_text(BASE + "webhook: {bearerTokenFile: secrets/absent-token}\n")
    assert main(["run", "--config", str(config)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "webhook.bearerTokenFile:" in err and "absent-token: cannot read the token" in err
