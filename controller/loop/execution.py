"""Execution in the dispatcher: one action, journal first (controller/loop/dispatcher.py).

    terminal in the journal  -> returned as is (never run twice)
    dry-run decision         -> recorded `dry_run`, never executed
    mutating and over limits -> recorded `deferred` with the reason (controller/loop/deferral.py)
    otherwise                -> `started` (attempts+1) is COMMITTED, then the port of its type is called (one
                                attempt: controller/loop/action_calls.py), then the result is recorded; transient
                                failures are retried here alone, with backoff (a mutating action while its deadline
                                lasts), the attempts recorded in the result's detail (`attempts`)

A resume of a started action checks the world first: the planned target already shown is done without a call; an
abort journaled since it started, a condition that ended or a deadline that passed end it unrun.
"""

from __future__ import annotations

import logging
from typing import Any

from tailguard.controller.core.actions import ActionRecord, ActionStatus, ActionType
from tailguard.controller.core.controls import AbortRequest
from tailguard.controller.core.model import DecisionKind
from tailguard.controller.core.ports import ActionJournalPort, ActionOutcome, Clock, OutcomeStatus
from tailguard.controller.kit.http import backoff_delay
from tailguard.controller.loop import preconditions
from tailguard.controller.loop.aborts import Aborts, ActionAbort
from tailguard.controller.loop.action_calls import ActionCalls
from tailguard.controller.loop.action_log import ActionLog, ServiceLocks
from tailguard.controller.loop.deferral import Deferrals

log = logging.getLogger("tailguard.controller.loop.dispatcher")

# Action types planned (and the plan journaled) before their first start: controller/loop/preconditions.py.
_PLANNED = preconditions.PLANNED


class ActionRunner:
    """Runs one journaled action to its end (or its deferral), under its service's lock when it is a change."""

    def __init__(
        self,
        journal: ActionJournalPort,
        clock: Clock,
        *,
        planner: preconditions.Planner,
        calls: ActionCalls,
        deferrals: Deferrals,
        aborts: Aborts,
        actions: ActionLog,
        locks: ServiceLocks,
        attempts: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
    ) -> None:
        self.journal = journal
        self.clock = clock
        self.planner = planner
        self.calls = calls
        self.deferrals = deferrals
        self.aborts = aborts
        self.actions = actions
        self.locks = locks
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.max_backoff = max_backoff

    def run(self, key: str, *, retry: bool = False) -> ActionRecord:
        record = self.journal.get_action(key)
        if record is None:
            raise KeyError(f"action {key!r} is not in the journal")
        if record.mutating and not record.dry_run and not record.terminal:
            with self.locks.lock(record.resource):  # the limits check and the start are atomic (ServiceLocks)
                return self._run_unlocked(key, retry)
        return self._run_unlocked(key, retry)

    def _run_unlocked(self, key: str, retry: bool = False) -> ActionRecord:
        record = self.journal.get_action(key)
        assert record is not None
        if record.terminal:
            return record
        if record.dry_run:
            return self.actions.finish(record, ActionStatus.DRY_RUN, {"would": record.request().to_json()}, None)
        if record.status is ActionStatus.DEFERRED and not retry:
            return record  # only retry_deferred runs it again, once its condition is known to still hold
        if record.status in (ActionStatus.PLANNED, ActionStatus.DEFERRED) and record.mutating:
            with self.aborts.guard:  # an abort between the read above and the deferral: it ended the action
                current = self.journal.get_action(key)
                assert current is not None
                if current.terminal:
                    return current
                gated = self.planner.gate(current, confirmed=retry)
                if gated is None and current.plan is None and current.type in preconditions.PLANNED_AT_DECISION:
                    # Its decision's plan never reached the journal (a restart came between them): never planned
                    # from the world now; it waits for an evaluation that finds its condition holding.
                    why = f"no plan from its decision's world; {preconditions.WAITS_FOR_PLAN}"
                    waiting = self.journal.defer(key, self.clock.now(), why)
                    log.warning("%s on %s (%s) %s", record.type.value, record.resource, key, why)
                    self.actions.report(waiting)
                    return waiting
            if gated is not None:
                return self.actions.finish(current, gated[0], None, gated[1])
            deferred = self.deferrals.defer_if_refused(record, self.aborts.guard)
            if deferred is not None:
                return deferred
        with self.aborts.signal_for(key) as signal:
            return self._execute(record, signal)

    def _execute(self, record: ActionRecord, signal: ActionAbort) -> ActionRecord:
        plan = dict(record.plan) if record.plan is not None else None
        if record.status is ActionStatus.STARTED:
            ended = self._resumed(record, signal, plan)
            if ended is not None:
                return ended
        tried = self._attempts(record, signal, plan)
        if isinstance(tried, ActionRecord):
            return tried
        record, outcome, called = tried
        status = preconditions.OUTCOME_STATUS[outcome.status]
        result = outcome.to_json()
        if status in (ActionStatus.SUCCEEDED, ActionStatus.ABORTED) and record.type in _PLANNED:
            result["after"] = self.calls.after(record)
        late = signal.requested()
        if late is not None and status is not ActionStatus.ABORTED:
            # The abort came after the port's last step: the action ended as it would have; said in the result.
            result["detail"]["abort_requested"] = {**late.to_json(), "note": "arrived after the action's last step"}
        if called:
            # The port made one attempt per call; how many calls it took is the dispatcher's to say (the
            # journal's count, so an attempt before a crash counts too).
            result["detail"]["attempts"] = record.attempts
        return self.actions.finish(record, status, result, outcome.error)

    def _resumed(self, record: ActionRecord, signal: ActionAbort, plan: dict[str, Any] | None) -> ActionRecord | None:
        """A resume of a started action (after a restart, or a requeue): its end without a call, when it has one."""
        # An abort journaled since it started ends it here, unrun.
        aborted = signal.requested() or self.journal.abort_requested(record.idempotency_key)
        if aborted is not None:
            return self._finish_aborted(record, aborted, None, resumed=True)
        if plan is not None:
            # The world may already show the planned target (the call went through before the crash).
            shown = self.planner.shows_target(record, plan)
            if shown is not None:
                result = shown.to_json()
                result["after"] = self.calls.after(record)
                result["detail"]["attempts"] = record.attempts
                return self.actions.finish(record, ActionStatus.SUCCEEDED, result, None)
        if record.mutating:
            # Recovered while this process was down, or past the deadline: never run again.
            gone = self.planner.condition_gone(record)
            expired = (
                gone is None
                and record.decision_kind != DecisionKind.RESOLVE.value
                and self.clock.now() > self.planner.deadline(record)
            )
            if gone is not None or expired:
                ended = ActionStatus.EXPIRED if expired else ActionStatus.NO_LONGER_NEEDED
                ran = f"{record.attempts} attempt(s) before a restart; a write sent then, if any, stays"
                summary = {"status": ended.value, "detail": {"ran": ran}, "error": None, "transient": False}
                why = "past its deadline at the resume" if expired else f"{gone} before the resume"
                return self.actions.finish(record, ended, summary, why)
        return None

    def _attempts(
        self, record: ActionRecord, signal: ActionAbort, plan: dict[str, Any] | None
    ) -> ActionRecord | tuple[ActionRecord, ActionOutcome, bool]:
        """Attempt after attempt until one is not a transient failure, or the retries end: the record as started,
        the last outcome and whether the port was called; or the action's end when an abort came first."""
        outcome: ActionOutcome | None = None
        attempt = 0
        called = False
        while True:
            attempt += 1
            if record.type in _PLANNED and plan is None:
                # Fixed once, before the first start, and journaled with it (the state a change replaces; a
                # scale's target count; a restore's target): a resume does the same though the world moved.
                planned = self.planner.plan(record)
                if isinstance(planned, ActionOutcome):
                    outcome = planned
                else:
                    plan = planned
            # Before its first write only (a partial ramp of its own is not a change by someone else).
            first = plan is not None and record.status is not ActionStatus.STARTED
            changed = self.planner.world_changed(record, plan) if first and plan is not None else None
            if changed is not None:  # a change's precondition, read right before its write: nothing written
                outcome = changed
            elif record.type not in _PLANNED or plan is not None:
                started = self._start(record, signal, plan, outcome)
                if started.status is not ActionStatus.STARTED:
                    return started  # aborted before it ran, or between two attempts
                record = started
                self.actions.hook("after-start", record)
                outcome = self.calls.call(record, signal)
                called = True
                self.actions.hook("after-execute", record)
            assert outcome is not None
            if not self._again(record, signal, outcome, attempt):
                return record, outcome, called

    def _start(
        self, record: ActionRecord, signal: ActionAbort, plan: dict[str, Any] | None, last: ActionOutcome | None
    ) -> ActionRecord:
        """Journal the start (attempts+1, with the plan): the record `started`; or, when an abort came first, the
        action's end (never started, nor retried)."""
        with self.aborts.guard:  # an abort and this start never interleave
            current = self.journal.get_action(record.idempotency_key)
            assert current is not None
            if current.terminal:  # aborted before it ran
                return current
            aborted = signal.requested()
            if aborted is None:
                return self.journal.mark_started(record.idempotency_key, self.clock.now(), plan)
        return self._finish_aborted(current, aborted, last, resumed=False)

    def _again(self, record: ActionRecord, signal: ActionAbort, outcome: ActionOutcome, attempt: int) -> bool:
        """After a transient failure, whether to try again; if so, the backoff is waited (an abort cuts it short and
        is found before the next attempt starts)."""
        if outcome.status is not OutcomeStatus.FAILED or not outcome.transient:
            return False
        delay = backoff_delay(attempt, backoff=self.backoff, max_backoff=self.max_backoff)
        if record.mutating:
            # Journaled, each: the attempt's error. A change is tried `attempts` times, and more while its
            # deadline lasts; never once its condition has ended.
            self.journal.record_event(record.idempotency_key, self.clock.now(), preconditions.ATTEMPT_EVENT,
                                      f"attempt {attempt} failed: {outcome.error}")  # fmt: skip
            gone = self.planner.condition_gone(record)
            within = gone is None and self.clock.now() + delay <= self.planner.deadline(record)
            if gone is not None or (attempt >= self.attempts and not within):
                return False
        elif attempt >= self.attempts:
            return False
        log.info(
            "%s %s failed transiently (%s); attempt %d of %d, retrying in %.1fs",
            record.type.value,
            record.idempotency_key,
            outcome.error,
            attempt,
            self.attempts,
            delay,
        )
        signal.hold(delay)
        return True

    def _finish_aborted(
        self, record: ActionRecord, request: AbortRequest, last: ActionOutcome | None, *, resumed: bool
    ) -> ActionRecord:
        """End an action its port did not get to stop: one a restart left started (not resumed), or one between two
        attempts (not retried). The result says what state it left, read now where the dispatcher can read it."""
        detail: dict[str, Any] = {"aborted": request.to_json()}
        if resumed:
            detail["ran"] = "started before a restart; not resumed"
            if record.type is ActionType.ROLLBACK:
                detail["left"] = (
                    "a rollback request sent before the restart stays with the deployer (not undone); its state was "
                    "not read"
                )
        else:
            detail["ran"] = f"{record.attempts} attempt(s); not retried"
            if last is not None:
                detail["last_attempt"] = last.to_json()
        result: dict[str, Any] = {
            "status": ActionStatus.ABORTED.value,
            "detail": detail,
            "error": None,
            "transient": False,
        }
        if record.type in _PLANNED:
            result["after"] = self.calls.after(record)
        error = f"{request.phrase()}; " + ("not resumed after a restart" if resumed else "not retried")
        return self.actions.finish(record, ActionStatus.ABORTED, result, error)
