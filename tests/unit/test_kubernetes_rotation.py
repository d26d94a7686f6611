"""Failover and shadow warm-up on Kubernetes (tailguard.serving.tier.rotation) on the fake API, with the local tier's
assertions (tests/unit/test_supervisor.py): a pod joins only after its warm-up, the warm-up needs vLLM's metrics, 3
failed health checks take it out, it comes back at half weight then full; plus the manifests that wire it (readiness
gates on the vLLM pods, the controller's Deployment) and its RBAC, exactly the verbs it used."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import kubernetes
import pytest
import yaml
from aiohttp import web

from tailguard.serving.tier.failover import FailoverState, Rotation
from tailguard.serving.tier.manifests import MANIFESTS_DIR, render_kustomization
from tailguard.serving.tier.rotation import (
    IN_ROTATION,
    READINESS_GATES,
    ROTATION_LABEL,
    WARMED_UP,
    WEIGHT_ANNOTATION,
    PodRotation,
    RotationController,
)
from tests.support.fake_kubernetes import FakeKubernetes

NAMESPACE = "llm"


class FakeVllm:
    """An in-process OpenAI/vLLM surface whose behaviour is switched by flags (as the supervisor test's files)."""

    def __init__(self) -> None:
        self.flags: set[str] = set()
        self.completions = 0

    def app(self) -> web.Application:
        async def health(_: web.Request) -> web.Response:
            return web.Response(status=503 if "unhealthy" in self.flags else 200)

        async def models(_: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

        async def metrics(_: web.Request) -> web.Response:
            text = "other_metric 1\n" if "no-vllm-metrics" in self.flags else "vllm:num_requests_running 0\n"
            return web.Response(text=text)

        async def completions(_: web.Request) -> web.Response:
            self.completions += 1
            if "completions-fail" in self.flags:
                return web.json_response({"error": "boom"}, status=500)
            return web.json_response({"choices": [{"text": "ok"}]})

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/v1/completions", completions)
        return app


def pod(name: str, port: int, *, containers_ready: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": "vllm", "service": "chat", "version": "stable"},
        },
        "spec": {
            "readinessGates": [{"conditionType": gate} for gate in READINESS_GATES],
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.32.0",
                    "args": ["--model", "/models/tiny", "--served-model-name", "tiny", "--port", str(port)],
                    "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
                }
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "ContainersReady", "status": "True" if containers_ready else "False"}],
        },
    }


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        yield server


def gates(fake: FakeKubernetes, name: str) -> dict[str, str]:
    stored = fake.get_object("pods", NAMESPACE, name)
    assert stored is not None
    return {c["type"]: c["status"] for c in stored["status"]["conditions"] if c["type"] in READINESS_GATES}


def weight(fake: FakeKubernetes, name: str) -> int:
    stored = fake.get_object("pods", NAMESPACE, name)
    assert stored is not None
    return int(stored["metadata"].get("annotations", {}).get(WEIGHT_ANNOTATION, "-1"))


async def _run(fake: FakeKubernetes, engine: FakeVllm, body: Any) -> RotationController:
    runner = web.AppRunner(engine.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(fake.configuration()))
    try:
        async with aiohttp.ClientSession() as session:
            controller = RotationController(api, NAMESPACE, session, health_timeout_s=2.0, warmup_timeout_s=5.0)
            await body(controller, port)
            return controller
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("checks", "weights", "in_rotation"),
    [
        ([False, False, False], [100, 100, 0], [True, True, False]),
        ([False, True, False, False, True], [100] * 5, [True] * 5),
        ([False] * 3 + [True] * 4, [100, 100, 0, 50, 50, 50, 100], [True, True, False, True, False, True, True]),
    ],
)
def test_pod_rotation_follows_the_local_failover_sequence(
    checks: list[bool], weights: list[int], in_rotation: list[bool]
) -> None:
    state = PodRotation(warmed=True)
    seen = []
    for healthy in checks:
        state.observe_health(healthy)
        seen.append((state.weight, state.in_rotation))
    assert seen == list(zip(weights, in_rotation, strict=True))
    assert PodRotation().weight == 0 and not PodRotation().in_rotation  # never in rotation before its warm-up


def test_pod_joins_only_after_its_warmup(fake: FakeKubernetes) -> None:
    engine = FakeVllm()

    async def body(controller: RotationController, port: int) -> None:
        fake.put_object(pod("chat-stable-0", port, containers_ready=False))
        await controller.reconcile()
        # Still starting (startup probe not passed): no warm-up request yet, not Ready.
        assert engine.completions == 0
        assert gates(fake, "chat-stable-0") == {WARMED_UP: "False", IN_ROTATION: "False"}
        # The kubelet: the startup probe passed, the containers are ready (the gates keep the pod un-Ready).
        conditions = [c for c in fake.get_object("pods", NAMESPACE, "chat-stable-0")["status"]["conditions"]]  # type: ignore[index]
        conditions[0] = {"type": "ContainersReady", "status": "True"}
        controller.api.patch_namespaced_pod_status("chat-stable-0", NAMESPACE, {"status": {"conditions": conditions}})
        engine.flags.add("completions-fail")
        await controller.reconcile()
        state = controller.state("chat-stable-0")
        assert state.last_warmup is not None and state.last_warmup.step == "completions"
        assert gates(fake, "chat-stable-0") == {WARMED_UP: "False", IN_ROTATION: "False"}
        assert weight(fake, "chat-stable-0") == 0
        engine.flags.discard("completions-fail")
        await controller.reconcile()
        assert state.warmed and gates(fake, "chat-stable-0") == {WARMED_UP: "True", IN_ROTATION: "True"}
        assert weight(fake, "chat-stable-0") == 100
        assert fake.get_object("pods", NAMESPACE, "chat-stable-0")["metadata"]["labels"][ROTATION_LABEL] == "in"  # type: ignore[index]

    asyncio.run(_run(fake, engine, body))


def test_warmup_requires_vllm_metrics(fake: FakeKubernetes) -> None:
    engine = FakeVllm()
    engine.flags.add("no-vllm-metrics")

    async def body(controller: RotationController, port: int) -> None:
        fake.put_object(pod("chat-stable-0", port))
        await controller.reconcile()
        state = controller.state("chat-stable-0")
        assert not state.warmed and state.last_warmup is not None and state.last_warmup.step == "metrics"
        assert gates(fake, "chat-stable-0")[WARMED_UP] == "False"

    asyncio.run(_run(fake, engine, body))


def test_three_failed_health_checks_take_it_out_then_half_then_full(fake: FakeKubernetes) -> None:
    engine = FakeVllm()

    async def body(controller: RotationController, port: int) -> None:
        fake.put_object(pod("chat-stable-0", port))
        await controller.reconcile()
        assert weight(fake, "chat-stable-0") == 100
        engine.flags.add("unhealthy")
        weights, ready = [], []
        for _ in range(3):
            await controller.reconcile()
            weights.append(weight(fake, "chat-stable-0"))
            ready.append(gates(fake, "chat-stable-0")[IN_ROTATION])
        assert weights == [100, 100, 0] and ready == ["True", "True", "False"]
        state = controller.state("chat-stable-0")
        assert state.failover.consecutive_failures == 3 and state.rotation is Rotation.OUT
        engine.flags.discard("unhealthy")
        weights, ready = [], []
        for _ in range(4):
            await controller.reconcile()
            weights.append(weight(fake, "chat-stable-0"))
            ready.append(gates(fake, "chat-stable-0")[IN_ROTATION])
        assert weights == [50, 50, 50, 100]
        # Half weight as a duty cycle: an endpoint every other period while recovering.
        assert ready == ["True", "False", "True", "True"]
        assert gates(fake, "chat-stable-0")[WARMED_UP] == "True", "a failed health check is failover, not a new warm-up"

    asyncio.run(_run(fake, engine, body))


def test_rotation_uses_exactly_the_verbs_of_its_role(fake: FakeKubernetes) -> None:
    engine = FakeVllm()

    async def body(controller: RotationController, port: int) -> None:
        fake.put_object(pod("chat-stable-0", port))
        for _ in range(2):
            await controller.reconcile()

    asyncio.run(_run(fake, engine, body))
    used = {(r.api_group, r.resource, r.verb) for r in fake.requests}
    documents = list(yaml.safe_load_all((MANIFESTS_DIR / "base" / "rotation.yaml").read_text()))
    (role,) = [d for d in documents if d["kind"] == "Role"]
    granted = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    assert used == granted


def test_the_vllm_pods_are_gated_and_the_rotation_controller_ships_with_the_tier() -> None:
    objects = render_kustomization(MANIFESTS_DIR)
    for name in ("chat-stable", "chat-canary"):
        (deployment,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
        gates_declared = [g["conditionType"] for g in deployment["spec"]["template"]["spec"]["readinessGates"]]
        assert gates_declared == [WARMED_UP, IN_ROTATION]
    (rotation,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "tailguard-rotation"]
    (container,) = rotation["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "tailguard.serving.tier.rotation"]
    assert rotation["metadata"]["namespace"] == "llm"
    assert FailoverState().failures_to_remove == 3
