"""Streaks in the running controller (issue 12, item 2): alert posts touch only the targets they name and cannot
shorten `for`; scheduled evaluations late by a few ms still fire at the N-th tick (their nominal times)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.core.engine import Phase, PolicyState
from tailguard.controller.core.model import DecisionKind, SignalResult, target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.loop.scheduling import scheduled_time
from tailguard.controller.testing import FakeDispatcher, FakeSource

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "alertmanager"
A = target_key({"service": "a"})
B = target_key({"service": "b"})
T0 = 1_700_000_000.0


def policy_yaml(*, interval: str, for_: int) -> str:
    return f"""\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: lat
interval: {interval}
targets:
  groupBy: [service]
  match:
    namespace: llm
signals:
  - name: p99
    query: p99{{ {{{{ selector }}}} }}
conditions:
  - name: p99-high
    signal: p99
    when: {{op: ">", value: 0.8}}
    for: {for_}
    noData: hold
    actions:
      - type: annotate
        text: "p99 {{{{ value }}}} on {{{{ service }}}}"
"""


class Stack:
    def __init__(self, tmp_path: Path, *, interval: str, for_: int) -> None:
        rules = tmp_path / "rules"
        rules.mkdir()
        (rules / "lat.yaml").write_text(policy_yaml(interval=interval, for_=for_))
        self.clock = ManualClock(T0)
        self.dispatcher = FakeDispatcher()
        self.journal = Journal(tmp_path / "journal.db")
        self.controller = Controller(
            policy_paths=[rules],
            source=FakeSource(default=SignalResult({A: 2.0, B: 2.0})),  # both services breach throughout
            journal=self.journal,
            dispatcher=self.dispatcher,
            clock=self.clock,
            metrics=ControllerMetrics(CollectorRegistry()),
            schedule=False,
        )
        self.api = ControllerAPI(self.controller)

    def at(self, t: float) -> None:
        self.clock.advance(t - self.clock.now())

    def post_alert(self, service: str) -> None:
        payload = json.loads((FIXTURES / "firing.json").read_text())
        for alert in payload["alerts"]:
            alert["labels"].update({"service": service, "namespace": "llm"})
        status, body = self.api.alerts(json.dumps(payload).encode())
        assert (status, body["triggered"]) == (202, ["lat"])
        assert self.controller.wait_for_triggered(timeout=30)

    def state(self) -> PolicyState:
        state = self.journal.load_state("lat")
        assert state is not None
        return state

    def fires(self) -> list[tuple[float, str]]:
        return [(d.at, dict(d.target)["service"]) for d in self.dispatcher.dispatched if d.kind is DecisionKind.FIRE]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    built = Stack(tmp_path, interval="10s", for_=3)
    built.controller.start()
    try:
        yield built
    finally:
        built.controller.stop()
        built.api.stop()


def test_one_scheduled_evaluation_and_two_alert_posts_do_not_fire_a_for_3_condition(stack: Stack) -> None:
    """The reproduction from issue 12: before, this rolled back 0.9-4 s after the first breach."""
    stack.controller.evaluate_scheduled("lat")
    stack.at(T0 + 0.9)
    stack.post_alert("a")
    stack.at(T0 + 4.0)
    stack.post_alert("a")
    assert stack.fires() == []
    state = stack.state()
    assert state.condition("p99-high", A).breach_count == 3
    assert state.condition("p99-high", A).phase is Phase.PENDING
    # The alert about service a did not advance service b's streak.
    assert state.condition("p99-high", B).breach_count == 1
    # The scheduled ticks complete both streaks when they span 2 intervals, not before.
    stack.at(T0 + 10)
    stack.controller.evaluate_scheduled("lat")
    assert stack.fires() == []
    stack.at(T0 + 20)
    stack.controller.evaluate_scheduled("lat")
    assert sorted(stack.fires()) == [(T0 + 20, "a"), (T0 + 20, "b")]


def test_an_alert_storm_about_one_service_leaves_the_other_untouched(stack: Stack) -> None:
    stack.controller.evaluate_scheduled("lat")
    b_before = stack.state().condition("p99-high", B)
    for step in range(1, 8):
        stack.at(T0 + step)
        stack.post_alert("a")
    assert stack.state().condition("p99-high", B) == b_before
    assert stack.fires() == []


def test_scheduled_evaluations_a_few_ms_late_still_fire_at_the_nth_tick(tmp_path: Path) -> None:
    """The first tick runs 4 ms late, the third 0.5 ms late: measured on the clock the streak spans 29.9965 s,
    short of 2 x 15 s. Named by their nominal times (T0, T0 + 15, T0 + 30) it spans exactly 30 s: fire at the 3rd."""
    built = Stack(tmp_path, interval="15s", for_=3)
    built.controller.start()  # the schedule's anchor: T0
    try:
        for tick, late in enumerate([0.004, 0.0012, 0.0005]):
            built.at(T0 + tick * 15 + late)
            outcome = built.controller.evaluate_scheduled("lat")
            assert outcome is not None and outcome.at == T0 + tick * 15
        assert sorted(built.fires()) == [(T0 + 30, "a"), (T0 + 30, "b")]
        decision = built.dispatcher.dispatched[0]
        assert decision.onset == T0
    finally:
        built.controller.stop()
        built.api.stop()


def test_scheduled_time_names_the_nominal_tick() -> None:
    assert scheduled_time(T0, 15, T0 + 0.003) == T0
    assert scheduled_time(T0, 15, T0 + 15.0004) == T0 + 15
    # a run that missed ticks (a slow evaluation before it) names the latest tick
    assert scheduled_time(T0, 15, T0 + 47.0) == T0 + 45
    # never before the policy's previous evaluation (an alert evaluated just after the tick)
    assert scheduled_time(T0, 15, T0 + 15.01, last=T0 + 15.002) == T0 + 15.002
    # never after the clock (within the millisecond before a tick)
    assert scheduled_time(T0, 15, T0 + 14.9995) == T0 + 14.9995
    # a clock that does not move (tests): the anchor
    assert scheduled_time(T0, 15, T0) == T0
