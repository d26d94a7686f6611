"""Issue 16 (5), the remaining clients: the Kubernetes client and grafana-client take per-read timeouts only; a
loopback server that trickles its answer one byte at a time (or hangs after the headers) is cut at the call's
total deadline. Kubernetes: `bounded_api_client` (what `cluster_api_client` returns) ends each request within its
`_request_timeout` (a number or (connect, read)), and the adapters' kube_call reports a transient "no answer".
Grafana: GrafanaHttp's session (`deadline_session`: the kit's DeadlineAdapter) ends each request within the
configured timeout: a transient "timed out" answer, which the outbox retries later. Hang guards only (generous,
above the deadline)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from tailguard.controller.adapters.annotations.grafana import GrafanaHttp
from tailguard.controller.adapters.kube.api_client import bounded_api_client, cluster_api_client
from tailguard.controller.adapters.kube.calls import KubeError, kube_call
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.kit.http import DeadlinePoolManager, RetryPolicy
from tests.chaos.test_chaos_deadlines import TricklingServer, timed


@pytest.fixture(params=["trickle", "hang"])
def slow(request: pytest.FixtureRequest) -> Iterator[TricklingServer]:
    server = TricklingServer(hang=request.param == "hang")
    yield server
    server.close()


def api_client(url: str) -> k8s.ApiClient:
    configuration = k8s.Configuration()
    configuration.host = url
    configuration.retries = 0
    return bounded_api_client(k8s.ApiClient(configuration))


@pytest.mark.parametrize("request_timeout", [1.0, (0.5, 0.5)], ids=["total", "connect-read"])
def test_a_slow_kubernetes_api_is_cut_at_the_request_timeout(
    slow: TricklingServer, request_timeout: float | tuple[float, float]
) -> None:
    leases = k8s.CoordinationV1Api(api_client(slow.url))
    answer, elapsed = timed(
        lambda: kube_call(
            lambda: leases.read_namespaced_lease("tailguard-leader", "tailguard", _request_timeout=request_timeout),
            what="read Lease tailguard/tailguard-leader",
            clock=ManualClock(),
            retry=RetryPolicy(attempts=1),
        )
    )
    assert isinstance(answer, KubeError) and answer.transient and "no answer" in answer.message
    assert elapsed < 1.0 + 2.0, f"{elapsed:.2f}s"  # hang guard: per-read timeouts alone never end a trickle


def test_a_kubernetes_call_without_a_timeout_gets_the_default_total(slow: TricklingServer) -> None:
    client = api_client(slow.url)
    client.rest_client.pool_manager.default_total = 1.0  # type: ignore[attr-defined]
    leases = k8s.CoordinationV1Api(client)
    with pytest.raises(OSError, match="deadline"):
        leases.read_namespaced_lease("tailguard-leader", "tailguard")


def test_bounded_api_client_is_idempotent() -> None:
    client = api_client("http://127.0.0.1:1")
    wrapped = client.rest_client.pool_manager
    assert bounded_api_client(client).rest_client.pool_manager is wrapped


def test_a_slow_grafana_is_a_transient_timeout_within_the_configured_timeout(slow: TricklingServer) -> None:
    grafana = GrafanaHttp(slow.url, "grafana-token", ManualClock(), timeout=1.0, retries=1)
    answer, elapsed = timed(lambda: grafana.call("GET", "/annotations?tags=x", retry=True))
    assert answer.status is None and answer.transient  # type: ignore[attr-defined]
    assert "timed out" in answer.error  # type: ignore[attr-defined]
    assert elapsed < 1.0 + 2.0, f"{elapsed:.2f}s"


def test_every_grafana_retry_is_bounded_too(slow: TricklingServer) -> None:
    grafana = GrafanaHttp(slow.url, "grafana-token", ManualClock(), timeout=0.5, retries=3)
    answer, elapsed = timed(lambda: grafana.call("GET", "/annotations?tags=x", retry=True))
    assert answer.status is None and slow.requests == 3  # type: ignore[attr-defined]
    assert elapsed < 3 * 0.5 + 3.0, f"{elapsed:.2f}s"  # backoffs go through the ManualClock


def test_the_controllers_api_client_is_bounded(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        ),
        encoding="utf-8",
    )
    client = cluster_api_client(in_cluster=False, kubeconfig=str(kubeconfig))
    assert isinstance(client.rest_client.pool_manager, DeadlinePoolManager)
