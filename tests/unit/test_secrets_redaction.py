"""A receiver URL's secret (a Slack-style URL's path) never reaches the log, the journal or the API: each shows
scheme+host only (issue 16 item 6)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import requests

from tailguard.controller.adapters.notify.webhook import WebhookNotifier, WebhookReceiver
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.app.logging_setup import configure_logging
from tailguard.controller.core.ports import NotifyPayload, NotifyRequest, OutcomeStatus
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.kit.redact import REDACTED, redact_value, url_origin
from tailguard.controller.loop.ports import Readiness
from tests.support.dispatch import dispatched
from tests.support.webhook_receiver import receiver
from tests.unit.test_api_standby import FakeController, controller  # noqa: F401 - the fixture

SECRET_PATH = "/services/T0000/B0000/XXXXslackSECRETpath"
TOKEN = "redaction-token"


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TG_TEST_REDACTION_SECRET", "hmac-secret")
    return "TG_TEST_REDACTION_SECRET"


def test_url_origin_and_redact_value() -> None:
    assert url_origin("https://hooks.slack.com" + SECRET_PATH) == "https://hooks.slack.com"
    assert url_origin("http://user:pw@10.0.0.1:8080/x?token=1#f") == "http://10.0.0.1:8080"
    assert url_origin("not a url") == REDACTED
    value = {
        "url": "https://hooks.slack.com" + SECRET_PATH,
        "error": "POST https://u:p@h.example:8443/a?b=1: HTTP 500",
        "authorization": "Bearer x",
        "nested": [{"text": "see http://grafana.svc:3000/d/x?from=1."}],
        "count": 3,
    }
    assert redact_value(value) == {
        "url": "https://hooks.slack.com",
        "error": "POST https://h.example:8443: HTTP 500",
        "authorization": REDACTED,
        "nested": [{"text": "see http://grafana.svc:3000."}],
        "count": 3,
    }


@pytest.mark.parametrize("statuses", [(), (400,), (503, 503)], ids=["delivered", "refused", "unavailable"])
def test_the_receiver_path_is_not_in_the_outcome_the_journal_or_the_log(
    secret_env: str, statuses: tuple[int, ...], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    clock = ManualClock()
    with receiver(*statuses) as (url, state):
        notifier = WebhookNotifier({"oncall": WebhookReceiver(url=url + SECRET_PATH, secretEnv=secret_env)}, clock)
        # Through a real dispatcher and journal: the outcome read back is what the journal holds.
        outcome = dispatched(
            lambda: notifier.notify(NotifyRequest("oncall", NotifyPayload.from_json({}), idempotency_key="k")),
            clock=clock,
            attempts=2,
        )
    assert state.requests, "the receiver was called"
    journaled = json.dumps({"detail": outcome.detail, "error": outcome.error})
    assert "XXXXslackSECRETpath" not in journaled and "XXXXslackSECRETpath" not in caplog.text
    assert outcome.detail["url"] == url_origin(url)
    if outcome.status is not OutcomeStatus.SUCCEEDED:
        assert outcome.error is not None and url_origin(url) in outcome.error


def test_the_log_handler_cuts_every_url_even_at_debug() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging("json", "DEBUG")
        stream = io.StringIO()
        root.handlers[0].setStream(stream)  # type: ignore[attr-defined]
        logging.getLogger("tailguard.test").info("posting to %s", "https://hooks.slack.com" + SECRET_PATH)
        try:
            raise RuntimeError("failed: https://hooks.slack.com" + SECRET_PATH)
        except RuntimeError:
            logging.getLogger("tailguard.test").exception("it broke")
        logging.getLogger("urllib3.connectionpool").debug('"POST %s HTTP/1.1" 200 2', SECRET_PATH)
        text = stream.getvalue()
        assert "posting to https://hooks.slack.com" in text and "it broke" in text
        assert "XXXXslackSECRETpath" not in text
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


@pytest.fixture
def api(controller: FakeController) -> Iterator[ControllerAPI]:  # noqa: F811 - the imported fixture
    decision = {
        "policy": "p99-rollback",
        "kind": "fire",
        "action_records": [
            {
                "kind": "notify",
                "params": {"receiver": "oncall"},
                "result": {"url": "https://hooks.slack.com" + SECRET_PATH, "http_status": 200},
                "error": f"POST https://hooks.slack.com{SECRET_PATH}: HTTP 500",
            }
        ],
    }
    controller.recent_decisions = lambda limit=100: [decision]  # type: ignore[method-assign]
    served = ControllerAPI(controller, webhook_token=TOKEN)
    served.start()
    try:
        yield served
    finally:
        served.stop()


def test_decisions_in_the_api_show_receiver_urls_as_scheme_and_host(api: ControllerAPI) -> None:
    answer = requests.get(f"{api.url}/api/v1/decisions", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert answer.status_code == 200
    assert "XXXXslackSECRETpath" not in answer.text
    (record,) = answer.json()[0]["action_records"]
    assert record["result"]["url"] == "https://hooks.slack.com"
    assert record["error"] == "POST https://hooks.slack.com: HTTP 500"


def test_decisions_without_the_token_answer_nothing(api: ControllerAPI) -> None:
    answer = requests.get(f"{api.url}/api/v1/decisions", timeout=10)
    assert answer.status_code == 401 and "p99-rollback" not in answer.text


def test_readyz_is_open_and_shows_urls_as_scheme_and_host(api: ControllerAPI, controller: FakeController) -> None:  # noqa: F811
    warning = f"receiver oncall: POST https://hooks.slack.com{SECRET_PATH}: connection failed"
    controller.readiness = lambda: Readiness(True, (), (), warnings=(warning,))  # type: ignore[method-assign]
    answer = requests.get(f"{api.url}/readyz", timeout=10)
    assert answer.status_code == 200 and "XXXXslackSECRETpath" not in answer.text
    assert answer.json()["warnings"] == ["receiver oncall: POST https://hooks.slack.com: connection failed"]
