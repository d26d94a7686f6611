"""Issue 17's reliability test: the leader is SIGKILLed during a TailguardPolicy status write storm.

Two `tailguard run` processes (leader and standby, own journals) share the spec-validating fake Kubernetes API (Lease,
TailguardPolicy, status subresource, resourceVersion conflicts). A loopback Prometheus flips 24 targets between ok
and firing every evaluation (`for: 1`, recovery `for: 1`), so the leader's status changes, and is written, every
interval; meanwhile a "kubectl label" loop keeps changing the object's metadata, so status writes meet 409
Conflicts. Mid-storm the leader is killed (SIGKILL: no release of the Lease, no last write) at the moment the
targets take their final values. Then:

* no lost final status: after the takeover every status write carries all 24 targets (never the new leader's empty
  journal), and the CR ends with each target's final phase and value;
* no conflict loop: 409s (a label loop, and 4 writes raced by a patch between their read and their write, more in
  a row than one round retries) are each followed by a re-read; there are at most as many as the patches that
  caused them (a patch invalidates at most one pending write), and the status still converges;
* convergence within one interval after the new leader starts: the new leader's FIRST status write is already
  the final status (it writes a policy's status only once it has evaluated it as leader).
Every wait is a poll with a deadline; nothing asserts on durations.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client as k8s

from tailguard.serving.lab.promstack import free_port
from tests.support.controller_process import poll, ready, start_controller, tail, write_kubeconfig
from tests.support.fake_kubernetes import FakeKubernetes

pytestmark = pytest.mark.integration

NAMESPACE = "llm"
POLICY = "storm"
GROUP, VERSION, PLURAL = "tailguard.io", "v1alpha1", "tailguardpolicies"
TARGETS = [f"svc-{n:02d}" for n in range(24)]
LOW, HIGH = 0.2, 2.0
# The final values: every third target stays firing, the others recover.
FINAL = {service: HIGH if n % 3 == 0 else LOW for n, service in enumerate(TARGETS)}
STORM_WRITES = 8  # status writes by the first leader before it is killed
RACED_WRITES = 4  # status writes that meet a real resourceVersion conflict (a patch between read and write)


class FlippingPrometheus:
    """/api/v1/query: one value per service. While storming, each target's value flips with the query time's
    second (half of them in antiphase), so every 1 s evaluation sees most targets change; `settle` fixes them."""

    def __init__(self) -> None:
        self.final: Mapping[str, float] | None = None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, params: Mapping[str, list[str]]) -> None:
                at = float(params.get("time", [str(time.time())])[0])
                final = fake.final
                result = [
                    {"metric": {"service": service}, "value": [at, repr(fake.value(service, n, at, final))]}
                    for n, service in enumerate(TARGETS)
                ]
                body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer(parse_qs(urlsplit(self.path).query))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self._answer(parse_qs(self.rfile.read(length).decode()))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @staticmethod
    def value(service: str, n: int, at: float, final: Mapping[str, float] | None) -> float:
        if final is not None:
            return final[service]
        return HIGH if (int(at) + n) % 2 == 0 else LOW

    def settle(self, final: Mapping[str, float]) -> None:
        self.final = dict(final)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def storm_policy() -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TailguardPolicy",
        "metadata": {"name": POLICY, "namespace": NAMESPACE, "labels": {"round": "0"}},
        "spec": {
            "description": "every target flips: a status change every interval",
            "interval": "1s",
            "targets": {"groupBy": ["service"]},
            "signals": [{"name": "p99", "query": "p99_latency_seconds"}],
            "conditions": [
                {
                    "name": "p99-high",
                    "signal": "p99",
                    "when": {"op": ">", "value": 0.8},
                    "for": 1,
                    "noData": "hold",
                    "actions": [{"type": "annotate", "text": "P99 {{ value }}s on {{ service }}", "tags": ["p99"]}],
                    "recovery": {"for": 1},
                }
            ],
        },
    }


def config(tmp: Path, own: str, prometheus: str, kubeconfig: Path, port: int) -> Path:
    (tmp / own / "rules").mkdir(parents=True)  # no policy file: the custom resource is the only policy
    document = {
        "prometheus": {"url": prometheus, "timeout": 2, "retries": 0},
        "policies": ["rules"],
        "journal": "journal.db",
        "stateDir": "state",
        "listen": f"127.0.0.1:{port}",
        "reloadInterval": "1s",
        "annotations": {"path": "annotations.jsonl"},
        "kubernetes": {
            "inCluster": False,
            "kubeconfig": str(kubeconfig),
            "namespace": NAMESPACE,
            "events": False,
            "policies": {"namespace": NAMESPACE, "statusInterval": "500ms"},
        },
        "leaderElection": {
            "namespace": NAMESPACE,
            "leaseName": "tailguard",
            "leaseDuration": "3s",
            "renewDeadline": "2s",
            "retryPeriod": "500ms",
        },
    }
    path = tmp / own / "controller.yaml"
    path.write_text(json.dumps(document, indent=2), encoding="utf-8")
    return path


@pytest.fixture
def prometheus() -> Iterator[FlippingPrometheus]:
    server = FlippingPrometheus()
    yield server
    server.close()


def holder(kube: FakeKubernetes) -> str | None:
    lease = kube.get_object("leases", NAMESPACE, "tailguard")
    return None if lease is None else lease["spec"].get("holderIdentity")


def is_final(status: Mapping[str, Any] | None) -> bool:
    rows = {row["target"]["service"]: row for row in (status or {}).get("targets") or []}
    return set(rows) == set(TARGETS) and all(
        rows[s]["lastValue"] == FINAL[s] and rows[s]["phase"] == ("firing" if FINAL[s] > 0.8 else "ok") for s in TARGETS
    )


def test_a_leader_killed_in_a_status_storm_loses_no_status_and_the_new_leader_converges_at_once(
    tmp_path: Path, prometheus: FlippingPrometheus
) -> None:
    processes: list[subprocess.Popen[bytes]] = []
    labeling = threading.Event()
    patches = [0]
    with FakeKubernetes() as kube:
        api = k8s.CustomObjectsApi(kube.api_client())
        api.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, storm_policy())
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig.yaml", kube.url, "storm-token")
        ports = {"a": free_port(), "b": free_port()}
        configs = {own: config(tmp_path, own, prometheus.url, kubeconfig, ports[own]) for own in ports}
        logs = {own: tmp_path / own / "controller.log" for own in ports}

        def label_loop() -> None:  # a person (or GitOps) touching the object's metadata all along
            while not labeling.wait(0.2):
                patches[0] += 1
                body = {"metadata": {"labels": {"round": str(patches[0])}}}
                api.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, POLICY, body)

        labeler = threading.Thread(target=label_loop, daemon=True)
        try:
            env = {"POD_NAMESPACE": NAMESPACE, "POD_IP": "127.0.0.1"}
            first = start_controller(configs["a"], logs["a"], {**env, "POD_NAME": "tailguard-a"})
            processes.append(first)
            poll("a ready", lambda: ready(ports["a"]), first, logs["a"])
            poll("a leads", lambda: holder(kube) == "tailguard-a" or None, first, logs["a"])
            second = start_controller(configs["b"], logs["b"], {**env, "POD_NAME": "tailguard-b"})
            processes.append(second)
            poll("b ready", lambda: ready(ports["b"]), second, logs["b"])
            labeler.start()

            def status_writes() -> list[Any]:
                return [r for r in kube.calls("update", "tailguardpolicies/status") if r.status == 200]

            poll("the storm", lambda: len(status_writes()) >= STORM_WRITES // 2 or None, first, logs["a"])

            def touch_between_read_and_write() -> None:  # a metadata change lands between a read and its write
                patches[0] += 1
                body = {"metadata": {"labels": {"round": f"race-{patches[0]}"}}}
                api.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, POLICY, body)

            # The next writes each meet a conflict: more in a row than one round retries (3), so a round gives up
            # and the next one succeeds.
            kube.inject("update", PLURAL, hook=touch_between_read_and_write, times=RACED_WRITES)
            poll("the storm", lambda: len(status_writes()) >= STORM_WRITES or None, first, logs["a"])
            # Mid-storm: the targets take their final values, and the leader dies without a word.
            prometheus.settle(FINAL)
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=10)
            killed_at = len(kube.requests)
            poll("b takes the Lease over", lambda: holder(kube) == "tailguard-b" or None, second, logs["b"])

            def stored_status() -> dict[str, Any] | None:
                stored = kube.get_object(PLURAL, NAMESPACE, POLICY)
                return None if stored is None else stored.get("status")

            poll("the final status in the CR", lambda: True if is_final(stored_status()) else None, second, logs["b"])
            # Let the new leader run on: it must keep the final status (and write nothing else) from here.
            settle = time.time() + 3
            poll("three more seconds", lambda: True if time.time() > settle else None, second, logs["b"])
            labeling.set()
            labeler.join(timeout=10)
            assert is_final(stored_status())
        finally:
            labeling.set()
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    try:
                        process.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        os.killpg(process.pid, signal.SIGKILL)
                        process.wait(timeout=10)

        assert len(status_writes()) >= STORM_WRITES
        after_kill = [r for r in kube.requests[killed_at:] if r.resource == "tailguardpolicies/status"]
        successful = [r for r in after_kill if r.verb == "update" and r.status == 200]
        assert successful, "the new leader wrote the status"
        # Convergence within one interval: the new leader's first write is already the final status; no write of
        # it ever lacks a target (its empty journal never replaced the previous leader's status).
        assert is_final(successful[0].body["status"]), successful[0].body["status"]
        assert all({row["target"]["service"] for row in r.body["status"]["targets"]} == set(TARGETS)
                   for r in successful)  # fmt: skip
        # No conflict loop: each 409 came from a label patch in between, was re-read and written.
        status_updates = kube.calls("update", "tailguardpolicies/status")
        conflicts = [r for r in status_updates if r.status == 409]
        assert all(r.status in (200, 409) for r in status_updates)
        assert RACED_WRITES <= len(conflicts) <= patches[0], (len(conflicts), patches[0])
        reads = kube.calls("get", "tailguardpolicies")
        assert len(reads) >= len(status_updates), "every status write follows a read of the current object"
        for own in ("a", "b"):
            assert "Traceback" not in logs[own].read_text(encoding="utf-8", errors="replace"), tail(logs[own])
        assert processes[1].returncode == 0, tail(logs["b"])
        print(
            f"status writes: {len(status_writes())} ok, {len(conflicts)} conflicts for {patches[0]} label patches; "
            f"after the kill {len(successful)} writes by the new leader"
        )
