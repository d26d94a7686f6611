"""Narrow the blast radius (issue 24 item 9): what the controller's service account may touch in the serving
namespace, by name. At 7710821 the Role let it get/patch every Deployment and get/update every HPA, HTTPRoute and
VirtualService in `llm`: any image could be rolled in there. Now every rule on those kinds names its objects
(resourceNames), and the names are the ones deploy/base/controller.yaml acts on.

The RBAC rules are evaluated as the API server's authorizer does (a rule allows a request when group, resource and
verb match and it has no resourceNames or names the object) against the rendered deploy/ and the rendered serving
tier (serving/tier/manifests): the table of objects the controller may change is printed and asserted."""

from __future__ import annotations

from typing import Any

import pytest

from tailguard.serving.tier.manifests import MANIFESTS_DIR, render_kustomization
from tests.unit.test_cluster_wiring_deploy import DEPLOYS, controller_settings
from tests.unit.test_deploy import SERVING_NAMESPACE, one

# The kinds an actuator changes (and the verbs it changes them with): each must be limited by name.
ACTED_ON = {
    "HorizontalPodAutoscaler": ("autoscaling", "horizontalpodautoscalers", ("get", "update")),
    "HTTPRoute": ("gateway.networking.k8s.io", "httproutes", ("get", "update")),
    "VirtualService": ("networking.istio.io", "virtualservices", ("get", "update")),
    "Deployment": ("apps", "deployments", ("get", "patch")),
}
WRITES = ("update", "patch", "delete", "create")


def allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str, name: str) -> bool:
    """Whether an RBAC Role with `rules` allows `verb` on `resource`/`name` (Kubernetes' RBAC authorizer)."""
    for rule in rules:
        if group not in rule.get("apiGroups", []) and "*" not in rule.get("apiGroups", []):
            continue
        if resource not in rule.get("resources", []) and "*" not in rule.get("resources", []):
            continue
        if verb not in rule.get("verbs", []) and "*" not in rule.get("verbs", []):
            continue
        names = rule.get("resourceNames")
        if not names or name in names:
            return True
    return False


@pytest.fixture(scope="module")
def serving_tier() -> list[dict[str, Any]]:
    return render_kustomization(MANIFESTS_DIR)


@pytest.fixture(scope="module", params=sorted(DEPLOYS))
def deployed(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render_kustomization(DEPLOYS[request.param])


def test_every_rule_on_an_acted_on_kind_names_its_objects(deployed: list[dict[str, Any]]) -> None:
    rules = one(deployed, "Role", "tailguard-actuators")["rules"]
    for kind, (group, resource, _verbs) in ACTED_ON.items():
        for rule in rules:
            if group in rule["apiGroups"] and resource in rule["resources"]:
                assert rule.get("resourceNames"), f"{kind}: {rule['verbs']} on every object in the namespace"
        for verb in WRITES:
            assert not allows(rules, group, resource, verb, "anything-else-in-the-namespace"), (kind, verb)


def test_what_the_controller_may_touch_in_the_serving_namespace(
    serving_tier: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    rules = one(render_kustomization(DEPLOYS["base"]), "Role", "tailguard-actuators")["rules"]
    may_change, may_not = [], []
    for obj in serving_tier:
        if obj["kind"] not in ACTED_ON or obj["metadata"].get("namespace", SERVING_NAMESPACE) != SERVING_NAMESPACE:
            continue
        group, resource, verbs = ACTED_ON[obj["kind"]]
        name = obj["metadata"]["name"]
        write = next(verb for verb in verbs if verb in WRITES)
        (may_change if allows(rules, group, resource, write, name) else may_not).append(f"{obj['kind']}/{name}")
    with capsys.disabled():
        print(f"\nthe controller may change in {SERVING_NAMESPACE}: {', '.join(sorted(may_change))}")
        print(f"and may not change: {', '.join(sorted(may_not)) or '(nothing else of these kinds)'}")
    assert sorted(may_change) == [
        "Deployment/chat-canary",
        "Deployment/chat-stable",
        "HTTPRoute/chat",
        "HorizontalPodAutoscaler/chat-stable",
    ]
    # Other workloads of the namespace (the rotation controller's Deployment) are out of reach.
    assert "Deployment/tailguard-rotation" in may_not


def test_the_names_are_the_objects_controller_yaml_acts_on() -> None:
    objects = render_kustomization(DEPLOYS["base"])
    kubernetes = controller_settings(objects).kubernetes
    assert kubernetes is not None and kubernetes.hpa is not None and kubernetes.traffic is not None
    rules = one(objects, "Role", "tailguard-actuators")["rules"]

    def named(resource: str) -> set[str]:
        return {name for rule in rules if resource in rule["resources"] for name in rule.get("resourceNames", [])}

    assert named("horizontalpodautoscalers") == {target.name for target in kubernetes.hpa.targets.values()}
    routes = {route.name for route in kubernetes.traffic.routes.values()}
    assert named("httproutes" if kubernetes.traffic.kind == "httproute" else "virtualservices") == routes
    rollback = kubernetes.rollback
    assert named("deployments") >= ({d.name for d in rollback.deployments.values()} if rollback else set())
