"""The Kubernetes ApiClient every adapter uses: without urllib3's own retries, with a total deadline per request."""

from __future__ import annotations

from kubernetes import client as k8s

from tailguard.controller.kit.http import DeadlinePoolManager


def cluster_api_client(*, in_cluster: bool = True, kubeconfig: str | None = None) -> k8s.ApiClient:
    """An ApiClient for the cluster tailguard runs in (or a kubeconfig), without urllib3's own retries:
    the actuators retry boundedly themselves, and two retry layers would multiply the attempts."""
    from kubernetes import config as k8s_config  # only where a cluster is used

    configuration = k8s.Configuration()
    if in_cluster:
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    configuration.retries = 0
    return bounded_api_client(k8s.ApiClient(configuration))


KUBE_DEFAULT_TOTAL_SECONDS = 30.0  # a call made without `_request_timeout` (every adapter passes its own)


def bounded_api_client(client: k8s.ApiClient, default_total: float = KUBE_DEFAULT_TOTAL_SECONDS) -> k8s.ApiClient:
    """`client` with a TOTAL deadline per request: the Kubernetes client turns `_request_timeout` into urllib3
    per-read timeouts, so a trickling API server (or a proxy in front of it) could hold a call far longer. Each
    request now ends within its `_request_timeout` (connect at most 5 s of it, then headers and the whole body),
    or `default_total` without one (tailguard.controller.kit.http.DeadlinePoolManager)."""
    rest = client.rest_client
    if not isinstance(rest.pool_manager, DeadlinePoolManager):
        rest.pool_manager = DeadlinePoolManager(rest.pool_manager, default_total)  # type: ignore[assignment]  # a wrapper
    return client
