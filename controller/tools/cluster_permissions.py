"""The Kubernetes API permissions tailguard needs: exactly the calls its cluster clients make, nothing more.

This is the reference for the RBAC in deploy/ (tests render the Roles and compare): ACTUATOR_PERMISSIONS for the
serving namespace, LEASE_PERMISSIONS for the controller's own namespace. Each entry
names the client call(s) behind it; tests/unit/test_kubernetes_permissions.py runs those clients against the
fake API server and checks that every recorded request is covered here and that every entry is used.

- serving namespace(s): HPAs (controller/adapters/scale/hpa.py), HTTPRoutes and VirtualServices
  (controller/adapters/traffic/routes.py), ReplicaSets (controller/adapters/changes/tracker.py,
  KubernetesDeploymentSource),
  Events about those objects (EventRecorder);
- the controller's own namespace: its leader Lease (controller/adapters/lease/leader.py).
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
        "KubernetesDeploymentSource: list_namespaced_replica_set",
        "serving",
    ),
    Permission("", "events", ("create",), "EventRecorder: create_namespaced_event", "serving"),
)


# In the controller's own namespace.
LEASE_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        "coordination.k8s.io",
        "leases",
        ("get", "create", "update"),
        "LeaderElector: read_/create_/replace_namespaced_lease",
        "controller",
    ),
)

ALL_PERMISSIONS = ACTUATOR_PERMISSIONS + LEASE_PERMISSIONS


def permission_triples(scope: str | None = None) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every permission (of one namespace scope, if given)."""
    return {
        (p.api_group, p.resource, verb)
        for p in ALL_PERMISSIONS
        if scope is None or p.namespace_scope == scope
        for verb in p.verbs
    }
