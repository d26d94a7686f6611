"""Alerts posted to the standby replica: 503 with Retry-After and a JSON body saying so (Alertmanager retries a
5xx, and through the Service the retry reaches the leader); the leader, and a controller without leader
election, accept them as before. Served for real on a loopback port with a fake controller and leader port."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import requests

from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.core.model import TargetKey
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.core.ports import HandoverPort
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.ports import TRIGGER_ALERT, Readiness
from tests.unit.test_api import policy_yaml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "alertmanager"
TOKEN = "standby-test-token"
TIMEOUT = 10


class FakeLeader:
    """The LeaderPort: leading or not, as the test says."""

    def __init__(self, leading: bool) -> None:
        self.leading = leading

    def is_leader(self) -> bool:
        return self.leading

    def attach_handover(self, handover: HandoverPort) -> None:
        pass

    def publish(self) -> bool:
        return self.leading


class FakeController:
    """The ControllerPort, recording every trigger."""

    def __init__(self, policies: dict[str, Policy]) -> None:
        self._policies = policies
        self.metrics = ControllerMetrics()
        self.triggered: list[tuple[list[str], str]] = []

    def policies(self) -> dict[str, Policy]:
        return dict(self._policies)

    def readiness(self) -> Readiness:
        return Readiness(True, (), ())

    def trigger(
        self,
        policy_names: Sequence[str],
        trigger: str = TRIGGER_ALERT,
        *,
        targets: Mapping[str, Collection[TargetKey]] | None = None,
    ) -> list[str]:
        self.triggered.append((list(policy_names), trigger))
        return list(policy_names)

    def recent_decisions(self, limit: int = 100) -> list[dict[str, Any]]:
        return []


@pytest.fixture
def controller(tmp_path: Path) -> FakeController:
    (tmp_path / "p99-rollback.yaml").write_text(policy_yaml("p99-rollback", {}), encoding="utf-8")
    loaded, errors = load_policies([tmp_path])
    assert errors == []
    return FakeController({entry.policy.name: entry.policy for entry in loaded})


@pytest.fixture
def leader() -> FakeLeader:
    return FakeLeader(leading=False)


@pytest.fixture
def api(controller: FakeController, leader: FakeLeader) -> Iterator[ControllerAPI]:
    served = ControllerAPI(controller, webhook_token=TOKEN, leader=leader, standby_retry_after=3)
    served.start()
    try:
        yield served
    finally:
        served.stop()


def post_alert(api: ControllerAPI, token: str | None = TOKEN) -> requests.Response:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = (FIXTURES / "firing.json").read_bytes()
    return requests.post(f"{api.url}/api/v1/alerts", data=body, headers=headers, timeout=TIMEOUT)


def test_the_standby_answers_503_with_retry_after_and_triggers_nothing(
    api: ControllerAPI, controller: FakeController
) -> None:
    answer = post_alert(api)
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "3"
    assert answer.headers["Content-Type"] == "application/json"
    body = answer.json()
    assert body["standby"] is True and "standby" in body["error"] and "leader" in body["error"]
    assert controller.triggered == []
    # The connection stays usable (the body was read): a second post on the same session is answered too.
    with requests.Session() as session:
        for _ in range(2):
            again = session.post(
                f"{api.url}/api/v1/alerts",
                data=(FIXTURES / "firing.json").read_bytes(),
                headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
                timeout=TIMEOUT,
            )
            assert again.status_code == 503


def test_the_leader_accepts_the_same_alert(api: ControllerAPI, controller: FakeController, leader: FakeLeader) -> None:
    assert post_alert(api).status_code == 503
    leader.leading = True  # the Lease changed hands: Alertmanager's retry now reaches a leader
    answer = post_alert(api)
    assert answer.status_code == 202, answer.text
    assert "Retry-After" not in answer.headers
    assert answer.json()["triggered"] == ["p99-rollback"]
    assert controller.triggered == [(["p99-rollback"], TRIGGER_ALERT)]


def test_authentication_comes_before_the_standby_answer(api: ControllerAPI, controller: FakeController) -> None:
    assert post_alert(api, token=None).status_code == 401
    assert post_alert(api, token="wrong").status_code == 403
    assert controller.triggered == []


def test_without_leader_election_alerts_are_accepted(controller: FakeController) -> None:
    served = ControllerAPI(controller, webhook_token=TOKEN)
    served.start()
    try:
        answer = post_alert(served)
    finally:
        served.stop()
    assert answer.status_code == 202
    assert controller.triggered == [(["p99-rollback"], TRIGGER_ALERT)]


def test_probes_stay_open_on_the_standby(api: ControllerAPI) -> None:
    assert requests.get(f"{api.url}/healthz", timeout=TIMEOUT).status_code == 200
    assert requests.get(f"{api.url}/readyz", timeout=TIMEOUT).status_code == 200
