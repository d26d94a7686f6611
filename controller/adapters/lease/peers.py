"""Where a standby may forward: only to the pod that holds the Lease, of this controller's own Deployment.

A Lease annotation (`tailguard.io/api-url`) is written by whoever may write Leases in the namespace, which is more
people than may steer the controller. So the URL is never trusted as written: before a standby forwards anything
to the Lease holder `identity` at `url`, it reads the pod named `identity` from the API server and checks

- `url` is `http://IP:PORT` with an IP literal (no name to resolve, no credentials, no path) and PORT the API's
  configured port;
- IP is that pod's `status.podIP` (or one of `status.podIPs`);
- that pod belongs to the same Deployment as this replica's own pod: both are owned by a ReplicaSet whose name is
  `<deployment>-<pod-template-hash>` (so two ReplicaSets of one Deployment during a rollout match, a pod of
  anything else does not).

Answers are cached per (identity, url) for `ttl` seconds (a refusal for `refusal_ttl`), so a burst of forwarded
requests reads the pod once; the API server's errors are refusals (never "forward anyway"). Needs `get` on pods
in the namespace (deploy/base/rbac-leader-election.yaml).
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from urllib.parse import urlsplit

from kubernetes import client as k8s

from tailguard.controller.adapters.kube.calls import KubeError, kube_call
from tailguard.controller.core.ports import Clock
from tailguard.controller.kit.http import RetryPolicy

log = logging.getLogger(__name__)

TEMPLATE_HASH_LABEL = "pod-template-hash"


class PodPeerCheck:
    """The PeerCheckPort against the Kubernetes API (controller/core/ports/leadership.py)."""

    def __init__(
        self,
        core: k8s.CoreV1Api,
        namespace: str,
        own_pod: str,
        port: int,
        clock: Clock,
        *,
        ttl: float = 30.0,
        refusal_ttl: float = 5.0,
        timeout: float = 5.0,
    ) -> None:
        self.core = core
        self.namespace = namespace
        self.own_pod = own_pod
        self.port = port
        self.clock = clock
        self.ttl = ttl
        self.refusal_ttl = refusal_ttl
        self.timeout = timeout
        self._own_deployment: str | None = None
        self._cache: dict[tuple[str, str], tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def check(self, identity: str, url: str) -> str | None:
        now = self.clock.now()
        with self._lock:
            cached = self._cache.get((identity, url))
            if cached is not None and cached[0] > now:
                return cached[1]
        reason = self._check(identity, url)
        if reason is not None:
            log.warning("not forwarding to the Lease holder %r at %s: %s", identity, _origin(url), reason)
        with self._lock:
            if len(self._cache) > 64:
                self._cache.clear()  # one holder at a time; a bounded memory however often the Lease changes
            self._cache[(identity, url)] = (now + (self.ttl if reason is None else self.refusal_ttl), reason)
        return reason

    def _check(self, identity: str, url: str) -> str | None:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return "the Lease's API URL is not a URL"
        if parts.scheme != "http" or parts.username or parts.password or parts.path not in ("", "/"):
            return "the Lease's API URL is not http://POD_IP:PORT"
        if parts.query or parts.fragment:
            return "the Lease's API URL is not http://POD_IP:PORT"
        try:
            host = str(ipaddress.ip_address(parts.hostname or ""))
        except ValueError:
            return "the Lease's API URL names a host, not a pod IP"
        if port != self.port:
            return f"the Lease's API URL has port {port}, the API's port is {self.port}"
        pod = self._pod(identity)
        if isinstance(pod, str):
            return pod
        addresses = {pod.status.pod_ip} if pod.status is not None and pod.status.pod_ip else set()
        for entry in (pod.status.pod_ips if pod.status is not None else None) or []:
            if entry.ip:
                addresses.add(str(entry.ip))
        if host not in {str(ipaddress.ip_address(a)) for a in addresses}:
            return f"{host} is not the IP of pod {identity} (the Lease holder)"
        own = self._own()
        if own is None:
            return f"this replica's own pod {self.own_pod!r} is not owned by a Deployment's ReplicaSet"
        theirs = deployment_of(pod)
        if theirs != own:
            return f"pod {identity} is not a replica of Deployment {own}"
        return None

    def _own(self) -> str | None:
        if self._own_deployment is None:
            pod = self._pod(self.own_pod)
            if not isinstance(pod, str):
                self._own_deployment = deployment_of(pod)
        return self._own_deployment

    def _pod(self, name: str) -> k8s.V1Pod | str:
        found = kube_call(
            lambda: self.core.read_namespaced_pod(name, self.namespace, _request_timeout=self.timeout),
            what=f"reading pod {self.namespace}/{name}",
            clock=self.clock,
            retry=RetryPolicy(attempts=1),
        )
        if isinstance(found, KubeError):
            if found.status == 404:
                return f"no pod named {name!r} in namespace {self.namespace}"
            return f"cannot read pod {name!r}: {found.message}"
        return found


def deployment_of(pod: k8s.V1Pod) -> str | None:
    """The name of the Deployment owning `pod` through its ReplicaSet (`<deployment>-<pod-template-hash>`)."""
    metadata = pod.metadata
    if metadata is None:
        return None
    template_hash = (metadata.labels or {}).get(TEMPLATE_HASH_LABEL)
    for owner in metadata.owner_references or []:
        if owner.kind == "ReplicaSet" and owner.controller and template_hash:
            suffix = f"-{template_hash}"
            if owner.name.endswith(suffix) and len(owner.name) > len(suffix):
                return str(owner.name[: -len(suffix)])
    return None


def _origin(url: str) -> str:
    try:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.hostname}:{parts.port}" if parts.hostname else "(not a URL)"
    except ValueError:
        return "(not a URL)"
