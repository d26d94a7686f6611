"""The shipped configuration does the job: `kubectl kustomize deploy/base` is rendered, the controller
configuration and the policies are taken from the generated ConfigMaps exactly as rendered, and only the URLs
(pointed at the spec-validating fakes and a real Prometheus) and the file paths (journal, state, secrets written
into tmp) are changed. `tailguard run` (a real process) then goes through the seed incident: an Argo CD rollout
(auto-sync on, as GitOps applications usually are), then a P99 regression -> exactly one rollback on Argo CD
(auto-sync switched off first, as the shipped `autoSync: disableAutoSync` says), the rollout annotation and the
decision's region in Grafana, one notification at the receiver, nothing done to the HPA or the route.

Every wait is a poll with a deadline; nothing asserts on durations.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tailguard.controller.adapters.notify.webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify_signature
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.serving.lab.promstack import PrometheusServer, free_port, static_scrape_config, write_prometheus_config
from tests.support.controller_process import (
    REPO,
    annotations_tagged,
    poll,
    ready,
    start_controller,
    tail,
    write_kubeconfig,
)
from tests.support.fake_argocd import FakeArgoCD, application
from tests.support.fake_grafana import FakeGrafana
from tests.support.fake_kubernetes import FakeKubernetes, hpa, http_route
from tests.support.latency_exporter import LatencyExporter
from tests.support.webhook_receiver import Received, receiver

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SERVICE = "chat"  # the service of the shipped configuration's placeholders (argocd.apps, kubernetes targets)
ARGOCD_TOKEN = "argocd-shipped-token"
GRAFANA_TOKEN = "grafana-shipped-token"
WEBHOOK_HMAC = "webhook-shipped-hmac"
ALERTMANAGER_TOKEN = "alertmanager-shipped-token"
KUBE_TOKEN = "kube-shipped-token"
HEALTHY_SECONDS = 0.08
REGRESSED_SECONDS = 2.0


def render_base() -> tuple[dict[str, Any], dict[str, str]]:
    """The controller configuration and the policy files, as the ConfigMaps of `kubectl kustomize deploy/base`."""
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "deploy" / "base")], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    objects = [doc for doc in yaml.safe_load_all(rendered) if doc]

    def config_map(prefix: str) -> dict[str, str]:
        (found,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(prefix)]
        return dict(found["data"])

    return yaml.safe_load(config_map("tailguard-config-")["controller.yaml"]), config_map("tailguard-policies-")


def leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        found: dict[str, Any] = {}
        for key, child in value.items():
            found.update(leaves(child, f"{prefix}.{key}" if prefix else str(key)))
        return found
    return {prefix: value}


@dataclass
class Stack:
    tmp: Path
    exporter: LatencyExporter
    prometheus: PrometheusServer
    argocd: FakeArgoCD
    grafana: FakeGrafana
    kube: FakeKubernetes
    hook_url: str
    received: Received
    rollout_at: float


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    rollout_at = float(int(time.time()) - 120)  # the bad revision went out two minutes before the test
    with (
        LatencyExporter({"namespace": "llm"}) as exporter,
        FakeArgoCD() as argocd,
        FakeGrafana(GRAFANA_TOKEN) as grafana,
        FakeKubernetes() as kube,
        receiver() as (hook_url, received),
    ):
        exporter.set(SERVICE, HEALTHY_SECONDS)
        argocd.state.token = ARGOCD_TOKEN
        kube.put_object(hpa("chat-stable", "llm", min_replicas=2, max_replicas=10))
        kube.put_object(http_route("chat", "llm", {"chat-stable": 90, "chat-canary": 10}))
        config = write_prometheus_config(
            tmp_path / "prometheus.yml",
            scrape_configs=[static_scrape_config("vllm", [exporter.target])],
            scrape_interval="1s",
            evaluation_interval="1s",
        )
        with PrometheusServer(config=config, workdir=tmp_path / "prometheus").start() as prometheus:
            prometheus.wait_target_up("vllm", timeout=90)
            yield Stack(tmp_path, exporter, prometheus, argocd, grafana, kube, hook_url, received, rollout_at)
    assert argocd.state.spec_violations == [], "every Argo CD request must be valid against its swagger"
    assert grafana.state.rejections == [], "every Grafana request must be valid against its spec"


def point_at_fakes(shipped: dict[str, Any], stack: Stack, port: int) -> dict[str, Any]:
    """The shipped configuration with only its URLs and file paths changed (the kubeconfig carries the cluster's
    URL: `inCluster: false` + `kubeconfig` is how a URL is given to the `kubernetes` section)."""
    tmp = stack.tmp
    secrets = tmp / "secrets"
    secrets.mkdir()
    for name, value in {
        "argocd-token": ARGOCD_TOKEN,
        "grafana-token": GRAFANA_TOKEN,
        "webhook-hmac": WEBHOOK_HMAC,
        "alertmanager-token": ALERTMANAGER_TOKEN,
    }.items():
        (secrets / name).write_text(value + "\n", encoding="utf-8")
    config = copy.deepcopy(shipped)
    config["prometheus"]["url"] = stack.prometheus.url
    config["policies"] = [str(tmp / "policies")]
    config["journal"] = str(tmp / "journal.db")
    config["stateDir"] = str(tmp / "state")
    config["listen"] = f"127.0.0.1:{port}"
    config["webhook"]["bearerTokenFile"] = str(secrets / "alertmanager-token")
    config["argocd"]["url"] = stack.argocd.url
    config["argocd"]["tokenFile"] = str(secrets / "argocd-token")
    config["annotations"]["path"] = str(tmp / "annotations.jsonl")
    grafana = config["annotations"]["grafana"]
    grafana.update(url=stack.grafana.url, tokenFile=str(secrets / "grafana-token"), outbox=str(tmp / "outbox.db"))
    config["receivers"]["oncall"].update(url=stack.hook_url, secretFile=str(secrets / "webhook-hmac"))
    kubeconfig = write_kubeconfig(tmp / "kubeconfig.yaml", stack.kube.url, KUBE_TOKEN)
    config["kubernetes"].update(inCluster=False, kubeconfig=str(kubeconfig))
    config["predictors"]["sla"]["path"] = str(tmp / "models" / "sla")  # no model: that policy is no-data
    return config


def shorten(policy_text: str) -> str:
    """The only change to the shipped policies: a 1 s `interval` and 10 s rate windows instead of 15 s and 1 m,
    so the incident takes seconds (the conditions, thresholds, `for`, attribution and actions are as shipped)."""
    shortened = re.sub(r"(?m)^interval: 15s$", "interval: 1s", policy_text)
    return shortened.replace("[1m]", "[10s]")


def test_the_rendered_deploy_base_rolls_back_the_seed_incident(stack: Stack) -> None:
    shipped, policies = render_base()
    assert {"argocd", "changeTracking", "annotations", "receivers", "predictors"} <= set(shipped)
    port = free_port()
    config = point_at_fakes(shipped, stack, port)
    changed = {path for path, value in leaves(config).items() if leaves(shipped).get(path, object()) != value}
    assert changed == {
        "prometheus.url",
        "policies",
        "journal",
        "stateDir",
        "listen",
        "webhook.bearerTokenFile",
        "argocd.url",
        "argocd.tokenFile",
        "annotations.path",
        "annotations.grafana.url",
        "annotations.grafana.tokenFile",
        "annotations.grafana.outbox",
        "receivers.oncall.url",
        "receivers.oncall.secretFile",
        "kubernetes.inCluster",
        "kubernetes.kubeconfig",
        "predictors.sla.path",
    }, "only URLs and file paths differ from the rendered configuration"
    (stack.tmp / "policies").mkdir()
    for name, text in policies.items():
        (stack.tmp / "policies" / name).write_text(shorten(text), encoding="utf-8")
    config_path = stack.tmp / "controller.yaml"
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")  # JSON is YAML

    app = shipped["argocd"]["apps"][SERVICE]
    stack.argocd.add_app(
        application(
            app,
            [("good1", stack.rollout_at - 7200), ("bad2", stack.rollout_at)],
            automated=True,
            helm_parameters={"good1": [("maxNumSeqs", "64")], "bad2": [("maxNumSeqs", "2")]},
        )
    )
    log = stack.tmp / "controller.log"
    process = start_controller(config_path, log, {"POD_NAME": "tailguard-0", "POD_NAMESPACE": "tailguard"})
    try:
        poll("the controller ready", lambda: ready(port), process, log)
        (rollout_note,) = poll(
            "the rollout annotation in Grafana",
            lambda: annotations_tagged(stack.grafana, "rollout", "revision:bad2") or None,
            process,
            log,
        )
        assert stack.argocd.calls("POST", "/rollback") == [], "no rollback while latency is healthy"

        stack.exporter.set(SERVICE, REGRESSED_SECONDS)
        poll(
            "the Argo CD rollback to good1 to finish",
            lambda: (
                stack.argocd.app(app)["status"]["sync"]["revision"] == "good1"
                and stack.argocd.app(app)["status"]["operationState"]["phase"] == "Succeeded"
                or None
            ),
            process,
            log,
        )
        poll("the notification", lambda: stack.received.requests or None, process, log)
        stack.exporter.set(SERVICE, HEALTHY_SECONDS)  # the rollback fixed it
        regions = poll(
            "both decisions' regions closed in Grafana",
            lambda: closed if len(closed := annotations_tagged(stack.grafana, "region", "resolved")) == 2 else None,
            process,
            log,
        )
        # Let the loop run on through the breach: a second rollback, region or notification would show now.
        evaluated_at = time.time()
        poll(
            "five more seconds of evaluations",
            lambda: True if time.time() > evaluated_at + 5 else None,
            process,
            log,
        )
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, tail(log)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    output = log.read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in output, output[-4000:]
    for secret in (ARGOCD_TOKEN, GRAFANA_TOKEN, WEBHOOK_HMAC, ALERTMANAGER_TOKEN, KUBE_TOKEN):
        assert secret not in output, "secrets never appear in the log"

    # Argo CD: auto-sync switched off, then exactly one rollback to the last good revision; nothing else written.
    writes = [(r.method, r.path) for r in stack.argocd.state.requests if r.method != "GET"]
    assert writes == [("PATCH", f"/api/v1/applications/{app}"), ("POST", f"/api/v1/applications/{app}/rollback")]
    (post,) = stack.argocd.calls("POST", "/rollback")
    assert post.body == {"name": app, "id": 1, "dryRun": False, "prune": False} and post.status == 200
    final = stack.argocd.app(app)
    assert final["status"]["sync"]["revision"] == "good1"
    assert "automated" not in final["spec"].get("syncPolicy", {})

    # Grafana: the rollout, then the decision's region (onset -> resolution, its decision id) and the policy's
    # own annotation of the rollback.
    assert rollout_note["time"] == round(stack.rollout_at * 1000)
    assert "rollout bad2 (from good1)" in rollout_note["text"] and "maxNumSeqs: 64 -> 2" in rollout_note["text"]
    # The journal: both shipped P99 policies fired on the one breach (p99-rollback and
    # attributed-rollback-or-scale, evaluated concurrently: either may be first), both joining the service's one
    # incident. The first rolled back; the incident refused the second's rollback (at most one rollback per
    # incident, whichever policy asks: controller/loop/incident_ports.py), so Argo CD saw one rollback.
    with Journal(stack.tmp / "journal.db") as journal:
        decisions = journal.recent_decisions(100)
    fires = {d["policy"]: d for d in decisions if d["kind"] == "fire"}
    assert sorted(fires) == ["attributed-rollback-or-scale", "p99-rollback"]
    assert fires["attributed-rollback-or-scale"]["branch"]["name"] == "rollback-the-rollout"
    assert fires["attributed-rollback-or-scale"]["attribution"]["rollout"]["revision"] == "bad2"
    rollbacks = {name: next(r for r in d["action_records"] if r["type"] == "rollback") for name, d in fires.items()}
    assert sorted(r["status"] for r in rollbacks.values()) == ["skipped", "succeeded"]
    (refused,) = [r for r in rollbacks.values() if r["status"] == "skipped"]
    assert '"refused_by": "incident"' in json.dumps(refused), refused
    assert sorted(d["policy"] for d in decisions if d["kind"] == "resolve") == sorted(fires)

    # Grafana, in order: the rollout of bad2; per decision its region (tagged with the decision id) and the
    # policy's annotate action, the region closed (PATCH timeEnd) on recovery; the rollback's own rollout (good1).
    # The two policies run concurrently, so only the order within each is fixed.
    writes = [r for r in stack.grafana.requests() if r.method != "GET" and r.status == 200]

    def kind(recorded: Any) -> str:
        tags = recorded.body.get("tags", [])
        if "rollout" in tags:
            return f"rollout {next(t for t in tags if t.startswith('revision:'))}"
        if recorded.method == "PATCH":
            return "close region"
        policy = next(t.removeprefix("policy:") for t in tags if t.startswith("policy:"))
        what = "region" if "region" in tags else "recovery annotate" if "recovered" in tags else "annotate"
        return f"{what} {policy}"

    sequence = [kind(w) for w in writes]
    assert sequence[0] == "rollout revision:bad2"
    assert sorted(sequence) == sorted(
        [
            "rollout revision:bad2",
            "rollout revision:good1",
            "region p99-rollback",
            "annotate p99-rollback",
            "region attributed-rollback-or-scale",
            "annotate attributed-rollback-or-scale",
            "close region",
            "close region",
            "recovery annotate p99-rollback",  # p99-rollback's recovery action (the other policy has none)
        ]
    ), [(kind(w), w.body.get("tags"), w.body.get("text", "")[:120]) for w in writes]
    for name in fires:
        assert sequence.index(f"region {name}") < sequence.index(f"annotate {name}")
    assert rollout_note["time"] == round(stack.rollout_at * 1000)
    assert "rollout bad2 (from good1)" in rollout_note["text"] and "maxNumSeqs: 64 -> 2" in rollout_note["text"]
    assert {r["tags"][[t.startswith("decision:") for t in r["tags"]].index(True)] for r in regions} == {
        f"decision:{d['id']}" for d in fires.values()
    }
    for region in regions:
        assert region["timeEnd"] > region["time"]

    # The receiver: one notification, the auto-sync notice, signed with the mounted HMAC secret.
    (notification,) = stack.received.requests
    headers, body = notification
    assert verify_signature(WEBHOOK_HMAC, headers[TIMESTAMP_HEADER], body, headers[SIGNATURE_HEADER])
    message = json.loads(body)
    assert message["kind"] == "notice" and message["application"] == app and message["receiver"] == "oncall"
    assert "disabled automated sync" in message["message"]

    # The cluster: the Lease only (leader election); the HPA and the route untouched.
    assert stack.kube.calls("update", "horizontalpodautoscalers") == []
    assert stack.kube.calls("update", "httproutes") == []
    stored_hpa = stack.kube.get_object("horizontalpodautoscalers", "llm", "chat-stable")
    assert stored_hpa is not None and stored_hpa["spec"]["minReplicas"] == 2
