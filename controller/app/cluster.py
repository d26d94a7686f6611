"""What `tailguard run` builds from the `kubernetes` and `leaderElection` sections: the connection (one ApiClient
and the Event recorder its actuators share), the Lease elector and the peer check (the sections themselves:
controller/app/cluster_settings.py; the actuators, the HPA scaler, the route weights and the Deployment rollback,
are registered in controller/app/registrations.py and chosen by build()).

Needs the cluster extra (kubernetes): controller/app/build.py imports this module only when a section asks for it.
Building never raises a traceback at the operator: a cluster that cannot be reached from the configuration
(not in a pod, an unreadable kubeconfig) is a `ClusterConfigError` whose text is one clear line.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubernetes import client as k8s

from tailguard.controller.adapters.kube.api_client import cluster_api_client
from tailguard.controller.adapters.kube.events import EventRecorder
from tailguard.controller.adapters.lease.leader import LeaderElector
from tailguard.controller.adapters.lease.peers import PodPeerCheck
from tailguard.controller.adapters.lease.settings import LeaderElectionSettings
from tailguard.controller.adapters.lease.shards import ShardChange, ShardedElector
from tailguard.controller.adapters.rollback.deployment import DeploymentRollback
from tailguard.controller.adapters.scale.hpa import HpaScaler
from tailguard.controller.adapters.traffic.routes import HttpRouteRouter, VirtualServiceRouter
from tailguard.controller.app.cluster_settings import KubernetesSettings
from tailguard.controller.app.registrations import deployment_rollback, hpa_scaler, route_router
from tailguard.controller.app.registry import BuildContext, ClusterConnection
from tailguard.controller.core.ports import Clock
from tailguard.controller.kit.errors import ConfigError
from tailguard.controller.kit.http import RetryPolicy


class ClusterConfigError(ConfigError):
    """The cluster cannot be reached as configured; the message is one line for the operator."""


@dataclass(frozen=True)
class ClusterActuators:
    scaler: HpaScaler | None
    router: HttpRouteRouter | VirtualServiceRouter | None
    events: EventRecorder | None
    api_client: k8s.ApiClient
    rollback: DeploymentRollback | None = None


def cluster_client(settings: KubernetesSettings | None, *, base_dir: Path | None = None) -> k8s.ApiClient:
    """The ApiClient the settings describe (None: in-cluster); ClusterConfigError when it cannot be built."""
    in_cluster = settings is None or settings.inCluster
    kubeconfig: str | None = None
    if settings is not None and settings.kubeconfig is not None:
        path = Path(settings.kubeconfig).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path  # relative to the configuration file, like every other path in it
        kubeconfig = str(path)
        try:
            with path.open("rb"):
                pass
        except OSError as unreadable:
            raise ClusterConfigError(
                f"kubernetes.kubeconfig: cannot read {path}: {unreadable.strerror or unreadable}"
            ) from None
    try:
        return cluster_api_client(in_cluster=in_cluster, kubeconfig=kubeconfig)
    except Exception as unusable:  # the kubernetes config loader raises many types; all are config
        reason = _one_line(unusable)
        if in_cluster:
            raise ClusterConfigError(
                f"kubernetes: cannot use the in-cluster service account ({reason}); outside a cluster set "
                "kubernetes.inCluster: false and kubernetes.kubeconfig"
            ) from unusable
        where = kubeconfig or "the default kubeconfig ($KUBECONFIG or ~/.kube/config)"
        raise ClusterConfigError(f"kubernetes.kubeconfig: {where} is not usable: {reason}") from unusable


def _one_line(error: BaseException) -> str:
    if isinstance(error, yaml.YAMLError):
        mark = getattr(error, "problem_mark", None)
        problem = getattr(error, "problem", None) or type(error).__name__
        return f"invalid YAML at line {mark.line + 1}: {problem}" if mark is not None else f"invalid YAML: {problem}"
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:300]


def connect(
    settings: KubernetesSettings,
    clock: Clock,
    *,
    api_client: k8s.ApiClient | None = None,
    base_dir: Path | None = None,
) -> ClusterConnection:
    """The one ApiClient the `kubernetes` section describes, and what its actuators share: the namespace, the
    per-request timeout and retry, the Event recorder (`events: true`)."""
    client = api_client if api_client is not None else cluster_client(settings, base_dir=base_dir)
    return ClusterConnection(
        api_client=client,
        namespace=settings.namespace,
        timeout=settings.timeout,
        retry=RetryPolicy(attempts=settings.retries),
        events=EventRecorder(k8s.CoreV1Api(client), clock) if settings.events else None,
    )


def build_cluster_actuators(
    settings: KubernetesSettings,
    clock: Clock,
    *,
    api_client: k8s.ApiClient | None = None,
    base_dir: Path | None = None,
    state_dir: Path | None = None,
) -> ClusterActuators:
    """The HPA scaler, the traffic router and the Deployment rollback the settings ask for, sharing one ApiClient
    and Event recorder (the rollback's record of bad templates and plans lives in `state_dir`), made by their
    registered factories (controller/app/registrations.py) as `tailguard run` makes them."""
    cluster = connect(settings, clock, api_client=api_client, base_dir=base_dir)
    with ExitStack() as unused:  # nothing these factories make registers a close
        context = BuildContext(settings, clock, base_dir or Path("."), state_dir, unused, cluster)
        return ClusterActuators(
            scaler=hpa_scaler(settings.hpa, context) if settings.hpa is not None else None,
            router=route_router(settings.traffic, context) if settings.traffic is not None else None,
            events=cluster.events,
            api_client=cluster.api_client,
            rollback=deployment_rollback(settings.rollback, context) if settings.rollback is not None else None,
        )


def build_leader_elector(
    election: LeaderElectionSettings,
    kubernetes: KubernetesSettings | None,
    clock: Clock,
    *,
    api_client: k8s.ApiClient | None = None,
    base_dir: Path | None = None,
    on_shard_change: ShardChange | None = None,
) -> LeaderElector | ShardedElector:
    """The Lease elector on the cluster `kubernetes` names (absent: in-cluster); ClusterConfigError if unusable.
    With `shards` > 1, the sharded elector (controller/adapters/lease/shards.py), reporting ownership changes."""
    client = api_client if api_client is not None else cluster_client(kubernetes, base_dir=base_dir)
    if election.shards > 1:
        return ShardedElector.from_settings(election, k8s.CoordinationV1Api(client), clock, on_change=on_shard_change)
    return LeaderElector.from_settings(election, k8s.CoordinationV1Api(client), clock)


def build_peer_check(elector: LeaderElector, election: LeaderElectionSettings, clock: Clock, port: int) -> PodPeerCheck:
    """Which Lease URL a standby may forward to: the holder's pod of this Deployment (adapters/lease/peers.py)."""
    return PodPeerCheck(
        k8s.CoreV1Api(elector.api.api_client), election.namespace, election.resolved_identity(), port, clock
    )
