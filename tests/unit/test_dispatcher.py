from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tailguard.controller.adapters.stores.journal import ActionRecord, ActionStatus, Journal
from tailguard.controller.adapters.tier.local_tier import TierError
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.model import Decision
from tailguard.controller.core.ports import ActionOutcome
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.preconditions import ScaleError, desired_replicas
from tailguard.controller.testing import (
    FakeAnnotator,
    FakeDeployer,
    FakeNotifier,
    FakeRouter,
    condition_state,
    make_decision,
    permanent_failure,
    transient_failure,
)


class SimulatedCrash(BaseException):
    """Raised by a crash hook: unwinds like a killed process would stop (nothing after it runs)."""


class Rig:
    def __init__(self, path: Path, limits: GlobalLimits | None = None) -> None:
        self.path = path
        self.clock = ManualClock()
        self.deployer = FakeDeployer(replicas={"chat": 2}, revisions={"chat": 3})
        self.router = FakeRouter()
        self.annotator = FakeAnnotator()
        self.notifier = FakeNotifier()
        self.limits = limits or GlobalLimits()
        self.seen: list[ActionRecord] = []
        self.journal = Journal(path)

    def actuators(self) -> Actuators:
        return Actuators(self.deployer, self.deployer, self.router, self.annotator, self.notifier)

    def dispatcher(self, crash_at: str | None = None, crash_type: str = "rollback", **kwargs: Any) -> Dispatcher:
        def hook(point: str, record: ActionRecord) -> None:
            if point == crash_at and record.type.value == crash_type:
                raise SimulatedCrash(point)

        return Dispatcher(
            self.journal,
            kwargs.pop("actuators", self.actuators()),
            self.clock,
            self.limits,
            on_action=self.seen.append,
            crash_hook=hook,
            **kwargs,
        )

    def commit(self, decision: Decision) -> None:
        self.journal.commit_evaluation(decision.policy, PolicyState(), [decision], self.clock.now())

    def reopen(self) -> None:
        self.journal.close()
        self.journal = Journal(self.path)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    rig = Rig(tmp_path / "journal.db")
    yield rig
    rig.journal.close()


ROLLBACK = ("rollback", {"service": "chat"})
ANNOTATE = ("annotate", {"text": "p99 high on chat", "tags": ["regression"]})


def test_dispatch_runs_actions_in_order_and_records_results(rig: Rig) -> None:
    decision = make_decision([ANNOTATE, ROLLBACK, ("notify", {"receiver": "oncall", "message": "m"})])
    rig.commit(decision)
    records = rig.dispatcher().dispatch(decision)
    assert [(r.type.value, r.status, r.attempts) for r in records] == [
        ("annotate", ActionStatus.SUCCEEDED, 1),
        ("rollback", ActionStatus.SUCCEEDED, 1),
        ("notify", ActionStatus.SUCCEEDED, 1),
    ]
    assert rig.deployer.active_revision["chat"] == 2
    assert records[1].result is not None and records[1].result["detail"]["to_revision"] == 2
    assert [r.idempotency_key for r in rig.seen] == [r.idempotency_key for r in records]
    annotation = rig.annotator.annotations[0]
    assert annotation.decision_id == decision.id and annotation.labels == {"service": "chat"}
    assert "regression" in annotation.tags and annotation.time == decision.at
    receiver, payload = rig.notifier.sent[0]
    assert receiver == "oncall" and payload["decision"]["id"] == decision.id
    assert payload["evidence"] == [[t, v] for t, v in decision.evidence]
    assert [a["type"] for a in payload["actions"]] == ["annotate", "rollback", "notify"]


def test_dispatch_twice_is_idempotent(rig: Rig) -> None:
    decision = make_decision([ANNOTATE, ROLLBACK])
    rig.commit(decision)
    dispatcher = rig.dispatcher()
    dispatcher.dispatch(decision)
    again = dispatcher.dispatch(decision)
    assert [r.attempts for r in again] == [1, 1]
    assert len(rig.deployer.calls) == 1 and len(rig.annotator.calls) == 1
    assert rig.deployer.active_revision["chat"] == 2


def test_dispatch_journals_an_uncommitted_decision_first(rig: Rig) -> None:
    decision = make_decision([ROLLBACK])
    records = rig.dispatcher().dispatch(decision)
    assert records[0].status is ActionStatus.SUCCEEDED
    assert rig.journal.recent_decisions()[0]["id"] == decision.id


def test_dry_run_is_recorded_never_executed(rig: Rig) -> None:
    decision = make_decision([ANNOTATE, ROLLBACK], dry_run=True)
    rig.commit(decision)
    records = rig.dispatcher().dispatch(decision)
    assert [r.status for r in records] == [ActionStatus.DRY_RUN, ActionStatus.DRY_RUN]
    assert [r.attempts for r in records] == [0, 0]
    assert rig.deployer.calls == [] and rig.annotator.calls == []
    assert records[1].result == {
        "would": {
            "type": "rollback",
            "params": {"service": "chat"},
            "idempotency_key": decision.actions[1].idempotency_key,
        }
    }


def test_an_annotate_failure_does_not_block_the_rollback(rig: Rig) -> None:
    rig.annotator.script(permanent_failure("annotation log is read-only"))
    decision = make_decision([ANNOTATE, ROLLBACK])
    rig.commit(decision)
    records = rig.dispatcher().dispatch(decision)
    assert [r.status for r in records] == [ActionStatus.FAILED, ActionStatus.SUCCEEDED]
    assert records[0].error == "annotation log is read-only"
    assert rig.deployer.active_revision["chat"] == 2


def test_an_actuator_that_raises_is_a_failed_action_not_a_crash(rig: Rig) -> None:
    rig.annotator.script(RuntimeError("disk on fire"))
    decision = make_decision([ANNOTATE, ROLLBACK])
    records = rig.dispatcher().dispatch(decision)
    assert records[0].status is ActionStatus.FAILED and records[0].error == "RuntimeError: disk on fire"
    assert records[1].status is ActionStatus.SUCCEEDED


def test_transient_failures_are_retried_with_backoff_through_the_clock(rig: Rig) -> None:
    rig.deployer.script(transient_failure("HTTP 503"), transient_failure("HTTP 503"))
    decision = make_decision([ROLLBACK])
    start = rig.clock.now()
    records = rig.dispatcher(attempts=3, backoff=2.0).dispatch(decision)
    assert records[0].status is ActionStatus.SUCCEEDED and records[0].attempts == 3
    assert rig.clock.now() - start == pytest.approx(2.0 + 4.0)
    assert len(rig.deployer.calls) == 3


def test_transient_failures_stop_at_the_deadline(rig: Rig) -> None:
    """A change is tried again while its deadline lasts (5 s here: attempts at 0, 1 and 3 s; the next, at 7 s, would
    be past it), each failed attempt journaled as an event (issue 24, item 5)."""
    rig.deployer.script(*(transient_failure("HTTP 503") for _ in range(5)))
    dispatcher = rig.dispatcher(attempts=3, backoff=1.0, deadline_for=lambda _policy: 5.0)
    records = dispatcher.dispatch(make_decision([ROLLBACK]))
    assert records[0].status is ActionStatus.FAILED and records[0].attempts == 3
    assert records[0].error == "HTTP 503"
    assert records[0].result is not None and records[0].result["transient"] is True
    assert len(rig.deployer.calls) == 3
    attempts = [e["detail"] for e in rig.journal.action_events(records[0].idempotency_key) if e["event"] == "attempt"]
    assert attempts == [f"attempt {n} failed: HTTP 503" for n in (1, 2, 3)]


def test_transient_failures_are_retried_past_the_attempts_within_the_deadline(rig: Rig) -> None:
    rig.deployer.script(*(transient_failure("HTTP 503") for _ in range(5)))
    records = rig.dispatcher(attempts=3, backoff=1.0, deadline_for=lambda _policy: 60.0).dispatch(
        make_decision([ROLLBACK])
    )
    assert records[0].status is ActionStatus.SUCCEEDED and records[0].attempts == 6
    assert len(rig.deployer.calls) == 6


def test_permanent_failure_is_not_retried(rig: Rig) -> None:
    rig.deployer.script(permanent_failure("no earlier good revision"))
    start = rig.clock.now()
    records = rig.dispatcher(attempts=3).dispatch(make_decision([ROLLBACK]))
    assert records[0].status is ActionStatus.FAILED and records[0].attempts == 1
    assert records[0].error == "no earlier good revision"
    assert rig.clock.now() == start
    assert len(rig.deployer.calls) == 1


def test_missing_actuator_fails_with_a_clear_error(rig: Rig) -> None:
    decision = make_decision([ROLLBACK, ANNOTATE])
    records = rig.dispatcher(actuators=Actuators(annotator=rig.annotator)).dispatch(decision)
    assert records[0].status is ActionStatus.FAILED
    assert records[0].error == "no deployer configured: a rollback action needs Actuators.deployer"
    assert records[1].status is ActionStatus.SUCCEEDED


@pytest.mark.parametrize(
    "crash_at, expected_attempts, expected_replayed", [("after-start", 2, False), ("after-execute", 2, True)]
)
def test_resume_after_a_crash_finishes_without_repeating(
    rig: Rig, crash_at: str, expected_attempts: int, expected_replayed: bool
) -> None:
    decision = make_decision([ANNOTATE, ROLLBACK])
    rig.commit(decision)
    # The annotate runs fine; the process dies in the middle of the rollback.
    with pytest.raises(SimulatedCrash):
        rig.dispatcher(crash_at=crash_at).dispatch(decision)
    rig.reopen()
    [pending] = rig.journal.pending_actions()
    assert (pending.type.value, pending.status, pending.attempts) == ("rollback", ActionStatus.STARTED, 1)
    [record] = rig.dispatcher().resume()
    assert record.status is ActionStatus.SUCCEEDED and record.attempts == expected_attempts
    assert record.result is not None and record.result["detail"]["replayed"] is expected_replayed
    assert rig.deployer.active_revision["chat"] == 2  # exactly one rollback performed
    assert len(rig.deployer.performed("rollback")) == 1
    assert len(rig.annotator.performed("annotate")) == 1
    assert [r.status for r in rig.journal.actions_for(decision.id)] == [ActionStatus.SUCCEEDED] * 2
    assert rig.dispatcher().resume() == []  # a further resume is a no-op


def test_resume_of_a_started_rollback_replays_the_same_key(rig: Rig) -> None:
    decision = make_decision([ROLLBACK])
    rig.commit(decision)
    with pytest.raises(SimulatedCrash):
        rig.dispatcher(crash_at="after-execute").dispatch(decision)
    rig.reopen()
    [pending] = rig.journal.pending_actions()
    assert pending.status is ActionStatus.STARTED and pending.attempts == 1
    [record] = rig.dispatcher().resume()
    assert record.status is ActionStatus.SUCCEEDED and record.attempts == 2
    assert record.result is not None and record.result["detail"]["replayed"] is True
    assert [c.idempotency_key for c in rig.deployer.calls] == [decision.actions[0].idempotency_key] * 2
    assert len(rig.deployer.performed("rollback")) == 1 and rig.deployer.active_revision["chat"] == 2


def test_a_crash_before_the_plan_waits_for_an_evaluation_then_plans_from_its_world(rig: Rig) -> None:
    """Issue 23 (3): a rollback whose decision was committed but never planned (the process died in between) is
    not planned from the world at restart: it waits, deferred, until an evaluation finds its condition still
    firing, and is planned and run then."""
    decision = make_decision([ROLLBACK])
    rig.commit(decision)
    rig.reopen()
    [waiting] = rig.dispatcher().resume()
    assert waiting.status is ActionStatus.DEFERRED and waiting.plan is None and rig.deployer.calls == []
    assert "waits for a plan" in (waiting.error or "")
    [record] = rig.dispatcher().retry_deferred(decision.policy, condition_state(decision))
    assert record.status is ActionStatus.SUCCEEDED and record.attempts == 1
    assert record.plan is not None and record.plan["decided_at"] == rig.clock.now()
    assert rig.dispatcher().resume() == []


# -- global limits ------------------------------------------------------------------------------------------


def _shift(policy: str, onset: float, weight: int = 10) -> Decision:
    return make_decision(
        [("shift_traffic", {"service": "chat", "version": "r2", "weight": weight})],
        policy=policy,
        onset=onset,
    )


def test_global_cooldown_across_policies(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.db", GlobalLimits(cooldown=300.0))
    try:
        first = rig.dispatcher().dispatch(make_decision([ROLLBACK], policy="p99-rollback"))
        rig.clock.advance(60)
        second = rig.dispatcher().dispatch(_shift("error-rate-shift", onset=1.0))
        assert first[0].status is ActionStatus.SUCCEEDED
        assert second[0].status is ActionStatus.DEFERRED and second[0].attempts == 0
        assert second[0].error is not None and second[0].error.startswith(
            "global cooldown: rollback on chat by policy 'p99-rollback' 60s ago, 240s left"
        )
        assert rig.router.calls == []
        # Another service is not limited by chat's cooldown.
        other = rig.dispatcher().dispatch(make_decision([("rollback", {"service": "code"})], service="code"))
        assert other[0].status is ActionStatus.SUCCEEDED
        rig.clock.advance(241)
        third = rig.dispatcher().dispatch(_shift("error-rate-shift", onset=2.0))
        assert third[0].status is ActionStatus.SUCCEEDED
    finally:
        rig.journal.close()


def test_non_mutating_actions_are_never_limited(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.db", GlobalLimits(cooldown=300.0, maxActionsPerHour=0))
    try:
        records = rig.dispatcher().dispatch(make_decision([ANNOTATE, ("notify", {"receiver": "r"}), ROLLBACK]))
        assert [r.status for r in records] == [
            ActionStatus.SUCCEEDED,
            ActionStatus.SUCCEEDED,
            ActionStatus.DEFERRED,
        ]
        assert (
            records[2].error == "global budget: 0 mutating action(s) on chat in the last hour across all "
            "policies (max 0)"
        )
    finally:
        rig.journal.close()


def test_global_budget_counts_all_policies_and_survives_reopening(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.db", GlobalLimits(maxActionsPerHour=2))
    try:
        assert rig.dispatcher().dispatch(_shift("a", 1.0))[0].status is ActionStatus.SUCCEEDED
        rig.clock.advance(10)
        assert rig.dispatcher().dispatch(_shift("b", 2.0))[0].status is ActionStatus.SUCCEEDED
        rig.reopen()  # a restarted controller counts from the journal, not from memory
        rig.clock.advance(10)
        blocked = rig.dispatcher().dispatch(_shift("c", 3.0))[0]
        assert blocked.status is ActionStatus.DEFERRED
        assert (
            blocked.error == "global budget: 2 mutating action(s) on chat in the last hour across all policies (max 2)"
        )
        rig.clock.advance(3600 - 10)  # the first action leaves the hour window
        assert rig.dispatcher().dispatch(_shift("d", 4.0))[0].status is ActionStatus.SUCCEEDED
    finally:
        rig.journal.close()


def test_failed_actions_do_not_use_up_the_budget(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.db", GlobalLimits(maxActionsPerHour=1, cooldown=60.0))
    try:
        rig.router.script(permanent_failure("HTTP 400"))
        assert rig.dispatcher().dispatch(_shift("a", 1.0))[0].status is ActionStatus.FAILED
        assert rig.dispatcher().dispatch(_shift("b", 2.0))[0].status is ActionStatus.SUCCEEDED
    finally:
        rig.journal.close()


def test_actions_of_one_decision_do_not_cool_each_other_down(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.db", GlobalLimits(cooldown=300.0))
    try:
        decision = make_decision(
            [
                ("shift_traffic", {"service": "chat", "version": "r2", "weight": 10}),
                ("scale", {"service": "chat", "delta": 1, "min": 1, "max": 4}),
            ]
        )
        records = rig.dispatcher().dispatch(decision)
        assert [r.status for r in records] == [ActionStatus.SUCCEEDED, ActionStatus.SUCCEEDED]
    finally:
        rig.journal.close()


# -- scale --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params, current, expected",
    [
        ({"replicas": 4, "max": 8}, 2, 4),
        ({"replicas": 20, "max": 8}, 2, 8),
        ({"replicas": 0, "min": 1, "max": 8}, 2, 1),
        ({"delta": 2, "max": 8}, 3, 5),
        ({"delta": -5, "min": 1, "max": 8}, 3, 1),
        ({"targetPerReplica": 20, "observed": 45.0, "max": 8}, 2, 5),  # ceil(2 * 45 / 20) = ceil(4.5)
        (
            {"targetPerReplica": 20, "observed": 20.0, "max": 8},
            3,
            3,
        ),  # exactly on target: no float-noise step
        ({"targetPerReplica": 20, "observed": 200.0, "min": 1, "max": 8}, 4, 8),
        ({"targetPerReplica": 20, "observed": 1.0, "min": 2, "max": 8}, 4, 2),
        ({"targetPerReplica": 20, "observed": 50.0, "min": 1, "max": 8}, 0, 1),
        (
            {"replicas": None, "delta": None, "targetPerReplica": 20.0, "observed": 30.0, "min": 1, "max": 8},
            2,
            3,
        ),
    ],
)
def test_desired_replicas(params: dict[str, Any], current: int, expected: int) -> None:
    assert desired_replicas(params, current) == expected


@pytest.mark.parametrize(
    "params, message",
    [
        ({"max": 8}, "exactly one of replicas, delta or targetPerReplica"),
        ({"replicas": 2, "delta": 1, "max": 8}, "exactly one of replicas, delta or targetPerReplica"),
        ({"targetPerReplica": 20, "observed": None, "max": 8}, "needs the observed value"),
        ({"replicas": 2, "min": 5, "max": 3}, r"min \(5\) is above max \(3\)"),
        ({"replicas": 2}, "needs 'max'"),
    ],
)
def test_desired_replicas_rejects_bad_params(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ScaleError, match=message):
        desired_replicas(params, 2)


def test_scale_reads_current_count_and_sets_the_desired_one(rig: Rig) -> None:
    decision = make_decision(
        [("scale", {"service": "chat", "targetPerReplica": 20, "observed": 45.0, "min": 1, "max": 8})]
    )
    [record] = rig.dispatcher().dispatch(decision)
    assert record.status is ActionStatus.SUCCEEDED
    # With what it replaces (issue 12: a restore puts it back) and the episode it belongs to.
    assert record.plan == {
        "service": "chat",
        "current": 2,
        "desired": 5,
        "before": {"replicas": 2},
        "episode": rig.clock.now(),
        "target": {"replicas": 5},  # issue 16: what a resume checks the world against
        "decided_at": rig.clock.now(),  # issue 23: planned by the decision, and until when it may run
        "deadline": rig.clock.now() + 300.0,
    }
    assert record.result is not None and record.result["after"] == {"scale": {"replicas": 5}}
    assert rig.deployer.replica_counts["chat"] == 5


def test_scale_to_the_current_count_is_skipped(rig: Rig) -> None:
    [record] = rig.dispatcher().dispatch(make_decision([("scale", {"service": "chat", "replicas": 2, "max": 8})]))
    assert record.status is ActionStatus.SKIPPED and record.attempts == 0
    assert rig.deployer.performed("set_replicas") == []


def test_scale_resume_uses_the_journaled_plan(rig: Rig) -> None:
    decision = make_decision([("scale", {"service": "chat", "delta": 2, "max": 8})])
    with pytest.raises(SimulatedCrash):
        rig.dispatcher(crash_at="after-execute", crash_type="scale").dispatch(decision)
    assert rig.deployer.replica_counts["chat"] == 4
    rig.reopen()
    [record] = rig.dispatcher().resume()
    # Recomputing delta from the new count would ask for 6; the plan asks for 4 again, with the same key.
    assert record.status is ActionStatus.SUCCEEDED and rig.deployer.replica_counts["chat"] == 4
    # Issue 16: the world already shows the planned target (4), so the resume is done without a second call.
    assert [c.args["replicas"] for c in rig.deployer.calls] == [4]
    assert record.result is not None and record.result["detail"]["already_done"] is True


def test_scale_with_unreadable_replicas_waits_for_the_next_evaluation(rig: Rig) -> None:
    """Its decision cannot see the world: the scale is not planned later by the worker, it waits (deferred) for an
    evaluation that plans it from what it sees."""
    rig.deployer.replicas_error = TierError("GET /api/v1/services/chat: timed out", transient=True)
    decision = make_decision([("scale", {"service": "chat", "delta": 1, "max": 8})])
    [record] = rig.dispatcher(attempts=2).dispatch(decision)
    assert record.status is ActionStatus.DEFERRED and record.attempts == 0
    assert record.error == (
        "not planned (reading the replicas of 'chat': GET /api/v1/services/chat: timed out); waits for a plan "
        "from the world an evaluation of its policy sees"
    )
    rig.deployer.replicas_error = None
    [done] = rig.dispatcher().retry_deferred(decision.policy, condition_state(decision))
    assert done.status is ActionStatus.SUCCEEDED and done.plan is not None and done.plan["desired"] == 3


def test_scale_with_bad_params_fails_clearly(rig: Rig) -> None:
    [record] = rig.dispatcher().dispatch(
        make_decision([("scale", {"service": "chat", "targetPerReplica": 20, "observed": None, "max": 8})])
    )
    assert record.status is ActionStatus.FAILED
    assert record.error == (
        "scale of 'chat': targetPerReplica scaling needs the observed value, and the decision has none"
    )


def test_resolve_annotation_is_a_region(rig: Rig) -> None:
    decision = make_decision([ANNOTATE], kind="resolve", onset=1000.0, at=1200.0)
    rig.dispatcher().dispatch(decision)
    annotation = rig.annotator.annotations[0]
    assert (annotation.time, annotation.time_end) == (1000.0, 1200.0)


def test_concurrent_policies_cannot_both_pass_the_cooldown(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.db", GlobalLimits(cooldown=300.0))
    try:
        dispatcher = rig.dispatcher()
        decisions = [_shift(f"policy-{n}", float(n)) for n in range(4)]
        results: list[ActionRecord] = []
        threads = [threading.Thread(target=lambda d=d: results.extend(dispatcher.dispatch(d))) for d in decisions]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        statuses = sorted(r.status.value for r in results)
        assert statuses == ["deferred", "deferred", "deferred", "succeeded"]
        assert len(rig.router.performed("set_weight")) == 1
    finally:
        rig.journal.close()


def test_a_slow_change_on_one_service_does_not_hold_up_another(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "j.db", GlobalLimits())
    entered, release = threading.Event(), threading.Event()
    original = rig.router.set_weight

    def slow_for_chat(request: Any, abort: Any = None) -> ActionOutcome:
        if request.service == "chat":
            entered.set()
            release.wait(timeout=30)  # e.g. a ramp holding between weight steps
        return original(request, abort)

    rig.router.set_weight = slow_for_chat  # type: ignore[method-assign]
    try:
        dispatcher = rig.dispatcher()
        slow = threading.Thread(target=lambda: dispatcher.dispatch(_shift("error-rate", 1.0)))
        slow.start()
        assert entered.wait(timeout=30)
        other = make_decision([("rollback", {"service": "code"})], policy="p99-rollback", service="code", onset=2.0)
        (record,) = dispatcher.dispatch(other)  # returns while the chat change is still in progress
        assert record.status.value == "succeeded"
        assert rig.router.performed("set_weight") == [], "the rollback of code ran while chat's change was held"
        release.set()
        slow.join(timeout=30)
        assert rig.router.performed("set_weight")
    finally:
        release.set()
        rig.journal.close()


def test_a_scale_whose_floor_a_human_changed_after_the_decision_is_not_written(rig: Rig) -> None:
    """Issue 23 (3): planned by the decision (2 -> 4 replicas), the process dies before the write; an engineer sets
    6 replicas by hand; the resume reads the count right before writing: `world-changed`, nothing written."""
    decision = make_decision([("scale", {"service": "chat", "delta": 2, "max": 8})])
    rig.commit(decision)
    with pytest.raises(SimulatedCrash):
        rig.dispatcher(crash_at="after-plan", crash_type="scale").dispatch(decision)
    rig.deployer.replica_counts["chat"] = 6
    rig.reopen()
    [record] = rig.dispatcher().resume()
    assert record.status is ActionStatus.WORLD_CHANGED, record
    assert rig.deployer.replica_counts["chat"] == 6 and rig.deployer.performed("set_replicas") == []
    assert record.plan is not None and (record.plan["before"], record.plan["target"]) == ({"replicas": 2},
                                                                                          {"replicas": 4})  # fmt: skip
    assert "changed since the decision" in (record.error or "")
