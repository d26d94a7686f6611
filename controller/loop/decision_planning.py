"""Planning in the dispatcher: a decision's rollback, scale or shift is planned from the world that decision saw,
on the deciding evaluation's thread, and the plan journaled before anything is queued (the plans, preconditions and
deadlines themselves: controller/loop/preconditions.py)."""

from __future__ import annotations

import threading

from tailguard.controller.core.actions import ActionStatus
from tailguard.controller.core.ports import ActionJournalPort, ActionOutcome, Clock, OutcomeStatus
from tailguard.controller.loop import preconditions
from tailguard.controller.loop.action_log import ActionLog


class DecisionPlanning:
    """Plans a decision's mutating actions before they are queued (`dispatch`), or again when an evaluation finds a
    deferred one's condition still holding (`retry_deferred`)."""

    def __init__(
        self,
        journal: ActionJournalPort,
        clock: Clock,
        planner: preconditions.Planner,
        actions: ActionLog,
        guard: threading.Lock,
    ) -> None:
        self.journal = journal
        self.clock = clock
        self.planner = planner
        self.actions = actions
        self._guard = guard  # the abort's guard: an abort and this plan never interleave

    def plan_now(self, key: str, *, again: bool = False) -> bool:
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
        with self._guard:
            current = self.journal.get_action(key)
            if current is None or current.status not in (ActionStatus.PLANNED, ActionStatus.DEFERRED):
                return False  # aborted (or run) meanwhile
            if not isinstance(planned, ActionOutcome):
                self.actions.hook("after-plan", self.journal.set_plan(key, planned, self.clock.now()))
                return True
            if planned.status is OutcomeStatus.FAILED and planned.transient:
                why = f"not planned ({planned.error}); {preconditions.WAITS_FOR_PLAN}"
                self.actions.report(self.journal.defer(key, self.clock.now(), why))
                return False
        status = preconditions.OUTCOME_STATUS[planned.status]
        self.actions.finish(current, status, planned.to_json(), planned.error)
        return False
