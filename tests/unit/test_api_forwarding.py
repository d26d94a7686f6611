"""One view across replicas (issue 17 item 4): a standby authenticates a status read, a decisions read, a control or
an alert itself and answers with the leader's answer (controller/app/forwarding.py); a request already forwarded
once is never forwarded again; no leader known or reachable is a 503 with Retry-After and a reason. Two real
ControllerAPIs on loopback ports, each with its own fake controller, and a leader directory the test sets."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.app.forwarding import ANSWERED_BY_HEADER, FORWARDED_HEADER, VIA_HEADER
from tailguard.controller.app.ports import LeaderDirectoryPort
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.core.ports import HandoverPort
from tests.unit.test_api import policy_yaml
from tests.unit.test_api_standby import FakeController

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "alertmanager"
TOKEN = "forwarding-test-token"
TIMEOUT = 10


class DirectoryLeader:
    """The elector as the API sees it: leading or not, and where the leader's API answers (the Lease's URL)."""

    def __init__(self, identity: str, leading: bool, holder: str = "tailguard-a") -> None:
        self.identity = identity
        self.leading = leading
        self.holder = holder  # the Lease's holderIdentity
        self.url: str | None = None

    def is_leader(self) -> bool:
        return self.leading

    def leader_endpoint(self) -> tuple[str, str] | None:
        return None if self.leading or self.url is None else (self.holder, self.url)


class AddressBook:
    """The PeerCheckPort as a table: the URL each replica really answers at (the pod check is
    tests/unit/test_replica_trust.py's, against the fake Kubernetes API)."""

    def __init__(self) -> None:
        self.replicas: dict[str, str] = {}

    def check(self, identity: str, url: str) -> str | None:
        return None if self.replicas.get(identity) == url else f"{url} is not replica {identity}"

    def attach_handover(self, handover: HandoverPort) -> None:
        pass

    def publish(self) -> bool:
        return self.leading


class OperatorController(FakeController):
    """FakeController with the operator endpoints: a status naming its replica, pauses recorded."""

    def __init__(self, replica: str, tmp: Path) -> None:
        (tmp / "p99-rollback.yaml").write_text(policy_yaml("p99-rollback", {}), encoding="utf-8")
        loaded, errors = load_policies([tmp])
        assert errors == []
        super().__init__({entry.policy.name: entry.policy for entry in loaded})
        self.replica = replica
        self.paused: list[tuple[str | None, bool, str]] = []
        self.status_reads = 0

    def status(self, decisions: int = 20) -> dict[str, Any]:
        self.status_reads += 1
        return {"replica": self.replica, "policies": [{"name": "p99-rollback"}]}

    def recent_decisions(self, limit: int = 100) -> list[dict[str, Any]]:
        return [{"id": f"{self.replica}-decision", "policy": "p99-rollback"}]

    def set_paused(self, policy: str | None, paused: bool, *, by: str, reason: str) -> Any:
        self.paused.append((policy, paused, by))

        class Control:
            def to_json(self) -> dict[str, Any]:
                return {"paused": paused, "by": by}

        return Control()


class Pair:
    def __init__(self, tmp: Path) -> None:
        (tmp / "a").mkdir()
        (tmp / "b").mkdir()
        self.leader_controller = OperatorController("tailguard-a", tmp / "a")
        self.standby_controller = OperatorController("tailguard-b", tmp / "b")
        self.leader_elector = DirectoryLeader("tailguard-a", leading=True)
        self.standby_elector = DirectoryLeader("tailguard-b", leading=False)
        self.peers = AddressBook()
        self.leader = ControllerAPI(
            self.leader_controller, webhook_token=TOKEN, leader=self.leader_elector, peers=self.peers
        )
        self.standby = ControllerAPI(
            self.standby_controller,
            webhook_token=TOKEN,
            leader=self.standby_elector,
            standby_retry_after=3,
            peers=self.peers,
        )
        self.standby_elector.url = self.leader.url  # what the leader published in the Lease
        self.peers.replicas = {"tailguard-a": self.leader.url, "tailguard-b": self.standby.url}


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    replicas = Pair(tmp_path)
    replicas.leader.start()
    replicas.standby.start()
    try:
        yield replicas
    finally:
        replicas.standby.stop()
        replicas.leader.stop()


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def post_alert(url: str, token: str = TOKEN) -> requests.Response:
    body = (FIXTURES / "firing.json").read_bytes()
    headers = {**auth(token), "Content-Type": "application/json"}
    return requests.post(f"{url}/api/v1/alerts", data=body, headers=headers, timeout=TIMEOUT)


def test_the_elector_implements_the_directory_the_api_forwards_with() -> None:
    assert isinstance(DirectoryLeader("x", leading=False), LeaderDirectoryPort)


def test_status_and_decisions_read_on_the_standby_are_the_leaders(pair: Pair) -> None:
    for replica in (pair.leader, pair.standby):
        answer = requests.get(f"{replica.url}/api/v1/status", headers=auth(), timeout=TIMEOUT)
        assert answer.status_code == 200, answer.text
        assert answer.json()["replica"] == "tailguard-a"
        assert answer.headers[ANSWERED_BY_HEADER] == "tailguard-a"
    assert pair.standby_controller.status_reads == 0, "the standby's own journal is never the answer"
    assert pair.leader_controller.status_reads == 2
    via = requests.get(f"{pair.standby.url}/api/v1/decisions?limit=5", headers=auth(), timeout=TIMEOUT)
    assert via.status_code == 200 and via.json() == [{"id": "tailguard-a-decision", "policy": "p99-rollback"}]
    assert via.headers[VIA_HEADER] == "tailguard-b" and via.headers[ANSWERED_BY_HEADER] == "tailguard-a"
    # The status page, signed in on the standby (the session cookie is checked there, the token goes on to the
    # leader): the page the leader rendered.
    browser = requests.Session()
    page = browser.post(f"{pair.standby.url}/status/login", data={"token": TOKEN}, timeout=TIMEOUT)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert page.headers[ANSWERED_BY_HEADER] == "tailguard-a"
    assert requests.get(f"{pair.standby.url}/status", params={"token": TOKEN}, timeout=TIMEOUT).status_code == 401
    # Probes and metrics stay the replica's own.
    health = requests.get(f"{pair.standby.url}/healthz", timeout=TIMEOUT)
    assert health.status_code == 200 and health.headers[ANSWERED_BY_HEADER] == "tailguard-b"


def test_the_token_header_of_the_service_proxy_reaches_the_leader_through_the_standby(pair: Pair) -> None:
    """Through the Kubernetes API's service proxy the token is in X-Tailguard-Token (the API server drops
    Authorization): the standby checks it and passes it on, so the leader answers."""
    proxied = {"X-Tailguard-Token": TOKEN}
    answer = requests.get(f"{pair.standby.url}/api/v1/status", headers=proxied, timeout=TIMEOUT)
    assert answer.status_code == 200 and answer.headers[ANSWERED_BY_HEADER] == "tailguard-a"
    wrong = requests.get(f"{pair.standby.url}/api/v1/status", headers={"X-Tailguard-Token": "x"}, timeout=TIMEOUT)
    assert wrong.status_code == 403


def test_an_alert_posted_to_the_standby_is_evaluated_once_by_the_leader(pair: Pair) -> None:
    answer = post_alert(pair.standby.url)
    assert answer.status_code == 202, answer.text
    assert answer.json()["triggered"] == ["p99-rollback"]
    assert answer.headers[ANSWERED_BY_HEADER] == "tailguard-a"
    assert pair.leader_controller.triggered == [(["p99-rollback"], "alert")]
    assert pair.standby_controller.triggered == []


def test_a_control_on_the_standby_is_applied_by_the_leader(pair: Pair) -> None:
    body = json.dumps({"by": "alice", "reason": "incident 42"})
    answer = requests.post(
        f"{pair.standby.url}/api/v1/policies/p99-rollback/pause",
        data=body,
        headers={**auth(), "Content-Type": "application/json"},
        timeout=TIMEOUT,
    )
    assert answer.status_code == 200, answer.text
    assert pair.leader_controller.paused == [("p99-rollback", True, "alice (bearer token)")]
    assert pair.standby_controller.paused == []


def test_the_standby_authenticates_before_it_forwards(pair: Pair) -> None:
    assert requests.get(f"{pair.standby.url}/api/v1/status", timeout=TIMEOUT).status_code == 401
    assert requests.get(f"{pair.standby.url}/api/v1/status", headers=auth("wrong"), timeout=TIMEOUT).status_code == 403
    assert post_alert(pair.standby.url, token="wrong").status_code == 403
    assert pair.leader_controller.status_reads == 0 and pair.leader_controller.triggered == []


def test_no_leader_known_is_a_503_with_retry_after_and_a_reason(pair: Pair) -> None:
    pair.standby_elector.url = None
    answer = requests.get(f"{pair.standby.url}/api/v1/status", headers=auth(), timeout=TIMEOUT)
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "3"
    assert answer.json()["standby"] is True and "no leader is known" in answer.json()["reason"]
    alert = post_alert(pair.standby.url)
    assert alert.status_code == 503 and alert.headers["Retry-After"] == "3"
    assert pair.leader_controller.triggered == [] and pair.standby_controller.triggered == []


def test_an_unreachable_leader_is_a_503(pair: Pair) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        pair.standby_elector.url = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening
        pair.peers.replicas["tailguard-a"] = pair.standby_elector.url
        answer = post_alert(pair.standby.url)
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "3"
    assert "unreachable" in answer.json()["reason"]
    assert pair.standby_controller.triggered == []


def test_a_forwarded_request_is_never_forwarded_again(pair: Pair) -> None:
    # The Lease moved: the old leader is now a standby that believes the other standby leads. A request with the
    # hop marker is answered 503 where it lands, so the two never pass it back and forth.
    pair.leader_elector.leading = False
    pair.leader_elector.holder = "tailguard-b"
    pair.leader_elector.url = pair.standby.url
    answer = requests.get(f"{pair.standby.url}/api/v1/status", headers=auth(), timeout=TIMEOUT)
    # tailguard-a answered 503 ("forwarded by 'tailguard-b'"), unsigned since it does not lead: the standby never
    # relays that as the leader's answer, it answers 503 itself.
    assert answer.status_code == 503
    assert "did not answer as the leader 'tailguard-a'" in answer.json()["reason"]
    assert answer.headers[ANSWERED_BY_HEADER] == "tailguard-b"
    assert pair.leader_controller.status_reads == 0 and pair.standby_controller.status_reads == 0
    marked = requests.get(
        f"{pair.standby.url}/api/v1/status", headers={**auth(), FORWARDED_HEADER: "someone"}, timeout=TIMEOUT
    )
    assert marked.status_code == 503 and "forwarded by 'someone'" in marked.json()["reason"]


def test_a_leader_answer_over_the_size_bound_is_a_502(pair: Pair) -> None:
    forwarder = pair.standby._forwarder
    assert forwarder is not None
    forwarder.max_response_bytes = 16
    answer = requests.get(f"{pair.standby.url}/api/v1/status", headers=auth(), timeout=TIMEOUT)
    assert answer.status_code == 502 and "exceeds 16 bytes" in answer.json()["error"]
