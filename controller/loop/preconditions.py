"""Every write checks the world it was decided on: plans, preconditions and deadlines of mutating actions.

A mutating action's PLAN is made inside its decision, from the world the decision saw: `Dispatcher.dispatch`
(called by the evaluation right after its commit, on the evaluation's thread, before anything is queued) asks the
port (`RollbackPort.plan_rollback`: the running revision / ReplicaSet, the bad one, the target; a scale: the
replica count and the HPA state it replaces; a shift: the weights it replaces) and journals the plan with
`Journal.set_plan`. The plan carries its precondition (`from_revision` / `from_hash`: what must still run when the
write is made; a change's `before`) and its `deadline` (decided_at + the policy's `limits.actionDeadline`, default
`DEADLINE_INTERVALS` evaluation intervals).

The worker never plans a rollback, a scale or a shift (a restore's plan is tailguard's own record, the journal, and
is still made when it runs). A resume finds one of three things:

* a plan: past its deadline the action ends `expired`, with its condition no longer holding (the journal's
  latest engine state) `no-longer-needed`; otherwise it runs, and the port checks the precondition right before
  its write (in the same request where the API allows: the Deployment patch's `test` of the resourceVersion after
  a check of the running template; Argo CD's synced revision read just before its rollback call). On a mismatch
  nothing is written and the action ends `world-changed`; it is not retried.
* no plan (the process died between the decision's commit and its plan): the action is never planned from the
  world at restart. It waits, journaled (deferred, "waits for a plan"), until an evaluation of its policy finds
  its condition still holding; `retry_deferred` then plans it from the world that evaluation sees (on that
  evaluation's thread) with a fresh deadline; past the deadline counted from its decision it ends `expired`.
* a started action (a write may have gone out): its port checks the plan (target shown: done without a write;
  neither the plan's source nor its target: `world-changed`).

A transient failure is tried again with backoff while the deadline lasts and the condition holds, each failed
attempt journaled as an `attempt` event (controller/loop/execution.py `ActionRunner`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

from tailguard.controller.core.actions import (
    ActionRecord,
    ActionStatus,
    ActionType,
    RenderedRollback,
    ShiftTrafficAction,
)
from tailguard.controller.core.engine import Phase, PolicyState
from tailguard.controller.core.model import DecisionKind, TargetKey, target_key
from tailguard.controller.core.ports import (
    ActionJournalPort,
    ActionOutcome,
    Clock,
    OutcomeStatus,
    RollbackPort,
    ScaleLimits,
    ScalePort,
    TrafficRouter,
)
from tailguard.controller.kit.errors import ConfigError
from tailguard.controller.loop import restore

log = logging.getLogger(__name__)

# Every mutating action journals a plan before its first start; these are planned by the decision (dispatch, on the
# evaluation's thread), a restore (its plan is the journal's record of tailguard's own changes) when it runs.
PLANNED = frozenset({ActionType.ROLLBACK, ActionType.SCALE, ActionType.SHIFT_TRAFFIC, ActionType.RESTORE})
PLANNED_AT_DECISION = frozenset({ActionType.ROLLBACK, ActionType.SCALE, ActionType.SHIFT_TRAFFIC})

# The default deadline of a planned action: this many evaluation intervals of its policy after the decision.
DEADLINE_INTERVALS = 3
# The deadline of an action whose policy the dispatcher cannot look up (not loaded, or no lookup wired).
FALLBACK_DEADLINE = 300.0

# The action_events row of each failed attempt of a retried action, and of a plan that waits for an evaluation.
ATTEMPT_EVENT = "attempt"
WAITS_FOR_PLAN = "waits for a plan from the world an evaluation of its policy sees"

OUTCOME_STATUS = {
    OutcomeStatus.SUCCEEDED: ActionStatus.SUCCEEDED,
    OutcomeStatus.SKIPPED: ActionStatus.SKIPPED,
    OutcomeStatus.FAILED: ActionStatus.FAILED,
    OutcomeStatus.ABORTED: ActionStatus.ABORTED,
    OutcomeStatus.WORLD_CHANGED: ActionStatus.WORLD_CHANGED,
}


class Deferral(StrEnum):
    RETRY = "retry"  # the condition still holds: run the action again (the limits are checked again)
    WAIT = "wait"  # a recovery whose condition breaches again without firing: neither run nor end it yet
    END = "end"  # the condition no longer holds: the action ends suppressed


def deferred_verdict(state: PolicyState | None, decision: Mapping[str, Any] | None) -> tuple[Deferral, str]:
    """What to do with a deferred action of `decision` (its journaled JSON) after an evaluation of its policy
    committed `state` (None: the policy is no longer loaded); with END, the phrase that says why.

    An action of a fire runs while its condition is FIRING for that target with the action's decision id (the
    same incident); an action of a recovery (resolve) while the condition stays recovered (OK), waits while a
    new breach is pending, and ends once the condition fires again.
    """
    if state is None:
        return Deferral.END, "policy removed"
    if decision is None:
        return Deferral.END, "decision not in the journal"
    key: tuple[str, TargetKey] = (str(decision.get("condition")), target_key(dict(decision.get("target") or {})))
    condition = state.conditions.get(key)
    if condition is None:
        return Deferral.END, "condition no longer evaluated for the target"
    if decision.get("kind") == DecisionKind.RESOLVE.value:
        if condition.phase is Phase.OK:
            return Deferral.RETRY, ""
        if condition.phase is Phase.PENDING:
            return Deferral.WAIT, ""
        return Deferral.END, "condition fired again"
    if condition.phase is Phase.FIRING and condition.decision_id == decision.get("id"):
        return Deferral.RETRY, ""
    if decision.get("adopted") and condition.phase in (Phase.FIRING, Phase.PENDING):
        # Adopted from the previous leader (controller/loop/adoption.py): its decision id is that replica's; here
        # the same condition still breaching for the target is what keeps it needed.
        return Deferral.RETRY, ""
    return Deferral.END, "condition resolved"


def no_longer_holds(state: PolicyState | None, decision: Mapping[str, Any] | None) -> str | None:
    """Why the condition of `decision` positively no longer holds in the latest committed `state`, else None.
    Unknown (no state journaled, the condition not in it) is not "no longer": the deadline bounds those."""
    if state is None or decision is None:
        return None
    key: tuple[str, TargetKey] = (str(decision.get("condition")), target_key(dict(decision.get("target") or {})))
    if key not in state.conditions:
        return None
    verdict, why = deferred_verdict(state, decision)
    return why if verdict is Deferral.END else None


class ScaleError(ConfigError, ValueError):
    """The scale parameters cannot produce a replica count (the message says which and why)."""


def desired_replicas(params: Mapping[str, Any], current: int) -> int:
    """The replica count a scale action asks for, clamped to [min, max].

    Exactly one mode: `replicas` (absolute), `delta` (relative to `current`), or
    `targetPerReplica` (proportional: ceil(current * observed / targetPerReplica),
    `observed` being the decision's value, e.g. waiting requests per replica).
    """
    replicas, delta, per_replica = params.get("replicas"), params.get("delta"), params.get("targetPerReplica")
    modes = [
        name
        for name, value in (("replicas", replicas), ("delta", delta), ("targetPerReplica", per_replica))
        if value is not None
    ]
    if len(modes) != 1:
        raise ScaleError(f"scale needs exactly one of replicas, delta or targetPerReplica, got {modes or 'none'}")
    low = int(params.get("min", 1) if params.get("min") is not None else 1)
    high_raw = params.get("max")
    if high_raw is None:
        raise ScaleError("scale needs 'max'")
    high = int(high_raw)
    if low > high:
        raise ScaleError(f"scale min ({low}) is above max ({high})")
    if replicas is not None:
        wanted = int(replicas)
    elif delta is not None:
        wanted = current + int(delta)
    else:
        assert per_replica is not None
        observed = params.get("observed")
        if observed is None or not math.isfinite(float(observed)):
            raise ScaleError("targetPerReplica scaling needs the observed value, and the decision has none")
        if float(per_replica) <= 0:
            raise ScaleError(f"targetPerReplica must be positive, got {per_replica}")
        # The epsilon keeps 3 * 20 / 20 from becoming 4 through floating-point noise.
        wanted = math.ceil(current * float(observed) / float(per_replica) - 1e-9)
    return max(low, min(high, wanted))


SCALE_MODES = ("replicas", "delta", "targetPerReplica")


def scale_limits(params: Mapping[str, Any]) -> dict[str, object]:
    """What a scale sets besides its count (its `ceiling` and `metricTargets`), as its plan journals it
    (core/ports/scale.py `ScaleLimits`); empty when it sets neither."""
    return ScaleLimits.of_action(params).to_json()


def _failed_read(what: str, exc: Exception) -> ActionOutcome:
    transient = bool(getattr(exc, "transient", isinstance(exc, (ConnectionError, TimeoutError))))
    return ActionOutcome(OutcomeStatus.FAILED, {}, f"{what}: {exc}", transient)


class Planner:
    """The plans, deadlines and gates of mutating actions (the module docstring); the dispatcher asks it."""

    def __init__(
        self,
        journal: ActionJournalPort,
        rollback: Callable[[], RollbackPort],
        scale: Callable[[], ScalePort],
        router: Callable[[], TrafficRouter],
        clock: Clock,
        deadline_for: Callable[[str], float | None] | None = None,
    ) -> None:
        # The ports are looked up at each use: the dispatcher's actuators may be replaced after it is built.
        self.journal = journal
        self._rollback, self._scale, self._router = rollback, scale, router
        self.clock = clock
        self.deadline_for = deadline_for

    # -- deadlines and gates -----------------------------------------------------------------------------

    def allowance(self, policy: str) -> float:
        """How long after its decision an action of `policy` may still start (its `limits.actionDeadline`)."""
        seconds = self.deadline_for(policy) if self.deadline_for is not None else None
        return float(seconds) if seconds is not None and seconds > 0 else FALLBACK_DEADLINE

    def deadline(self, record: ActionRecord) -> float:
        """The plan's deadline; for an action without one, its decision's commit plus the policy's allowance."""
        planned = (record.plan or {}).get("deadline")
        if isinstance(planned, (int, float)):
            return float(planned)
        return record.created_at + self.allowance(record.policy)

    def gate(self, record: ActionRecord, *, confirmed: bool = False) -> tuple[ActionStatus, str] | None:
        """Before the first start of a planned (or deferred) mutating action: `expired` past its deadline (an
        action of a fire),
        `no-longer-needed` when its condition no longer holds, else None. `confirmed`: an evaluation has just found
        its condition holding (a deferred retry), so an action without a planned deadline is not timed out."""
        now = self.clock.now()
        # A recovery's action (a restore puts back the pre-incident state, and writes only where the resource
        # still shows tailguard's last write) is held by its condition alone: expiring it would leave the
        # incident's surge in place for good.
        timed = record.decision_kind != DecisionKind.RESOLVE.value and not (confirmed and record.plan is None)
        if timed and now > self.deadline(record):
            since = now - record.created_at
            return ActionStatus.EXPIRED, (
                f"past its deadline ({self.deadline(record) - record.created_at:g}s after its decision; "
                f"{since:g}s have passed): never run"
            )
        decision = self.journal.decision(record.decision_id, record.decision_kind)
        why = no_longer_holds(self.journal.load_state(record.policy), decision)
        if why is not None:
            return ActionStatus.NO_LONGER_NEEDED, f"{why} before it ran: never run"
        return None

    def condition_gone(self, record: ActionRecord) -> str | None:
        """Between two attempts: why its condition no longer holds (the journal's latest state), else None."""
        decision = self.journal.decision(record.decision_id, record.decision_kind)
        return no_longer_holds(self.journal.load_state(record.policy), decision)

    # -- plans -------------------------------------------------------------------------------------------

    def plan(self, record: ActionRecord) -> dict[str, Any] | ActionOutcome:
        """The plan of a mutating action from the world now, with `decided_at` and `deadline` (a restore's plan:
        controller/loop/restore.py; a rollback's: the port's from/bad/to revision; a change's `before` and
        `target`)."""
        now = self.clock.now()
        if record.type is ActionType.RESTORE:
            planned: dict[str, Any] | ActionOutcome = restore.restore_plan(self.journal, record)
        elif record.type is ActionType.ROLLBACK:
            planned = self._plan_rollback(record)
        else:
            planned = self._plan_change(record, now)
        if isinstance(planned, ActionOutcome):
            return planned
        return {**planned, "decided_at": now, "deadline": now + self.allowance(record.policy)}

    def _plan_rollback(self, record: ActionRecord) -> dict[str, Any] | ActionOutcome:
        try:
            action = record.request().action
            assert isinstance(action, RenderedRollback)
            planned = self._rollback().plan_rollback(action.service, rollout_revision=action.rollout_revision)
        except Exception as exc:  # noqa: BLE001 - a failed read is an outcome, not a crash of the controller
            return _failed_read("planning the rollback", exc)
        if isinstance(planned, ActionOutcome):
            return planned
        blamed, running = action.rollout_revision, planned.from_revision
        if blamed is not None and str(planned.bad_revision) == str(blamed) and str(running) != str(blamed):
            # The decision blamed a revision that no longer runs (a human rolled out a fix, or back): rolling back
            # whatever runs now was never decided.
            reason = f"the decision blamed revision {blamed}, and {running} runs now: not rolled back"
            return ActionOutcome(OutcomeStatus.WORLD_CHANGED, {**planned.to_json(), "reason": reason}, reason)
        decision = self.journal.decision(record.decision_id, record.decision_kind) or {}
        deployed, decided = planned.from_deployed_at, decision.get("at")
        if isinstance(deployed, (int, float)) and isinstance(decided, (int, float)) and deployed > decided:
            # What runs now was deployed after the breach was decided (a plan made late: a restart, a deferral):
            # the decision never saw it.
            reason = f"revision {running} was deployed after the decision: not rolled back"
            return ActionOutcome(OutcomeStatus.WORLD_CHANGED, {**planned.to_json(), "reason": reason}, reason)
        return planned.to_json()

    def _plan_change(self, record: ActionRecord, now: float) -> dict[str, Any] | ActionOutcome:
        planned: dict[str, Any] | ActionOutcome = {}
        if record.type is ActionType.SCALE:
            planned = self._plan_scale(record)
        elif record.type is ActionType.SHIFT_TRAFFIC:
            planned = self._plan_shift(record)
        if isinstance(planned, ActionOutcome):
            return planned
        plan = {**planned, **restore.change_plan(self.journal, record, self._router(), self._scale(), now)}
        if record.type is ActionType.SCALE and plan.get("desired") is not None and "limits" not in plan:
            # The fields the scale port sets for that count (its own: an HPA's floor, the tier's count).
            # (A scale of an HPA's limits has no target to check on a resume: its port calls replay by key.)
            plan["target"] = self._scale().scale_target(int(plan["desired"]))
        return plan

    def _plan_shift(self, record: ActionRecord) -> dict[str, Any] | ActionOutcome:
        try:
            action = record.request().action
            assert isinstance(action, ShiftTrafficAction)
        except AttributeError as exc:
            return ActionOutcome(OutcomeStatus.FAILED, {}, f"shift_traffic action lacks parameter {exc.name!r}")
        return {"service": action.service, "target": {"version": action.version, "weight": int(action.weight)}}

    def _plan_scale(self, record: ActionRecord) -> dict[str, Any] | ActionOutcome:
        service = str(record.params.get("service", record.resource))
        limits = scale_limits(record.params)
        if limits and not any(record.params.get(mode) is not None for mode in SCALE_MODES):
            return {"service": service, "limits": limits}  # the HPA's ceiling and metric targets only
        try:
            current = self._scale().replicas(service)
        except Exception as exc:  # noqa: BLE001 - a failed read is an outcome, not a crash of the controller
            return _failed_read(f"reading the replicas of {service!r}", exc)
        try:
            desired = desired_replicas(record.params, current)
        except (ScaleError, TypeError, ValueError) as exc:
            return ActionOutcome(OutcomeStatus.FAILED, {"current": current}, f"scale of {service!r}: {exc}", False)
        if desired == current and not limits:
            return ActionOutcome(OutcomeStatus.SKIPPED, {"current": current, "desired": desired}, None)
        return {"service": service, "current": current, "desired": desired, **({"limits": limits} if limits else {})}

    def world_changed(self, record: ActionRecord, plan: Mapping[str, Any]) -> ActionOutcome | None:
        """Right before a scale's or a shift's write: WORLD_CHANGED when what it writes (the HPA floor or replica
        count, the version's weight) shows neither the state its decision saw (`before`) nor its target; None
        otherwise, or when it cannot be read (the port's own call decides). A rollback's port checks its plan."""
        before, target = plan.get("before"), plan.get("target")
        if not isinstance(before, Mapping) or not isinstance(target, Mapping):
            return None
        service = str(plan.get("service", record.params.get("service", record.resource)))
        try:
            if record.type is ActionType.SCALE:
                current: Mapping[str, Any] = self._scale().scale_state(service).to_json()
                fields = {name: (before.get(name), value) for name, value in target.items()}
            elif record.type is ActionType.SHIFT_TRAFFIC:
                current = {str(k): int(v) for k, v in self._router().weights(service).items()}
                version = str(target["version"])
                fields = {version: (before.get(version), int(target["weight"]))}
            else:
                return None
        except Exception:  # noqa: BLE001 - unreadable: the port's call reads it again and reports
            return None
        moved = {name: current.get(name) for name, allowed in fields.items() if current.get(name) not in allowed}
        if not moved:
            return None
        reason = (
            f"{service} changed since the decision: {moved} (the decision saw {dict(before)}, would set "
            f"{dict(target)}); not written"
        )
        return ActionOutcome(OutcomeStatus.WORLD_CHANGED, {"service": service, "found": moved}, reason)

    def shows_target(self, record: ActionRecord, plan: Mapping[str, Any]) -> ActionOutcome | None:
        """On a resume of a change: SUCCEEDED when the system already shows the plan's target, else None (the
        port is called again with the same key and plan; a rollback's port makes this check itself)."""
        target = plan.get("target")
        if not isinstance(target, Mapping):
            return None
        service = str(plan.get("service", record.params.get("service", record.resource)))
        try:
            if record.type is ActionType.SHIFT_TRAFFIC:
                weights = {str(k): int(v) for k, v in self._router().weights(service).items()}
                if weights.get(str(target["version"])) != int(target["weight"]):
                    return None
                shown: dict[str, Any] = {"weights": weights}
            elif record.type is ActionType.SCALE:
                state = self._scale().scale_state(service).to_json()
                if any(state.get(name) != value for name, value in target.items()):
                    return None
                shown = {"state": state}
            else:
                return None
        except Exception as exc:  # noqa: BLE001 - unreadable: the port's own call decides
            log.info("resume of %s: could not read the current state (%s); calling the port", record.idempotency_key,
                     exc)  # fmt: skip
            return None
        log.info("resume of %s: %s already shows the planned target %s", record.idempotency_key, service, target)
        return ActionOutcome(OutcomeStatus.SUCCEEDED, {**shown, "already_done": True, "replayed": True})
