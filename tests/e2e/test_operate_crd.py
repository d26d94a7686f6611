"""Issue 17's "done when", end to end on the configuration rendered from deploy/: two `tailguard run` processes (the
leader and the standby, each with its own journal, as two pods have) on the spec-validating fake Kubernetes API,
the fake Argo CD and Grafana, and a real Prometheus scraping a latency exporter.

1. The shipped p99-rollback policy, converted with `tailguard rules to-cr`, is applied as a TailguardPolicy.
2. A bad rollout of `chat` regresses its P99: the leader rolls it back on Argo CD, and a `kubectl get`-style GET of
   the custom resource shows the target firing and the rollback's outcome in `status`.
3. Mid-incident (chat still firing) `spec.suspend: true` is applied; a breach of `code` is then journaled as
   suppressed with reason "suspended" and nothing is done on Argo CD.
4. `spec.suspend: false`, and an alert about `code` posted to the STANDBY: the standby forwards it, the leader
   evaluates it once and rolls `code` back once. Every read in between goes to the standby and is the leader's.
In the end Argo CD saw exactly: disable auto-sync + roll back chat, disable auto-sync + roll back code.

Only URLs and file paths differ from the rendered configuration, plus what the test needs and says: the
`kubernetes.policies` section (docs/deploy.md: added with the crd-policies component), a 1 s status interval, a
second Argo CD application (`argocd.apps` is a CHANGE ME map of YOUR services), and the policy's 1 s interval and
10 s rate window. Every wait is a poll with a deadline; nothing asserts on durations.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from kubernetes import client as k8s

from tailguard.controller.core.actions import TERMINAL_STATUSES
from tailguard.serving.lab.promstack import free_port
from tests.e2e.test_shipped_config import (
    ALERTMANAGER_TOKEN,
    SERVICE,
    Stack,
    leaves,
    point_at_fakes,
    render_base,
    shorten,
    stack,  # noqa: F401 - the fixture: exporter, Prometheus, Argo CD, Grafana, Kubernetes, receiver
)
from tests.support.controller_process import REPO, poll, ready, replica_pod, start_controller, tail
from tests.support.fake_argocd import application

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

NAMESPACE = "tailguard"  # the controller's namespace: its Lease and (kubernetes.policies) its TailguardPolicies
OTHER = "code"  # the second service (its own Argo CD application)
HEALTHY_SECONDS = 0.08
REGRESSED_SECONDS = 2.0
GROUP, VERSION, PLURAL = "tailguard.io", "v1alpha1", "tailguardpolicies"
POLICY = "p99-rollback"
TIMEOUT = 10


@dataclass
class Replica:
    """One replica of the Deployment: the API port is every replica's, the address (its pod IP) its own."""

    name: str
    host: str
    port: int
    config: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        self.process = start_controller(
            self.config,
            self.log,
            {"POD_NAME": self.name, "POD_NAMESPACE": NAMESPACE, "POD_IP": self.host},
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


def replica_configs(stack: Stack) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:  # noqa: F811
    """(shipped, leader's, standby's): the rendered configuration pointed at the fakes, with the CRD source on."""
    shipped, _policies = render_base()
    leader = point_at_fakes(shipped, stack, free_port())
    (stack.tmp / "policies").mkdir()  # no policy file: the custom resource is the only policy
    leader["kubernetes"]["policies"] = {"namespace": NAMESPACE, "statusInterval": "1s"}
    leader["argocd"]["apps"][OTHER] = OTHER
    standby = copy.deepcopy(leader)
    # The same port on the standby's own address (its pod IP): a standby forwards only to the API's port.
    standby["listen"] = "127.0.0.2:" + str(leader["listen"]).rsplit(":", 1)[1]
    for config, own in ((leader, "a"), (standby, "b")):
        config["journal"] = str(stack.tmp / own / "journal.db")
        config["stateDir"] = str(stack.tmp / own / "state")
        config["annotations"]["path"] = str(stack.tmp / own / "annotations.jsonl")
        config["annotations"]["grafana"]["outbox"] = str(stack.tmp / own / "outbox.db")
    return shipped, leader, standby


def custom_resource(stack: Stack) -> dict[str, Any]:  # noqa: F811
    """The shipped p99-rollback policy (interval 1 s, 10 s rate window) as `tailguard rules to-cr` prints it."""
    source = stack.tmp / "p99-rollback.yaml"
    source.write_text(shorten((REPO / "rules" / "examples" / "p99-rollback.yaml").read_text()), encoding="utf-8")
    printed = subprocess.run(
        [sys.executable, "-m", "tailguard.controller", "rules", "to-cr", str(source), "--namespace", NAMESPACE],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout
    (manifest,) = [doc for doc in yaml.safe_load_all(printed) if doc]
    assert manifest["spec"]["interval"] == "1s" and "suspend" not in manifest["spec"]
    return dict(manifest)


@pytest.fixture
def replicas(stack: Stack) -> Iterator[tuple[Replica, Replica, dict[str, Any]]]:  # noqa: F811 - the fixture
    shipped, leader_config, standby_config = replica_configs(stack)
    made = []
    for name, config in (("tailguard-a", leader_config), ("tailguard-b", standby_config)):
        path = stack.tmp / f"{name}.yaml"
        path.write_text(json.dumps(config, indent=2), encoding="utf-8")  # JSON is YAML
        host, port = str(config["listen"]).rsplit(":", 1)
        made.append(Replica(name, host, int(port), path, stack.tmp / f"{name}.log"))
        stack.kube.put_object(replica_pod(name, NAMESPACE, host))  # a standby forwards only to a replica's pod
    try:
        yield made[0], made[1], {"shipped": shipped, "config": leader_config}
    finally:
        for replica in made:
            replica.stop()
            if replica.process is not None and replica.process.poll() is None:
                os.killpg(replica.process.pid, signal.SIGKILL)


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {ALERTMANAGER_TOKEN}"}


def read(replica: Replica, path: str) -> tuple[Any, str]:
    """GET `path` (JSON) from `replica` with the bearer token: (document, the replica that answered)."""
    answer = requests.get(f"{replica.url}{path}", headers=auth(), timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    return answer.json(), answer.headers["X-Tailguard-Answered-By"]


def metric(replica: Replica, name: str, **labels: str) -> float:
    """A sample of `replica`'s own /metrics (0 when absent)."""
    text = requests.get(f"{replica.url}/metrics", timeout=TIMEOUT).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.index("}")]))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def alert_about(service: str) -> bytes:
    payload = json.loads((REPO / "tests" / "fixtures" / "alertmanager" / "firing.json").read_text())
    labels = {"alertname": "P99LatencyHigh", "namespace": "llm", "service": service, "severity": "page"}
    for alert in payload["alerts"]:
        alert["labels"] = dict(labels)
    payload["commonLabels"] = dict(labels)
    payload["groupLabels"] = {"alertname": "P99LatencyHigh"}
    return json.dumps(payload).encode()


def test_a_tailguard_policy_rolls_back_is_suspended_and_resumed_and_the_standby_forwards(
    stack: Stack,  # noqa: F811 - the fixture
    replicas: tuple[Replica, Replica, dict[str, Any]],
) -> None:
    leader, standby, configs = replicas
    changed = {p for p, v in leaves(configs["config"]).items() if leaves(configs["shipped"]).get(p, object()) != v}
    assert changed - {
        "prometheus.url", "policies", "journal", "stateDir", "listen", "webhook.bearerTokenFile", "argocd.url",
        "argocd.tokenFile", "annotations.path", "annotations.grafana.url", "annotations.grafana.tokenFile",
        "annotations.grafana.outbox", "receivers.oncall.url", "receivers.oncall.secretFile", "kubernetes.inCluster",
        "kubernetes.kubeconfig", "predictors.sla.path",
    } == {"kubernetes.policies.namespace", "kubernetes.policies.statusInterval", f"argocd.apps.{OTHER}"}  # fmt: skip
    assert configs["config"]["leaderElection"]["advertiseAddressEnv"] == "POD_IP", "shipped: the one view is on"
    api = k8s.CustomObjectsApi(stack.kube.api_client())

    def get_cr() -> dict[str, Any]:  # kubectl -n tailguard get tailguardpolicy p99-rollback -o yaml
        return dict(api.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, POLICY))

    def suspend(value: bool) -> None:  # kubectl patch --type merge -p '{"spec": {"suspend": ...}}'
        api.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, POLICY, {"spec": {"suspend": value}})

    # 1. The policy as a custom resource; two applications with a bad rollout each (auto-sync on, as with GitOps).
    api.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, custom_resource(stack))
    for service in (SERVICE, OTHER):
        stack.exporter.set(service, HEALTHY_SECONDS)
        stack.argocd.add_app(
            application(service, [("good1", stack.rollout_at - 7200), ("bad2", stack.rollout_at)], automated=True)
        )
    leader.start()
    poll("the leader ready", lambda: ready(leader.port, leader.host), leader.process, leader.log)
    poll(
        "tailguard-a to hold the Lease",
        lambda: (
            (lease := stack.kube.get_object("leases", NAMESPACE, "tailguard-leader"))
            and lease["spec"].get("holderIdentity") == "tailguard-a"
            or None
        ),
        leader.process,
        leader.log,
    )
    standby.start()
    poll("the standby ready", lambda: ready(standby.port, standby.host), standby.process, standby.log)
    lease = stack.kube.get_object("leases", NAMESPACE, "tailguard-leader")
    assert lease is not None and lease["metadata"]["annotations"]["tailguard.io/api-url"] == leader.url

    def target_row(service: str) -> dict[str, Any] | None:
        rows = (get_cr().get("status") or {}).get("targets") or []
        return next((row for row in rows if row["target"].get("service") == service), None)

    poll("chat evaluated ok in the CR's status", lambda: (r := target_row(SERVICE)) and r["phase"] == "ok" or None,
         leader.process, leader.log)  # fmt: skip
    # One view: the standby's answer is the leader's (the standby's own journal has evaluated nothing).
    status, answered_by = read(standby, "/api/v1/status")
    assert answered_by == "tailguard-a" and status["policies"][0]["name"] == POLICY
    assert status["policies"][0]["evaluations"] > 0

    # 2. The bad rollout of chat regresses its P99: one rollback, visible in the CR's status.
    stack.exporter.set(SERVICE, REGRESSED_SECONDS)

    def rolled_back(service: str) -> dict[str, Any] | None:
        row = target_row(service)
        actions = ((row or {}).get("lastDecision") or {}).get("actions") or []
        finished = actions and all(a["status"] in TERMINAL_STATUSES for a in actions)
        fired = ((row or {}).get("lastDecision") or {}).get("kind") == "fire"
        return row if row is not None and row["phase"] == "firing" and fired and finished else None

    row = poll("chat firing with the rollback's outcome in the CR's status", lambda: rolled_back(SERVICE),
               leader.process, leader.log)  # fmt: skip
    assert row["lastDecision"]["kind"] == "fire"
    assert {"type": "rollback", "status": "succeeded"} in row["lastDecision"]["actions"]
    assert row["lastValue"] > 0.8 and row["condition"] == "p99-above-800ms"
    cr = get_cr()
    assert cr["status"]["targetsFiring"] == 1 and cr["status"]["lastAction"] == "rollback succeeded"
    conditions = {c["type"]: c["status"] for c in cr["status"]["conditions"]}
    assert conditions == {"Ready": "True", "Suspended": "False", "Degraded": "False"}
    assert stack.argocd.app(SERVICE)["status"]["sync"]["revision"] == "good1"

    # 3. Mid-incident (chat is still firing) the policy is suspended; then code breaches.
    suspend(True)
    poll(
        "the leader to run the policy suspended (asked through the standby)",
        lambda: read(standby, "/api/v1/status")[0]["policies"][0]["suspended"] is True or None,
        leader.process,
        leader.log,
    )
    stack.exporter.set(OTHER, REGRESSED_SECONDS)

    def code_decisions(kind: str) -> list[dict[str, Any]]:
        decisions, answered = read(standby, "/api/v1/decisions?limit=100")
        assert answered == "tailguard-a"
        return [d for d in decisions if d["kind"] == kind and (d.get("target") or {}).get("service") == OTHER]

    (suppressed,) = poll("code's breach journaled as suppressed", lambda: code_decisions("suppressed") or None,
                         leader.process, leader.log)  # fmt: skip
    assert suppressed["reason"] == "suspended" and suppressed["policy"] == POLICY
    assert [r for r in stack.argocd.state.requests if r.method != "GET" and OTHER in r.path] == [], "nothing done"
    poll("the CR's Suspended condition", lambda: {c["type"]: c["status"] for c in get_cr()["status"]["conditions"]}
         ["Suspended"] == "True" or None, leader.process, leader.log)  # fmt: skip

    # 4. Resumed; the alert about code goes to the standby, which hands it to the leader.
    alert_evaluations_before = metric(leader, "tailguard_evaluations_total", policy=POLICY, trigger="alert")
    suspend(False)
    poll(
        "the leader to run the policy again",
        lambda: read(standby, "/api/v1/status")[0]["policies"][0]["suspended"] is False or None,
        leader.process,
        leader.log,
    )
    posted = requests.post(
        f"{standby.url}/api/v1/alerts",
        data=alert_about(OTHER),
        headers={**auth(), "Content-Type": "application/json"},
        timeout=TIMEOUT,
    )
    assert posted.status_code == 202, posted.text
    assert posted.json()["triggered"] == [POLICY]
    assert posted.headers["X-Tailguard-Answered-By"] == "tailguard-a"
    assert posted.headers["X-Tailguard-Via"] == "tailguard-b"
    poll("code rolled back", lambda: rolled_back(OTHER), leader.process, leader.log)
    poll(
        "the alert's evaluation on the leader",
        lambda: (
            metric(leader, "tailguard_evaluations_total", policy=POLICY, trigger="alert")
            == alert_evaluations_before + 1
            or None
        ),
        leader.process,
        leader.log,
    )
    # Let both run on: a second rollback, or any evaluation on the standby, would show now.
    settle = time.time() + 5
    poll("five more seconds", lambda: True if time.time() > settle else None, leader.process, leader.log)
    assert metric(standby, "tailguard_evaluations_total") == 0, "the standby evaluates nothing, the alert neither"
    assert metric(leader, "tailguard_evaluations_total", trigger="alert") == alert_evaluations_before + 1
    (fire,) = code_decisions("fire")
    assert [(a["type"], a["status"]) for a in fire["action_records"]] == [("annotate", "succeeded"),
                                                                          ("rollback", "succeeded")]  # fmt: skip

    # Argo CD, exactly: per application auto-sync off, then one rollback to good1; nothing for the suspended breach.
    writes = [(r.method, r.path) for r in stack.argocd.state.requests if r.method != "GET"]
    assert writes == [
        ("PATCH", f"/api/v1/applications/{SERVICE}"),
        ("POST", f"/api/v1/applications/{SERVICE}/rollback"),
        ("PATCH", f"/api/v1/applications/{OTHER}"),
        ("POST", f"/api/v1/applications/{OTHER}/rollback"),
    ]
    for service in (SERVICE, OTHER):
        (post,) = stack.argocd.calls("POST", f"/{service}/rollback")
        assert post.body == {"name": service, "id": 1, "dryRun": False, "prune": False} and post.status == 200
    # The custom resource: written by the leader only (status subresource), the spec twice by the test.
    assert stack.kube.calls("update", "tailguardpolicies") == []
    for replica in (leader, standby):
        replica.stop()
        assert replica.process is not None and replica.process.returncode == 0, tail(replica.log)
        assert "Traceback" not in replica.log.read_text(encoding="utf-8", errors="replace"), tail(replica.log)
