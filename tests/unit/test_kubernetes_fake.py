"""The fake Kubernetes API answers like the real one: validation, resourceVersion conflicts, 404, patches."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from tests.support.fake_kubernetes import FakeKubernetes, InvalidObject, RecordedRequest, deployment, hpa, http_route


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        yield server


def status_of(exc: k8s.ApiException) -> dict[str, object]:
    body = json.loads(exc.body)
    assert body["kind"] == "Status"
    return dict(body)


def test_core_kinds_are_validated_strictly(fake: FakeKubernetes) -> None:
    broken = hpa("chat")
    broken["spec"]["minReplica"] = 2  # typo: unknown field
    with pytest.raises(InvalidObject, match="minReplica"):
        fake.put_object(broken)
    api = k8s.AutoscalingV2Api(fake.api_client())
    fake.put_object(hpa("chat"))
    with pytest.raises(k8s.ApiException) as raised:
        api.patch_namespaced_horizontal_pod_autoscaler("chat", "llm", {"spec": {"maxReplicas": "ten"}})
    assert raised.value.status == 422
    assert "maxReplicas" in str(status_of(raised.value)["message"])


def test_crds_are_validated_with_their_schema(fake: FakeKubernetes) -> None:
    route = http_route("chat")
    route["spec"]["rules"][0]["backendRefs"][0]["weight"] = -1
    with pytest.raises(InvalidObject, match="HTTPRoute spec.rules.0.backendRefs.0.weight"):
        fake.put_object(route)
    other = http_route("chat")
    other["spec"]["rules"][0]["backendRefs"][0]["wieght"] = 5
    with pytest.raises(InvalidObject, match="wieght"):
        fake.put_object(other)


def test_stale_resource_version_conflicts_and_missing_objects_are_404(fake: FakeKubernetes) -> None:
    fake.put_object(deployment("chat"))
    apps = k8s.AppsV1Api(fake.api_client())
    first = apps.read_namespaced_deployment("chat", "llm")
    fake.touch("deployments", "llm", "chat")
    with pytest.raises(k8s.ApiException) as conflict:
        apps.replace_namespaced_deployment("chat", "llm", first)
    assert conflict.value.status == 409 and status_of(conflict.value)["reason"] == "Conflict"
    with pytest.raises(k8s.ApiException) as missing:
        apps.read_namespaced_deployment("nope", "llm")
    assert missing.value.status == 404 and status_of(missing.value)["reason"] == "NotFound"
    with pytest.raises(k8s.ApiException) as exists:
        apps.create_namespaced_deployment("llm", deployment("chat"))
    assert exists.value.status == 409 and status_of(exists.value)["reason"] == "AlreadyExists"


def test_json_patch_and_merge_patch(fake: FakeKubernetes) -> None:
    fake.put_object(deployment("chat", replicas=2))
    apps = k8s.AppsV1Api(fake.api_client())
    patched = apps.patch_namespaced_deployment("chat", "llm", [{"op": "replace", "path": "/spec/replicas", "value": 5}])
    assert patched.spec.replicas == 5
    patched = apps.patch_namespaced_deployment("chat", "llm", {"metadata": {"annotations": {"a": "b"}}})
    assert patched.metadata.annotations == {"a": "b"}
    custom = k8s.CustomObjectsApi(fake.api_client())
    fake.put_object(http_route("chat"))
    merged = custom.patch_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1", "llm", "httproutes", "chat", {"metadata": {"labels": {"x": "y"}}}
    )
    assert merged["metadata"]["labels"] == {"x": "y"}


def test_requests_are_recorded_with_rbac_verbs(fake: FakeKubernetes) -> None:
    fake.put_object(deployment("chat"))
    apps = k8s.AppsV1Api(fake.api_client())
    apps.list_namespaced_deployment("llm")
    apps.read_namespaced_deployment("chat", "llm")
    apps.patch_namespaced_deployment("chat", "llm", {"metadata": {"labels": {"a": "b"}}})
    assert fake.requests == [
        RecordedRequest("list", "apps", "deployments", "llm", None),
        RecordedRequest("get", "apps", "deployments", "llm", "chat"),
        RecordedRequest("patch", "apps", "deployments", "llm", "chat"),
    ]


def test_injected_status_and_unknown_paths(fake: FakeKubernetes) -> None:
    fake.put_object(deployment("chat"))
    apps = k8s.AppsV1Api(fake.api_client())
    fake.inject("get", "deployments", status=503)
    with pytest.raises(k8s.ApiException) as unavailable:
        apps.read_namespaced_deployment("chat", "llm")
    assert unavailable.value.status == 503
    assert apps.read_namespaced_deployment("chat", "llm").metadata.name == "chat"  # only once
    with pytest.raises(k8s.ApiException) as unknown:
        k8s.CoreV1Api(fake.api_client()).read_namespaced_pod("p", "llm")
    assert unknown.value.status == 404
