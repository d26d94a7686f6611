"""The one way actions are executed: journal first, global limits, idempotency, bounded retries.

For each action of a committed decision, in order and independently of the others:

    terminal in the journal  -> returned as is (never run twice)
    dry-run decision         -> recorded `dry_run`, never executed
    mutating and over limits -> recorded `deferred` with the reason (limits counted from the journal,
                                across all policies, per service, so they survive restarts; the cooldown
                                counts only actions of equal or higher precedence: controller/core/limits.py)
    otherwise                -> `started` (attempts+1) is COMMITTED, then the port of its type is called
                                (one attempt), then the result is recorded; the dispatcher alone retries
                                transient failures, with backoff (a mutating action while its deadline
                                lasts), and records the attempts in the result's detail (`attempts`)

Each action type has its port (a table: rollback -> RollbackPort, scale -> ScalePort, ...), and the typed
action the engine rendered (an `ActionRequest`) gives the port its arguments; a port nobody configured is a
"not configured" implementation (controller/core/unconfigured.py) that answers a permanent failure.

A deferred action is not final: after each evaluation of its policy, `retry_deferred` runs it again with the
same key while its condition still holds (a fire: the condition is still firing with the action's decision id;
a recovery: the condition is still recovered), and ends it `suppressed` ("condition resolved while deferred:
<last refusal>") once it does not. Each refusal, the start and the final outcome are journaled as events.

A rollback, scale or shift is planned by `dispatch` (on the deciding evaluation's thread, before anything is
queued) from the world its decision saw, with a deadline; a resume never plans it, and before its first start it
ends `expired` past the deadline or `no-longer-needed` once its condition ended; a port that finds the plan's
precondition broken right before its write answers `world-changed` (controller/loop/preconditions.py).
Every mutating action journals its PLAN before its first start, before the port is called (a rollback: service,
from-revision, to-revision; a traffic shift: the weights it replaces and its target; a scale: the HPA state it
replaces and its target count; a restore: per kind its target and expected state). The plan is fixed once: a
resume never computes a new target. A process that dies between `started` and the result leaves the action
`started`; `resume()` runs it again with the same idempotency key and the journaled plan, so the port acts
against the world: "the system already shows the planned target" is done, a state that is neither the plan's
start nor its target was changed by someone else (never overwritten), and an actuator with keys (the tier, the
routes, the HPA) answers a repeated key with its first answer instead of acting twice.

An operator's abort of a decision (`abort`, `tailguard abort DECISION`) ends its planned and deferred actions
`aborted` (they never run, nor after a restart) and tells a started one through its AbortSignal, passed into the
port call: a port that works in steps (a traffic ramp, an Argo CD sync wait) stops before its next step and answers
ABORTED with what it left. An aborted action is never retried; an abort in a retry backoff ends it there; a resume
of a started action whose abort is journaled ends it `aborted` without calling the port.

With `workers=True` (the running controller) actions run on per-lane worker threads, outside the evaluation
that decided them: `dispatch`, `resume` and `retry_deferred` journal and queue, and return at once (what they
return is the journal's record as queued; each result reaches `on_action`). A lane is a service (the resource
of a decision's first mutating action; all of a decision's actions run in order on it), or a policy for
decisions without a mutating action. A rollback waiting on a sync therefore holds neither its policy's
evaluations nor another service's actions; per-service serialisation stays the service lock of `_run`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from controller.core import limits
from controller.core.actions import (
    MUTATING_ACTIONS,
    ActionRecord,
    ActionRequest,
    ActionStatus,
    ActionType,
    AnnotateAction,
    NotifyAction,
    RenderedRollback,
    RenderedScale,
    ShiftTrafficAction,
)
from controller.core.controls import AbortRequest, AbortResult, AbortState
from controller.core.engine import PolicyState
from controller.core.model import Decision, DecisionKind
from controller.core.policy import Duration
from controller.core.ports import (
    ActionJournalPort,
    ActionOutcome,
    Annotation,
    Annotator,
    Clock,
    Notifier,
    OutcomeStatus,
    RollbackPort,
    ScaleLimitsPort,
    ScalePort,
    TrafficRouter,
)
from controller.core.unconfigured import (
    UnconfiguredAnnotator,
    UnconfiguredNotifier,
    UnconfiguredRollback,
    UnconfiguredRouter,
    UnconfiguredScale,
)
from controller.kit.http import backoff_delay
from controller.loop import preconditions, restore
from controller.loop.ports import WakeableClock
from controller.loop.preconditions import Deferral, deferred_verdict
from controller.loop.workers import ActionLanes

log = logging.getLogger(__name__)

# Action types planned (and the plan journaled) before their first start: every mutating action (the changes
# journal what they replace and their target, a rollback its from- and to-revision): controller/loop/preconditions.py.
_PLANNED = preconditions.PLANNED

# Statuses that count against the global limits: the change happened, or may have (outcome unknown).
# An aborted action that had started counts too (`actions_since` lists started ones only): it may have written a step.
LIMITED_STATUSES = frozenset({ActionStatus.STARTED, ActionStatus.SUCCEEDED, ActionStatus.ABORTED})


class GlobalLimits(BaseModel):
    """Cooldown and budget per service across ALL policies (the `limits` block of the controller config)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    cooldown: Duration = Field(default=0.0, description="minimum time between mutating actions on one service")
    maxActionsPerHour: int | None = Field(
        default=None, ge=0, description="mutating actions per service in any hour, all policies together"
    )
    precedence: tuple[ActionType, ...] = Field(
        default=tuple(ActionType(name) for name in limits.DEFAULT_PRECEDENCE),
        description="mutating action types, highest first: the cooldown holds an action back only for recent "
        "actions of equal or higher precedence on the same service (a type not listed ranks last)",
    )

    @field_validator("precedence")
    @classmethod
    def _mutating_once(cls, value: tuple[ActionType, ...]) -> tuple[ActionType, ...]:
        for action_type in value:
            if action_type not in MUTATING_ACTIONS:
                raise ValueError(f"{action_type.value!r} is not a mutating action type; the limits never hold it")
        if len(set(value)) != len(value):
            raise ValueError("precedence names an action type twice")
        return value


@dataclass(frozen=True)
class Actuators:
    """One port per action type; a port left out is its "not configured" implementation."""

    rollback: RollbackPort = field(default_factory=UnconfiguredRollback)
    scale: ScalePort = field(default_factory=UnconfiguredScale)
    router: TrafficRouter = field(default_factory=UnconfiguredRouter)
    annotator: Annotator = field(default_factory=UnconfiguredAnnotator)
    notifier: Notifier = field(default_factory=UnconfiguredNotifier)
    # A scale's `ceiling` and `metricTargets` (an HPA's maxReplicas and metric targets): the HPA scaler, or None.
    limits: ScaleLimitsPort | None = None


class ActionAbort:
    """The AbortSignal (controller/core/ports/outcomes.py) of one action: `Dispatcher.abort` sets it, the action's
    port asks it between steps. Its hold is the clock's sleep, cut short when an abort arrives (a WakeableClock)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._event = threading.Event()
        self._request: AbortRequest | None = None

    def set(self, request: AbortRequest) -> None:
        if self._request is None:  # the first abort is the one that stopped it
            self._request = request
        self._event.set()

    def requested(self) -> AbortRequest | None:
        return self._request

    def hold(self, seconds: float) -> AbortRequest | None:
        if self._request is not None:
            return self._request
        if isinstance(self._clock, WakeableClock):
            self._clock.sleep_unless(seconds, self._event)
        else:
            self._clock.sleep(seconds)
        return self._request


class Dispatcher:
    def __init__(
        self,
        journal: ActionJournalPort,
        actuators: Actuators,
        clock: Clock,
        limits: GlobalLimits,
        on_action: Callable[[ActionRecord], None] | None = None,
        crash_hook: Callable[[str, ActionRecord], None] | None = None,
        *,
        attempts: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        links_for: Callable[[Mapping[str, Any]], Mapping[str, str]] | None = None,
        workers: bool = False,
        may_act: Callable[[], bool] | None = None,
        may_act_for: Callable[[str], bool] | None = None,
        deadline_for: Callable[[str], float | None] | None = None,
        on_planned: Callable[[str], object] | None = None,
    ) -> None:
        self.journal = journal
        self.actuators = actuators
        self.clock = clock
        self.limits = limits
        self.on_action = on_action
        self.crash_hook = crash_hook
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.links_for = links_for
        # Background mode: actions run on per-lane workers (see the module docstring); `may_act` is asked before
        # each one runs (the leader's Lease: a replica that lost it leaves the action in the journal).
        self._lanes: ActionLanes | None = ActionLanes() if workers else None
        self.may_act = may_act
        # With sharded leader election: asked with the action's policy (its shard's Lease), in both modes.
        self.may_act_for = may_act_for
        self._locks_guard = threading.Lock()
        self._service_locks: dict[str, threading.Lock] = {}
        # Aborts: the signal of each action started in this process (by key), and the guard that makes an abort and
        # a start (or a deferral) of the same action happen one after the other, never interleaved.
        self._abort_guard = threading.Lock()
        self._signals: dict[str, ActionAbort] = {}
        # Plans, preconditions and deadlines (controller/loop/preconditions.py); `deadline_for(policy)` is the
        # policy's limits.actionDeadline in seconds (None: the fallback).
        # Called with the policy once a decision's plans are journaled (the leader publishes them in its Lease for a
        # successor to adopt: controller/loop/adoption.py).
        self.on_planned = on_planned
        self.planner = preconditions.Planner(
            journal,
            lambda: self.actuators.rollback,
            lambda: self.actuators.scale,
            lambda: self.actuators.router,
            clock,
            deadline_for,
        )
        # action type -> the call of its port
        self._ports: dict[ActionType, Callable[[ActionRecord, ActionRequest, ActionAbort], ActionOutcome]] = {
            ActionType.ROLLBACK: self._rollback,
            ActionType.SCALE: self._scale,
            ActionType.SHIFT_TRAFFIC: self._shift_traffic,
            ActionType.RESTORE: self._restore,
            ActionType.ANNOTATE: self._annotate,
            ActionType.NOTIFY: self._notify,
        }

    # -- public ---------------------------------------------------------------------------------------------

    def dispatch(self, decision: Decision) -> list[ActionRecord]:
        """Run the actions of a decision (journaling it first if the caller has not). With workers: queue them on
        the decision's lane and return [] (the results reach `on_action`)."""
        if not decision.actions:
            return []
        # Idempotent: rows already committed by commit_evaluation are kept as they are.
        self.journal.record_decision(decision, self.clock.now())
        keys = [action.idempotency_key for action in decision.actions]
        planned = [self._plan_now(key) for key in keys]  # from the world this decision saw, before anything is queued
        if any(planned) and self.on_planned is not None:
            self.on_planned(decision.policy)
        if self._lanes is None:
            return [self._run(key) for key in keys]
        records = [record for key in keys if (record := self.journal.get_action(key)) is not None]
        lane = _lane(records, decision.policy)
        for key in keys:
            self._submit(lane, key)
        return []

    def resume(self) -> list[ActionRecord]:
        """At start-up (or when leading again): finish what was left planned or started, with the original keys
        and the journaled plans. With workers: queue them (each on its decision's lane) and return []."""
        pending = self.journal.pending_actions()
        if pending:
            log.info("resuming %d unfinished action(s)", len(pending))
        if self._lanes is None:
            return [self._run(record.idempotency_key) for record in pending if self._may_act_for(record.policy)]
        for record in pending:
            siblings = [
                other
                for other in self.journal.actions_for(record.decision_id)
                if other.decision_kind == record.decision_kind
            ]
            self._submit(_lane(siblings or [record], record.policy), record.idempotency_key)
        return []

    def abort(self, request: AbortRequest) -> AbortResult:
        """Stop the actions of `request.decision_id` (`tailguard abort`): each planned or deferred one ends `aborted`
        at once and never runs (nor after a restart); a started one is told through its AbortSignal and stops at its
        next step (a ramp before its next weight step, an Argo CD wait at its next poll), its outcome saying what it
        left; a started one a restart left behind ends `aborted` when resumed, without acting. Never a retry."""
        decision_id = request.decision_id
        with self._abort_guard:
            before = self.journal.actions_for(decision_id)
            if not before:
                return AbortResult(
                    decision_id,
                    AbortState.UNKNOWN,
                    f"no action of decision {decision_id!r} is in the journal (an unknown id, or a decision that "
                    "acted on nothing)",
                )
            if all(record.terminal for record in before):
                ended = ", ".join(f"{record.type.value} {record.status.value}" for record in before)
                return AbortResult(
                    decision_id,
                    AbortState.FINISHED,
                    f"decision {decision_id!r} has already finished ({ended}); nothing to abort",
                    tuple(_brief(record) for record in before),
                )
            after = self.journal.abort_actions(request, self.clock.now())
            running = [record for record in after if record.status is ActionStatus.STARTED]
            for record in running:
                self._signals.setdefault(record.idempotency_key, ActionAbort(self.clock)).set(request)
        was_open = {record.idempotency_key for record in before if not record.terminal}
        cancelled = [r for r in after if r.idempotency_key in was_open and r.status is ActionStatus.ABORTED]
        for record in cancelled:
            log.warning("%s on %s aborted before it ran (%s): %s", record.type.value, record.resource,
                        record.idempotency_key, request.phrase())  # fmt: skip
            self._report(record)
        actions = tuple(_brief(record) for record in after)
        if running:
            names = ", ".join(f"{record.type.value} on {record.resource}" for record in running)
            log.warning("abort of %s: %s in flight, stops at its next step (%s)", decision_id, names, request.phrase())
            return AbortResult(
                decision_id,
                AbortState.IN_FLIGHT,
                f"{names} in flight: stops at its next step (its outcome will say what it left in place); "
                f"{len(cancelled)} queued or deferred action(s) cancelled",
                actions,
            )
        return AbortResult(
            decision_id,
            AbortState.CANCELLED,
            f"{len(cancelled)} queued or deferred action(s) cancelled before they ran",
            actions,
        )

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no action is queued or running on the workers (always True without workers)."""
        return self._lanes.wait_idle(timeout) if self._lanes is not None else True

    def close(self, timeout: float = 30.0) -> bool:
        """Stop the workers: queued actions stay in the journal (resumed by the next process), running ones finish
        or are cut short by the clock's interrupt. False when one still runs after `timeout`."""
        return self._lanes.close(timeout) if self._lanes is not None else True

    def _submit(self, lane: str, key: str, *, retry: bool = False) -> None:
        assert self._lanes is not None
        self._lanes.submit(lane, key, lambda: self._job(key, retry))

    def _job(self, key: str, retry: bool) -> None:
        if self.may_act is not None and not self.may_act():
            log.warning("not acting on %s: this replica does not hold the leader lease; it stays in the journal", key)
            return
        if self.may_act_for is not None:
            record = self.journal.get_action(key)
            if record is not None and not self._may_act_for(record.policy):
                return
        self._run(key, retry=retry)

    def _may_act_for(self, policy: str) -> bool:
        if self.may_act_for is None or self.may_act_for(policy):
            return True
        log.warning("not acting for policy %s: this replica does not hold its shard's lease; it stays in the journal",
                    policy)  # fmt: skip
        return False

    def retry_deferred(self, policy: str, state: PolicyState | None) -> list[ActionRecord]:
        """After an evaluation of `policy` committed `state` (None: the policy is no longer loaded): each of its
        deferred actions runs again with its key when its condition still holds (the limits are checked again:
        a refusal defers it once more), waits when a recovery's condition is breaching again without firing,
        and ends `suppressed` with why otherwise."""
        out: list[ActionRecord] = []
        for record in self.journal.deferred_actions(policy):
            decision = self.journal.decision(record.decision_id, record.decision_kind)
            verdict, why = deferred_verdict(state, decision)
            if verdict is Deferral.RETRY:
                # The world has moved since the decision: planned again from what this evaluation sees.
                self._plan_now(record.idempotency_key, again=True)
                if self._lanes is not None:
                    self._submit(record.resource, record.idempotency_key, retry=True)
                else:
                    out.append(self._run(record.idempotency_key, retry=True))
            elif verdict is Deferral.END:
                if self._lanes is not None:
                    # On the service's lane: the service lock may be held by a long action there.
                    key = record.idempotency_key
                    self._lanes.submit(record.resource, key, partial(self._end_deferred, key, why))
                    continue
                ended = self._end_deferred(record.idempotency_key, why)
                if ended is not None:
                    out.append(ended)
        return out

    def _plan_now(self, key: str, *, again: bool = False) -> bool:
        """Plan a mutating action from the world now, on the deciding evaluation's thread, and journal the plan
        (with its precondition and deadline) before it is queued. A transient failure to read the world leaves it
        deferred until an evaluation finds its condition holding; another one ends it (failed, skipped)."""
        record = self.journal.get_action(key)
        if (
            record is None
            or record.dry_run
            or record.type not in preconditions.PLANNED_AT_DECISION
            or record.status not in (ActionStatus.PLANNED, ActionStatus.DEFERRED)
            or (record.plan is not None and not again)
        ):
            return False
        # Reads only, and no service lock: a long action on the service's lane must not hold up an evaluation.
        planned = self.planner.plan(record)
        with self._abort_guard:
            current = self.journal.get_action(key)
            if current is None or current.status not in (ActionStatus.PLANNED, ActionStatus.DEFERRED):
                return False  # aborted (or run) meanwhile
            if not isinstance(planned, ActionOutcome):
                self._hook("after-plan", self.journal.set_plan(key, planned, self.clock.now()))
                return True
            if planned.status is OutcomeStatus.FAILED and planned.transient:
                why = f"not planned ({planned.error}); {preconditions.WAITS_FOR_PLAN}"
                self._report(self.journal.defer(key, self.clock.now(), why))
                return False
        status = preconditions.OUTCOME_STATUS[planned.status]
        self._finish(current, status, planned.to_json(), planned.error)
        return False

    def _end_deferred(self, key: str, why: str) -> ActionRecord | None:
        record = self.journal.get_action(key)
        if record is None:
            return None
        with self._service_lock(record.resource):
            current = self.journal.get_action(key)
            if current is None or current.status is not ActionStatus.DEFERRED:
                return None
            # One that waited for a plan never had one: its condition ended before it was needed.
            waited = preconditions.WAITS_FOR_PLAN in (current.error or "")
            ended = ActionStatus.NO_LONGER_NEEDED if waited else ActionStatus.SUPPRESSED
            return self._finish(current, ended, None, f"{why} while deferred: {current.error}")

    def deferred_policies(self) -> set[str]:
        return {record.policy for record in self.journal.deferred_actions()}

    # -- one action ---------------------------------------------------------------------------------------

    def _run(self, key: str, *, retry: bool = False) -> ActionRecord:
        record = self.journal.get_action(key)
        if record is None:
            raise KeyError(f"action {key!r} is not in the journal")
        if record.mutating and not record.dry_run and not record.terminal:
            # One lock per service across all policies (they evaluate on separate threads): the limits check
            # and the start of a mutating action are atomic, and two changes to one service never interleave.
            # Per service, not global: a slow change (a traffic ramp holding between steps) on one service
            # must not delay a rollback of another.
            with self._service_lock(record.resource):
                return self._run_unlocked(key, retry)
        return self._run_unlocked(key, retry)

    def _service_lock(self, resource: str) -> threading.Lock:
        with self._locks_guard:
            return self._service_locks.setdefault(resource, threading.Lock())

    def _run_unlocked(self, key: str, retry: bool = False) -> ActionRecord:
        record = self.journal.get_action(key)
        assert record is not None
        if record.terminal:
            return record
        if record.dry_run:
            return self._finish(record, ActionStatus.DRY_RUN, {"would": record.request().to_json()}, None)
        if record.status is ActionStatus.DEFERRED and not retry:
            return record  # only retry_deferred runs it again, once its condition is known to still hold
        if record.status in (ActionStatus.PLANNED, ActionStatus.DEFERRED) and record.mutating:
            with self._abort_guard:  # an abort between the read above and the deferral: it ended the action
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
                    self._report(waiting)
                    return waiting
            if gated is not None:
                return self._finish(current, gated[0], None, gated[1])
            with self._abort_guard:
                block = self._limits_block(record)
                deferred = self.journal.defer(key, self.clock.now(), block) if block is not None else None
            if deferred is not None:
                log.warning("deferred %s on %s (%s): %s", record.type.value, record.resource, key, block)
                self._report(deferred)
                return deferred
        return self._execute(record)

    def _execute(self, record: ActionRecord) -> ActionRecord:
        key = record.idempotency_key
        with self._abort_guard:
            signal = self._signals.setdefault(key, ActionAbort(self.clock))
        try:
            return self._execute_with(record, signal)
        finally:
            with self._abort_guard:
                self._signals.pop(key, None)

    def _execute_with(self, record: ActionRecord, signal: ActionAbort) -> ActionRecord:  # noqa: PLR0915 - issue 26 item 3
        plan = dict(record.plan) if record.plan is not None else None
        if record.status is ActionStatus.STARTED:
            # A resume (after a restart, or a requeue): an abort journaled since it started ends it here, unrun.
            aborted = signal.requested() or self.journal.abort_requested(record.idempotency_key)
            if aborted is not None:
                return self._finish_aborted(record, aborted, None, resumed=True)
        if record.status is ActionStatus.STARTED and plan is not None:
            # A resume: the world may already show the planned target (the call went through before the crash).
            shown = self.planner.shows_target(record, plan)
            if shown is not None:
                result = shown.to_json()
                result["after"] = restore.after_state(record, self.actuators.router, self.actuators.scale)
                result["detail"]["attempts"] = record.attempts
                return self._finish(record, ActionStatus.SUCCEEDED, result, None)
        if record.status is ActionStatus.STARTED and record.mutating:
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
                return self._finish(record, ended, summary, why)
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
                with self._abort_guard:  # an abort and this start never interleave
                    current = self.journal.get_action(record.idempotency_key)
                    assert current is not None
                    if current.terminal:  # aborted before it ran
                        return current
                    aborted = signal.requested()
                    if aborted is None:
                        record = self.journal.mark_started(record.idempotency_key, self.clock.now(), plan)
                if aborted is not None:  # between two attempts: never retried
                    return self._finish_aborted(current, aborted, outcome, resumed=False)
                self._hook("after-start", record)
                outcome = self._call(record, signal)
                called = True
                self._hook("after-execute", record)
            assert outcome is not None
            if outcome.status is not OutcomeStatus.FAILED or not outcome.transient:
                break
            delay = self._delay(attempt)
            if record.mutating:
                # Journaled, each: the attempt's error. A change is tried `attempts` times, and more while its
                # deadline lasts; never once its condition has ended.
                self.journal.record_event(record.idempotency_key, self.clock.now(), preconditions.ATTEMPT_EVENT,
                                          f"attempt {attempt} failed: {outcome.error}")  # fmt: skip
                gone = self.planner.condition_gone(record)
                within = gone is None and self.clock.now() + delay <= self.planner.deadline(record)
                if gone is not None or (attempt >= self.attempts and not within):
                    break
            elif attempt >= self.attempts:
                break
            log.info(
                "%s %s failed transiently (%s); attempt %d of %d, retrying in %.1fs",
                record.type.value,
                record.idempotency_key,
                outcome.error,
                attempt,
                self.attempts,
                delay,
            )
            signal.hold(delay)  # an abort during the backoff is found before the next attempt starts
        assert outcome is not None
        status = preconditions.OUTCOME_STATUS[outcome.status]
        result = outcome.to_json()
        if status in (ActionStatus.SUCCEEDED, ActionStatus.ABORTED) and record.type in _PLANNED:
            result["after"] = restore.after_state(record, self.actuators.router, self.actuators.scale)
        late = signal.requested()
        if late is not None and status is not ActionStatus.ABORTED:
            # The abort came after the port's last step: the action ended as it would have; said in the result.
            result["detail"]["abort_requested"] = {**late.to_json(), "note": "arrived after the action's last step"}
        if called:
            # The port made one attempt per call; how many calls it took is the dispatcher's to say (the
            # journal's count, so an attempt before a crash counts too).
            result["detail"]["attempts"] = record.attempts
        return self._finish(record, status, result, outcome.error)

    def _delay(self, attempt: int) -> float:
        return backoff_delay(attempt, backoff=self.backoff, max_backoff=self.max_backoff)

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
            result["after"] = restore.after_state(record, self.actuators.router, self.actuators.scale)
        error = f"{request.phrase()}; " + ("not resumed after a restart" if resumed else "not retried")
        return self._finish(record, ActionStatus.ABORTED, result, error)

    def _hook(self, point: str, record: ActionRecord) -> None:
        if self.crash_hook is not None:
            self.crash_hook(point, record)

    def _finish(
        self, record: ActionRecord, status: ActionStatus, result: Mapping[str, Any] | None, error: str | None
    ) -> ActionRecord:
        finished = self.journal.finish(record.idempotency_key, status, self.clock.now(), result=result, error=error)
        if status in (ActionStatus.FAILED, ActionStatus.SUPPRESSED, ActionStatus.ABORTED):
            log.warning(
                "%s %s on %s: %s (%s)",
                record.type.value,
                status.value,
                record.resource,
                error,
                record.idempotency_key,
            )
        else:
            log.info("%s %s on %s (%s)", record.type.value, status.value, record.resource, record.idempotency_key)
        self._report(finished)
        return finished

    def _report(self, record: ActionRecord) -> None:
        if self.on_action is not None:
            try:
                self.on_action(record)
            except Exception:
                log.exception("on_action callback failed for %s", record.idempotency_key)

    # -- limits ---------------------------------------------------------------------------------------------

    def _limits_block(self, record: ActionRecord) -> str | None:
        """The global limits' refusal of `record` now (controller/core/limits.py decides), or None."""
        now = self.clock.now()
        previous = [
            limits.PastAction(
                other.type.value, other.started_at or 0.0, other.policy, f"{other.decision_id}:{other.decision_kind}"
            )
            for other in self.journal.actions_since(record.resource, now - limits.retention(self.limits.cooldown))
            if other.idempotency_key != record.idempotency_key and other.status in LIMITED_STATUSES
        ]
        refusal = limits.global_refusal(
            record.type.value,
            f"{record.decision_id}:{record.decision_kind}",
            previous,
            now,
            service=record.resource,
            cooldown=self.limits.cooldown,
            max_actions=self.limits.maxActionsPerHour,
            precedence=[action_type.value for action_type in self.limits.precedence],
        )
        return refusal.reason if refusal is not None else None

    # -- ports --------------------------------------------------------------------------------------------

    def _call(self, record: ActionRecord, signal: ActionAbort) -> ActionOutcome:
        """One attempt: the port of the action's type, with the typed action's fields as its arguments (and the
        action's abort signal, which the ports that work in steps ask between steps)."""
        try:
            return self._ports[record.type](record, record.request(), signal)
        except AttributeError as exc:
            if exc.name is None:
                raise
            return ActionOutcome(
                OutcomeStatus.FAILED, {}, f"{record.type.value} action lacks parameter {exc.name!r}", False
            )
        except Exception as exc:  # noqa: BLE001
            # Ports return outcomes for expected failures; anything raised is a bug or an outage.
            transient = bool(getattr(exc, "transient", isinstance(exc, (ConnectionError, TimeoutError))))
            return ActionOutcome(OutcomeStatus.FAILED, {}, f"{type(exc).__name__}: {exc}", transient)

    def _rollback(self, record: ActionRecord, request: ActionRequest, abort: ActionAbort) -> ActionOutcome:
        action = request.action
        assert isinstance(action, RenderedRollback)
        # The plan journaled before the first start (from- and to-revision): a resume acts on the same one.
        return self.actuators.rollback.rollback(
            action.service,
            idempotency_key=request.idempotency_key,
            rollout_revision=action.rollout_revision,
            plan=record.plan,
            abort=abort,
        )

    def _scale(self, record: ActionRecord, request: ActionRequest, abort: ActionAbort) -> ActionOutcome:
        assert isinstance(request.action, RenderedScale) and record.plan is not None
        # The count planned (and journaled) before the first start, so a resume asks for the same one.
        service, plan, key = str(record.plan["service"]), record.plan, request.idempotency_key
        floor = None
        if plan.get("desired") is not None:
            floor = self.actuators.scale.set_replicas(service, int(plan["desired"]), idempotency_key=key)
            if not plan.get("limits") or floor.status is OutcomeStatus.FAILED:
                return floor
        limits = plan["limits"]
        if self.actuators.limits is None:
            if floor is not None:
                # No HPA scales this service (the local tier): its count moved, and there is no ceiling or
                # metric target to set; said in the outcome.
                note = "no HPA actuator: ceiling and metricTargets not applied"
                return ActionOutcome(floor.status, {**floor.detail, "limits": note}, floor.error, floor.transient)
            error = f"scale of {service!r}: ceiling and metricTargets need an HPA (a `kubernetes.hpa` section)"
            return ActionOutcome(OutcomeStatus.FAILED, {"limits": limits}, error, False)
        # Its own key: the HPA records each key once, and the floor's call already recorded this action's.
        hpa = self.actuators.limits.set_limits(
            service,
            max_replicas=limits.get("maxReplicas"),
            metric_targets=limits.get("metrics") or {},
            idempotency_key=f"{key}#limits",
        )
        if floor is None:
            return hpa
        statuses = {floor.status, hpa.status}
        status = (
            hpa.status
            if hpa.status is OutcomeStatus.FAILED
            else (OutcomeStatus.SKIPPED if statuses == {OutcomeStatus.SKIPPED} else OutcomeStatus.SUCCEEDED)
        )
        detail = {"floor": dict(floor.detail), "limits": dict(hpa.detail)}
        return ActionOutcome(status, detail, hpa.error, hpa.transient)

    def _shift_traffic(self, record: ActionRecord, request: ActionRequest, abort: ActionAbort) -> ActionOutcome:
        action = request.action
        assert isinstance(action, ShiftTrafficAction)
        return self.actuators.router.set_weight(
            action.service, action.version, int(action.weight), idempotency_key=request.idempotency_key, abort=abort
        )

    def _restore(self, record: ActionRecord, request: ActionRequest, abort: ActionAbort) -> ActionOutcome:
        assert record.plan is not None
        # The plan journaled before the first start: per state the incident changed, its target and expected state.
        router, scale = self.actuators.router, self.actuators.scale
        return restore.run_restore(record.plan, router, scale, idempotency_key=request.idempotency_key, abort=abort)

    def _annotate(self, record: ActionRecord, request: ActionRequest, abort: ActionAbort) -> ActionOutcome:
        assert isinstance(request.action, AnnotateAction)
        return self.actuators.annotator.annotate(
            self._annotation(record, request.action), idempotency_key=request.idempotency_key
        )

    def _notify(self, record: ActionRecord, request: ActionRequest, abort: ActionAbort) -> ActionOutcome:
        action = request.action
        assert isinstance(action, NotifyAction)
        return self.actuators.notifier.notify(
            action.receiver, self._payload(record, action), idempotency_key=request.idempotency_key
        )

    def _decision(self, record: ActionRecord) -> dict[str, Any]:
        return self.journal.decision(record.decision_id, record.decision_kind) or {
            "id": record.decision_id,
            "kind": record.decision_kind,
            "policy": record.policy,
        }

    def _annotation(self, record: ActionRecord, action: AnnotateAction) -> Annotation:
        decision = self._decision(record)
        at = float(decision.get("at") or self.clock.now())
        start, end = at, None
        if record.decision_kind == "resolve":
            # A region from the onset (or the firing) to the recovery.
            start = float(decision.get("onset") or decision.get("fired_at") or at)
            end = float(decision.get("resolved_at") or at)
        labels = {str(k): str(v) for k, v in (decision.get("target") or {}).items()}
        tags = [str(tag) for tag in action.tags]
        extra = [f"policy:{record.policy}", f"decision:{record.decision_kind}"]
        text = action.text
        if record.decision_kind == "resolve":
            # A restore of this recovery that found the object changed by a human: the text says what it found.
            text = restore.truthful_annotation(self.journal.actions_for(record.decision_id), record, text)
        return Annotation(
            time=start,
            time_end=end,
            text=text,
            tags=[*tags, *extra],
            decision_id=record.decision_id,
            labels=labels,
        )

    def _payload(self, record: ActionRecord, action: NotifyAction) -> dict[str, Any]:
        decision = self._decision(record)
        actions = [
            other.to_json()
            for other in self.journal.actions_for(record.decision_id)
            if other.decision_kind == record.decision_kind
        ]
        return {
            "message": action.message,
            "decision": decision,
            "evidence": decision.get("evidence", []),
            "actions": actions,
            "links": dict(self.links_for(decision)) if self.links_for is not None else {},
        }


def _brief(record: ActionRecord) -> dict[str, Any]:
    """An action as an abort's answer lists it."""
    return {
        "idempotency_key": record.idempotency_key,
        "type": record.type.value,
        "resource": record.resource,
        "status": record.status.value,
        "error": record.error,
    }


def _lane(records: Sequence[ActionRecord], policy: str) -> str:
    """The lane of a decision's actions: the resource of its first mutating action, else its policy's."""
    for record in records:
        if record.mutating and not record.dry_run:
            return record.resource
    return f"policy:{policy}"
