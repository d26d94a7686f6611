"""The in-cluster configuration (deploy/) against what it names: the Lease the RBAC allows, and the serving
tier's HPA and HTTPRoute (serving/tier/manifests) acted on through the real client, as rendered, on the
spec-validating fake."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tailguard.controller.app.cluster import build_cluster_actuators
from tailguard.controller.app.settings import ControllerSettings, parse_settings_text
from tailguard.controller.core.ports import OutcomeStatus, ScaleRequest, TrafficRequest
from tailguard.controller.kit.clock import ManualClock
from tailguard.serving.tier.manifests import MANIFESTS_DIR, render_kustomization
from tests.support.fake_kubernetes import FakeKubernetes

REPO = Path(__file__).resolve().parents[2]
DEPLOYS = {"base": REPO / "deploy" / "base", "overlay": REPO / "deploy" / "overlays" / "example"}


def one(objects: list[dict[str, Any]], kind: str, name_prefix: str = "") -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].startswith(name_prefix)]
    return found


def controller_settings(objects: list[dict[str, Any]]) -> ControllerSettings:
    text = str(one(objects, "ConfigMap", "tailguard-config-")["data"]["controller.yaml"])
    return parse_settings_text(text, "controller.yaml", Path("/"))


@pytest.fixture(scope="module")
def serving_tier() -> list[dict[str, Any]]:
    return render_kustomization(MANIFESTS_DIR)


@pytest.mark.parametrize("which", sorted(DEPLOYS))
def test_the_lease_is_the_one_the_role_allows_in_the_controller_namespace(which: str) -> None:
    objects = render_kustomization(DEPLOYS[which])
    settings = controller_settings(objects)
    election = settings.leaderElection
    assert election is not None
    role = one(objects, "Role", "tailguard-leader-election")
    assert election.namespace == role["metadata"]["namespace"] == one(objects, "Deployment")["metadata"]["namespace"]
    named = [rule for rule in role["rules"] if rule.get("resourceNames")]
    assert named and all(rule["resourceNames"] == [election.leaseName] for rule in named)
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item for item in container["env"]}
    assert env["TAILGUARD_LEASE_NAME"]["value"] == election.leaseName
    assert election.identity is None, "the identity is the pod name (POD_NAME), never a fixed value"
    assert "POD_NAME" in env
    # In the cluster: the pod's service account, and its actuators' Role in the namespace the config names.
    kubernetes = settings.kubernetes
    assert kubernetes is not None and kubernetes.inCluster is True and kubernetes.kubeconfig is None
    actuators_role = one(objects, "Role", "tailguard-actuators")
    assert actuators_role["metadata"]["namespace"] == kubernetes.namespace


@pytest.fixture
def fake_cluster(serving_tier: list[dict[str, Any]]) -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        for kind in ("HorizontalPodAutoscaler", "HTTPRoute"):
            for obj in (o for o in serving_tier if o["kind"] == kind):
                fake.put_object(obj)  # validated as rendered: the real API server would accept them
        yield fake


def test_the_base_config_scales_and_shifts_the_serving_tier_as_rendered(fake_cluster: FakeKubernetes) -> None:
    settings = controller_settings(render_kustomization(DEPLOYS["base"]))
    assert settings.kubernetes is not None
    clock = ManualClock()
    built = build_cluster_actuators(settings.kubernetes, clock, api_client=fake_cluster.api_client())
    assert built.scaler is not None and built.router is not None
    hpa_target = built.scaler.target("chat")
    before = fake_cluster.get_object("horizontalpodautoscalers", hpa_target.namespace, hpa_target.name)
    assert before is not None, f"the configured HPA {hpa_target} is not in serving/tier/manifests"
    scaled = built.scaler.set_replicas(ScaleRequest("chat", 4, idempotency_key="deploy-check:fire:0"))
    assert scaled.status is OutcomeStatus.SUCCEEDED, scaled
    after = fake_cluster.get_object("horizontalpodautoscalers", hpa_target.namespace, hpa_target.name)
    assert after is not None and after["spec"]["minReplicas"] == 4
    # The canary's backend (chat-canary) is version `canary`: stepped up through the configured ramp.
    shifted = built.router.set_weight(TrafficRequest("chat", "canary", 100, idempotency_key="deploy-check:fire:1"))
    assert shifted.status is OutcomeStatus.SUCCEEDED, shifted
    assert shifted.detail["weights"] == {"stable": 0, "canary": 100} and shifted.detail["steps"] == [50, 100]
    assert fake_cluster.calls("create", "events"), "events: true records what was done on the objects"
