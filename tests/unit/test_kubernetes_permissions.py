"""ACTUATOR_PERMISSIONS is exactly what tailguard's Kubernetes clients call (recorded by the fake API server)."""

from __future__ import annotations

import yaml
from kubernetes import client as k8s

from tailguard.controller.adapters.changes.tracker import KubernetesDeploymentSource
from tailguard.controller.adapters.kube.events import EventRecorder
from tailguard.controller.adapters.lease.leader import LeaderElector
from tailguard.controller.adapters.rollback.deployment import DeploymentRollback
from tailguard.controller.adapters.scale.hpa import HpaBounds, HpaScaler
from tailguard.controller.adapters.traffic.routes import HttpRouteRouter, VirtualServiceRouter
from tailguard.controller.core.ports import OutcomeStatus, RollbackRequest, ScaleRequest, TrafficRequest
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.tools.cluster_permissions import ACTUATOR_PERMISSIONS, ALL_PERMISSIONS, permission_triples
from tests.support.fake_kubernetes import (
    FakeKubernetes,
    deployment,
    helm_release_secret,
    hpa,
    http_route,
    virtual_service,
)


def test_recorded_calls_equal_the_declared_permissions() -> None:
    clock = ManualClock()
    with FakeKubernetes(deployment_controller=True) as fake:
        fake.put_object(hpa("chat"))
        owned = deployment("chat", image="vllm:0.31")
        owned["metadata"]["annotations"] = {"meta.helm.sh/release-name": "chat"}
        fake.put_object(owned)
        owned = fake.get_object("deployments", "llm", "chat") or {}
        owned["spec"]["template"]["spec"]["containers"][0]["image"] = "vllm:0.32"
        k8s.AppsV1Api(fake.api_client()).replace_namespaced_deployment("chat", "llm", owned)
        fake.put_object(
            helm_release_secret("chat", 1, "superseded", yaml.safe_dump(deployment("chat", image="vllm:0.31")))
        )
        fake.requests.clear()  # the seeding above is the test's, not tailguard's
        fake.put_object(http_route("chat"))
        fake.put_object(virtual_service("chat"))
        api = fake.api_client()
        events = EventRecorder(k8s.CoreV1Api(api), clock)
        deployer = HpaScaler(
            k8s.AutoscalingV2Api(api), clock=clock, bounds=HpaBounds(max_replicas=10), namespace="llm", events=events
        )
        assert deployer.replicas("chat") == 2
        assert deployer.set_replicas(ScaleRequest("chat", 4, idempotency_key="a")).status is OutcomeStatus.SUCCEEDED
        metric = deployer.set_metric_target("chat", "vllm:num_requests_waiting", "3", idempotency_key="b")
        assert metric.status is OutcomeStatus.SUCCEEDED
        for router in (
            HttpRouteRouter(k8s.CustomObjectsApi(api), clock=clock, namespace="llm", events=events),
            VirtualServiceRouter(k8s.CustomObjectsApi(api), clock=clock, namespace="llm", events=events),
        ):
            assert (
                router.set_weight(TrafficRequest("chat", "r2", 0, idempotency_key="c")).status
                is OutcomeStatus.SUCCEEDED
            )
        assert KubernetesDeploymentSource(k8s.AppsV1Api(api), "llm").rollouts(0.0) != []
        undo = DeploymentRollback(
            k8s.AppsV1Api(api), k8s.CoreV1Api(api), clock=clock, namespace="llm", helm=True, events=events
        )
        assert undo.rollback(RollbackRequest("chat", idempotency_key="d")).status is OutcomeStatus.SUCCEEDED
        lease_api = k8s.CoordinationV1Api(api)
        first = LeaderElector(lease_api, "tailguard-leader", "tailguard", "pod-a", 15, clock)
        second = LeaderElector(lease_api, "tailguard-leader", "tailguard", "pod-b", 15, clock)
        assert first.run_once()  # create
        clock.advance(5)
        assert first.run_once()  # renew (update)
        first.release()  # update
        assert second.run_once()  # take over (update)

        recorded = {(r.api_group, r.resource, r.verb) for r in fake.requests}
        namespaces = {(r.resource, r.namespace) for r in fake.requests}

    declared = permission_triples()
    assert recorded - declared == set(), "calls not covered by ACTUATOR_PERMISSIONS"
    assert declared - recorded == set(), "permissions no client uses"
    # The Lease lives in the controller's namespace; everything else is in the serving namespace.
    assert {ns for resource, ns in namespaces if resource == "leases"} == {"tailguard"}
    assert {ns for resource, ns in namespaces if resource != "leases"} == {"llm"}
    assert permission_triples("controller") == {
        ("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")
    }


def test_every_entry_names_its_caller_and_unique_resources() -> None:
    resources = [(p.api_group, p.resource) for p in ALL_PERMISSIONS]
    assert len(resources) == len(set(resources))
    assert all(p.used_by and p.verbs and p.namespace_scope in ("serving", "controller") for p in ALL_PERMISSIONS)
    assert all(p.namespace_scope == "serving" for p in ACTUATOR_PERMISSIONS)
