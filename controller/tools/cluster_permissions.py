"""The Kubernetes API permissions tailguard needs: exactly the calls its cluster clients make, nothing more.

This is the reference for the RBAC in deploy/ (tests render the Roles and compare): ACTUATOR_PERMISSIONS for the
serving namespace, LEASE_PERMISSIONS for the controller's own namespace. Each entry
names the client call(s) behind it; tests/unit/test_kubernetes_permissions.py runs those clients against the
fake API server and checks that every recorded request is covered here and that every entry is used.

- serving namespace(s): HPAs (controller/adapters/scale/hpa.py), HTTPRoutes and VirtualServices
  (controller/adapters/traffic/routes.py), ReplicaSets (controller/adapters/changes/tracker.py,
  KubernetesDeploymentSource; DeploymentRollback), Deployments (controller/adapters/rollback/deployment.py),
  Events about those objects (EventRecorder); with `kubernetes.rollback.helm` only, the Helm release Secrets
  (HELM_PERMISSIONS, the optional component deploy/components/helm-rollback);
- the controller's own namespace: its leader Lease (controller/adapters/lease/leader.py), or with
  `leaderElection.shards` its shard and member-slot Leases (shards.py; names granted by deploy/components/sharding).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Permission:
    api_group: str  # "" is the core group
    resource: str
    verbs: tuple[str, ...]
    used_by: str
    namespace_scope: str  # "serving" (where the workloads are) or "controller" (where tailguard runs)


# In the serving namespace(s): the actuators, the change tracker and the Events about their objects.
ACTUATOR_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        "autoscaling",
        "horizontalpodautoscalers",
        ("get", "update"),
        "HpaScaler: read_/replace_namespaced_horizontal_pod_autoscaler",
        "serving",
    ),
    Permission(
        "gateway.networking.k8s.io",
        "httproutes",
        ("get", "update"),
        "HttpRouteRouter: get_/replace_namespaced_custom_object",
        "serving",
    ),
    Permission(
        "networking.istio.io",
        "virtualservices",
        ("get", "update"),
        "VirtualServiceRouter: get_/replace_namespaced_custom_object",
        "serving",
    ),
    Permission(
        "apps",
        "replicasets",
        ("list",),
        "KubernetesDeploymentSource, DeploymentRollback: list_namespaced_replica_set",
        "serving",
    ),
    Permission(
        "apps",
        "deployments",
        ("get", "patch"),
        "DeploymentRollback: read_namespaced_deployment / patch_namespaced_deployment (JSON patch, kubectl's undo)",
        "serving",
    ),
    Permission("", "events", ("create",), "EventRecorder: create_namespaced_event", "serving"),
)


# In the serving namespace(s), only with `kubernetes.rollback.helm`: the Helm release records, read only.
HELM_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        "",
        "secrets",
        ("list",),
        "DeploymentRollback (helm): list_namespaced_secret, labelSelector owner=helm,name=<release>",
        "serving",
    ),
)


# In the controller's own namespace.
LEASE_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        "coordination.k8s.io",
        "leases",
        ("get", "create", "update"),
        "LeaderElector (and ShardedElector, per shard and member-slot Lease): read_/create_/replace_namespaced_lease",
        "controller",
    ),
)

ALL_PERMISSIONS = ACTUATOR_PERMISSIONS + HELM_PERMISSIONS + LEASE_PERMISSIONS


# In the controller's own namespace, with one leader Lease (not sharded: each shard's holder answers itself):
# replica-to-replica trust reads the Lease holder's pod and its own before a standby forwards
# (controller/adapters/lease/peers.py). Kept apart from ALL_PERMISSIONS, whose controller-scope entries a sharded
# elector uses all of; deploy/base/rbac-leader-election.yaml grants it (tests/unit/test_deploy.py compares).
PEER_PERMISSIONS: tuple[Permission, ...] = (
    Permission("", "pods", ("get",), "PodPeerCheck: read_namespaced_pod (the Lease holder's, its own)", "controller"),
)


# In the namespace of `kubernetes.policies` (TailguardPolicy custom resources), only with that section: kept
# apart from ALL_PERMISSIONS (the base RBAC): the optional component deploy/components/crd-policies grants them
# (tests/unit/test_deploy.py compares); tests/unit/test_policy_crd.py proves the CRD source
# (controller/adapters/policies/crd.py) calls exactly these.
POLICY_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        "tailguard.io",
        "tailguardpolicies",
        ("get", "list", "watch"),
        "CrdPolicySource: list_namespaced_custom_object (list, then watch), get_ before a status write",
        "controller",
    ),
    Permission(
        "tailguard.io",
        "tailguardpolicies/status",
        ("update",),
        "CrdPolicySource: replace_namespaced_custom_object_status (409: re-read, retry)",
        "controller",
    ),
    Permission("", "events", ("create",), "CrdPolicySource: create_namespaced_event on the policy", "controller"),
)


# With `kubernetes.incidents` (TailguardIncident custom resources, controller/adapters/stores/incident_resources.py):
# the optional component deploy/components/incidents grants them (tests/unit/test_incidents_store.py compares, and
# proves the store calls exactly these against the fake API server).
INCIDENT_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        "tailguard.io",
        "tailguardincidents",
        ("create", "list"),
        "KubernetesIncidentStore: list_namespaced_custom_object (every read), create_ (an incident opens)",
        "controller",
    ),
    Permission(
        "tailguard.io",
        "tailguardincidents/status",
        ("update",),
        "KubernetesIncidentStore: replace_namespaced_custom_object_status (resourceVersion compare-and-set)",
        "controller",
    ),
)


def permission_triples(scope: str | None = None) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every permission (of one namespace scope, if given)."""
    return {
        (p.api_group, p.resource, verb)
        for p in ALL_PERMISSIONS
        if scope is None or p.namespace_scope == scope
        for verb in p.verbs
    }
