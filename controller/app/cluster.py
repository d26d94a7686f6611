"""The `kubernetes` section of the controller configuration and what `tailguard run` builds from it.

```yaml
kubernetes:
  inCluster: true            # the pod's service account; false: the kubeconfig below (or $KUBECONFIG, ~/.kube/config)
  kubeconfig: null
  namespace: llm             # where HPAs and routes live unless a target names its own
  events: true               # a core/v1 Event on every object tailguard changes
  timeout: 5                 # seconds per API request
  retries: 3                 # attempts in all, transient errors only
  hpa:                       # scale actions move the HPA's minReplicas (controller/adapters/scale/hpa.py)
    maxReplicas: 8
    minReplicas: 1
    allowBelowHumanFloor: false
    targets: {chat: {namespace: llm, name: chat-stable}}   # default: the HPA named like the service
  traffic:                   # shift_traffic actions set route weights (controller/adapters/traffic/routes.py)
    kind: httproute          # or virtualservice
    routes: {chat: {namespace: llm, name: chat}}          # default: the route named like the service
    ramp: {steps: [50], hold: 60s}                        # absent: increases in one step
```

Both `hpa` and `traffic` are optional: without them scale and shift_traffic go to the local tier (if any).
Building never raises a traceback at the operator: a cluster that cannot be reached from the configuration
(not in a pod, an unreadable kubeconfig) is a `ClusterConfigError` whose text is one clear line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from kubernetes import client as k8s
from pydantic import BaseModel, ConfigDict, Field, model_validator

from controller.adapters.lease.leader import LeaderElectionSettings, LeaderElector
from controller.adapters.scale.hpa import (
    EventRecorder,
    HpaBounds,
    HpaScaler,
    HpaTarget,
    cluster_api_client,
)
from controller.adapters.traffic.routes import HttpRouteRouter, Ramp, RouteRef, VirtualServiceRouter
from controller.core.errors import ConfigError
from controller.core.policy import Duration
from controller.core.ports import Clock
from controller.kit.http import RetryPolicy


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ObjectRefSettings(_Strict):
    """One Kubernetes object of a service: its namespace (default: `kubernetes.namespace`) and name."""

    namespace: str | None = Field(default=None, min_length=1, description="default: kubernetes.namespace")
    name: str = Field(min_length=1)


class HpaSettings(_Strict):
    maxReplicas: int = Field(ge=1, description="tailguard never sets minReplicas or maxReplicas above this")
    minReplicas: int = Field(default=1, ge=1, description="tailguard never sets minReplicas below this")
    allowBelowHumanFloor: bool = Field(
        default=False, description="may scaling down go below the minReplicas a human set (recorded at first touch)"
    )
    targets: dict[str, ObjectRefSettings] = Field(
        default_factory=dict, description="service -> its HPA; default: the HPA named like the service"
    )

    @model_validator(mode="after")
    def _ordered(self) -> HpaSettings:
        if self.minReplicas > self.maxReplicas:
            raise ValueError(f"expected minReplicas <= maxReplicas, got {self.minReplicas} > {self.maxReplicas}")
        return self


class RampSettings(_Strict):
    steps: list[int] = Field(default_factory=lambda: [50], description="intermediate weights on the way up")
    hold: Duration = Field(default=60.0, description="time at each step before the next")

    @model_validator(mode="after")
    def _in_range(self) -> RampSettings:
        outside = [step for step in self.steps if not 0 < step < 100]
        if outside:
            raise ValueError(f"ramp steps are intermediate weights: expected 1..99, got {outside}")
        return self


class TrafficSettings(_Strict):
    kind: Literal["httproute", "virtualservice"] = Field(
        default="httproute", description="Gateway API HTTPRoute backendRefs or Istio VirtualService routes"
    )
    routes: dict[str, ObjectRefSettings] = Field(
        default_factory=dict, description="service -> its route; default: the route named like the service"
    )
    ramp: RampSettings | None = Field(default=None, description="step increases of a weight; absent: one step")


class KubernetesSettings(_Strict):
    """`kubernetes:` in the controller configuration."""

    inCluster: bool = Field(default=True, description="use the pod's service account (false: a kubeconfig)")
    kubeconfig: str | None = Field(
        default=None, min_length=1, description="kubeconfig file when inCluster is false (default: $KUBECONFIG)"
    )
    namespace: str = Field(default="llm", min_length=1, description="namespace of the serving tier's objects")
    events: bool = Field(default=True, description="record a core/v1 Event on every object changed")
    timeout: float = Field(default=5.0, gt=0, description="seconds per API request")
    retries: int = Field(default=3, ge=1, le=10, description="attempts in all, transient errors only")
    hpa: HpaSettings | None = Field(default=None, description="scale actions through HorizontalPodAutoscalers")
    traffic: TrafficSettings | None = Field(default=None, description="shift_traffic actions through route weights")

    @model_validator(mode="after")
    def _kubeconfig_only_outside(self) -> KubernetesSettings:
        if self.inCluster and self.kubeconfig is not None:
            raise ValueError("kubeconfig is only read when inCluster is false: set inCluster: false or drop it")
        return self


class ClusterConfigError(ConfigError):
    """The cluster cannot be reached as configured; the message is one line for the operator."""


@dataclass(frozen=True)
class ClusterActuators:
    scaler: HpaScaler | None
    router: HttpRouteRouter | VirtualServiceRouter | None
    events: EventRecorder | None
    api_client: k8s.ApiClient


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


def build_cluster_actuators(
    settings: KubernetesSettings,
    clock: Clock,
    *,
    api_client: k8s.ApiClient | None = None,
    base_dir: Path | None = None,
) -> ClusterActuators:
    """The HPA scaler and the traffic router the settings ask for, sharing one ApiClient and Event recorder."""
    client = api_client if api_client is not None else cluster_client(settings, base_dir=base_dir)
    retry = RetryPolicy(attempts=settings.retries)
    events = EventRecorder(k8s.CoreV1Api(client), clock) if settings.events else None
    scaler: HpaScaler | None = None
    if settings.hpa is not None:
        hpa = settings.hpa
        scaler = HpaScaler(
            k8s.AutoscalingV2Api(client),
            clock=clock,
            bounds=HpaBounds(
                max_replicas=hpa.maxReplicas,
                allow_below_human_floor=hpa.allowBelowHumanFloor,
                min_replicas=hpa.minReplicas,
            ),
            targets={
                service: HpaTarget(ref.namespace or settings.namespace, ref.name)
                for service, ref in hpa.targets.items()
            },
            namespace=settings.namespace,
            timeout=settings.timeout,
            retry=retry,
            events=events,
        )
    router: HttpRouteRouter | VirtualServiceRouter | None = None
    if settings.traffic is not None:
        traffic = settings.traffic
        router_class = HttpRouteRouter if traffic.kind == "httproute" else VirtualServiceRouter
        router = router_class(
            k8s.CustomObjectsApi(client),
            clock=clock,
            routes={
                service: RouteRef(ref.namespace or settings.namespace, ref.name)
                for service, ref in traffic.routes.items()
            },
            namespace=settings.namespace,
            ramp=Ramp(tuple(traffic.ramp.steps), traffic.ramp.hold) if traffic.ramp is not None else None,
            timeout=settings.timeout,
            retry=retry,
            events=events,
        )
    return ClusterActuators(scaler=scaler, router=router, events=events, api_client=client)


def build_leader_elector(
    election: LeaderElectionSettings,
    kubernetes: KubernetesSettings | None,
    clock: Clock,
    *,
    api_client: k8s.ApiClient | None = None,
    base_dir: Path | None = None,
) -> LeaderElector:
    """The Lease elector on the cluster `kubernetes` names (absent: in-cluster); ClusterConfigError if unusable."""
    client = api_client if api_client is not None else cluster_client(kubernetes, base_dir=base_dir)
    return election.elector(k8s.CoordinationV1Api(client), clock)
