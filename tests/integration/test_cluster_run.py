"""`tailguard run` (a real process) with the `kubernetes` and `leaderElection` sections: a REAL Prometheus scrapes
a tiny exporter in this process (`vllm:num_requests_waiting`, text format 0.0.4 so the colon survives), a
queue-scale policy breaches, and the HPA's minReplicas is raised through the official client on the
spec-validating fake Kubernetes API (reached through a kubeconfig file, `inCluster: false`).

With leader election, two controller processes share the fake's Lease: only the leader acts (exactly one HPA
update), and after SIGTERM of the leader (which releases the Lease) the other takes over, inherits the old
leader's action times from the Lease, and on the next breach within the policy's cooldown decides `suppressed`
instead of scaling a second time. Every wait is a poll with a deadline; nothing asserts on durations; every
process is cleaned up.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tailguard.controller.adapters.kube.action_keys import ANNOTATION_KEYS
from tailguard.controller.adapters.scale.hpa import ANNOTATION_HUMAN_FLOOR
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.handover import HANDOVER_ANNOTATION, decode_action_times
from tailguard.controller.core.model import target_key
from tailguard.serving.lab.promstack import free_port
from tests.support.controller_process import (
    ScrapedStack,
    poll_processes,
    replica_pod,
    scraped_stack,
    start_controller,
)

pytestmark = pytest.mark.integration

SERVICE = "chat"
HPA_NAME = "chat-stable"
NAMESPACE = "llm"
LEASE_NAMESPACE = "tailguard"
REPLICA_ADDRESSES = {"tailguard-a": "127.0.0.1", "tailguard-b": "127.0.0.2"}
PEER_SECRET = "cluster-run-replica-secret-0123456789"
LEASE_NAME = "tailguard-leader"
DEADLINE_SECONDS = 60.0  # per wait; generous for a loaded 2-core machine, never reached when things work
KUBE_TOKEN = "integration-kube-token"

# The queue-scale example with a 1 s interval: waiting requests per replica above 20 for 2 evaluations.
POLICY = """apiVersion: tailguard.io/v1alpha1
kind: Policy
name: queue-scale
interval: 1s
targets:
  groupBy: [service]
  match:
    namespace: llm
signals:
  - name: waiting-per-replica
    query: >-
      sum by ({{ by }}) (vllm:num_requests_waiting{ {{ selector }} })
      / count by ({{ by }}) (vllm:num_requests_waiting{ {{ selector }} })
conditions:
  - name: queue-above-target
    signal: waiting-per-replica
    when: {op: ">", value: 20}
    for: 2
    noData: hold
    staleAfter: 1m
    actions:
      - type: scale
        service: "{{ service }}"
        targetPerReplica: 20
        min: 1
        max: 8
limits:
  cooldown: 10m
  maxActionsPerHour: 10
"""


Stack = ScrapedStack


class ControllerProcess:
    """One `python -m tailguard.controller run` in its own process group, its output in a log file."""

    def __init__(self, stack: Stack, name: str, *, leader_election: bool, port: int | None = None) -> None:
        """Replicas of one Deployment share the API port and have an address each (their pod IP): tailguard-a
        127.0.0.1, tailguard-b 127.0.0.2, both pods seeded in the fake API (a standby forwards only there)."""
        self.name = name
        self.host = REPLICA_ADDRESSES.get(name, "127.0.0.1")
        self.port = port if port is not None else free_port()
        self.dir = stack.tmp / name
        (self.dir / "rules").mkdir(parents=True)
        (self.dir / "rules" / "queue-scale.yaml").write_text(POLICY, encoding="utf-8")
        config: dict[str, Any] = {
            "prometheus": {"url": stack.prometheus.url, "timeout": 5, "retries": 2},
            "policies": ["rules"],
            "journal": "journal.db",
            "stateDir": "state",
            "listen": f"{self.host}:{self.port}",
            "reloadInterval": "1s",
            "kubernetes": {
                "inCluster": False,
                "kubeconfig": str(stack.kubeconfig),
                "namespace": NAMESPACE,
                "timeout": 5,
                "retries": 2,
                "hpa": {"maxReplicas": 8, "targets": {SERVICE: {"name": HPA_NAME}}},
            },
        }
        if leader_election:
            config["leaderElection"] = {
                "namespace": LEASE_NAMESPACE,
                "leaseName": LEASE_NAME,
                "leaseDuration": "3s",
                "renewDeadline": "2s",
                "retryPeriod": 0.5,
                # Replica-to-replica trust: the replicas' own secret (this configuration has no webhook token).
                "peerSecretEnv": "TAILGUARD_PEER_SECRET",
            }
            stack.kube.put_object(replica_pod(name, LEASE_NAMESPACE, self.host))
        self.config = self.dir / "controller.yaml"
        self.config.write_text(json.dumps(config, indent=2), encoding="utf-8")  # JSON is YAML
        self.log = self.dir / "controller.log"
        # POD_IP: the leader publishes its API URL in the Lease; the standby forwards to it.
        env = {"POD_NAME": name, "POD_IP": self.host, "TAILGUARD_PEER_SECRET": PEER_SECRET}
        self.process = start_controller(self.config, self.log, env=env)

    def tail(self, limit: int = 3000) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-limit:] if self.log.exists() else ""

    def get(self, path: str) -> Any:
        try:
            answer = requests.get(f"http://{self.host}:{self.port}{path}", timeout=2)
        except requests.RequestException:
            return None
        return answer.json() if answer.headers.get("Content-Type", "").startswith("application/json") else None

    def readiness(self) -> dict[str, Any] | None:
        found = self.get("/readyz")
        return found if isinstance(found, dict) else None

    def following(self) -> bool:
        ready = self.readiness()
        return ready is not None and any("follower" in warning for warning in ready["warnings"])

    def last_evaluation(self) -> float | None:
        ready = self.readiness()
        at = ready["policies"].get("queue-scale", {}).get("last_evaluation") if ready is not None else None
        return float(at) if at is not None else None

    def terminate(self) -> None:
        """SIGTERM and a clean exit 0, with nothing of its process group left behind."""
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=DEADLINE_SECONDS) == 0, self.tail()
        with pytest.raises(ProcessLookupError):
            os.killpg(self.process.pid, 0)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def fire_decisions(self) -> list[dict[str, Any]]:
        return self.decisions("fire")

    def decisions(self, kind: str) -> list[dict[str, Any]]:
        with Journal(self.dir / "journal.db") as journal:
            return [d for d in journal.recent_decisions(100) if d["kind"] == kind]


def min_replicas(stack: Stack) -> int:
    stored = stack.kube.get_object("horizontalpodautoscalers", NAMESPACE, HPA_NAME)
    assert stored is not None
    return int(stored["spec"]["minReplicas"])


def hpa_updates(stack: Stack) -> int:
    return len(stack.kube.calls("update", "horizontalpodautoscalers"))


def lease_holder(stack: Stack) -> str | None:
    lease = stack.kube.get_object("leases", LEASE_NAMESPACE, LEASE_NAME)
    return lease["spec"].get("holderIdentity") if lease is not None else None


def waiting_in_prometheus(stack: Stack) -> float | None:
    query = f'vllm:num_requests_waiting{{namespace="{NAMESPACE}",service="{SERVICE}"}}'
    try:
        answer = requests.get(f"{stack.prometheus.url}/api/v1/query", params={"query": query}, timeout=5).json()
        result = answer["data"]["result"]
    except (requests.RequestException, ValueError, KeyError):
        return None
    return float(result[0]["value"][1]) if result else None


def set_waiting(stack: Stack, waiting: float) -> None:
    """Set the queue and wait until Prometheus has scraped it, so no evaluation can still read the old value."""
    stack.exporter.set(SERVICE, 0.1, waiting)
    poll_processes(
        f"{waiting} waiting requests in Prometheus", lambda: True if waiting_in_prometheus(stack) == waiting else None
    )


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with scraped_stack(tmp_path, NAMESPACE, {SERVICE: HPA_NAME}, KUBE_TOKEN) as running:
        yield running


def assert_clean_log(controller: ControllerProcess) -> None:
    output = controller.log.read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in output, output[-4000:]
    assert KUBE_TOKEN not in output, "the cluster token never appears in the log"


def scale_record(decision: dict[str, Any]) -> dict[str, Any]:
    (record,) = [r for r in decision["action_records"] if r["type"] == "scale"]
    return dict(record)


def test_queue_breach_raises_the_hpa_floor_through_the_kubeconfig_cluster(stack: Stack) -> None:
    controller = ControllerProcess(stack, "tailguard-solo", leader_election=False)
    try:
        poll_processes(
            "the controller ready", lambda: True if (controller.readiness() or {}).get("ready") else None, controller
        )
        assert hpa_updates(stack) == 0, "no scaling while the queue is short"

        set_waiting(stack, 50.0)  # 50 per replica on 2 replicas, target 20 -> ceil(2 * 50 / 20) = 5
        poll_processes("the HPA floor raised to 5", lambda: True if min_replicas(stack) == 5 else None, controller)
        controller.terminate()
    finally:
        controller.kill()
    assert_clean_log(controller)

    assert hpa_updates(stack) == 1
    stored = stack.kube.get_object("horizontalpodautoscalers", NAMESPACE, HPA_NAME)
    assert stored is not None
    assert (stored["spec"]["minReplicas"], stored["spec"]["maxReplicas"]) == (5, 10)
    annotations = stored["metadata"]["annotations"]
    assert annotations[ANNOTATION_HUMAN_FLOOR] == "2"
    (fire,) = controller.fire_decisions()
    record = scale_record(fire)
    assert record["status"] == "succeeded"
    assert json.loads(annotations[ANNOTATION_KEYS]) == [record["idempotency_key"]]
    assert record["result"]["detail"]["to"] == {"minReplicas": 5, "maxReplicas": 10}
    (event,) = stack.kube.objects("events", NAMESPACE)
    assert event["reason"] == "TailguardScale" and event["involvedObject"]["name"] == HPA_NAME
    assert record["idempotency_key"] in event["message"]


def test_only_the_leader_acts_and_the_standby_takes_over_after_sigterm(stack: Stack) -> None:
    first = ControllerProcess(stack, "tailguard-a", leader_election=True)
    second: ControllerProcess | None = None
    try:
        poll_processes(
            "tailguard-a to hold the Lease", lambda: True if lease_holder(stack) == "tailguard-a" else None, first
        )
        poll_processes("tailguard-a ready", lambda: True if (first.readiness() or {}).get("ready") else None, first)
        second = ControllerProcess(stack, "tailguard-b", leader_election=True, port=first.port)
        standby = second
        poll_processes("tailguard-b ready as a follower", lambda: True if standby.following() else None, first, standby)
        # An alert that reaches the standby is handed to the leader (one view across replicas), not accepted and
        # dropped: the answer is the leader's.
        alert = {
            "version": "4",
            "status": "firing",
            "alerts": [{"status": "firing", "labels": {"tailguard_policy": "queue-scale", "service": SERVICE}}],
        }
        forwarded = requests.post(f"http://{standby.host}:{standby.port}/api/v1/alerts", json=alert, timeout=5)
        assert forwarded.status_code == 202 and "triggered" in forwarded.json(), forwarded.text
        assert forwarded.headers["X-Tailguard-Answered-By"] == "tailguard-a"

        set_waiting(stack, 50.0)
        poll_processes(
            "the leader to raise the HPA floor to 5", lambda: True if min_replicas(stack) == 5 else None, first, standby
        )
        updated_at = time.time()
        # Give the follower every chance to act too: the leader evaluates three more times meanwhile.
        poll_processes(
            "three more evaluations by the leader",
            lambda: True if (first.last_evaluation() or 0.0) > updated_at + 3 else None,
            first,
            standby,
        )
        assert hpa_updates(stack) == 1, "exactly one HPA update: the follower did not act"
        assert standby.following()
        # The standby's decisions are the leader's (its own journal has none).
        leader_decisions = first.get("/api/v1/decisions")
        assert leader_decisions and standby.get("/api/v1/decisions") == leader_decisions

        set_waiting(stack, 1.0)  # the breach is over before the leader goes away
        first.terminate()
        poll_processes(
            "tailguard-b to take the Lease", lambda: True if lease_holder(stack) == "tailguard-b" else None, standby
        )
        poll_processes("tailguard-b leading", lambda: True if not standby.following() else None, standby)
        assert hpa_updates(stack) == 1

        # The next breach comes within the 10-minute cooldown of tailguard-a's scale: tailguard-b inherited that
        # action's time from the Lease, so it decides `suppressed` instead of scaling again.
        set_waiting(stack, 80.0)
        (suppressed, *_) = poll_processes(
            "the new leader to suppress the breach (cooldown)", lambda: standby.decisions("suppressed") or None, standby
        )
        assert "cooldown: last mutating action" in suppressed["reason"]
        standby.terminate()
    finally:
        first.kill()
        if second is not None:
            second.kill()
    assert_clean_log(first)
    assert_clean_log(standby)

    assert hpa_updates(stack) == 1 and min_replicas(stack) == 5
    (first_fire,) = first.fire_decisions()
    assert standby.fire_decisions() == []
    assert scale_record(first_fire)["result"]["detail"]["to"]["minReplicas"] == 5
    # The Lease changed hands once, and the last holder released it on its own SIGTERM, still carrying the one
    # scale's time for whoever leads next.
    lease = stack.kube.get_object("leases", LEASE_NAMESPACE, LEASE_NAME)
    assert lease is not None and lease["spec"]["leaseTransitions"] == 1
    assert lease["spec"].get("holderIdentity", "") == ""
    handed_over = decode_action_times(lease["metadata"]["annotations"][HANDOVER_ANNOTATION])
    assert handed_over == {"queue-scale": {target_key({"service": SERVICE}): (round(first_fire["at"], 3),)}}
