"""The one way actions are executed: journal first, global limits, idempotency, bounded retries.

The Dispatcher is the face of three parts, each its own module and class, wired here (none holds another to reach
a fourth, none hands itself to another):

    planning          controller/loop/decision_planning.py   DecisionPlanning (and preconditions.Planner)
    deferral, abort   controller/loop/deferral.py            GlobalLimits, Deferrals
                      controller/loop/aborts.py              ActionAbort, Aborts
    execution         controller/loop/execution.py           ActionRunner (one action, its retries)
                      controller/loop/action_calls.py        Actuators, ActionCalls (the port of each type)

and what they share (controller/loop/action_log.py: an action's end, journaled and reported; the service locks).

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
"not configured" implementation (controller/core/unconfigured.py) that answers a permanent failure
(controller/loop/action_calls.py).

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
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from tailguard.controller.core.actions import ActionRecord
from tailguard.controller.core.controls import AbortRequest, AbortResult
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.model import Decision
from tailguard.controller.core.ports import ActionJournalPort, Clock
from tailguard.controller.loop import preconditions
from tailguard.controller.loop.aborts import Aborts, ActionAbort
from tailguard.controller.loop.action_calls import ActionCalls, Actuators
from tailguard.controller.loop.action_log import ActionLog, ServiceLocks
from tailguard.controller.loop.decision_planning import DecisionPlanning
from tailguard.controller.loop.deferral import LIMITED_STATUSES, Deferrals, GlobalLimits
from tailguard.controller.loop.execution import ActionRunner
from tailguard.controller.loop.preconditions import Deferral, deferred_verdict
from tailguard.controller.loop.workers import ActionLanes

# Re-exported: where the app, the backtest, the lab and the tests have always found them.
__all__ = ["LIMITED_STATUSES", "ActionAbort", "Actuators", "Dispatcher", "GlobalLimits"]

log = logging.getLogger(__name__)


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
        # Background mode: actions run on per-lane workers (see the module docstring); `may_act` is asked before
        # each one runs (the leader's Lease: a replica that lost it leaves the action in the journal).
        self._lanes: ActionLanes | None = ActionLanes() if workers else None
        self.may_act = may_act
        # With sharded leader election: asked with the action's policy (its shard's Lease), in both modes.
        self.may_act_for = may_act_for
        # Called with the policy once a decision's plans are journaled (the leader publishes them in its Lease for a
        # successor to adopt: controller/loop/adoption.py).
        self.on_planned = on_planned
        # Plans, preconditions and deadlines (controller/loop/preconditions.py); `deadline_for(policy)` is the
        # policy's limits.actionDeadline in seconds (None: the fallback).
        self.planner = preconditions.Planner(
            journal, lambda: actuators.rollback, lambda: actuators.scale, lambda: actuators.router, clock, deadline_for
        )
        actions = ActionLog(journal, clock, on_action, crash_hook)
        locks = ServiceLocks()
        self._aborts = Aborts(journal, clock, actions)
        self._planning = DecisionPlanning(journal, clock, self.planner, actions, self._aborts.guard)
        self._deferrals = Deferrals(journal, clock, limits, actions, locks)
        self._runner = ActionRunner(
            journal,
            clock,
            planner=self.planner,
            calls=ActionCalls(journal, actuators, clock, links_for),
            deferrals=self._deferrals,
            aborts=self._aborts,
            actions=actions,
            locks=locks,
            attempts=attempts,
            backoff=backoff,
            max_backoff=max_backoff,
        )

    # -- public ---------------------------------------------------------------------------------------------

    def dispatch(self, decision: Decision) -> list[ActionRecord]:
        """Run the actions of a decision (journaling it first if the caller has not). With workers: queue them on
        the decision's lane and return [] (the results reach `on_action`)."""
        if not decision.actions:
            return []
        # Idempotent: rows already committed by commit_evaluation are kept as they are.
        self.journal.record_decision(decision, self.clock.now())
        keys = [action.idempotency_key for action in decision.actions]
        # from the world this decision saw, before anything is queued
        planned = [self._planning.plan_now(key) for key in keys]
        if any(planned) and self.on_planned is not None:
            self.on_planned(decision.policy)
        if self._lanes is None:
            return [self._runner.run(key) for key in keys]
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
            return [self._runner.run(record.idempotency_key) for record in pending if self._may_act_for(record.policy)]
        for record in pending:
            siblings = [
                other
                for other in self.journal.actions_for(record.decision_id)
                if other.decision_kind == record.decision_kind
            ]
            self._submit(_lane(siblings or [record], record.policy), record.idempotency_key)
        return []

    def abort(self, request: AbortRequest) -> AbortResult:
        """Stop the actions of `request.decision_id` (`tailguard abort`; controller/loop/aborts.py)."""
        return self._aborts.abort(request)

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
                self._planning.plan_now(record.idempotency_key, again=True)
                if self._lanes is not None:
                    self._submit(record.resource, record.idempotency_key, retry=True)
                else:
                    out.append(self._runner.run(record.idempotency_key, retry=True))
            elif verdict is Deferral.END:
                if self._lanes is not None:
                    # On the service's lane: the service lock may be held by a long action there.
                    key = record.idempotency_key
                    self._lanes.submit(record.resource, key, partial(self._deferrals.end, key, why))
                    continue
                ended = self._deferrals.end(record.idempotency_key, why)
                if ended is not None:
                    out.append(ended)
        return out

    def deferred_policies(self) -> set[str]:
        return self._deferrals.policies()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no action is queued or running on the workers (always True without workers)."""
        return self._lanes.wait_idle(timeout) if self._lanes is not None else True

    def close(self, timeout: float = 30.0) -> bool:
        """Stop the workers: queued actions stay in the journal (resumed by the next process), running ones finish
        or are cut short by the clock's interrupt. False when one still runs after `timeout`."""
        return self._lanes.close(timeout) if self._lanes is not None else True

    # -- the workers ----------------------------------------------------------------------------------------

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
        self._runner.run(key, retry=retry)

    def _may_act_for(self, policy: str) -> bool:
        if self.may_act_for is None or self.may_act_for(policy):
            return True
        log.warning("not acting for policy %s: this replica does not hold its shard's lease; it stays in the journal",
                    policy)  # fmt: skip
        return False


def _lane(records: Sequence[ActionRecord], policy: str) -> str:
    """The lane of a decision's actions: the resource of its first mutating action, else its policy's."""
    for record in records:
        if record.mutating and not record.dry_run:
            return record.resource
    return f"policy:{policy}"
