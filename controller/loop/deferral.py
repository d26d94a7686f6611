"""The global limits and the deferral they cause (controller/loop/dispatcher.py).

A mutating action over the global limits (cooldown and budget per service across all policies, counted from the
journal: controller/core/limits.py decides) is `deferred` with the reason, not ended: after each evaluation of its
policy it runs again with its key while its condition still holds (controller/loop/preconditions.py
`deferred_verdict`), and ends `suppressed` ("condition resolved while deferred: <last refusal>") once it does not;
one that waited for a plan its decision never journaled ends `no-longer-needed`.
"""

from __future__ import annotations

import logging
import threading

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tailguard.controller.core import limits
from tailguard.controller.core.actions import MUTATING_ACTIONS, ActionRecord, ActionStatus, ActionType
from tailguard.controller.core.policy import Duration
from tailguard.controller.core.ports import ActionJournalPort, Clock
from tailguard.controller.loop import preconditions
from tailguard.controller.loop.action_log import ActionLog, ServiceLocks

log = logging.getLogger("tailguard.controller.loop.dispatcher")

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


class Deferrals:
    """The limits' refusal of an action about to start, and the end of a deferred action whose condition ended."""

    def __init__(
        self,
        journal: ActionJournalPort,
        clock: Clock,
        global_limits: GlobalLimits,
        actions: ActionLog,
        locks: ServiceLocks,
    ) -> None:
        self.journal = journal
        self.clock = clock
        self.limits = global_limits
        self.actions = actions
        self.locks = locks

    def refusal(self, record: ActionRecord) -> str | None:
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

    def defer_if_refused(self, record: ActionRecord, guard: threading.Lock) -> ActionRecord | None:
        """Right before a start (under its service's lock): the action `deferred` when the limits refuse it now,
        journaled under `guard` (the abort's: an abort and this deferral never interleave), else None."""
        with guard:
            block = self.refusal(record)
            if block is None:
                return None
            deferred = self.journal.defer(record.idempotency_key, self.clock.now(), block)
        log.warning("deferred %s on %s (%s): %s", record.type.value, record.resource, record.idempotency_key, block)
        self.actions.report(deferred)
        return deferred

    def end(self, key: str, why: str) -> ActionRecord | None:
        """End a deferred action whose condition no longer holds (under its service's lock: a long action of the
        service may hold it), with why; None when it is no longer deferred."""
        record = self.journal.get_action(key)
        if record is None:
            return None
        with self.locks.lock(record.resource):
            current = self.journal.get_action(key)
            if current is None or current.status is not ActionStatus.DEFERRED:
                return None
            # One that waited for a plan never had one: its condition ended before it was needed.
            waited = preconditions.WAITS_FOR_PLAN in (current.error or "")
            ended = ActionStatus.NO_LONGER_NEEDED if waited else ActionStatus.SUPPRESSED
            return self.actions.finish(current, ended, None, f"{why} while deferred: {current.error}")

    def policies(self) -> set[str]:
        """The policies that have deferred actions in the journal."""
        return {record.policy for record in self.journal.deferred_actions()}
