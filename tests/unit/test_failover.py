"""The failover state machine as a table, and its driver over a router (fake and Kubernetes HTTPRoute)."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from controller.actuators.fakes import FakeRouter, transient_failure
from controller.actuators.traffic import HttpRouteRouter
from controller.clock import ManualClock
from controller.failover import BackendState, FailoverConfig, FailoverDriver, Phase, next_state
from controller.protocols import OutcomeStatus
from tests.support.fake_kubernetes import FakeKubernetes, http_route

CONFIG = FailoverConfig(failures_to_remove=3, successes_to_return=1, return_fraction=0.5, hold_seconds=60)

# (checks as (time, healthy)), expected (phase, weights set) after them. Full weight 40.
TABLE = [
    ("two failures keep it", [(0, False), (10, False)], Phase.IN_ROTATION, []),
    ("three failures remove it", [(0, False), (10, False), (20, False)], Phase.REMOVED, [0]),
    ("a success resets the count", [(0, False), (10, False), (20, True), (30, False)], Phase.IN_ROTATION, []),
    ("unknown neither fails nor resets", [(0, False), (10, None), (20, False), (30, None), (40, False)],
     Phase.REMOVED, [0]),
    ("healthy again returns at half", [(0, False), (1, False), (2, False), (3, True)], Phase.RETURNING, [0, 20]),
    ("full weight after the hold", [(0, False), (1, False), (2, False), (3, True), (30, True), (63, True)],
     Phase.IN_ROTATION, [0, 20, 40]),
    ("not before the hold", [(0, False), (1, False), (2, False), (3, True), (62, True)], Phase.RETURNING, [0, 20]),
    ("a failure while returning removes it at once", [(0, False), (1, False), (2, False), (3, True), (4, False)],
     Phase.REMOVED, [0, 20, 0]),
    ("unknown while removed keeps it removed", [(0, False), (1, False), (2, False), (3, None)], Phase.REMOVED, [0]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "checks", "phase", "weights"), TABLE, ids=[row[0] for row in TABLE])
def test_state_machine(name: str, checks: list[tuple[float, bool | None]], phase: Phase, weights: list[int]) -> None:
    state = BackendState(full_weight=40)
    set_weights: list[int] = []
    for at, healthy in checks:
        state, weight = next_state(state, healthy, at, CONFIG)
        if weight is not None:
            set_weights.append(weight)
    assert state.phase is phase
    assert set_weights == weights


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="return_fraction"):
        FailoverConfig(return_fraction=0)
    with pytest.raises(ValueError, match="at least 1"):
        FailoverConfig(failures_to_remove=0)


def test_driver_retries_a_failed_write_with_the_same_key() -> None:
    clock = ManualClock()
    router = FakeRouter()
    driver = FailoverDriver(router, clock, CONFIG)
    driver.track("chat", "r2", 40)
    for _ in range(2):
        assert driver.observe("chat", "r2", False) is None
    router.script(transient_failure())
    failed = driver.observe("chat", "r2", False)
    assert failed is not None and failed.status is OutcomeStatus.FAILED
    assert driver.state("chat", "r2").phase is Phase.IN_ROTATION  # not advanced: the weight was not set
    done = driver.observe("chat", "r2", False)
    assert done is not None and done.status is OutcomeStatus.SUCCEEDED
    assert driver.state("chat", "r2").phase is Phase.REMOVED
    keys = [call.idempotency_key for call in router.calls]
    assert keys[0] == keys[1]  # the retry is the same action
    assert router.weights[("chat", "r2")] == 0


def test_driver_over_an_httproute() -> None:
    clock = ManualClock()
    with FakeKubernetes() as fake:
        fake.put_object(http_route("chat", backends={"chat-r1": 60, "chat-r2": 40}))
        router = HttpRouteRouter(k8s.CustomObjectsApi(fake.api_client()), clock=clock, namespace="llm")
        driver = FailoverDriver(router, clock, CONFIG)
        driver.track("chat", "r2", 40)

        def weights() -> dict[str, int]:
            stored = fake.get_object("httproutes", "llm", "chat")
            assert stored is not None
            return {b["name"]: b["weight"] for b in stored["spec"]["rules"][0]["backendRefs"]}

        for _ in range(3):
            clock.advance(10)
            driver.observe("chat", "r2", False)
        assert weights() == {"chat-r1": 100, "chat-r2": 0}
        clock.advance(10)
        driver.observe("chat", "r2", True)
        assert weights() == {"chat-r1": 80, "chat-r2": 20}
        clock.advance(60)
        outcome = driver.observe("chat", "r2", True)
        assert outcome is not None and outcome.status is OutcomeStatus.SUCCEEDED
        assert weights() == {"chat-r1": 60, "chat-r2": 40}
        assert len(fake.calls("update", "httproutes")) == 3
