"""Three `tailguard run` processes with `leaderElection.shards: 3` on the spec-validating fake Kubernetes API and
one REAL Prometheus (scraping a tiny exporter in this process): six queue-scale policies, two per shard, each
raising its own service's HPA floor.

* Every policy is evaluated by exactly one replica, the holder of its shard's Lease (the replicas' /readyz show
  whose evaluations advance), and the three replicas hold one shard each.
* All six queues breach; the moment the first HPA update of one replica's shard lands, that replica is SIGKILLed
  (mid-cycle: its other policy is deciding or acting). The survivors take its shard over (Lease holders change,
  journaled as shard-acquired); no HPA is ever updated twice (the fake's call log), the survivors' own
  services are scaled exactly once, and the service the killed replica had scaled is `suppressed` by its new
  owner (cooldown: the action time moved with the shard Lease). The time from the kill to the takeover is
  printed (the lease is 3 s), never asserted.
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

from tailguard.controller.adapters.lease.shards import shard_lease_name
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.sharding import shard_of
from tailguard.serving.lab.promstack import free_port
from tests.support.controller_process import ScrapedStack, poll_processes, scraped_stack, start_controller

pytestmark = pytest.mark.integration

NAMESPACE = "llm"
LEASE_NAMESPACE = "tailguard"
LEASE_BASE = "tailguard-leader"
SHARDS = 3
LEASE_SECONDS = 3.0
DEADLINE_SECONDS = 90.0  # per wait; generous for a loaded 2-core machine, never reached when things work
KUBE_TOKEN = "sharded-kube-token"
# Two services per shard (shard_of("queue-<service>", 3), pinned by tests/unit/test_sharding.py's hash).
SERVICES = ("chat", "code", "embed", "rerank", "search", "translate")

POLICY = """apiVersion: tailguard.io/v1alpha1
kind: Policy
name: queue-{service}
interval: 1s
targets:
  groupBy: [service]
  match:
    namespace: llm
    service: {service}
signals:
  - name: waiting-per-replica
    query: >-
      sum by ({{{{ by }}}}) (vllm:num_requests_waiting{{ {{{{ selector }}}} }})
      / count by ({{{{ by }}}}) (vllm:num_requests_waiting{{ {{{{ selector }}}} }})
conditions:
  - name: queue-above-target
    signal: waiting-per-replica
    when: {{op: ">", value: 20}}
    for: 2
    noData: hold
    staleAfter: 1m
    actions:
      - type: scale
        service: "{{{{ service }}}}"
        targetPerReplica: 20
        min: 1
        max: 8
limits:
  cooldown: 10m
  maxActionsPerHour: 10
"""


def policy_name(service: str) -> str:
    return f"queue-{service}"


def hpa_name(service: str) -> str:
    return f"{service}-stable"


Stack = ScrapedStack


class Replica:
    """One `python -m tailguard.controller run` with sharded leader election, in its own process group."""

    def __init__(self, stack: Stack, name: str) -> None:
        self.name = name
        self.port = free_port()
        self.dir = stack.tmp / name
        (self.dir / "rules").mkdir(parents=True)
        for service in SERVICES:
            (self.dir / "rules" / f"{policy_name(service)}.yaml").write_text(
                POLICY.format(service=service), encoding="utf-8"
            )
        config: dict[str, Any] = {
            "prometheus": {"url": stack.prometheus.url, "timeout": 5, "retries": 2},
            "policies": ["rules"],
            "journal": "journal.db",
            "stateDir": "state",
            "listen": f"127.0.0.1:{self.port}",
            "reloadInterval": "5s",
            "kubernetes": {
                "inCluster": False,
                "kubeconfig": str(stack.kubeconfig),
                "namespace": NAMESPACE,
                "timeout": 5,
                "retries": 2,
                "hpa": {"maxReplicas": 8, "targets": {s: {"name": hpa_name(s)} for s in SERVICES}},
            },
            "leaderElection": {
                "namespace": LEASE_NAMESPACE,
                "leaseName": LEASE_BASE,
                "leaseDuration": f"{LEASE_SECONDS:g}s",
                "renewDeadline": "2s",
                "retryPeriod": 0.5,
                "shards": SHARDS,
            },
        }
        self.config = self.dir / "controller.yaml"
        self.config.write_text(json.dumps(config, indent=2), encoding="utf-8")
        self.log = self.dir / "controller.log"
        self.process = start_controller(self.config, self.log, env={"POD_NAME": name})

    def tail(self, limit: int = 3000) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-limit:] if self.log.exists() else ""

    def last_evaluations(self) -> dict[str, float | None] | None:
        try:
            answer = requests.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2).json()
        except (requests.RequestException, ValueError):
            return None
        return {name: entry.get("last_evaluation") for name, entry in answer["policies"].items()}

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=DEADLINE_SECONDS) == 0, self.tail()

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def decisions(self, kind: str) -> list[dict[str, Any]]:
        with Journal(self.dir / "journal.db") as journal:
            return [d for d in journal.recent_decisions(500) if d["kind"] == kind]

    def shard_controls(self) -> list[tuple[str, str]]:
        with Journal(self.dir / "journal.db") as journal:
            return [
                (c["action"], c["subject"]) for c in journal.recent_controls(500) if c["action"].startswith("shard")
            ]


def shard_holders(stack: Stack) -> dict[int, str]:
    out: dict[int, str] = {}
    for index in range(SHARDS):
        lease = stack.kube.get_object("leases", LEASE_NAMESPACE, shard_lease_name(LEASE_BASE, index))
        out[index] = str((lease or {}).get("spec", {}).get("holderIdentity") or "")
    return out


def hpa_updates(stack: Stack) -> dict[str, int]:
    """HPA name -> how many updates the fake accepted."""
    counts = {hpa_name(service): 0 for service in SERVICES}
    for call in stack.kube.calls("update", "horizontalpodautoscalers"):
        name = str(call.body["metadata"]["name"]) if isinstance(call.body, dict) else ""
        counts[name] = counts.get(name, 0) + 1
    return counts


def min_replicas(stack: Stack, service: str) -> int:
    stored = stack.kube.get_object("horizontalpodautoscalers", NAMESPACE, hpa_name(service))
    assert stored is not None
    return int(stored["spec"]["minReplicas"])


def waiting_in_prometheus(stack: Stack) -> dict[str, float]:
    query = f'vllm:num_requests_waiting{{namespace="{NAMESPACE}"}}'
    try:
        answer = requests.get(f"{stack.prometheus.url}/api/v1/query", params={"query": query}, timeout=5).json()
        return {r["metric"]["service"]: float(r["value"][1]) for r in answer["data"]["result"]}
    except (requests.RequestException, ValueError, KeyError):
        return {}


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with scraped_stack(
        tmp_path, NAMESPACE, {service: hpa_name(service) for service in SERVICES}, KUBE_TOKEN
    ) as running:
        yield running


def test_three_sharded_replicas_evaluate_each_policy_once_and_survive_a_sigkill_without_a_duplicate(
    stack: Stack,
) -> None:
    by_shard = {index: [s for s in SERVICES if shard_of(policy_name(s), SHARDS) == index] for index in range(SHARDS)}
    assert all(len(services) == 2 for services in by_shard.values()), by_shard
    replicas = [Replica(stack, f"tailguard-{n}") for n in range(3)]
    names = {r.name for r in replicas}
    try:
        holders = poll_processes(
            "each replica to hold one shard",
            lambda: found if set((found := shard_holders(stack)).values()) == names else None,
            *replicas,
        )
        # Every policy is evaluated by exactly one replica: the holder of its shard. Two snapshots of every
        # replica's last evaluation per policy; between them each policy advanced on its shard's holder only.
        first = {r.name: poll_processes(f"{r.name} answering", r.last_evaluations, *replicas) for r in replicas}

        def advanced() -> dict[str, list[str]] | None:
            now = {r.name: r.last_evaluations() or {} for r in replicas}
            moved = {
                policy: [n for n in sorted(names) if (now[n].get(policy) or 0) > (first[n].get(policy) or 0)]
                for policy in map(policy_name, SERVICES)
            }
            return moved if all(moved.values()) else None

        moved = poll_processes("every policy evaluated again", advanced, *replicas)
        time.sleep(2)  # two more 1 s intervals in which a wrong replica could evaluate too
        moved = advanced() or moved
        assert shard_holders(stack) == holders, "no rebalancing while all three run"
        assert moved == {policy_name(s): [holders[shard_of(policy_name(s), SHARDS)]] for s in SERVICES}

        # Every queue breaches; kill the replica whose shard's first HPA update lands first.
        for service in SERVICES:
            stack.exporter.set(service, 0.1, waiting=50.0)
        poll_processes("the breach in Prometheus", lambda: True if set(waiting_in_prometheus(stack).values()) == {50.0}
             else None, *replicas)  # fmt: skip
        first_scaled = poll_processes(
            "a first HPA update",
            lambda: next((s for s in SERVICES if hpa_updates(stack)[hpa_name(s)]), None),
            *replicas,
        )
        victim_shard = shard_of(policy_name(first_scaled), SHARDS)
        victim = next(r for r in replicas if r.name == holders[victim_shard])
        victim.kill()
        killed_at = time.monotonic()
        survivors = [r for r in replicas if r is not victim]
        new_holder = poll_processes(
            f"the survivors to take shard {victim_shard} over",
            lambda: h if (h := shard_holders(stack)[victim_shard]) in {r.name for r in survivors} else None,
            *survivors,
        )
        takeover = time.monotonic() - killed_at
        print(f"\nshard {victim_shard} of {victim.name} taken over by {new_holder} {takeover:.2f} s after the "
              f"SIGKILL (lease {LEASE_SECONDS:g} s, retry period 0.5 s)")  # fmt: skip
        owner = next(r for r in survivors if r.name == new_holder)
        survivor_services = [s for s in SERVICES if shard_of(policy_name(s), SHARDS) != victim_shard]
        poll_processes(
            "the survivors' services scaled",
            lambda: True if all(min_replicas(stack, s) == 5 for s in survivor_services) else None,
            *survivors,
        )
        # The service the victim had scaled is still breaching: its new owner inherited the action time with the
        # shard Lease, so it decides `suppressed` (cooldown) instead of scaling a second time.
        suppressed = poll_processes(
            f"{owner.name} to suppress {first_scaled} (cooldown)",
            lambda: [d for d in owner.decisions("suppressed") if d["policy"] == policy_name(first_scaled)] or None,
            *survivors,
        )
        assert "cooldown: last mutating action" in suppressed[0]["reason"]
        for replica in survivors:
            replica.terminate()
    finally:
        for replica in replicas:
            replica.kill()

    updates = hpa_updates(stack)
    assert max(updates.values()) == 1, f"an HPA was updated twice: {updates}"
    assert all(updates[hpa_name(s)] == 1 for s in [*survivor_services, first_scaled]), updates
    assert ("shard-acquired", f"shard-{victim_shard}") in owner.shard_controls()
    for replica in survivors:
        output = replica.log.read_text(encoding="utf-8", errors="replace")
        assert "Traceback" not in output, output[-4000:]
        assert KUBE_TOKEN not in output
