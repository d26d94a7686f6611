"""Traffic shifts on HTTPRoute and VirtualService against the spec-validating fake Kubernetes API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from tailguard.controller.adapters.kube.action_keys import ANNOTATION_KEYS
from tailguard.controller.adapters.kube.events import EventRecorder
from tailguard.controller.adapters.traffic.routes import (
    HttpRouteRouter,
    Ramp,
    VirtualServiceRouter,
    WeightError,
    split_weights,
)
from tailguard.controller.core.ports import OutcomeStatus, TrafficRequest
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.kit.http import RetryPolicy
from tests.support.dispatch import dispatched
from tests.support.fake_kubernetes import FakeKubernetes, http_route, virtual_service


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        server.put_object(http_route("chat", backends={"chat-r1": 90, "chat-r2": 10}))
        server.put_object(virtual_service("chat", subsets={"r1": 90, "r2": 10}))
        yield server


def gateway(fake: FakeKubernetes, clock: ManualClock, **options: Any) -> HttpRouteRouter:
    api = fake.api_client()
    defaults: dict[str, Any] = {
        "clock": clock,
        "namespace": "llm",
        "timeout": 5.0,
        "retry": RetryPolicy(attempts=3, backoff=1.0),
        "events": EventRecorder(k8s.CoreV1Api(api), clock),
    }
    return HttpRouteRouter(k8s.CustomObjectsApi(api), **{**defaults, **options})


def istio(fake: FakeKubernetes, clock: ManualClock, **options: Any) -> VirtualServiceRouter:
    api = fake.api_client()
    defaults: dict[str, Any] = {"clock": clock, "namespace": "llm", "timeout": 5.0}
    return VirtualServiceRouter(k8s.CustomObjectsApi(api), **{**defaults, **options})


def route_weights(fake: FakeKubernetes) -> dict[str, int]:
    stored = fake.get_object("httproutes", "llm", "chat")
    assert stored is not None
    return {b["name"]: b["weight"] for b in stored["spec"]["rules"][0]["backendRefs"]}


def vs_weights(fake: FakeKubernetes) -> dict[str, int]:
    stored = fake.get_object("virtualservices", "llm", "chat")
    assert stored is not None
    return {r["destination"]["subset"]: r["weight"] for r in stored["spec"]["http"][0]["route"]}


@pytest.mark.parametrize(
    ("current", "version", "weight", "expected"),
    [
        ({"r1": 90, "r2": 10}, "r2", 0, {"r1": 100, "r2": 0}),
        ({"r1": 50, "r2": 50}, "r2", 10, {"r1": 90, "r2": 10}),
        ({"r1": 1, "r2": 1, "r3": 1}, "r1", 0, {"r1": 0, "r2": 50, "r3": 50}),
        ({"r1": 0, "r2": 0, "r3": 100}, "r3", 1, {"r1": 50, "r2": 49, "r3": 1}),
        ({"a": 30, "b": 60, "c": 10}, "c", 0, {"a": 33, "b": 67, "c": 0}),
        ({"only": 100}, "only", 100, {"only": 100}),
    ],
)
def test_split_weights(current: dict[str, int], version: str, weight: int, expected: dict[str, int]) -> None:
    result = split_weights(current, version, weight)
    assert result == expected and sum(result.values()) == 100


@pytest.mark.parametrize(
    ("current", "version", "weight", "message"),
    [
        ({"r1": 100}, "r2", 10, "no backend for version 'r2'"),
        ({"r1": 100}, "r1", 10, "only backend"),
        ({"r1": 50, "r2": 50}, "r1", 101, "between 0 and 100"),
    ],
)
def test_split_weights_refuses(current: dict[str, int], version: str, weight: int, message: str) -> None:
    with pytest.raises(WeightError, match=message):
        split_weights(current, version, weight)


def test_ramp_paths() -> None:
    ramp = Ramp(steps=(50,), hold_seconds=30)
    assert ramp.path(10, 100) == [50, 100]
    assert ramp.path(50, 100) == [100]
    assert ramp.path(100, 10) == [10]  # down at once
    assert Ramp(steps=(25, 50, 75)).path(0, 60) == [25, 50, 60]


def test_httproute_shift_writes_verifies_records_key_and_event(fake: FakeKubernetes) -> None:
    outcome = gateway(fake, ManualClock()).set_weight(TrafficRequest("chat", "r2", 0, idempotency_key="d:fire:0"))
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome
    assert outcome.detail["verified"] is True
    assert route_weights(fake) == {"chat-r1": 100, "chat-r2": 0}
    stored = fake.get_object("httproutes", "llm", "chat")
    assert stored is not None
    assert json.loads(stored["metadata"]["annotations"][ANNOTATION_KEYS]) == ["d:fire:0"]
    assert [e["reason"] for e in fake.objects("events", "llm")] == ["TailguardTrafficShift"]


def test_virtualservice_shift(fake: FakeKubernetes) -> None:
    outcome = istio(fake, ManualClock()).set_weight(TrafficRequest("chat", "r2", 50, idempotency_key="k"))
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome
    assert vs_weights(fake) == {"r1": 50, "r2": 50}


def test_replay_is_a_no_op(fake: FakeKubernetes) -> None:
    router = gateway(fake, ManualClock())
    router.set_weight(TrafficRequest("chat", "r2", 0, idempotency_key="k"))
    writes = len(fake.calls("update", "httproutes"))
    again = router.set_weight(TrafficRequest("chat", "r2", 0, idempotency_key="k"))
    assert again.status is OutcomeStatus.SUCCEEDED and again.detail["replayed"] is True
    assert len(fake.calls("update", "httproutes")) == writes


def test_verify_mismatch_is_a_failed_outcome(fake: FakeKubernetes) -> None:
    def fight(obj: dict[str, Any]) -> None:  # another controller sets its own weights right after ours
        obj["spec"]["rules"][0]["backendRefs"][1]["weight"] = 10
        obj["spec"]["rules"][0]["backendRefs"][0]["weight"] = 90

    fake.inject("update", "httproutes", mutate=fight)
    outcome = gateway(fake, ManualClock()).set_weight(TrafficRequest("chat", "r2", 0, idempotency_key="k"))
    assert outcome.status is OutcomeStatus.FAILED and not outcome.transient
    assert outcome.detail["expected"] == {"r1": 100, "r2": 0}
    assert outcome.detail["observed"] == {"r1": 90, "r2": 10}
    assert "differ" in (outcome.error or "")
    assert fake.objects("events", "llm") == []


def test_conflict_is_retried_with_a_fresh_read(fake: FakeKubernetes) -> None:
    fake.inject("update", "virtualservices", hook=lambda: fake.touch("virtualservices", "llm", "chat"))
    outcome = istio(fake, ManualClock()).set_weight(TrafficRequest("chat", "r2", 0, idempotency_key="k"))
    assert outcome.status is OutcomeStatus.SUCCEEDED and outcome.detail["conflicts"] == 1
    assert len(fake.calls("update", "virtualservices")) == 2
    assert vs_weights(fake) == {"r1": 100, "r2": 0}


def test_unknown_route_and_unknown_version(fake: FakeKubernetes) -> None:
    router = gateway(fake, ManualClock())
    missing = router.set_weight(TrafficRequest("nope", "r2", 0, idempotency_key="k1"))
    assert missing.status is OutcomeStatus.FAILED and not missing.transient and "404" in (missing.error or "")
    unknown = router.set_weight(TrafficRequest("chat", "r9", 0, idempotency_key="k2"))
    assert unknown.status is OutcomeStatus.FAILED and "no backend for version 'r9'" in (unknown.error or "")
    assert fake.calls("update", "httproutes") == []


def test_server_error_retried_then_transient_failure_without_a_write(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    fake.inject("get", "httproutes", status=500, times=3)
    outcome = gateway(fake, clock).set_weight(TrafficRequest("chat", "r2", 0, idempotency_key="k"))
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient and "HTTP 500" in (outcome.error or "")
    assert len(fake.calls("get", "httproutes")) == 3
    assert fake.calls("update", "httproutes") == []


def test_write_timeout_then_replay_does_not_write_twice(fake: FakeKubernetes) -> None:
    fake.inject("update", "httproutes", delay_after=1.0)
    clock = ManualClock()
    router = gateway(fake, clock, timeout=0.3)
    outcome = dispatched(lambda: router.set_weight(TrafficRequest("chat", "r2", 0, idempotency_key="k")), clock=clock)
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome
    assert len(fake.calls("update", "httproutes")) == 1
    assert route_weights(fake) == {"chat-r1": 100, "chat-r2": 0}


def test_step_down_then_step_up_with_holds(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    router = gateway(fake, clock, ramp=Ramp(steps=(50,), hold_seconds=60))
    fake.put_object(http_route("chat", backends={"chat-r1": 0, "chat-r2": 100}))  # r2: the new version
    start = clock.now()
    down = router.set_weight(TrafficRequest("chat", "r2", 10, idempotency_key="fire"))
    assert down.status is OutcomeStatus.SUCCEEDED and down.detail["steps"] == [10]
    assert clock.now() == start  # no hold on the way down
    assert route_weights(fake) == {"chat-r1": 90, "chat-r2": 10}
    seen: list[dict[str, int]] = []
    fake.inject("get", "httproutes", hook=lambda: seen.append(route_weights(fake)), times=100)
    up = router.set_weight(TrafficRequest("chat", "r2", 100, idempotency_key="resolve"))
    assert up.status is OutcomeStatus.SUCCEEDED, up
    assert up.detail["steps"] == [50, 100]
    assert clock.now() == start + 60  # one hold between the two steps
    assert {"chat-r1": 50, "chat-r2": 50} in seen
    assert route_weights(fake) == {"chat-r1": 0, "chat-r2": 100}
    keys = json.loads(fake.get_object("httproutes", "llm", "chat")["metadata"]["annotations"][ANNOTATION_KEYS])  # type: ignore[index]
    assert keys[-2:] == ["resolve#step1", "resolve"]


def test_ramp_interrupted_by_another_change_stops(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    router = gateway(fake, clock, ramp=Ramp(steps=(50,), hold_seconds=60))
    original_sleep = clock.sleep

    def someone_else_changes_it(seconds: float) -> None:
        original_sleep(seconds)
        if seconds == 60:  # during the hold, a human shifts r2 back down
            other = gateway(fake, ManualClock())
            other.set_weight(TrafficRequest("chat", "r2", 5, idempotency_key="human"))

    clock.sleep = someone_else_changes_it  # type: ignore[method-assign]
    outcome = router.set_weight(TrafficRequest("chat", "r2", 100, idempotency_key="up"))
    assert outcome.status is OutcomeStatus.FAILED and "interrupted" in (outcome.error or "")
    assert outcome.detail["reached"] == {"r1": 50, "r2": 50}
    assert route_weights(fake) == {"chat-r1": 95, "chat-r2": 5}  # the human's change stands


def test_rejected_write_is_a_permanent_failure(fake: FakeKubernetes) -> None:
    fake.inject("update", "httproutes", status=422)
    outcome = gateway(fake, ManualClock()).set_weight(TrafficRequest("chat", "r2", 30, idempotency_key="k"))
    assert outcome.status is OutcomeStatus.FAILED and not outcome.transient and "HTTP 422" in (outcome.error or "")
    assert len(fake.calls("update", "httproutes")) == 1
