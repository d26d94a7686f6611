"""The one way actions are executed: journal first, global limits, idempotency, bounded retries.

For each action of a committed decision, in order and independently of the others:

    terminal in the journal  -> returned as is (never run twice)
    dry-run decision         -> recorded `dry_run`, never executed
    mutating and over limits -> recorded `deferred` with the reason (limits counted from the journal,
                                across all policies, per service, so they survive restarts; the cooldown
                                counts only actions of equal or higher precedence: controller/core/limits.py)
    otherwise                -> `started` (attempts+1) is COMMITTED, then the port of its type is called
                                (one attempt), then the result is recorded; the dispatcher alone retries
                                transient failures, with backoff, and records the attempts in the
                                result's detail (`attempts`)

Each action type has its port (a table: rollback -> RollbackPort, scale -> ScalePort, ...), and the typed
action the engine rendered (an `ActionRequest`) gives the port its arguments; a port nobody configured is a
"not configured" implementation (controller/core/unconfigured.py) that answers a permanent failure.

A deferred action is not final: after each evaluation of its policy, `retry_deferred` runs it again with the
same key while its condition still holds (a fire: the condition is still firing with the action's decision id;
a recovery: the condition is still recovered), and ends it `suppressed` ("condition resolved while deferred:
<last refusal>") once it does not. Each refusal, the start and the final outcome are journaled as events.

A process that dies between `started` and the result leaves the action `started`;
`resume()` runs it again with the same idempotency key, and the actuator (the tier)
answers a repeated key with its first answer instead of acting twice.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
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
from controller.core.engine import Phase, PolicyState
from controller.core.model import Decision, DecisionKind, TargetKey, target_key
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
from controller.kit.errors import ConfigError
from controller.kit.http import backoff_delay
from controller.loop import restore

log = logging.getLogger(__name__)

# Action types planned (and the plan journaled) before their first start: the changes journal what they replace.
_PLANNED = frozenset({ActionType.SCALE, ActionType.SHIFT_TRAFFIC, ActionType.RESTORE})

# Statuses that count against the global limits: the change happened, or may have (outcome unknown).
LIMITED_STATUSES = frozenset({ActionStatus.STARTED, ActionStatus.SUCCEEDED})


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
    return Deferral.END, "condition resolved"


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
        self._locks_guard = threading.Lock()
        self._service_locks: dict[str, threading.Lock] = {}
        # action type -> the call of its port
        self._ports: dict[ActionType, Callable[[ActionRecord, ActionRequest], ActionOutcome]] = {
            ActionType.ROLLBACK: self._rollback,
            ActionType.SCALE: self._scale,
            ActionType.SHIFT_TRAFFIC: self._shift_traffic,
            ActionType.RESTORE: self._restore,
            ActionType.ANNOTATE: self._annotate,
            ActionType.NOTIFY: self._notify,
        }

    # -- public ---------------------------------------------------------------------------------------------

    def dispatch(self, decision: Decision) -> list[ActionRecord]:
        """Run the actions of a decision (journaling it first if the caller has not)."""
        if not decision.actions:
            return []
        # Idempotent: rows already committed by commit_evaluation are kept as they are.
        self.journal.record_decision(decision, self.clock.now())
        return [self._run(action.idempotency_key) for action in decision.actions]

    def resume(self) -> list[ActionRecord]:
        """At start-up: finish what a previous process left planned or started, with the original keys."""
        pending = self.journal.pending_actions()
        if pending:
            log.info("resuming %d unfinished action(s)", len(pending))
        return [self._run(record.idempotency_key) for record in pending]

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
                out.append(self._run(record.idempotency_key, retry=True))
            elif verdict is Deferral.END:
                with self._service_lock(record.resource):
                    current = self.journal.get_action(record.idempotency_key)
                    if current is None or current.status is not ActionStatus.DEFERRED:
                        continue
                    out.append(
                        self._finish(current, ActionStatus.SUPPRESSED, None, f"{why} while deferred: {current.error}")
                    )
        return out

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
            block = self._limits_block(record)
            if block is not None:
                log.warning("deferred %s on %s (%s): %s", record.type.value, record.resource, key, block)
                deferred = self.journal.defer(key, self.clock.now(), block)
                self._report(deferred)
                return deferred
        return self._execute(record)

    def _execute(self, record: ActionRecord) -> ActionRecord:
        plan = dict(record.plan) if record.plan is not None else None
        outcome: ActionOutcome | None = None
        attempt = 0
        called = False
        while True:
            attempt += 1
            if record.type in _PLANNED and plan is None:
                # Fixed once, before the first start, and journaled with it (the state a change replaces; a
                # scale's target count; a restore's target): a resume does the same though the world moved.
                planned = self._plan(record)
                if isinstance(planned, ActionOutcome):
                    outcome = planned
                else:
                    plan = planned
            if record.type not in _PLANNED or plan is not None:
                record = self.journal.mark_started(record.idempotency_key, self.clock.now(), plan)
                self._hook("after-start", record)
                outcome = self._call(record)
                called = True
                self._hook("after-execute", record)
            assert outcome is not None
            if outcome.status is not OutcomeStatus.FAILED or not outcome.transient or attempt >= self.attempts:
                break
            delay = self._delay(attempt)
            log.info(
                "%s %s failed transiently (%s); attempt %d of %d, retrying in %.1fs",
                record.type.value,
                record.idempotency_key,
                outcome.error,
                attempt,
                self.attempts,
                delay,
            )
            self.clock.sleep(delay)
        assert outcome is not None
        status = {
            OutcomeStatus.SUCCEEDED: ActionStatus.SUCCEEDED,
            OutcomeStatus.SKIPPED: ActionStatus.SKIPPED,
            OutcomeStatus.FAILED: ActionStatus.FAILED,
        }[outcome.status]
        result = outcome.to_json()
        if status is ActionStatus.SUCCEEDED and record.type in _PLANNED:
            result["after"] = restore.after_state(record, self.actuators.router, self.actuators.scale)
        if called:
            # The port made one attempt per call; how many calls it took is the dispatcher's to say (the
            # journal's count, so an attempt before a crash counts too).
            result["detail"]["attempts"] = record.attempts
        return self._finish(record, status, result, outcome.error)

    def _delay(self, attempt: int) -> float:
        return backoff_delay(attempt, backoff=self.backoff, max_backoff=self.max_backoff)

    def _hook(self, point: str, record: ActionRecord) -> None:
        if self.crash_hook is not None:
            self.crash_hook(point, record)

    def _finish(
        self, record: ActionRecord, status: ActionStatus, result: Mapping[str, Any] | None, error: str | None
    ) -> ActionRecord:
        finished = self.journal.finish(record.idempotency_key, status, self.clock.now(), result=result, error=error)
        if status in (ActionStatus.FAILED, ActionStatus.SUPPRESSED):
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

    def _plan(self, record: ActionRecord) -> dict[str, Any] | ActionOutcome:
        """A restore's plan (controller/loop/restore.py), or a change's: what it replaces, and a scale's count."""
        if record.type is ActionType.RESTORE:
            return restore.restore_plan(self.journal, record)
        planned: dict[str, Any] | ActionOutcome = {}
        if record.type is ActionType.SCALE:
            planned = self._plan_scale(record)
        if isinstance(planned, ActionOutcome):
            return planned
        router, scale = self.actuators.router, self.actuators.scale
        return {**planned, **restore.change_plan(self.journal, record, router, scale, self.clock.now())}

    def _plan_scale(self, record: ActionRecord) -> dict[str, Any] | ActionOutcome:
        service = str(record.params.get("service", record.resource))
        try:
            current = self.actuators.scale.replicas(service)
        except Exception as exc:  # noqa: BLE001 - a failed read is an outcome, not a crash of the controller
            transient = bool(getattr(exc, "transient", isinstance(exc, (ConnectionError, TimeoutError))))
            return ActionOutcome(OutcomeStatus.FAILED, {}, f"reading the replicas of {service!r}: {exc}", transient)
        try:
            desired = desired_replicas(record.params, current)
        except (ScaleError, TypeError, ValueError) as exc:
            return ActionOutcome(OutcomeStatus.FAILED, {"current": current}, f"scale of {service!r}: {exc}", False)
        if desired == current:
            return ActionOutcome(OutcomeStatus.SKIPPED, {"current": current, "desired": desired}, None)
        return {"service": service, "current": current, "desired": desired}

    def _call(self, record: ActionRecord) -> ActionOutcome:
        """One attempt: the port of the action's type, with the typed action's fields as its arguments."""
        try:
            return self._ports[record.type](record, record.request())
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

    def _rollback(self, record: ActionRecord, request: ActionRequest) -> ActionOutcome:
        action = request.action
        assert isinstance(action, RenderedRollback)
        return self.actuators.rollback.rollback(
            action.service, idempotency_key=request.idempotency_key, rollout_revision=action.rollout_revision
        )

    def _scale(self, record: ActionRecord, request: ActionRequest) -> ActionOutcome:
        assert isinstance(request.action, RenderedScale) and record.plan is not None
        # The count planned (and journaled) before the first start, so a resume asks for the same one.
        return self.actuators.scale.set_replicas(
            str(record.plan["service"]), int(record.plan["desired"]), idempotency_key=request.idempotency_key
        )

    def _shift_traffic(self, record: ActionRecord, request: ActionRequest) -> ActionOutcome:
        action = request.action
        assert isinstance(action, ShiftTrafficAction)
        return self.actuators.router.set_weight(
            action.service, action.version, int(action.weight), idempotency_key=request.idempotency_key
        )

    def _restore(self, record: ActionRecord, request: ActionRequest) -> ActionOutcome:
        assert record.plan is not None
        # The plan journaled before the first start: per state the incident changed, its target and expected state.
        return restore.run_restore(
            record.plan, self.actuators.router, self.actuators.scale, idempotency_key=request.idempotency_key
        )

    def _annotate(self, record: ActionRecord, request: ActionRequest) -> ActionOutcome:
        assert isinstance(request.action, AnnotateAction)
        return self.actuators.annotator.annotate(
            self._annotation(record, request.action), idempotency_key=request.idempotency_key
        )

    def _notify(self, record: ActionRecord, request: ActionRequest) -> ActionOutcome:
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
        return Annotation(
            time=start,
            time_end=end,
            text=action.text,
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
