"""`tailguard abort DECISION` in the dispatcher: the queued and deferred actions of a decision never run (nor after a
restart), the one in flight stops at its next step through its AbortSignal, a finished or unknown decision is
refused, and an abort never leads to a retry. (Against the real journal; the routes and Argo CD adapters' stops are
in tests/integration/test_abort_ramps_and_sync.py, the API and the CLI in tests/unit/test_abort_api.py.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.actions import ActionRecord, ActionStatus
from tailguard.controller.core.controls import AbortRequest, AbortState
from tailguard.controller.core.ports import AbortSignal, ActionOutcome, OutcomeStatus, TrafficRequest
from tailguard.controller.kit.clock import ManualClock, SystemClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.testing import FakeAnnotator, FakeDeployer, FakeRouter, make_decision, transient_failure

SHIFT = ("shift_traffic", {"service": "chat", "version": "r2", "weight": 10})
ROLLBACK = ("rollback", {"service": "chat"})
ANNOTATE = ("annotate", {"text": "p99 high on chat"})


def abort_of(decision_id: str, at: float = 0.0) -> AbortRequest:
    return AbortRequest(decision_id, "alice", "INC-42: the new version is fine, stop shifting", at)


class SteppingRouter(FakeRouter):
    """A router that ramps like the real ones: a write per step, the abort asked before each one and its hold cut
    short by an abort (`abort.hold`). `entered` is set once the first step is written."""

    def __init__(self, steps: tuple[int, ...], hold: float) -> None:
        super().__init__({"chat": {"r1": 100, "r2": 0}})
        self.steps, self.hold = steps, hold
        self.written: list[int] = []
        self.entered = threading.Event()

    def set_weight(self, request: TrafficRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        service, version, weight = request.service, request.version, request.weight
        path = [step for step in self.steps if step < weight] + [weight]
        for index, step in enumerate(path):
            if index and abort is not None and abort.hold(self.hold) is not None:
                break
            if abort is not None and abort.requested() is not None:
                break
            self.routes[service] = {version: step, "r1": 100 - step}
            self.written.append(step)
            self.entered.set()
        else:
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {"weights": dict(self.routes[service])})
        stopped = abort.requested() if abort is not None else None
        assert stopped is not None
        detail = {"weights": dict(self.routes[service]), "aborted": stopped.to_json()}
        return ActionOutcome(OutcomeStatus.ABORTED, detail, f"ramp {stopped.phrase()}")


class Rig:
    def __init__(self, path: Path, *, limits: GlobalLimits | None = None, router: FakeRouter | None = None) -> None:
        self.path = path
        self.clock = ManualClock()
        self.deployer = FakeDeployer(replicas={"chat": 2}, revisions={"chat": 3})
        self.router = router or FakeRouter({"chat": {"r1": 100, "r2": 0}})
        self.annotator = FakeAnnotator()
        self.limits = limits or GlobalLimits()
        self.seen: list[ActionRecord] = []
        self.journal = Journal(path)

    def dispatcher(self, **kwargs: Any) -> Dispatcher:
        actuators = Actuators(self.deployer, self.deployer, self.router, self.annotator)
        clock = kwargs.pop("clock", self.clock)
        return Dispatcher(self.journal, actuators, clock, self.limits, on_action=self.seen.append, **kwargs)

    def reopen(self) -> None:
        self.journal.close()
        self.journal = Journal(self.path)

    def events(self, key: str) -> list[str]:
        return [event["event"] for event in self.journal.action_events(key)]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path / "journal.db")
    yield rig
    rig.journal.close()


def test_an_unknown_decision_is_refused_and_nothing_is_journaled(rig: Rig) -> None:
    result = rig.dispatcher().abort(abort_of("0123456789abcdef"))
    assert result.state is AbortState.UNKNOWN and "0123456789abcdef" in result.message
    assert rig.journal.all_actions() == []


def test_a_finished_decision_is_refused_with_its_outcome(rig: Rig) -> None:
    decision = make_decision([ROLLBACK])
    dispatcher = rig.dispatcher()
    (done,) = dispatcher.dispatch(decision)
    assert done.status is ActionStatus.SUCCEEDED
    result = dispatcher.abort(abort_of(decision.id))
    assert result.state is AbortState.FINISHED
    assert "already finished (rollback succeeded)" in result.message
    assert rig.journal.get_action(done.idempotency_key) == done  # untouched
    assert rig.events(done.idempotency_key) == []


def test_a_deferred_action_is_cancelled_never_runs_and_is_journaled(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.db", limits=GlobalLimits(cooldown=300.0))
    try:
        dispatcher = rig.dispatcher()
        first = make_decision([SHIFT], policy="error-rate", onset=1.0)
        assert [r.status for r in dispatcher.dispatch(first)] == [ActionStatus.SUCCEEDED]
        # The same service, an action of equal precedence, 0 s later: the cooldown defers it.
        second = make_decision([("shift_traffic", {"service": "chat", "version": "r2", "weight": 0}), ANNOTATE],
                               policy="p99-shift", onset=2.0)  # fmt: skip
        deferred, annotated = dispatcher.dispatch(second)
        assert deferred.status is ActionStatus.DEFERRED and annotated.status is ActionStatus.SUCCEEDED
        rig.seen.clear()

        result = dispatcher.abort(abort_of(second.id, at=rig.clock.now()))

        assert result.state is AbortState.CANCELLED, result
        assert [(a["type"], a["status"]) for a in result.actions] == [
            ("shift_traffic", "aborted"),
            ("annotate", "succeeded"),
        ]
        record = rig.journal.get_action(deferred.idempotency_key)
        assert record is not None and record.status is ActionStatus.ABORTED
        assert record.error == "aborted by alice: INC-42: the new version is fine, stop shifting; never ran"
        assert record.result is not None and record.result["detail"]["ran"] is False
        assert rig.events(deferred.idempotency_key) == ["deferred", "aborted"]
        assert [r.status for r in rig.seen] == [ActionStatus.ABORTED]  # reported like any outcome
        # The cooldown passes and the policy evaluates again: the aborted action is not retried.
        rig.clock.advance(600)
        assert rig.journal.deferred_actions() == [] and dispatcher.retry_deferred("p99-shift", None) == []
        assert [call.args["weight"] for call in rig.router.performed("set_weight")] == [10]  # the first only
        assert rig.router.routes["chat"] == {"r1": 90, "r2": 10}
    finally:
        rig.journal.close()


def test_a_queued_action_is_cancelled_before_it_runs_and_stays_so_after_a_restart(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.db")
    release = threading.Event()
    entered = threading.Event()
    original = rig.deployer.rollback

    def slow_rollback(*args: Any, **kwargs: Any) -> ActionOutcome:
        entered.set()
        release.wait(timeout=30)  # holds the service's lane: the next decision's actions wait in the queue
        return original(*args, **kwargs)

    rig.deployer.rollback = slow_rollback  # type: ignore[method-assign]
    dispatcher = rig.dispatcher(workers=True)
    try:
        busy = make_decision([ROLLBACK], policy="p99-rollback", onset=1.0)
        queued = make_decision([SHIFT, ANNOTATE], policy="error-rate", onset=2.0)
        dispatcher.dispatch(busy)
        assert entered.wait(timeout=30)
        dispatcher.dispatch(queued)  # same lane (service chat): queued behind the rollback

        result = dispatcher.abort(abort_of(queued.id))

        assert result.state is AbortState.CANCELLED, result
        assert [a["status"] for a in result.actions] == ["aborted", "aborted"]
        release.set()
        assert dispatcher.wait_idle(timeout=30)
    finally:
        release.set()
        dispatcher.close()
    assert rig.router.performed() == [] and rig.annotator.performed() == []  # neither queued action ran
    statuses = {r.type.value: r.status for r in rig.journal.all_actions()}
    assert statuses == {"rollback": ActionStatus.SUCCEEDED, "shift_traffic": ActionStatus.ABORTED,
                        "annotate": ActionStatus.ABORTED}  # fmt: skip
    rig.reopen()
    try:
        assert rig.dispatcher().resume() == []  # nothing left to resume: an aborted action is terminal
        assert rig.router.performed() == []
    finally:
        rig.journal.close()


def test_an_action_in_flight_stops_at_its_next_step_on_real_threads(tmp_path: Path) -> None:
    # A real clock and a 10-minute hold: the action ends only because the abort cuts the hold short.
    router = SteppingRouter(steps=(25, 50, 75), hold=600.0)
    rig = Rig(tmp_path / "j.db", router=router)
    dispatcher = rig.dispatcher(workers=True, clock=SystemClock())
    try:
        decision = make_decision([("shift_traffic", {"service": "chat", "version": "r2", "weight": 100}), ANNOTATE])
        dispatcher.dispatch(decision)
        assert router.entered.wait(timeout=30)

        result = dispatcher.abort(abort_of(decision.id))

        assert result.state is AbortState.IN_FLIGHT, result
        assert [a["status"] for a in result.actions] == ["started", "aborted"]  # the annotation was queued
        assert dispatcher.wait_idle(timeout=30)
    finally:
        dispatcher.close()
    assert router.written == [25]  # stopped before the second step
    shift, annotation = rig.journal.all_actions()
    assert shift.status is ActionStatus.ABORTED and shift.attempts == 1  # never retried
    assert shift.result is not None and shift.result["detail"]["weights"] == {"r1": 75, "r2": 25}
    assert shift.result["after"] == {"traffic": {"r1": 75, "r2": 25}}  # read back by the dispatcher
    assert shift.error == "ramp aborted by alice: INC-42: the new version is fine, stop shifting"
    assert rig.events(shift.idempotency_key) == ["abort_requested", "aborted"]
    assert annotation.status is ActionStatus.ABORTED


def test_an_abort_during_a_retry_backoff_is_never_retried(rig: Rig) -> None:
    decision = make_decision([ROLLBACK])
    rig.deployer.script(transient_failure())

    class AbortInTheBackoff(ManualClock):
        def sleep(self, seconds: float) -> None:
            dispatcher.abort(abort_of(decision.id))  # the operator, while the dispatcher waits to retry
            super().sleep(seconds)

    dispatcher = rig.dispatcher(attempts=3, backoff=10.0, clock=AbortInTheBackoff(rig.clock.now()))
    (record,) = dispatcher.dispatch(decision)
    assert record.status is ActionStatus.ABORTED and record.attempts == 1
    assert len(rig.deployer.calls) == 1  # the one failed attempt; no second
    assert rig.deployer.active_revision["chat"] == 3
    assert record.error is not None and record.error.endswith("; not retried")
    assert record.result is not None and record.result["detail"]["last_attempt"]["transient"] is True


def test_an_abort_journaled_before_a_restart_ends_the_started_action_without_acting(rig: Rig) -> None:
    decision = make_decision([SHIFT])
    rig.journal.record_decision(decision, rig.clock.now())
    key = decision.actions[0].idempotency_key
    # The previous process started the shift (its plan journaled), the operator aborted it, the process died.
    plan = {"service": "chat", "target": {"version": "r2", "weight": 10}, "before": {"r1": 100, "r2": 0}}
    rig.journal.mark_started(key, rig.clock.now(), plan)
    assert rig.dispatcher().abort(abort_of(decision.id)).state is AbortState.IN_FLIGHT
    rig.reopen()
    (record,) = rig.dispatcher().resume()
    assert record.status is ActionStatus.ABORTED
    assert record.error is not None and "not resumed after a restart" in record.error
    assert record.result is not None and record.result["after"] == {"traffic": {"r1": 100, "r2": 0}}
    assert rig.router.performed() == []  # not resumed: nothing written
    assert rig.events(key) == ["abort_requested", "aborted"]


def test_an_abort_that_arrives_after_the_last_step_is_noted_in_the_outcome(rig: Rig) -> None:
    decision = make_decision([ROLLBACK])
    dispatcher = rig.dispatcher()
    original = rig.deployer.rollback

    def rollback_then_abort(*args: Any, **kwargs: Any) -> ActionOutcome:
        outcome = original(*args, **kwargs)
        dispatcher.abort(abort_of(decision.id))  # the rollback is done; the abort comes just after
        return outcome

    rig.deployer.rollback = rollback_then_abort  # type: ignore[method-assign]
    (record,) = dispatcher.dispatch(decision)
    assert record.status is ActionStatus.SUCCEEDED
    assert record.result is not None
    note: Mapping[str, Any] = record.result["detail"]["abort_requested"]
    assert note["by"] == "alice" and note["note"] == "arrived after the action's last step"
