"""Rollback of plain Deployments and Helm-owned ones (controller/adapters/rollback/deployment.py) against the
spec-validating fake API server with its small deployment controller: what `kubectl rollout undo` does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tailguard.controller.adapters.changes.tracker import KubernetesDeploymentSource
from tailguard.controller.adapters.rollback.deployment import (
    CHANGE_CAUSE,
    REVISION,
    DeploymentRef,
    DeploymentRollback,
    RollbackRecord,
)
from tailguard.controller.app.cluster import build_cluster_actuators
from tailguard.controller.app.cluster_settings import KubernetesSettings
from tailguard.controller.core.ports import OutcomeStatus, RollbackPlan, RollbackRequest
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.tools.cluster_permissions import HELM_PERMISSIONS
from tests.support.fake_kubernetes import FakeKubernetes, deployment, helm_release_secret

NS = "llm"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    clock_now = {"t": 1767225600.0}
    with FakeKubernetes(deployment_controller=True, now=lambda: clock_now["t"]) as server:
        server.clock_now = clock_now  # type: ignore[attr-defined]
        yield server


def _roll_out(fake: FakeKubernetes, image: str, *, at: float, cause: str) -> None:
    """A human rollout (`kubectl set image` + change-cause): the fake controller makes the next revision."""
    fake.clock_now["t"] = at  # type: ignore[attr-defined]
    found = fake.get_object("deployments", NS, "chat")
    assert found is not None
    found["spec"]["template"]["spec"]["containers"][0]["image"] = image
    found["metadata"].setdefault("annotations", {})[CHANGE_CAUSE] = cause
    api = k8s.AppsV1Api(fake.api_client())
    api.replace_namespaced_deployment("chat", NS, found)


def _seed(fake: FakeKubernetes, *, helm: bool = False) -> None:
    body = deployment("chat", image="vllm:0.30")
    body["metadata"]["annotations"] = {CHANGE_CAUSE: "install 0.30"}
    if helm:
        body["metadata"]["annotations"]["meta.helm.sh/release-name"] = "chat"
        body["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "Helm"
    fake.put_object(body)  # revision 1
    _roll_out(fake, "vllm:0.31", at=1767229200.0, cause="upgrade 0.31")  # revision 2
    _roll_out(fake, "vllm:0.32", at=1767232800.0, cause="upgrade 0.32")  # revision 3 (the bad one)


def _rollback(fake: FakeKubernetes, clock: ManualClock, record: RollbackRecord, *, helm: bool = False) -> Any:
    api = fake.api_client()
    return DeploymentRollback(
        k8s.AppsV1Api(api), k8s.CoreV1Api(api), clock=clock, namespace=NS, helm=helm, record=record
    )


def _image(fake: FakeKubernetes) -> str:
    found = fake.get_object("deployments", NS, "chat")
    assert found is not None
    return str(found["spec"]["template"]["spec"]["containers"][0]["image"])


def test_rollback_is_kubectl_rollout_undo_and_the_tracker_sees_it(fake: FakeKubernetes, tmp_path: Path) -> None:
    _seed(fake)
    clock = ManualClock(1767236400.0)
    record = RollbackRecord(tmp_path / "bad.json")
    outcome = _rollback(fake, clock, record).rollback(
        RollbackRequest("chat", idempotency_key="d1:fire:0", rollout_revision="3")
    )

    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome
    assert (outcome.detail["from_revision"], outcome.detail["to_revision"]) == (3, 2)
    patch = fake.calls("patch", "deployments")[-1]
    assert [op["path"] for op in patch.body] == ["/metadata/resourceVersion", "/spec/template", "/metadata/annotations"]
    assert "pod-template-hash" not in patch.body[1]["value"]["metadata"]["labels"]
    after = fake.get_object("deployments", NS, "chat")
    assert after is not None and _image(fake) == "vllm:0.31"
    annotations = after["metadata"]["annotations"]
    # The revived ReplicaSet is now revision 4 (the deployment controller's bump, as after kubectl).
    assert annotations[REVISION] == "4"
    assert annotations[CHANGE_CAUSE] == "tailguard rollback of revision 3 to revision 2 (d1:fire:0)"
    assert "d1:fire:0" in annotations["tailguard.io/action-keys"]
    # The bad template is recorded (before the patch): never a target again, after a restart too.
    assert len(RollbackRecord(tmp_path / "bad.json").bad("Deployment llm/chat")) == 1

    # The change tracker sees the rollback as the newest rollout, dated when it happened.
    rollouts = KubernetesDeploymentSource(k8s.AppsV1Api(fake.api_client()), NS).rollouts(1767236000.0)
    assert [(r.previous_revision, r.revision, r.at) for r in rollouts] == [("3", "4", 1767236400.0)]

    # A replay with the same key does nothing; resuming with the key's plan (world shows the target) is done.
    replay = _rollback(fake, clock, record).rollback(
        RollbackRequest("chat", idempotency_key="d1:fire:0", rollout_revision="3")
    )
    assert replay.status is OutcomeStatus.SUCCEEDED and replay.detail["replayed"] is True
    assert len(fake.calls("patch", "deployments")) == 1


def test_never_back_to_a_revision_recorded_as_bad(fake: FakeKubernetes, tmp_path: Path) -> None:
    _seed(fake)
    clock = ManualClock(1767236400.0)
    record = RollbackRecord(tmp_path / "bad.json")
    first = _rollback(fake, clock, record).rollback(RollbackRequest("chat", idempotency_key="a", rollout_revision="3"))
    assert first.status is OutcomeStatus.SUCCEEDED and _image(fake) == "vllm:0.31"
    # Someone rolls 0.32 forward again (revision 5) and it breaches again.
    _roll_out(fake, "vllm:0.32", at=1767240000.0, cause="retry 0.32")
    second = _rollback(fake, clock, record).rollback(RollbackRequest("chat", idempotency_key="b"))
    assert second.status is OutcomeStatus.SUCCEEDED, second
    # Revision 4 (0.31) is the newest before 5 and not recorded bad: chosen; 0.32 (bad) is never a target.
    assert _image(fake) == "vllm:0.31"
    assert second.detail["to_revision"] == 4
    # The bad record holds 0.32's template; asked to roll back 0.31 now, it skips 0.32 and goes to 0.30.
    third = _rollback(fake, clock, record).rollback(RollbackRequest("chat", idempotency_key="c"))
    assert third.status is OutcomeStatus.SUCCEEDED and _image(fake) == "vllm:0.30"


def test_resume_acts_on_the_journaled_plan_and_the_world_decides(fake: FakeKubernetes, tmp_path: Path) -> None:
    _seed(fake)
    clock = ManualClock(1767236400.0)
    path = tmp_path / "bad.json"
    plan = _rollback(fake, clock, RollbackRecord(path)).plan_rollback("chat", rollout_revision="3")
    assert isinstance(plan, RollbackPlan)
    assert {k: plan.to_json()[k] for k in ("service", "from_revision", "bad_revision", "to_revision")} == {
        "service": "chat",
        "from_revision": 3,
        "bad_revision": 3,
        "to_revision": 2,
    }
    # The patch lands, but another writer strips the key annotation right after (the answer is as good as lost).
    fake.inject(
        "patch", "deployments", mutate=lambda obj: obj["metadata"]["annotations"].pop("tailguard.io/action-keys")
    )
    first = _rollback(fake, clock, RollbackRecord(path)).rollback(
        RollbackRequest("chat", idempotency_key="k", plan=plan)
    )
    assert first.status is OutcomeStatus.SUCCEEDED
    # The resume (same journaled plan): the Deployment already runs the target's template: done, no second patch.
    again = _rollback(fake, clock, RollbackRecord(path)).rollback(
        RollbackRequest("chat", idempotency_key="k", plan=plan)
    )
    assert again.status is OutcomeStatus.SUCCEEDED and again.detail["already_done"] is True
    assert len(fake.calls("patch", "deployments")) == 1
    # Someone rolled out something else since the plan: world-changed, nothing written, never a new target.
    _roll_out(fake, "vllm:0.33", at=1767240000.0, cause="0.33")
    other = _rollback(fake, clock, RollbackRecord(path)).rollback(
        RollbackRequest("chat", idempotency_key="k2", plan=plan)
    )
    assert other.status is OutcomeStatus.WORLD_CHANGED and "someone else" in other.detail["reason"]
    assert len(fake.calls("patch", "deployments")) == 1 and _image(fake) == "vllm:0.33"


def test_paused_deployment_is_refused(fake: FakeKubernetes, tmp_path: Path) -> None:
    _seed(fake)
    stored = fake.get_object("deployments", NS, "chat")
    assert stored is not None
    stored["spec"]["paused"] = True
    k8s.AppsV1Api(fake.api_client()).replace_namespaced_deployment("chat", NS, stored)
    outcome = _rollback(fake, ManualClock(0.0), RollbackRecord()).rollback(RollbackRequest("chat", idempotency_key="p"))
    assert outcome.status is OutcomeStatus.FAILED and "paused" in (outcome.error or "")
    assert fake.calls("patch", "deployments") == []


def _manifest(image: str) -> str:
    body = deployment("chat", image=image)
    return yaml.safe_dump_all([{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat"}}, body])


def test_helm_release_previous_revision_through_the_deployment(fake: FakeKubernetes) -> None:
    _seed(fake, helm=True)
    for version, image, status in ((1, "vllm:0.30", "superseded"), (2, "vllm:0.32", "deployed")):
        fake.put_object(helm_release_secret("chat", version, status, _manifest(image)))
    # Helm revision 2 installed 0.32 (the bad one); 0.31 was a kubectl edit Helm never knew: Helm's previous
    # revision (1, 0.30) is the target, never the unrecorded 0.31.
    outcome = _rollback(fake, ManualClock(1767236400.0), RollbackRecord(), helm=True).rollback(
        RollbackRequest("chat", idempotency_key="h")
    )
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome
    assert _image(fake) == "vllm:0.30"
    helm = outcome.detail["helm"]
    assert (helm["release"], helm["deployed_revision"], helm["restored_revision"]) == ("chat", 2, 1)
    assert helm["history_differs"] is True and "helm rollback chat 1" in helm["note"]
    # Read only: the Secrets were listed by owner=helm,name=chat and never written.
    secret_calls = fake.calls(resource="secrets")
    assert {c.verb for c in secret_calls} == {"list"}
    assert all(c.verb != "create" or c.resource != "secrets" for c in fake.requests[len(secret_calls) :])


def test_helm_without_a_replicaset_of_an_earlier_release_writes_nothing(fake: FakeKubernetes) -> None:
    _seed(fake, helm=True)
    fake.put_object(helm_release_secret("chat", 1, "superseded", _manifest("vllm:0.20")))
    fake.put_object(helm_release_secret("chat", 2, "deployed", _manifest("vllm:0.32")))
    outcome = _rollback(fake, ManualClock(0.0), RollbackRecord(), helm=True).rollback(
        RollbackRequest("chat", idempotency_key="h")
    )
    assert outcome.status is OutcomeStatus.FAILED and "helm rollback chat" in (outcome.error or "")
    assert fake.calls("patch", "deployments") == []


def test_kubernetes_rollback_section_is_wired_and_the_helm_role_is_exactly_its_permission(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    settings = KubernetesSettings.model_validate(
        {"namespace": NS, "rollback": {"deployments": {"chat": {"name": "chat"}}, "helm": True}}
    )
    cluster = build_cluster_actuators(settings, ManualClock(0.0), api_client=fake.api_client(), state_dir=tmp_path)
    assert isinstance(cluster.rollback, DeploymentRollback) and cluster.rollback.helm
    assert cluster.rollback.target("chat") == DeploymentRef(NS, "chat")
    assert cluster.rollback.record.path == tmp_path / "deployment-rollbacks.json"
    with pytest.raises(ValueError, match="extra"):
        KubernetesSettings.model_validate({"rollback": {"deployment": {}}})
    roles = [
        d
        for d in yaml.safe_load_all((REPO / "deploy/components/helm-rollback/rbac-helm.yaml").read_text())
        if d["kind"] == "Role"
    ]
    granted = {
        (g, r, v)
        for role in roles
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert granted == {(p.api_group, p.resource, v) for p in HELM_PERMISSIONS for v in p.verbs}
