"""Issue 22 (1): answers of 20 MB and more arrive whole through every client path tailguard uses.

`tailguard backtest` over a week x 100 targets failed with "malformed response ... unexpected end of data": its
5-10 MB range answers came back cut short. The cause: `read_raw_within` took the first empty read as the end of
the body, and under urllib3-future a read whose bytes decode to nothing yet (the gzip header Prometheus sends in
a chunk of its own, an empty flush block) comes back empty with the rest of the answer still on the wire.

Each client path reads a >= 20 MiB JSON answer from tests/support/large_answers.py, sent with Content-Length and
chunked, plain and gzip (blocks as Go's writer sends them), and over a slow link; the parsed result must be the
whole answer: Prometheus instant and range (`PrometheusSource`: instant, range, range_grid), Kubernetes (the
bounded API client: DeadlinePoolManager), Argo CD (`ArgoCDClient`: the kit's request_with_retry) and Grafana
(`GrafanaHttp`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from kubernetes import client as k8s

from tailguard.controller.adapters.annotations.grafana import GrafanaHttp
from tailguard.controller.adapters.argocd.client import ArgoCDClient
from tailguard.controller.adapters.kube.api_client import bounded_api_client
from tailguard.controller.adapters.kube.calls import KubeError, kube_call
from tailguard.controller.adapters.metrics.prometheus import (
    PrometheusSettings,
    PrometheusSource,
    matrix_grid,
    matrix_result,
    vector_result,
)
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.kit.http import RetryPolicy
from tests.support.large_answers import TRANSFERS, LargeAnswerServer, Transfer

MIN_BYTES = 20 * 1024 * 1024
T0 = 1_700_000_000.0
STEP = 15.0
GROUP_BY = ["service"]
TIMEOUT = 120.0  # a hang guard only: the answers come over loopback


def _at_least(minimum: int, make: Any) -> bytes:
    body = json.dumps(make(), separators=(",", ":")).encode()
    assert len(body) >= minimum, len(body)
    return body


def range_body() -> bytes:
    """A matrix of 100 series x 8,000 samples (a week x 100 targets at 75 s), > 20 MiB."""
    points = 8_000

    def make() -> dict[str, Any]:
        result = [
            {
                "metric": {"service": f"svc-{index:05d}"},
                "values": [[T0 + k * STEP, f"{(index * 7919 + k) % 100_003 / 1000:.6f}"] for k in range(points)],
            }
            for index in range(100)
        ]
        return {"status": "success", "data": {"resultType": "matrix", "result": result}}

    return _at_least(MIN_BYTES, make)


def instant_body() -> bytes:
    """A vector of 150,000 series (labels as vLLM's exporters carry them), > 20 MiB."""

    def make() -> dict[str, Any]:
        result = [
            {
                "metric": {
                    "service": f"svc-{index:06d}",
                    "namespace": "serving",
                    "pod": f"vllm-{index:06d}-7f9c8d6b5-x2k4q",
                    "model_name": "meta-llama/Llama-3.1-8B-Instruct",
                },
                "value": [T0, f"{index % 9973 / 100:.4f}"],
            }
            for index in range(150_000)
        ]
        return {"status": "success", "data": {"resultType": "vector", "result": result}}

    return _at_least(MIN_BYTES, make)


def padding(index: int) -> str:
    return f"{index:08d}-" + "x" * 180


def kubernetes_body() -> bytes:
    """A custom-object list (as the policy CRD watch lists it) of 70,000 items, > 20 MiB."""

    def make() -> dict[str, Any]:
        items = [
            {
                "apiVersion": "tailguard.io/v1alpha1",
                "kind": "TailguardPolicy",
                "metadata": {"name": f"policy-{index:06d}", "namespace": "tailguard", "resourceVersion": str(index)},
                "spec": {"interval": "30s", "note": padding(index)},
            }
            for index in range(70_000)
        ]
        return {"apiVersion": "tailguard.io/v1alpha1", "kind": "TailguardPolicyList", "items": items}

    return _at_least(MIN_BYTES, make)


def argocd_body() -> bytes:
    """An Application with 80,000 history entries, > 20 MiB."""

    def make() -> dict[str, Any]:
        history = [
            {"id": index, "revision": f"{index:040x}", "deployedAt": "2026-12-01T00:00:00Z", "source": padding(index)}
            for index in range(80_000)
        ]
        return {"metadata": {"name": "chat"}, "spec": {}, "status": {"history": history}}

    return _at_least(MIN_BYTES, make)


def grafana_body() -> bytes:
    """80,000 annotations, > 20 MiB."""

    def make() -> list[dict[str, Any]]:
        return [
            {"id": index, "time": 1_700_000_000_000 + index, "tags": [f"key:{index:016x}"], "text": padding(index)}
            for index in range(80_000)
        ]

    return _at_least(MIN_BYTES, make)


@pytest.fixture(params=TRANSFERS, ids=[transfer.name for transfer in TRANSFERS])
def transfer(request: pytest.FixtureRequest) -> Transfer:
    return request.param  # type: ignore[no-any-return]


_BODIES: dict[str, bytes] = {}


def body(kind: str) -> bytes:
    """Each body is built once per session (they take a second or two)."""
    if kind not in _BODIES:
        _BODIES[kind] = {
            "range": range_body,
            "instant": instant_body,
            "kubernetes": kubernetes_body,
            "argocd": argocd_body,
            "grafana": grafana_body,
        }[kind]()
    return _BODIES[kind]


def prometheus(url: str) -> PrometheusSource:
    return PrometheusSource(PrometheusSettings(url=url, timeout=TIMEOUT, retries=0), ManualClock())


def test_a_prometheus_range_answer_arrives_whole(transfer: Transfer) -> None:
    data = json.loads(body("range"))["data"]["result"]
    times = [T0 + k * STEP for k in range(8_000)]
    with LargeAnswerServer(body("range"), transfer) as server:
        with prometheus(server.url) as source:
            got = source.range("x", GROUP_BY, times[0], times[-1], STEP)
            grid = source.range_grid("x", GROUP_BY, times, STEP)
        assert got.error is None, got.error
        assert got == matrix_result(data, GROUP_BY)
        assert sum(len(samples) for samples in got.series.values()) == 100 * 8_000
        assert grid.error is None, grid.error
        expected = matrix_grid(data, GROUP_BY, times, STEP)
        assert grid.targets == expected.targets
        assert np.array_equal(grid.values, expected.values, equal_nan=True)
        assert server.answers == 2


def test_a_prometheus_instant_answer_arrives_whole(transfer: Transfer) -> None:
    data = json.loads(body("instant"))["data"]["result"]
    with LargeAnswerServer(body("instant"), transfer) as server:
        with prometheus(server.url) as source:
            got = source.instant("x", GROUP_BY)
        assert got.error is None, got.error
        assert len(got.values) == 150_000
        assert got == vector_result(data, GROUP_BY)


def test_a_kubernetes_list_arrives_whole(transfer: Transfer) -> None:
    with LargeAnswerServer(body("kubernetes"), transfer) as server:
        configuration = k8s.Configuration()
        configuration.host = server.url
        configuration.retries = 0
        api = k8s.CustomObjectsApi(bounded_api_client(k8s.ApiClient(configuration)))
        listed = kube_call(
            lambda: api.list_namespaced_custom_object(
                "tailguard.io", "v1alpha1", "tailguard", "tailguardpolicies", _request_timeout=TIMEOUT
            ),
            what="list policies",
            clock=ManualClock(),
            retry=RetryPolicy(attempts=1),
        )
        assert not isinstance(listed, KubeError), listed
        assert listed == json.loads(body("kubernetes"))


def test_an_argocd_application_arrives_whole(transfer: Transfer) -> None:
    with LargeAnswerServer(body("argocd"), transfer) as server:
        argocd = ArgoCDClient(server.url, clock=ManualClock(), token=lambda: "argocd-token", timeout=TIMEOUT, retries=1)
        app = argocd.get_app("chat")
        assert app == json.loads(body("argocd"))


def test_grafana_annotations_arrive_whole(transfer: Transfer) -> None:
    with LargeAnswerServer(body("grafana"), transfer) as server:
        grafana = GrafanaHttp(server.url, "grafana-token", ManualClock(), timeout=TIMEOUT, retries=1)
        answer = grafana.call("GET", "/annotations?tags=x", retry=True)
        assert answer.ok, answer.error
        assert answer.body == json.loads(body("grafana"))
