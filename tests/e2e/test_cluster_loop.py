"""The cluster loop end to end: `tailguard run` (a real process) reads a REAL Prometheus scraping a live exporter,
attributes a P99 regression to the Argo CD rollout before it, rolls that rollout back on the swagger-validating fake
Argo CD, and leaves the rollout and the decision's region in the spec-validating fake Grafana; when latency is
healthy again the region is closed (PATCHed with its timeEnd), and SIGTERM stops the controller cleanly.

Every wait is a poll with a deadline; nothing asserts on durations.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
import requests

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.serving.lab.promstack import PrometheusServer, free_port, static_scrape_config, write_prometheus_config
from tests.support.controller_process import DEADLINE_SECONDS, annotations_tagged, poll, ready, start_controller, tail
from tests.support.fake_argocd import FakeArgoCD, application
from tests.support.fake_grafana import FakeGrafana
from tests.support.latency_exporter import LatencyExporter

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

POLICY_NAME = "cluster-loop"
CONDITION = "p99-above-800ms"
SERVICE = "regress"
APP = "llm-regress"
ARGOCD_TOKEN = "argocd-e2e-token"
GRAFANA_TOKEN = "grafana-e2e-token"
HEALTHY_SECONDS = 0.08
REGRESSED_SECONDS = 2.0
THRESHOLD_SECONDS = 0.8

# The attributed-rollback example with a 1 s interval and a 10 s rate window, so the loop closes in seconds.
POLICY = """apiVersion: tailguard.io/v1alpha1
kind: Policy
name: cluster-loop
interval: 1s
targets:
  groupBy: [service]
  match:
    namespace: llm
signals:
  - name: p99-e2e-latency
    query: >-
      histogram_quantile(0.99,
        sum by (le, {{ by }}) (rate(vllm:e2e_request_latency_seconds_bucket{ {{ selector }} }[10s])))
  - name: queue-per-replica
    query: >-
      sum by ({{ by }}) (vllm:num_requests_waiting{ {{ selector }} })
      / count by ({{ by }}) (vllm:num_requests_waiting{ {{ selector }} })
conditions:
  - name: p99-above-800ms
    signal: p99-e2e-latency
    when: {op: ">", value: 0.8}
    for: 2
    noData: hold
    staleAfter: 2m
    attribution: {window: 30m, labels: [service]}
    choose:
      - name: rollback-the-rollout
        if: {attributedToRollout: true}
        actions:
          - type: annotate
            text: >-
              P99 {{ value }}s on {{ service }}: rolling back {{ rollout_revision }} ({{ rollout_diff }})
            tags: [regression, rollback]
          - type: rollback
            service: "{{ service }}"
      - name: scale-out
        if: {signal: queue-per-replica, op: ">", value: 20}
        actions:
          - type: notify
            receiver: oncall
            message: "P99 {{ value }}s on {{ service }}: saturated, and this test configures nothing to scale"
      - name: notify
        actions:
          - type: notify
            receiver: oncall
            message: "P99 {{ value }}s on {{ service }}: {{ branch }}"
    recovery:
      when: {op: "<=", value: 0.8}
      for: 2
limits:
  cooldown: 10m
  maxActionsPerHour: 3
"""

T = TypeVar("T")


@dataclass
class Loop:
    tmp: Path
    exporter: LatencyExporter
    prometheus: PrometheusServer
    argocd: FakeArgoCD
    grafana: FakeGrafana
    rollout_at: float


def p99(prometheus: PrometheusServer) -> float | None:
    query = (
        "histogram_quantile(0.99, sum by (le, service) "
        f'(rate(vllm:e2e_request_latency_seconds_bucket{{namespace="llm",service="{SERVICE}"}}[10s])))'
    )
    try:
        answer = requests.get(f"{prometheus.url}/api/v1/query", params={"query": query}, timeout=5).json()
        result = answer["data"]["result"]
    except (requests.RequestException, ValueError, KeyError):
        return None
    if not result:
        return None
    value = float(result[0]["value"][1])
    return None if math.isnan(value) else value  # NaN: no requests in the window yet


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Loop]:
    now = time.time()
    rollout_at = float(int(now) - 120)  # the bad config went out two minutes before the test (seconds in history)
    with (
        LatencyExporter({"namespace": "llm"}) as exporter,
        FakeArgoCD() as argocd,
        FakeGrafana(GRAFANA_TOKEN) as grafana,
    ):
        exporter.set(SERVICE, HEALTHY_SECONDS)
        argocd.state.token = ARGOCD_TOKEN
        config = write_prometheus_config(
            tmp_path / "prometheus.yml",
            scrape_configs=[static_scrape_config("vllm", [exporter.target])],
            scrape_interval="1s",
            evaluation_interval="1s",
        )
        with PrometheusServer(config=config, workdir=tmp_path / "prometheus").start() as prometheus:
            yield Loop(tmp_path, exporter, prometheus, argocd, grafana, rollout_at)
    assert argocd.state.spec_violations == [], "every Argo CD request must be valid against its swagger"
    assert grafana.state.rejections == [], "every Grafana request must be valid against its spec"


def write_config(loop: Loop, *, auto_sync: bool, port: int) -> Path:
    tmp = loop.tmp
    (tmp / "rules").mkdir()
    (tmp / "rules" / f"{POLICY_NAME}.yaml").write_text(POLICY, encoding="utf-8")
    (tmp / "argocd-token").write_text(ARGOCD_TOKEN + "\n", encoding="utf-8")
    config = {
        "prometheus": {"url": loop.prometheus.url, "timeout": 5, "retries": 2},
        "policies": ["rules"],
        "journal": "journal.db",
        "stateDir": "state",
        "listen": f"127.0.0.1:{port}",
        "reloadInterval": "1s",
        "logFormat": "json",
        "argocd": {
            "url": loop.argocd.url,
            "tokenFile": str(tmp / "argocd-token"),
            "apps": {SERVICE: APP},
            "autoSync": "disableAutoSync" if auto_sync else "notifyOnly",
            "timeout": 5,
            "retries": 2,
            "waitTimeout": 60,
            "pollInterval": 0.2,
        },
        "changeTracking": {"sources": ["argocd"], "window": "1h"},
        "annotations": {
            "path": "annotations.jsonl",
            "grafana": {
                "url": loop.grafana.url,
                "tokenEnv": "TAILGUARD_E2E_GRAFANA_TOKEN",
                "outbox": "grafana-outbox.db",
                "timeout": 5,
                "retries": 2,
            },
        },
        # Never called when the breach is attributed; a closed port if it were (the journal would show it).
        "receivers": {"oncall": {"url": f"http://127.0.0.1:{free_port()}/hook", "secretEnv": "TAILGUARD_E2E_SECRET"}},
    }
    path = tmp / "controller.yaml"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")  # JSON is YAML
    return path


@pytest.mark.parametrize("auto_sync", [False, True], ids=["auto-sync-off", "auto-sync-on-disabled-first"])
def test_regression_attributed_to_the_argocd_rollout_is_rolled_back_and_annotated(loop: Loop, auto_sync: bool) -> None:
    loop.argocd.add_app(
        application(
            APP,
            [("good1", loop.rollout_at - 7200), ("bad2", loop.rollout_at)],
            automated=auto_sync,
            helm_parameters={"good1": [("maxNumSeqs", "64")], "bad2": [("maxNumSeqs", "2")]},
        )
    )
    port = free_port()
    config = write_config(loop, auto_sync=auto_sync, port=port)
    log = loop.tmp / "controller.log"
    loop.prometheus.wait_target_up("vllm", timeout=DEADLINE_SECONDS)
    process = start_controller(
        config, log, {"TAILGUARD_E2E_GRAFANA_TOKEN": GRAFANA_TOKEN, "TAILGUARD_E2E_SECRET": "e2e-webhook-secret"}
    )
    try:
        # Healthy first: Prometheus has the latency, the controller evaluates and tracks the rollout already.
        healthy = poll("a healthy P99 in Prometheus", lambda: p99(loop.prometheus), process, log)
        assert healthy <= THRESHOLD_SECONDS
        poll("the controller ready", lambda: ready(port), process, log)
        (rollout_note,) = poll(
            "the rollout annotation in Grafana",
            lambda: annotations_tagged(loop.grafana, "rollout", "revision:bad2") or None,
            process,
            log,
        )
        assert loop.argocd.calls("POST", "/rollback") == [], "no rollback while latency is healthy"

        loop.exporter.set(SERVICE, REGRESSED_SECONDS)
        poll(
            "the Argo CD rollback to good1 to finish",
            lambda: (
                loop.argocd.app(APP)["status"]["sync"]["revision"] == "good1"
                and loop.argocd.app(APP)["status"]["operationState"]["phase"] == "Succeeded"
                or None
            ),
            process,
            log,
        )
        (region,) = poll(
            "the decision's region in Grafana",
            lambda: annotations_tagged(loop.grafana, "region", "fire") or None,
            process,
            log,
        )

        loop.exporter.set(SERVICE, HEALTHY_SECONDS)
        (resolved,) = poll(
            "the region closed in Grafana",
            lambda: annotations_tagged(loop.grafana, "region", "resolved") or None,
            process,
            log,
        )
        assert loop.argocd.calls("POST", "/rollback"), "sanity: the rollback was seen before"

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, tail(log)
        with pytest.raises(ProcessLookupError):  # nothing of its process group outlived it
            os.killpg(process.pid, 0)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    output = log.read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in output, output[-4000:]
    assert '"msg": "controller stopped"' in output
    assert GRAFANA_TOKEN not in output and ARGOCD_TOKEN not in output, "secrets never appear in the log"

    # Argo CD: exactly one rollback, to the history id of the last good revision (validated against the swagger).
    posts = loop.argocd.calls("POST", "/rollback")
    assert [call.body for call in posts] == [{"name": APP, "id": 1, "dryRun": False, "prune": False}]
    assert posts[0].status == 200
    app = loop.argocd.app(APP)
    assert app["status"]["sync"]["revision"] == "good1"
    patches = [r for r in loop.argocd.state.requests if r.method == "PATCH"]
    if auto_sync:
        # Argo CD refuses a rollback while automated sync is on: it was switched off first, and only then rolled back.
        assert [json.loads(p.body["patch"]) for p in patches] == [{"spec": {"syncPolicy": {"automated": None}}}]
        assert patches[0].body["patchType"] == "merge" and patches[0].status == 200
        requests_in_order = loop.argocd.state.requests
        assert requests_in_order.index(patches[0]) < requests_in_order.index(posts[0])
        assert "automated" not in app["spec"].get("syncPolicy", {})
    else:
        assert patches == []

    # The journal: the decision carries the attribution (the bad revision and its diff) and the rollback branch.
    with Journal(loop.tmp / "journal.db") as journal:
        decisions = journal.recent_decisions(100)
    fires = [d for d in decisions if d["kind"] == "fire"]
    assert len(fires) == 1, fires
    fire = fires[0]
    assert fire["policy"] == POLICY_NAME and fire["condition"] == CONDITION
    assert fire["target"] == {"service": SERVICE}
    assert fire["attribution"]["status"] == "attributed"
    assert fire["attribution"]["rollout"]["revision"] == "bad2"
    assert fire["attribution"]["rollout"]["previous_revision"] == "good1"
    assert fire["attribution"]["rollout"]["diff"] == {"maxNumSeqs": {"from": "64", "to": "2"}}
    assert fire["attribution"]["rollout"]["at"] == loop.rollout_at
    assert fire["branch"]["name"] == "rollback-the-rollout"
    records = {r["type"]: r for r in fire["action_records"]}
    assert sorted(records) == ["annotate", "rollback"], "no scale, no notification: the breach was attributed"
    assert records["rollback"]["status"] == "succeeded"
    rolled_back = records["rollback"]["result"]["detail"]
    assert (rolled_back["history_id"], rolled_back["to_revision"], rolled_back["bad_revision"]) == (1, "good1", "bad2")
    assert rolled_back.get("auto_sync_disabled", False) is auto_sync
    resolves = [d for d in decisions if d["kind"] == "resolve"]
    assert [d["id"] for d in resolves] == [fire["id"]]

    # Grafana: the rollout of the bad revision, with its engine-argument diff, at the time Argo CD deployed it.
    assert rollout_note["time"] == round(loop.rollout_at * 1000)
    assert "rollout bad2 (from good1)" in rollout_note["text"]
    assert "maxNumSeqs: 64 -> 2" in rollout_note["text"]
    assert {"service:regress", "application:llm-regress", "source:argocd"} <= set(rollout_note["tags"])
    # ... and the decision's region, from the onset, tagged for the dashboards, closed by the resolution.
    assert region["id"] == resolved["id"]
    expected_tags = {
        "tailguard",
        POLICY_NAME,
        f"policy:{POLICY_NAME}",
        f"condition:{CONDITION}",
        f"decision:{fire['id']}",
    }
    assert expected_tags <= set(resolved["tags"])
    assert resolved["time"] == round(float(fire["onset"]) * 1000)
    assert resolved["timeEnd"] > resolved["time"]
    opening_posts = [
        r.body for r in loop.grafana.requests("POST") if r.status == 200 and f"decision:{fire['id']}" in r.body["tags"]
    ]
    assert len(opening_posts) == 1, "the region is created once, then only PATCHed"
    for text in (opening_posts[0]["text"], resolved["text"]):  # the resolution keeps the why of the opening
        assert "attributed to rollout bad2 (maxNumSeqs 64 -> 2)" in text
        assert "branch: rollback-the-rollout" in text and f"decision id: {fire['id']}" in text
        assert "None" not in text
    assert "resolved: " in resolved["text"]
    region_patches = [
        r for r in loop.grafana.requests("PATCH") if r.path == f"/api/annotations/{region['id']}" and r.status == 200
    ]
    assert len(region_patches) == 1 and region_patches[0].body["timeEnd"] == resolved["timeEnd"]
    # The policy's own annotate action went to Grafana too (its text names the bad revision and the diff).
    (noted,) = annotations_tagged(loop.grafana, "regression", "rollback")
    assert "rolling back bad2 (maxNumSeqs 64 -> 2)" in noted["text"]
