"""Driving `tailguard run` as a real process in end-to-end tests: start it in its own process group, poll with a
deadline (failing with the log's tail, or at once when the process exited), read readiness, write a kubeconfig for
the fake Kubernetes API, pick Grafana annotations by tag. Shared by tests/e2e and tests/integration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest
import requests

from tailguard.serving.lab.promstack import PrometheusServer, static_scrape_config, write_prometheus_config
from tests.support.fake_grafana import FakeGrafana
from tests.support.fake_kubernetes import FakeKubernetes, hpa
from tests.support.latency_exporter import LatencyExporter

REPO = Path(__file__).resolve().parents[2]
DEADLINE_SECONDS = 90.0  # per wait; generous for a loaded 2-core machine, never reached when things work

T = TypeVar("T")


def poll(what: str, probe: Callable[[], T | None], process: subprocess.Popen[bytes] | None, log: Path | None) -> T:
    """The first non-None answer of `probe`; fails naming `what` (and the controller's log tail) at the deadline."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        if process is not None and process.poll() is not None:
            pytest.fail(f"tailguard exited with {process.returncode} while waiting for {what}:\n{tail(log)}")
        answer = probe()
        if answer is not None:
            return answer
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}:\n{tail(log)}")
        time.sleep(0.2)


class NamedProcess(Protocol):
    """A started controller process with a name and its log's tail (the integration tests' replicas)."""

    name: str
    process: subprocess.Popen[bytes]

    def tail(self) -> str: ...


def poll_processes(what: str, probe: Callable[[], T | None], *processes: NamedProcess, interval: float = 0.2) -> T:
    """The first non-None answer of `probe`; fails naming `what` (and every log's tail) at the deadline, or at once
    when one of `processes` exited."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        for running in processes:
            if running.process.poll() is not None:
                pytest.fail(
                    f"{running.name} exited with {running.process.returncode} waiting for {what}:\n{running.tail()}"
                )
        answer = probe()
        if answer is not None:
            return answer
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}:\n" + "\n".join(f"{p.name}:\n{p.tail()}" for p in processes))
        time.sleep(interval)


def tail(log: Path | None, limit: int = 4000) -> str:
    if log is None or not log.exists():
        return ""
    return log.read_text(encoding="utf-8", errors="replace")[-limit:]


def annotations_tagged(grafana: FakeGrafana, *tags: str) -> list[dict[str, Any]]:
    return [a for a in grafana.annotations() if all(tag in a.get("tags", []) for tag in tags)]


def start_controller(config: Path, log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`python -m tailguard.controller run --config CONFIG` in CONFIG's directory, its own process group, output in
    `log`."""
    with log.open("wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "tailguard.controller", "run", "--config", str(config)],
            cwd=config.parent,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: the caller can always take all of it down
            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        )


def ready(port: int, host: str = "127.0.0.1") -> bool | None:
    try:
        answer = requests.get(f"http://{host}:{port}/readyz", timeout=2)
    except requests.RequestException:
        return None
    return True if answer.status_code == 200 and answer.json().get("ready") is True else None


def write_kubeconfig(path: Path, server: str, token: str) -> Path:
    """A kubeconfig for the fake Kubernetes API at `server` (the controller's `kubernetes.kubeconfig`)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "tailguard", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tailguard"}}],
        "current-context": "fake",
    }
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


@dataclass
class ScrapedStack:
    """A latency exporter scraped every second by a real Prometheus, the fake Kubernetes API with an HPA per
    service, and a kubeconfig for it: what the `tailguard run` integration tests run their processes against."""

    tmp: Path
    exporter: LatencyExporter
    prometheus: PrometheusServer
    kube: FakeKubernetes
    kubeconfig: Path


@contextmanager
def scraped_stack(tmp: Path, namespace: str, hpas: Mapping[str, str], kube_token: str) -> Iterator[ScrapedStack]:
    """`hpas`: service -> its HPA's name (min 2, max 10); each service starts healthy (0.1 s, 1 waiting)."""
    with LatencyExporter({"namespace": namespace}) as exporter, FakeKubernetes() as kube:
        for service, name in hpas.items():
            kube.put_object(hpa(name, namespace, min_replicas=2, max_replicas=10))
            exporter.set(service, 0.1, waiting=1.0)
        config = write_prometheus_config(
            tmp / "prometheus.yml",
            scrape_configs=[static_scrape_config("vllm", [exporter.target])],
            scrape_interval="1s",
            evaluation_interval="1s",
        )
        with PrometheusServer(config=config, workdir=tmp / "prometheus").start() as prometheus:
            prometheus.wait_target_up("vllm", timeout=DEADLINE_SECONDS)
            kubeconfig = write_kubeconfig(tmp / "kubeconfig.yaml", kube.url, kube_token)
            yield ScrapedStack(tmp, exporter, prometheus, kube, kubeconfig)


def replica_pod(name: str, namespace: str, ip: str, deployment: str = "tailguard") -> dict[str, Any]:
    """The Pod of controller replica `name` (owned by a ReplicaSet of Deployment `deployment`, at `ip`), as the
    fake Kubernetes API must hold it for a standby to forward to that replica (controller/adapters/lease/peers.py)."""
    template_hash = "5f7c9d"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "tailguard", "pod-template-hash": template_hash},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{deployment}-{template_hash}",
                    "uid": f"uid-{deployment}-{template_hash}",
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "controller", "image": "tailguard:dev"}]},
        "status": {"podIP": ip, "podIPs": [{"ip": ip}]},
    }
