"""Replica-to-replica trust (issue 24 item 3). At 7710821 a standby forwarded status, decisions, controls and alerts
with the client's `Authorization: Bearer` to whatever URL the Lease annotation `tailguard.io/api-url` named, and
relayed that server's answer as the controller's (4 of 4 requests reached an arbitrary server with the token).

Here a standby (a real ControllerAPI and a real LeaderElector reading the Lease from the spec-validating fake
Kubernetes API, with the real pod check) faces Leases that name an arbitrary server: a port that is not the API's,
a pod of another Deployment, no pod at all, a host name, an IP that is not the holder pod's. The server receives
nothing (0 of N requests). When the server does sit at the holder pod's address and port, it receives a replica
signature and never the client's token, and its unsigned answer is not relayed. A real leader behind the same
checks answers as before; a forged, replayed or stale replica signature is refused by the leader."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from kubernetes import client as k8s

from tailguard.controller.adapters.lease.leader import API_URL_ANNOTATION, LeaderElector
from tailguard.controller.adapters.lease.peers import PodPeerCheck
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.app.api_auth import TOKEN_HEADER
from tailguard.controller.app.forwarding import ANSWERED_BY_HEADER, FORWARDED_HEADER, VIA_HEADER
from tailguard.controller.app.peer_auth import NONCE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, PeerKey
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.tools.cluster_permissions import PEER_PERMISSIONS
from tests.support.fake_kubernetes import FakeKubernetes
from tests.unit.test_api_forwarding import FIXTURES, DirectoryLeader, OperatorController

NAMESPACE = "tailguard"
TOKEN = "replica-trust-test-token"
TIMEOUT = 10
LEADER_POD = "tailguard-5f7c9d-a1b2c"
STANDBY_POD = "tailguard-5f7c9d-d3e4f"
THIRD_POD = "tailguard-5f7c9d-g5h6i"  # a replica of the Deployment at 127.0.0.3
OTHER_DEPLOYMENT_POD = "intruder-6b8d4f-x9y8z"


def pod(name: str, replica_set: str, template_hash: str, ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": "tailguard", "pod-template-hash": template_hash},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": replica_set,
                    "uid": f"uid-{replica_set}",
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "controller", "image": "tailguard:dev"}]},
        "status": {"podIP": ip, "podIPs": [{"ip": ip}]},
    }


@dataclass
class Recorder:
    """An arbitrary HTTP server a Lease may name: it records what reaches it and answers like a controller would."""

    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    def start(self) -> Recorder:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                recorder.requests.append((self.command, self.path, dict(self.headers)))
                body = json.dumps({"triggered": ["p99-rollback"], "alerts": 1, "replica": "rogue"}).encode()
                self.send_response(202 if self.command == "POST" else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header(ANSWERED_BY_HEADER, LEADER_POD)  # claims to be the leader
                self.end_headers()
                self.wfile.write(body)

            do_GET = _answer
            do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class Cluster:
    """The fake API server with the controller's pods, a real leader API, an arbitrary server and a clock."""

    def __init__(self, fake: FakeKubernetes, tmp: Path) -> None:
        self.fake = fake
        self.tmp = tmp
        self.clock = ManualClock(1_767_225_600.0)
        (tmp / "leader").mkdir()
        self.leader_controller = OperatorController(LEADER_POD, tmp / "leader")
        self.leader = ControllerAPI(
            self.leader_controller, webhook_token=TOKEN, leader=DirectoryLeader(LEADER_POD, leading=True)
        )
        self.rogue = Recorder().start()
        fake.put_object(pod(LEADER_POD, "tailguard-5f7c9d", "5f7c9d", "127.0.0.1"))
        fake.put_object(pod(STANDBY_POD, "tailguard-5f7c9d", "5f7c9d", "127.0.0.2"))
        fake.put_object(pod(THIRD_POD, "tailguard-5f7c9d", "5f7c9d", "127.0.0.3"))
        fake.put_object(pod(OTHER_DEPLOYMENT_POD, "intruder-6b8d4f", "6b8d4f", "127.0.0.1"))
        self.standbys: list[ControllerAPI] = []

    def lease(self, holder: str, url: str) -> None:
        """The Lease as someone who may write Leases leaves it: held (unexpired), naming `url`."""
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "tailguard-leader", "namespace": NAMESPACE, "annotations": {API_URL_ANNOTATION: url}},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": 1},
        }
        if self.fake.get_object("leases", NAMESPACE, "tailguard-leader") is not None:
            self.fake.delete_object("leases", NAMESPACE, "tailguard-leader")
        self.fake.put_object(lease)

    def standby(self, port: int) -> ControllerAPI:
        """A standby replica whose API port (as configured on every replica) is `port`: elector + pod check."""
        api_client = self.fake.api_client()
        elector = LeaderElector(
            k8s.CoordinationV1Api(api_client), "tailguard-leader", NAMESPACE, STANDBY_POD, 15, self.clock
        )
        assert elector.run_once() is False, "the Lease is someone else's"
        peers = PodPeerCheck(k8s.CoreV1Api(api_client), NAMESPACE, STANDBY_POD, port, self.clock)
        (self.tmp / f"standby-{len(self.standbys)}").mkdir()
        controller = OperatorController(STANDBY_POD, self.tmp / f"standby-{len(self.standbys)}")
        api = ControllerAPI(controller, webhook_token=TOKEN, leader=elector, peers=peers)
        api.start()
        self.standbys.append(api)
        return api


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with FakeKubernetes() as fake:
        world = Cluster(fake, tmp_path)
        world.leader.start()
        try:
            yield world
        finally:
            for api in world.standbys:
                api.stop()
            world.leader.stop()
            world.rogue.stop()


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def four_requests(url: str) -> list[requests.Response]:
    """Status, decisions, an alert and the kill switch: what an operator and Alertmanager send a standby."""
    alert = (FIXTURES / "firing.json").read_bytes()
    json_headers = {**auth(), "Content-Type": "application/json"}
    return [
        requests.get(f"{url}/api/v1/status", headers=auth(), timeout=TIMEOUT),
        requests.get(f"{url}/api/v1/decisions?limit=5", headers=auth(), timeout=TIMEOUT),
        requests.post(f"{url}/api/v1/alerts", data=alert, headers=json_headers, timeout=TIMEOUT),
        requests.post(f"{url}/api/v1/pause", data=b'{"by": "alice"}', headers=json_headers, timeout=TIMEOUT),
    ]


@pytest.mark.parametrize(
    ("holder", "where", "why"),
    [
        (LEADER_POD, "rogue-port", "has port"),  # the holder's pod IP, but not the API's port
        (OTHER_DEPLOYMENT_POD, "rogue", "is not a replica of Deployment tailguard"),
        ("tailguard-no-such-pod", "rogue", "no pod named 'tailguard-no-such-pod'"),
        (LEADER_POD, "rogue-by-name", "names a host, not a pod IP"),
        (THIRD_POD, "rogue", "127.0.0.1 is not the IP of pod"),  # a real replica, another address
    ],
)
def test_a_lease_naming_an_arbitrary_server_sends_it_nothing(
    cluster: Cluster, holder: str, where: str, why: str
) -> None:
    rogue = cluster.rogue
    url = {
        "rogue-port": f"http://127.0.0.1:{rogue.port}",
        "rogue": f"http://127.0.0.1:{rogue.port}",
        "rogue-by-name": f"http://localhost:{rogue.port}",
    }[where]
    cluster.lease(holder, url)
    # The replicas' API port: the leader's, or the server's own where only the Deployment or name is at fault.
    standby = cluster.standby(cluster.leader.port if where == "rogue-port" else rogue.port)
    answers = four_requests(standby.url)
    assert rogue.requests == [], "0 of 4 requests may reach a server the Lease names"
    for answer in answers:
        assert answer.status_code == 503, answer.text
        body = answer.json()
        assert body["standby"] is True and why in body["reason"] and "retry" in body["error"]
        assert answer.headers[ANSWERED_BY_HEADER] == STANDBY_POD and answer.headers["Retry-After"]
        assert TOKEN not in answer.text
    assert cluster.leader_controller.status_reads == 0 and cluster.leader_controller.paused == []


def test_a_server_at_the_holders_address_gets_no_token_and_its_answer_is_not_relayed(cluster: Cluster) -> None:
    """Even where the pod check passes (the server sits at the holder pod's IP and the API's port), the client's
    credential never leaves the standby, and an answer not signed by the leader is never passed on."""
    rogue = cluster.rogue
    cluster.lease(LEADER_POD, f"http://127.0.0.1:{rogue.port}")
    standby = cluster.standby(rogue.port)
    answers = four_requests(standby.url)
    # A token in the URL is not a credential any more (the page signs in by form and cookie): the standby answers
    # its sign-in form and forwards nothing.
    in_url = requests.get(f"{standby.url}/status", params={"token": TOKEN, "x": "1"}, timeout=TIMEOUT)
    assert in_url.status_code == 401 and "<form" in in_url.text
    # The token header that passes the Kubernetes API's service proxy is authenticated here and never forwarded.
    answers.append(requests.get(f"{standby.url}/api/v1/status", headers={TOKEN_HEADER: TOKEN}, timeout=TIMEOUT))
    assert len(rogue.requests) == 5 and rogue.requests[-1][1] == "/api/v1/status"
    for method, path, headers in rogue.requests:
        assert TOKEN not in path
        names = {name.lower() for name in headers}
        assert "authorization" not in names, f"{method}: the client's bearer token was forwarded"
        assert TOKEN not in json.dumps(headers)
        assert {SIGNATURE_HEADER.lower(), NONCE_HEADER.lower(), TIMESTAMP_HEADER.lower()} <= names
        assert headers[FORWARDED_HEADER] == STANDBY_POD
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert f"did not answer as the leader '{LEADER_POD}'" in answer.json()["reason"]
        assert "rogue" not in answer.text and answer.headers[ANSWERED_BY_HEADER] == STANDBY_POD


def test_the_real_leader_behind_the_same_checks_answers(cluster: Cluster) -> None:
    cluster.lease(LEADER_POD, cluster.leader.url)
    standby = cluster.standby(cluster.leader.port)
    status, decisions, alert, pause = four_requests(standby.url)
    assert status.status_code == 200 and status.json()["replica"] == LEADER_POD
    assert decisions.json() == [{"id": f"{LEADER_POD}-decision", "policy": "p99-rollback"}]
    assert alert.status_code == 202 and cluster.leader_controller.triggered == [(["p99-rollback"], "alert")]
    assert pause.status_code == 200 and cluster.leader_controller.paused == [(None, True, "alice (bearer token)")]
    for answer in (status, decisions, alert, pause):
        assert answer.headers[ANSWERED_BY_HEADER] == LEADER_POD and answer.headers[VIA_HEADER] == STANDBY_POD
    # The pod was read once for the four requests (the check is cached), and the standby's own once: calls that
    # deploy/base's Role grants (PEER_PERMISSIONS, compared with the rendered Role in tests/unit/test_deploy.py).
    assert len(cluster.fake.calls("get", "pods")) == 2
    pods = {(r.api_group, r.resource, r.verb) for r in cluster.fake.requests if r.resource == "pods"}
    assert pods == {(p.api_group, p.resource, verb) for p in PEER_PERMISSIONS for verb in p.verbs}


def test_the_leader_refuses_forged_replayed_and_stale_replica_signatures(cluster: Cluster) -> None:
    leader = cluster.leader
    key = PeerKey.derived_from_token(TOKEN)  # replicas sign with their own clocks
    path = "/api/v1/status"

    def signed(**overrides: Any) -> dict[str, str]:
        fields = {"sender": STANDBY_POD, "receiver": LEADER_POD, "method": "GET", "path_qs": path, "content_length": 0}
        return {**key.sign_request(**{**fields, **overrides}), FORWARDED_HEADER: STANDBY_POD}

    good = signed()
    first = requests.get(leader.url + path, headers=good, timeout=TIMEOUT)
    assert first.status_code == 200 and first.headers[SIGNATURE_HEADER] == key.sign_answer(
        nonce=good[NONCE_HEADER], leader=LEADER_POD, status=200, body=first.content
    )
    replayed = requests.get(leader.url + path, headers=good, timeout=TIMEOUT)
    assert replayed.status_code == 403 and "replayed" in replayed.json()["error"]
    other_key = PeerKey.derived_from_token("another-token")
    forged = {**other_key.sign_request(sender=STANDBY_POD, receiver=LEADER_POD, method="GET", path_qs=path,
                                       content_length=0), FORWARDED_HEADER: STANDBY_POD}  # fmt: skip
    assert requests.get(leader.url + path, headers=forged, timeout=TIMEOUT).status_code == 403
    for_another = signed(receiver="tailguard-5f7c9d-zzzzz")
    assert requests.get(leader.url + path, headers=for_another, timeout=TIMEOUT).status_code == 403
    other_path = signed(path_qs="/api/v1/decisions")
    assert requests.get(leader.url + path, headers=other_path, timeout=TIMEOUT).status_code == 403
    stale_key = PeerKey.derived_from_token(TOKEN, now=lambda: time.time() - 3600)
    stale = {**stale_key.sign_request(sender=STANDBY_POD, receiver=LEADER_POD, method="GET", path_qs=path,
                                      content_length=0), FORWARDED_HEADER: STANDBY_POD}  # fmt: skip
    assert requests.get(leader.url + path, headers=stale, timeout=TIMEOUT).status_code == 403
    assert cluster.leader_controller.status_reads == 1
