"""The `kubernetes` section of the controller configuration (controller/app/settings.py); what `tailguard run`
builds from it: the connection in controller/app/cluster.py, the actuators in controller/app/registrations.py
(a registered section under `kubernetes` that is not declared here, such as a new actuator's, is added to this
model by the registry: controller/app/registry.py `assemble`).

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
    metricTargets:           # the metric targets a scale's `metricTargets` may set, and their bounds
      vllm_num_requests_waiting: {min: 5, max: 40}
  traffic:                   # shift_traffic actions set route weights (controller/adapters/traffic/routes.py)
    kind: httproute          # or virtualservice
    routes: {chat: {namespace: llm, name: chat}}          # default: the route named like the service
    ramp: {steps: [50], hold: 60s}                        # absent: increases in one step
  rollback:                  # rollback actions undo a Deployment's rollout (controller/adapters/rollback/deployment.py)
    deployments: {chat: {namespace: llm, name: chat-vllm}} # default: the Deployment named like the service
    helm: false              # true: a Helm-owned Deployment goes back to a previous Helm revision (reads its
                             # release Secrets: add deploy/components/helm-rollback)
```

`hpa`, `traffic` and `rollback` are optional: without them scale and shift_traffic go to the local tier (if any),
rollback to Argo CD or the local tier (`rollback` and `argocd` together are refused: one system rolls back).

Apart from cluster.py because it imports no client library: the configuration loads without the cluster extra
(kubernetes), which is needed only when the section is present.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controller.core.policy import Duration


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ObjectRefSettings(_Strict):
    """One Kubernetes object of a service: its namespace (default: `kubernetes.namespace`) and name."""

    namespace: str | None = Field(default=None, min_length=1, description="default: kubernetes.namespace")
    name: str = Field(min_length=1)


class MetricTargetBounds(_Strict):
    min: float = Field(gt=0, description="the lowest AverageValue target tailguard may set")
    max: float = Field(gt=0, description="the highest AverageValue target tailguard may set")

    @model_validator(mode="after")
    def _ordered(self) -> MetricTargetBounds:
        if self.min > self.max:
            raise ValueError(f"expected min <= max, got {self.min} > {self.max}")
        return self


class HpaSettings(_Strict):
    maxReplicas: int = Field(ge=1, description="tailguard never sets minReplicas or maxReplicas above this")
    minReplicas: int = Field(default=1, ge=1, description="tailguard never sets minReplicas below this")
    allowBelowHumanFloor: bool = Field(
        default=False, description="may scaling down go below the minReplicas a human set (recorded at first touch)"
    )
    targets: dict[str, ObjectRefSettings] = Field(
        default_factory=dict, description="service -> its HPA; default: the HPA named like the service"
    )
    metricTargets: dict[str, MetricTargetBounds] = Field(
        default_factory=dict,
        description="HPA metric -> the bounds of the AverageValue target a scale's metricTargets may set; a metric "
        "not named here is never changed",
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


class RollbackSettings(_Strict):
    """`kubernetes.rollback`: roll a Deployment back to its previous ReplicaSet revision (`kubectl rollout undo`)."""

    deployments: dict[str, ObjectRefSettings] = Field(
        default_factory=dict, description="service -> its Deployment; default: the Deployment named like the service"
    )
    helm: bool = Field(
        default=False,
        description="a Deployment Helm owns goes back to a previous Helm revision's template (read only, through "
        "the release Secrets; needs the Secrets list permission of deploy/components/helm-rollback)",
    )


class PolicyResourceSettings(_Strict):
    """`kubernetes.policies:`: TailguardPolicy custom resources as policies beside the files
    (controller/adapters/policies/crd.py; the CRD: deploy/crds/tailguardpolicy.yaml)."""

    namespace: str = Field(min_length=1, description="the namespace whose TailguardPolicies are watched")
    statusInterval: Duration = Field(
        default=10.0, gt=0, description="how often the leader writes their status (only what changed)"
    )


class IncidentResourceSettings(_Strict):
    """`kubernetes.incidents:`: incidents as TailguardIncident custom resources (controller/core/incidents.py; the
    store: controller/adapters/stores/incident_resources.py; the CRD: deploy/crds/tailguardincident.yaml; the RBAC:
    deploy/components/incidents). Without it, incidents live in the journal (one replica's SQLite)."""

    namespace: str = Field(min_length=1, description="the namespace of the TailguardIncidents (the controller's)")


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
    rollback: RollbackSettings | None = Field(
        default=None, description="rollback actions through Deployment revisions (and Helm-owned Deployments)"
    )
    policies: PolicyResourceSettings | None = Field(
        default=None, description="watch TailguardPolicy custom resources (policies beside the files)"
    )
    incidents: IncidentResourceSettings | None = Field(
        default=None,
        description="hold incidents in TailguardIncident custom resources, read by every replica (default: the "
        "journal)",
    )

    @model_validator(mode="after")
    def _kubeconfig_only_outside(self) -> KubernetesSettings:
        if self.inCluster and self.kubeconfig is not None:
            raise ValueError("kubeconfig is only read when inCluster is false: set inCluster: false or drop it")
        return self
