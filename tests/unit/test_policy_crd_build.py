"""`kubernetes.policies` end to end through tailguard.controller.app.build.build(): a TailguardPolicy applied to the
spec-validating fake Kubernetes API is listed, loaded and evaluated against a small loopback Prometheus; after a
breach the leader's status subresource (read back through the API, as `kubectl get -o yaml` would) shows the
target firing and the decision with its action's outcome, and an Event is recorded on the policy. Real time
(build() runs a SystemClock): one-second intervals, every wait a poll with a deadline."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client as k8s

from tailguard.controller.app.build import build
from tailguard.controller.app.settings import parse_settings_text
from tests.support.fake_kubernetes import FakeKubernetes

NAMESPACE = "llm"
DEADLINE_SECONDS = 30.0
T = TypeVar("T")


class LoopbackPrometheus:
    """/api/v1/query answering one vector: `values` per service (tests/scenarios/test_incident_matrix.py's
    FakePrometheus, trimmed)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, params: Mapping[str, list[str]]) -> None:
                at = float(params.get("time", [str(time.time())])[0])
                result = [
                    {"metric": {"service": service}, "value": [at, repr(value)]}
                    for service, value in sorted(fake.values.items())
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

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prometheus() -> Iterator[LoopbackPrometheus]:
    server = LoopbackPrometheus()
    yield server
    server.close()


def poll(what: str, probe: Callable[[], T | None]) -> T:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        found = probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def latency_policy(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "tailguard.io/v1alpha1",
        "kind": "TailguardPolicy",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "description": "P99 above 800 ms: annotate",
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
                }
            ],
        },
    }


def write_kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "tailguard", "user": {"token": "fake-cluster-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tailguard"}}],
        "current-context": "fake",
    }
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def test_a_tailguard_policy_is_loaded_evaluated_and_its_status_shows_the_target_firing(
    tmp_path: Path, prometheus: LoopbackPrometheus
) -> None:
    (tmp_path / "rules").mkdir()  # no policy file: the custom resource is the only policy
    with FakeKubernetes() as kube, ExitStack() as stack:
        kube.put_object(latency_policy("p99-annotate"))
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig.yaml", kube.url)
        config = {
            "prometheus": {"url": prometheus.url, "timeout": 2, "retries": 0},
            "policies": ["rules"],
            "journal": "journal.db",
            "stateDir": "state",
            "listen": "127.0.0.1:0",
            "reloadInterval": "1h",  # a CR change must not wait for it (see the end)
            "annotations": {"path": "annotations.jsonl"},
            "kubernetes": {
                "inCluster": False,
                "kubeconfig": str(kubeconfig),
                "namespace": NAMESPACE,
                "policies": {"namespace": NAMESPACE, "statusInterval": 0.2},
            },
        }
        settings = parse_settings_text(json.dumps(config), "controller.yaml", tmp_path)
        prometheus.values = {"chat": 0.2}
        application = build(settings, stack, webhook_token=None)
        application.start(stack)
        assert sorted(application.controller.policies()) == ["p99-annotate"], "listed before the first load"

        def status() -> dict[str, Any]:
            stored = kube.get_object("tailguardpolicies", NAMESPACE, "p99-annotate")
            assert stored is not None
            return dict(stored.get("status") or {})

        def with_phase(phase: str) -> dict[str, Any] | None:
            rows = status().get("targets") or []
            return rows[0] if rows and rows[0]["phase"] == phase else None

        ok = poll("the target evaluated ok in the status", lambda: with_phase("ok"))
        assert ok["target"] == {"service": "chat"} and ok["lastValue"] == 0.2
        ready = {c["type"]: c["status"] for c in status()["conditions"]}
        assert ready == {"Ready": "True", "Suspended": "False", "Degraded": "False"}
        assert status()["observedGeneration"] >= 1

        prometheus.values = {"chat": 2.0}  # the breach
        firing = poll("the target firing in the status", lambda: with_phase("firing"))
        assert firing["lastValue"] == 2.0 and firing["condition"] == "p99-high"
        assert status()["targetsFiring"] == 1

        def decided() -> dict[str, Any] | None:
            row = with_phase("firing")
            actions = ((row or {}).get("lastDecision") or {}).get("actions") or []
            unfinished = ("pending", "planned", "started", "deferred")  # journaled, not yet run to its outcome
            return row if row and actions and all(a["status"] not in unfinished for a in actions) else None

        last = poll("the fire decision and its action's outcome in the status", decided)["lastDecision"]
        assert last["kind"] == "fire" and last["actions"] == [{"type": "annotate", "status": "succeeded"}]
        annotated = poll("the annotation", lambda: (tmp_path / "annotations.jsonl").exists() or None)
        assert annotated
        events = poll(
            "an Event on the policy",
            lambda: (
                [
                    e
                    for e in kube.objects("events", NAMESPACE)
                    if e["involvedObject"].get("kind") == "TailguardPolicy"
                    and e["involvedObject"]["name"] == "p99-annotate"
                ]
                or None
            ),
        )
        assert events
        assert kube.calls("update", "tailguardpolicies/status") or kube.calls("update", "tailguardpolicies")

        # A change of the CR arrives through the watch (the cluster client's deadline pool lets a watch stream)
        # and is loaded at once (reloadInterval is far longer than this test waits).
        k8s.CustomObjectsApi(kube.api_client()).patch_namespaced_custom_object(
            "tailguard.io", "v1alpha1", NAMESPACE, "tailguardpolicies", "p99-annotate", {"spec": {"suspend": True}}
        )
        poll("the suspended policy loaded", lambda: application.controller.policies()["p99-annotate"].suspend or None)
