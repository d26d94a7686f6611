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

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tailguard.controller.adapters.rollback.settings import RollbackSettings
from tailguard.controller.adapters.scale.settings import HpaSettings
from tailguard.controller.adapters.traffic.settings import TrafficSettings
from tailguard.controller.core.policy import Duration


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
