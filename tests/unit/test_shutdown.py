"""Stopping cuts waits inside actions short; the interrupted action is resumed by the next process, once.

A real traffic ramp (HTTPRoute against the spec-validating fake Kubernetes API) holds 10 minutes between
its steps; stopping the controller during the hold must return at once, leave the action "started" in
the journal, and a new process must finish the ramp with the same keys, without repeating the first step.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.kube.action_keys import ANNOTATION_KEYS
from tailguard.controller.adapters.stores.journal import ActionStatus, Journal
from tailguard.controller.adapters.traffic.routes import HttpRouteRouter, Ramp
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.kit.clock import ManualClock, ShutdownInterrupt, SystemClock
from tailguard.controller.kit.http import RetryPolicy
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeSource, make_decision
from tests.support.fake_kubernetes import FakeKubernetes, http_route

HOLD_S = 600.0


@pytest.fixture
def kube() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        server.put_object(http_route("chat", backends={"chat-r1": 90, "chat-r2": 10}))
        yield server


def ramping_router(kube: FakeKubernetes, clock: SystemClock | ManualClock) -> HttpRouteRouter:
    return HttpRouteRouter(
        k8s.CustomObjectsApi(kube.api_client()),
        clock=clock,
        namespace="llm",
        timeout=5.0,
        retry=RetryPolicy(attempts=3, backoff=1.0),
        ramp=Ramp(steps=(50,), hold_seconds=HOLD_S),
    )


def weights(kube: FakeKubernetes) -> dict[str, int]:
    stored = kube.get_object("httproutes", "llm", "chat")
    assert stored is not None
    return {b["name"]: b["weight"] for b in stored["spec"]["rules"][0]["backendRefs"]}


def test_system_clock_sleeps_until_interrupted_then_refuses_to_sleep() -> None:
    clock = SystemClock()
    clock.sleep(0.01)  # an ordinary short wait returns
    outcome: list[str] = []

    def long_wait() -> None:
        try:
            clock.sleep(HOLD_S)
            outcome.append("slept")
        except ShutdownInterrupt:
            outcome.append("interrupted")

    sleeper = threading.Thread(target=long_wait)
    sleeper.start()
    clock.interrupt()
    sleeper.join(timeout=30)
    assert not sleeper.is_alive() and outcome == ["interrupted"]
    with pytest.raises(ShutdownInterrupt):
        clock.sleep(0)


def test_manual_clock_interrupt_makes_sleep_raise_without_advancing() -> None:
    clock = ManualClock(start=100.0)
    clock.sleep(5)
    clock.interrupt()
    with pytest.raises(ShutdownInterrupt):
        clock.sleep(5)
    assert clock.now() == 105.0


def test_stopping_during_a_ramp_hold_leaves_the_action_for_the_next_process(
    kube: FakeKubernetes, tmp_path: Path
) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()  # no policies needed: the action is dispatched directly, as an evaluation would
    decision = make_decision([("shift_traffic", {"service": "chat", "version": "r2", "weight": 100})])
    key = decision.actions[0].idempotency_key

    first_clock = SystemClock()
    journal = Journal(tmp_path / "journal.db")
    dispatcher = Dispatcher(journal, Actuators(router=ramping_router(kube, first_clock)), first_clock, GlobalLimits())
    controller = Controller(
        policy_paths=[rules],
        source=FakeSource(),
        journal=journal,
        dispatcher=dispatcher,
        clock=first_clock,
        metrics=ControllerMetrics(CollectorRegistry()),
        schedule=False,
    )
    controller.start()
    # Committed after the start (which resumes what is pending), as an evaluation commits its decisions.
    journal.commit_evaluation(decision.policy, PolicyState(), [decision], first_clock.now())
    raised: list[BaseException] = []

    def dispatch() -> None:
        try:
            dispatcher.dispatch(decision)
        except BaseException as exc:  # noqa: BLE001 - the test inspects what ended the thread
            raised.append(exc)

    worker = threading.Thread(target=dispatch)
    worker.start()
    # The first step (50%) is written, then the ramp holds for 10 minutes.
    for _ in range(600):
        if weights(kube) == {"chat-r1": 50, "chat-r2": 50}:
            break
        threading.Event().wait(0.05)
    assert weights(kube) == {"chat-r1": 50, "chat-r2": 50}
    controller.stop()
    worker.join(timeout=30)
    assert not worker.is_alive() and len(raised) == 1 and isinstance(raised[0], ShutdownInterrupt)

    # The next process: the action is still "started"; resuming finishes the ramp with the same key.
    reopened = Journal(tmp_path / "journal.db")
    [pending] = reopened.pending_actions()
    assert pending.idempotency_key == key and pending.status is ActionStatus.STARTED
    second_clock = ManualClock()
    [record] = Dispatcher(
        reopened, Actuators(router=ramping_router(kube, second_clock)), second_clock, GlobalLimits()
    ).resume()
    assert record.status is ActionStatus.SUCCEEDED, record.error
    assert weights(kube) == {"chat-r1": 0, "chat-r2": 100}
    # One write per step over both processes: the resumed ramp went on from 50% (50 -> 100 has no step left).
    assert len(kube.calls("update", "httproutes")) == 2
    stored = kube.get_object("httproutes", "llm", "chat")
    assert stored is not None
    assert json.loads(stored["metadata"]["annotations"][ANNOTATION_KEYS]) == [f"{key}#step1", key]
    reopened.close()
