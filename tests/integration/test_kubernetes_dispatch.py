"""Decisions through the real journal and dispatcher to the Kubernetes actuators on the fake API server:
the error-rate example's step-down and stepped step-up, HPA scaling, crash-replay without a second write."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tailguard.controller.adapters.kube.events import EventRecorder
from tailguard.controller.adapters.scale.hpa import HpaBounds, HpaScaler
from tailguard.controller.adapters.stores.journal import ActionStatus, Journal
from tailguard.controller.adapters.traffic.routes import HttpRouteRouter, Ramp
from tailguard.controller.core.ports import TrafficRequest
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.kit.http import RetryPolicy
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.testing import make_decision
from tests.support.fake_kubernetes import FakeKubernetes, hpa, http_route

pytestmark = pytest.mark.integration


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        server.put_object(http_route("chat", backends={"chat-r1": 0, "chat-r2": 100}))
        server.put_object(hpa("chat", min_replicas=2, max_replicas=6))
        yield server


def make_dispatcher(fake: FakeKubernetes, tmp_path: Path, clock: ManualClock) -> tuple[Dispatcher, HttpRouteRouter]:
    api = fake.api_client()
    events = EventRecorder(k8s.CoreV1Api(api), clock)
    retry = RetryPolicy(attempts=3, backoff=1.0)
    router = HttpRouteRouter(
        k8s.CustomObjectsApi(api),
        clock=clock,
        namespace="llm",
        ramp=Ramp(steps=(50,), hold_seconds=60),
        retry=retry,
        events=events,
    )
    deployer = HpaScaler(
        k8s.AutoscalingV2Api(api), clock=clock, bounds=HpaBounds(max_replicas=8), namespace="llm", events=events
    )
    journal = Journal(tmp_path / "journal.db")
    return Dispatcher(journal, Actuators(scale=deployer, router=router), clock, GlobalLimits()), router


def weights(fake: FakeKubernetes) -> dict[str, int]:
    stored = fake.get_object("httproutes", "llm", "chat")
    assert stored is not None
    return {b["name"]: b["weight"] for b in stored["spec"]["rules"][0]["backendRefs"]}


def test_error_rate_shift_down_then_stepped_back_up(fake: FakeKubernetes, tmp_path: Path) -> None:
    clock = ManualClock()
    dispatcher, _ = make_dispatcher(fake, tmp_path, clock)
    shift = {"service": "chat", "version": "r2"}
    fire = make_decision([("shift_traffic", {**shift, "weight": 10})], policy="error-rate-shift", onset=clock.now())
    (down,) = dispatcher.dispatch(fire)
    assert down.status is ActionStatus.SUCCEEDED, down
    assert weights(fake) == {"chat-r1": 90, "chat-r2": 10}
    writes = len(fake.calls("update", "httproutes"))
    assert [r.status for r in dispatcher.dispatch(fire)] == [ActionStatus.SUCCEEDED]  # terminal: not run again
    assert len(fake.calls("update", "httproutes")) == writes

    clock.advance(300)
    resolve = make_decision(
        [("shift_traffic", {**shift, "weight": 100})], policy="error-rate-shift", onset=fire.onset, kind="resolve"
    )
    before = clock.now()
    (up,) = dispatcher.dispatch(resolve)
    assert up.status is ActionStatus.SUCCEEDED, up
    assert up.result is not None and up.result["detail"]["steps"] == [50, 100]
    assert clock.now() - before == pytest.approx(60)
    assert weights(fake) == {"chat-r1": 0, "chat-r2": 100}
    reasons = [e["reason"] for e in fake.objects("events", "llm")]
    assert reasons == ["TailguardTrafficShift", "TailguardTrafficShift"]


def test_scale_through_the_hpa(fake: FakeKubernetes, tmp_path: Path) -> None:
    clock = ManualClock()
    dispatcher, _ = make_dispatcher(fake, tmp_path, clock)
    decision = make_decision([("scale", {"service": "chat", "delta": 3, "min": 1, "max": 8})], policy="queue-scale")
    (scaled,) = dispatcher.dispatch(decision)
    assert scaled.status is ActionStatus.SUCCEEDED, scaled
    stored = fake.get_object("horizontalpodautoscalers", "llm", "chat")
    assert stored is not None and stored["spec"]["minReplicas"] == 5


def test_a_write_left_by_a_crashed_process_is_not_repeated(fake: FakeKubernetes, tmp_path: Path) -> None:
    clock = ManualClock()
    dispatcher, router = make_dispatcher(fake, tmp_path, clock)
    fire = make_decision([("shift_traffic", {"service": "chat", "version": "r2", "weight": 10})], onset=clock.now())
    # The previous process sent the change and died before journaling the outcome.
    router.set_weight(TrafficRequest("chat", "r2", 10, idempotency_key=fire.actions[0].idempotency_key))
    writes = len(fake.calls("update", "httproutes"))
    (record,) = dispatcher.dispatch(fire)
    assert record.status is ActionStatus.SUCCEEDED
    assert record.result is not None and record.result["detail"]["replayed"] is True
    assert len(fake.calls("update", "httproutes")) == writes


def test_api_outage_is_a_recorded_transient_failure(fake: FakeKubernetes, tmp_path: Path) -> None:
    clock = ManualClock()
    dispatcher, _ = make_dispatcher(fake, tmp_path, clock)
    fake.inject("get", "httproutes", status=503, times=100)
    fire = make_decision([("shift_traffic", {"service": "chat", "version": "r2", "weight": 10})], onset=clock.now())
    (record,) = dispatcher.dispatch(fire)
    assert record.status is ActionStatus.FAILED
    assert record.result is not None and record.result["transient"] is True
    assert "HTTP 503" in (record.error or "")
    assert fake.calls("update", "httproutes") == []
    assert weights(fake) == {"chat-r1": 0, "chat-r2": 100}
