"""Issue 12, item 3 on the spec-validating fake API server: a recovery's `restore` returns the bundled route
(stable 90 / canary 10) and the HPA to exactly their pre-incident state, ramped, never overwriting a human's edit.
Through the real journal and dispatcher to the Kubernetes actuators."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tailguard.controller.adapters.scale.hpa import HpaBounds, HpaScaler
from tailguard.controller.adapters.stores.journal import ActionStatus, Journal
from tailguard.controller.adapters.traffic.routes import HttpRouteRouter, Ramp
from tailguard.controller.kit.clock import ManualClock, ShutdownInterrupt
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.testing import make_decision
from tests.support.fake_kubernetes import FakeKubernetes, hpa, http_route

pytestmark = pytest.mark.integration


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        server.put_object(http_route("chat", backends={"chat-r1": 90, "chat-r2": 10}))  # the bundled route
        server.put_object(hpa("chat", min_replicas=2, max_replicas=6))
        yield server


def dispatcher(fake: FakeKubernetes, tmp_path: Path, clock: ManualClock) -> Dispatcher:
    api = fake.api_client()
    router = HttpRouteRouter(
        k8s.CustomObjectsApi(api), clock=clock, namespace="llm", ramp=Ramp(steps=(50,), hold_seconds=60)
    )
    scaler = HpaScaler(k8s.AutoscalingV2Api(api), clock=clock, bounds=HpaBounds(max_replicas=8), namespace="llm")
    return Dispatcher(Journal(tmp_path / "journal.db"), Actuators(scale=scaler, router=router), clock, GlobalLimits())


def route_writes(fake: FakeKubernetes) -> list[dict[str, int]]:
    return [
        {b["name"]: b["weight"] for b in call.body["spec"]["rules"][0]["backendRefs"]}
        for call in fake.calls("update", "httproutes")
    ]


def hpa_spec(fake: FakeKubernetes) -> dict[str, Any]:
    stored = fake.get_object("horizontalpodautoscalers", "llm", "chat")
    assert stored is not None
    return stored["spec"]


def incident(action: tuple[str, dict[str, Any]], onset: float, policy: str = "error-rate-shift") -> tuple[Any, Any]:
    fire = make_decision([action], policy=policy, onset=onset)
    resolve = make_decision([("restore", {"service": "chat"})], policy=policy, onset=onset, kind="resolve")
    return fire, resolve


def test_error_rate_shift_and_recovery_end_at_stable_90_canary_10(fake: FakeKubernetes, tmp_path: Path) -> None:
    # rules/examples/error-rate-shift.yaml: the failing canary to 10%, then `restore` (it used to set 100%).
    clock = ManualClock()
    run = dispatcher(fake, tmp_path, clock)
    fire, resolve = incident(("shift_traffic", {"service": "chat", "version": "r2", "weight": 10}), clock.now())
    assert [r.status for r in run.dispatch(fire)] == [ActionStatus.SUCCEEDED]
    clock.advance(300)
    [restored] = run.dispatch(resolve)
    assert restored.status is ActionStatus.SKIPPED  # the route already shows its pre-incident weights
    assert route_writes(fake) == [{"chat-r1": 90, "chat-r2": 10}]


def test_a_failing_stable_is_restored_ramped_to_exactly_90_10(fake: FakeKubernetes, tmp_path: Path) -> None:
    clock = ManualClock()
    run = dispatcher(fake, tmp_path, clock)
    fire, resolve = incident(("shift_traffic", {"service": "chat", "version": "r1", "weight": 10}), clock.now())
    assert [r.status for r in run.dispatch(fire)] == [ActionStatus.SUCCEEDED]
    clock.advance(300)
    before = clock.now()
    [restored] = run.dispatch(resolve)
    assert restored.status is ActionStatus.SUCCEEDED, restored
    assert route_writes(fake) == [
        {"chat-r1": 10, "chat-r2": 90},  # the shift
        {"chat-r1": 50, "chat-r2": 50},  # the ramp's step on the way back up
        {"chat-r1": 90, "chat-r2": 10},  # exactly the pre-incident weights
    ]
    assert clock.now() - before == pytest.approx(60)
    assert restored.result is not None and restored.result["after"] == {"traffic": {"r1": 90, "r2": 10}}


def test_hpa_scale_out_then_calm_returns_to_the_pre_incident_floor(fake: FakeKubernetes, tmp_path: Path) -> None:
    clock = ManualClock()
    run = dispatcher(fake, tmp_path, clock)
    fire, resolve = incident(("scale", {"service": "chat", "replicas": 5, "max": 8}), clock.now(), "queue-scale")
    assert [r.status for r in run.dispatch(fire)] == [ActionStatus.SUCCEEDED]
    assert (hpa_spec(fake)["minReplicas"], hpa_spec(fake)["maxReplicas"]) == (5, 6)
    [scaled] = run.journal.actions_for(fire.id)  # type: ignore[attr-defined]
    assert scaled.plan["before"] == {
        "minReplicas": 2,
        "maxReplicas": 6,
        "metrics": {"vllm:num_requests_waiting": "5"},
        "replicas": 2,
    }
    clock.advance(600)
    [restored] = run.dispatch(resolve)
    assert restored.status is ActionStatus.SUCCEEDED, restored
    spec = hpa_spec(fake)
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 6)
    assert spec["metrics"][0]["pods"]["target"]["averageValue"] == "5"
    assert len(fake.calls("update", "horizontalpodautoscalers")) == 2


def test_a_restore_never_overwrites_a_human_edit_of_the_floor(fake: FakeKubernetes, tmp_path: Path) -> None:
    clock = ManualClock()
    run = dispatcher(fake, tmp_path, clock)
    fire, resolve = incident(("scale", {"service": "chat", "replicas": 5, "max": 8}), clock.now(), "queue-scale")
    run.dispatch(fire)
    edited = fake.get_object("horizontalpodautoscalers", "llm", "chat")
    assert edited is not None
    edited["spec"]["minReplicas"] = 4  # the operator raises the floor during the incident
    fake.put_object(edited)
    [restored] = run.dispatch(resolve)
    assert restored.status is ActionStatus.SKIPPED
    assert restored.result is not None and "changed by someone else" in str(restored.result["detail"])
    assert hpa_spec(fake)["minReplicas"] == 4


class _StopDuringHold(ManualClock):
    """The process stops during the ramp's hold: the first step is written, the rest is left to the next process."""

    def sleep(self, seconds: float) -> None:
        raise ShutdownInterrupt("stopping in the ramp's hold")


def test_a_restore_stopped_mid_ramp_resumes_after_its_last_step(fake: FakeKubernetes, tmp_path: Path) -> None:
    clock = ManualClock()
    run = dispatcher(fake, tmp_path, clock)
    fire, resolve = incident(("shift_traffic", {"service": "chat", "version": "r1", "weight": 10}), clock.now())
    assert [r.status for r in run.dispatch(fire)] == [ActionStatus.SUCCEEDED]
    clock.advance(300)
    stopping = _StopDuringHold(clock.now())
    with pytest.raises(ShutdownInterrupt):
        dispatcher(fake, tmp_path, stopping).dispatch(resolve)
    assert route_writes(fake)[-1] == {"chat-r1": 50, "chat-r2": 50}  # stopped after the ramp's first step
    # The next process resumes the same action (same key): it goes on from the step the route records, instead of
    # taking 50/50 for someone else's change and leaving the route mid-ramp.
    [restored] = dispatcher(fake, tmp_path, ManualClock(stopping.now())).resume()
    assert restored.status is ActionStatus.SUCCEEDED, restored
    assert route_writes(fake) == [
        {"chat-r1": 10, "chat-r2": 90},
        {"chat-r1": 50, "chat-r2": 50},
        {"chat-r1": 90, "chat-r2": 10},
    ]
