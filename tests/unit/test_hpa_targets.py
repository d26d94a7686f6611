"""Issue 14 item 2: the bundled HPA scales on both of the seed's targets (queue 20, rate 50 per pod), and a `scale`
action sets its floor, ceiling and metric targets within the controller's bounds, journaled, and the recovery's
`restore` puts back exactly the pre-incident HPA. On the spec-validating fake API server, through the real journal
and dispatcher to the HPA scaler, with the shipped manifest serving/tier/manifests/base/hpa.yaml."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from pydantic import ValidationError

from tailguard.controller.adapters.scale.hpa import HpaBounds, HpaScaler
from tailguard.controller.adapters.stores.journal import ActionStatus, Journal
from tailguard.controller.app.build import missing_actuators
from tailguard.controller.app.settings import parse_settings_text
from tailguard.controller.core.actions import ScaleAction
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.testing import make_decision
from tests.support.fake_kubernetes import FakeKubernetes

REPO = Path(__file__).resolve().parents[2]
QUEUE, RATE = "vllm_num_requests_waiting", "vllm_requests_per_second"
BOUNDS = HpaBounds(max_replicas=10, metric_targets={QUEUE: (5.0, 40.0), RATE: (20.0, 100.0)})


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    shipped = yaml.safe_load((REPO / "serving" / "tier" / "manifests" / "base" / "hpa.yaml").read_text())
    shipped["metadata"]["namespace"] = "llm"
    with FakeKubernetes() as server:
        server.put_object(shipped)
        yield server


def run(fake: FakeKubernetes, tmp_path: Path, clock: ManualClock) -> Dispatcher:
    scaler = HpaScaler(k8s.AutoscalingV2Api(fake.api_client()), clock=clock, bounds=BOUNDS, namespace="llm")
    actuators = Actuators(scale=scaler, limits=scaler)
    return Dispatcher(Journal(tmp_path / "journal.db"), actuators, clock, GlobalLimits())


def spec(fake: FakeKubernetes) -> dict[str, Any]:
    stored = fake.get_object("horizontalpodautoscalers", "llm", "chat-stable")
    assert stored is not None
    targets = {m["pods"]["metric"]["name"]: m["pods"]["target"]["averageValue"] for m in stored["spec"]["metrics"]}
    return {"min": stored["spec"]["minReplicas"], "max": stored["spec"]["maxReplicas"], **targets}


def test_scale_sets_floor_ceiling_and_both_targets_within_bounds_and_restore_puts_them_back(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    assert spec(fake) == {"min": 2, "max": 8, QUEUE: "20", RATE: "50"}
    clock = ManualClock()
    dispatcher = run(fake, tmp_path, clock)
    action = {
        "service": "chat-stable",
        "delta": 1,
        "max": 8,
        "ceiling": 12,  # above kubernetes.hpa.maxReplicas (10): kept at 10
        "metricTargets": {RATE: 40, QUEUE: 2},  # the queue target below its bounds (5..40): kept at 5
    }
    fire = make_decision([("scale", action)], policy="request-rate-scale", service="chat-stable", onset=clock.now())
    [scaled] = dispatcher.dispatch(fire)
    assert scaled.status is ActionStatus.SUCCEEDED, scaled.error
    assert spec(fake) == {"min": 3, "max": 10, QUEUE: "5", RATE: "40"}
    # Journaled before acting: the HPA it replaced (floor, ceiling and both targets) and what it asked for.
    assert scaled.plan is not None
    assert scaled.plan["before"]["metrics"] == {QUEUE: "20", RATE: "50"} and scaled.plan["before"]["maxReplicas"] == 8
    assert scaled.plan["limits"] == {"maxReplicas": 12, "metrics": {RATE: 40.0, QUEUE: 2.0}}
    assert "kept at 5" in scaled.result["detail"]["limits"]["clamped"]  # type: ignore[index]

    clock.advance(600)
    resolve = make_decision(
        [("restore", {"service": "chat-stable"})],
        policy="request-rate-scale",
        service="chat-stable",
        onset=fire.onset,
        kind="resolve",
    )
    [restored] = dispatcher.dispatch(resolve)
    assert restored.status is ActionStatus.SUCCEEDED, restored.error
    assert spec(fake) == {"min": 2, "max": 8, QUEUE: "20", RATE: "50"}


def test_a_metric_target_without_bounds_is_refused_and_nothing_is_written(fake: FakeKubernetes, tmp_path: Path) -> None:
    clock = ManualClock()
    scaler = HpaScaler(
        k8s.AutoscalingV2Api(fake.api_client()), clock=clock, bounds=HpaBounds(max_replicas=10), namespace="llm"
    )
    outcome = scaler.set_limits("chat-stable", max_replicas=None, metric_targets={QUEUE: 10}, idempotency_key="k")
    assert outcome.status.value == "failed" and "kubernetes.hpa.metricTargets" in (outcome.error or "")
    assert fake.calls("update", "horizontalpodautoscalers") == []


def test_the_policy_schema_takes_ceiling_and_metric_targets_alone_or_with_a_floor() -> None:
    assert ScaleAction(type="scale", max=8, ceiling=12).ceiling == 12
    assert ScaleAction(type="scale", max=8, delta=1, metricTargets={QUEUE: 10}).metricTargets == {QUEUE: 10}
    with pytest.raises(ValidationError, match="exactly one of replicas, delta or targetPerReplica"):
        ScaleAction(type="scale", max=8)
    with pytest.raises(ValidationError, match="AverageValue"):
        ScaleAction(type="scale", max=8, metricTargets={QUEUE: 0})


def test_the_rate_example_sets_both_targets_and_the_actuator_check_wants_their_bounds(tmp_path: Path) -> None:
    example = REPO / "rules" / "examples" / "request-rate-scale.yaml"
    (loaded,), errors = load_policies([example])
    assert errors == []
    (scale,) = [a for a in loaded.policy.conditions[0].actions or [] if a.type == "scale"]
    assert scale.metricTargets == {RATE: 40, QUEUE: 10}
    base = f"prometheus: {{url: 'http://127.0.0.1:9'}}\npolicies: [{example}]\nlisten: 127.0.0.1:0\n"
    kube = "kubernetes: {inCluster: false, kubeconfig: k.yaml, hpa: {maxReplicas: 8, metricTargets: %s}}\n"
    bounded = kube % "{vllm_num_requests_waiting: {min: 5, max: 40}, vllm_requests_per_second: {min: 20, max: 100}}"
    settings = parse_settings_text(base + bounded, str(tmp_path / "c.yaml"), tmp_path)
    assert missing_actuators(settings, [loaded]) == []
    half = kube % "{vllm_num_requests_waiting: {min: 5, max: 40}}"
    settings = parse_settings_text(base + half, str(tmp_path / "c.yaml"), tmp_path)
    (problem,) = missing_actuators(settings, [loaded])
    assert "'vllm_requests_per_second'" in problem.message and "kubernetes.hpa.metricTargets" in problem.message
    # The shipped configuration bounds every target the shipped policies set.
    shipped = yaml.safe_load((REPO / "deploy" / "base" / "controller.yaml").read_text())
    assert set(shipped["kubernetes"]["hpa"]["metricTargets"]) == {QUEUE, RATE}
