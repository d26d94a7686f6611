"""Failover adopts, never suppresses: the leader's unfinished mutating actions travel in the Lease to its successor.

The leader publishes its action times in the Lease when it decides, before it acts (controller/core/handover.py):
a successor counts them for its cooldowns, so it does not act a second time for the same breach. Alone, that lost
the action when the leader died before acting: the successor saw "a rollback 6 s ago" and held back for the
cooldown, though no rollback had happened. So the Lease also carries the leader's unfinished mutating actions
(`tailguard.io/pending-actions`: each action's journal record, with the plan its decision made and its deadline,
and its decision), written with every Lease write: at the decision (before acting), right after the plan is
journaled (the dispatcher's `on_planned`), and at every renewal. Whoever acquires the Lease adopts them into its
own journal (same idempotency key, `planned`, an `adopted` event) and its first evaluation as leader resumes them:

* with a plan: the deadline and condition gates, then the port's precondition check right before the write (the
  world the old leader's decision saw: the revision it would roll back from); so exactly one rollback, by the
  successor, and none when a human fixed it meanwhile (`world-changed`);
* without one (the leader died while planning): it waits until an evaluation of the successor finds the same
  condition still breaching for that target, and is planned from the world then.

The dead replica never runs its stale copy later: when it leads again, its resume meets the deadline (`expired`)
or the precondition (the target already runs: done without a write; anything else: `world-changed`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tailguard.controller.core.actions import ActionRecord, ActionStatus, ActionType
from tailguard.controller.core.ports import Clock
from tailguard.controller.loop.ports import AdoptingJournalPort
from tailguard.controller.loop.preconditions import Planner

log = logging.getLogger(__name__)

ADOPTED = "adopted"  # the decision body's flag, and the action event's name


class Adoption:
    """The PendingHandoverPort (controller/core/ports/leadership.py) of one replica: its journal's unfinished
    actions out, the previous leader's in."""

    def __init__(self, journal: AdoptingJournalPort, planner: Planner, clock: Clock) -> None:
        self.journal = journal
        self.planner = planner
        self.clock = clock
        # What the last snapshot found: the controller closes its journal before the elector's last write (the
        # release), which must still hand the queued actions over.
        self._last: list[dict[str, Any]] = []

    def pending_snapshot(self) -> list[dict[str, Any]]:
        """The unfinished (planned or started) mutating actions still within their deadline, newest first."""
        now = self.clock.now()
        if self.journal.closed:
            return list(self._last)
        entries: list[dict[str, Any]] = []
        for record in reversed(self.journal.pending_actions()):
            if not record.mutating or record.dry_run or now > self.planner.deadline(record):
                continue
            decision = self.journal.decision(record.decision_id, record.decision_kind)
            if decision is not None:
                entries.append({"action": record.to_json(), "decision": decision})
        self._last = entries
        return entries

    def adopt_pending(self, entries: Sequence[Mapping[str, Any]]) -> int:
        """Journal the previous leader's unfinished actions (those not yet past their deadline and not already
        here) for this replica's resume; returns how many were adopted."""
        now = self.clock.now()
        adopted = 0
        if self.journal.closed:
            return 0
        for entry in entries:
            action, decision = dict(entry["action"]), dict(entry["decision"])
            try:
                record = _record(action)
            except (KeyError, TypeError, ValueError) as unreadable:
                log.warning("a pending action in the Lease is unreadable (%s): not adopted", unreadable)
                continue
            if now > self.planner.deadline(record):
                log.info("not adopting %s on %s: past its deadline", record.type.value, record.resource)
                continue
            if self.journal.adopt(action, decision, now):
                adopted += 1
                log.warning("adopted the previous leader's unfinished %s on %s (%s, %s)", record.type.value,
                            record.resource, record.idempotency_key,
                            "planned" if record.plan is not None else "not planned yet")  # fmt: skip
        return adopted


def _record(action: Mapping[str, Any]) -> ActionRecord:
    """An ActionRecord from its JSON (ActionRecord.to_json)."""
    from_json: dict[str, Any] = dict(action)
    plan = from_json.get("plan")
    return ActionRecord(
        idempotency_key=str(from_json["idempotency_key"]),
        decision_id=str(from_json["decision_id"]),
        decision_kind=str(from_json["decision_kind"]),
        policy=str(from_json["policy"]),
        resource=str(from_json["resource"]),
        type=ActionType(from_json["type"]),
        params=dict(from_json.get("params") or {}),
        dry_run=bool(from_json.get("dry_run")),
        status=ActionStatus(from_json["status"]),
        attempts=int(from_json.get("attempts") or 0),
        result=None,
        error=None,
        plan=dict(plan) if isinstance(plan, Mapping) else None,
        created_at=float(from_json["created_at"]),
        started_at=None,
        finished_at=None,
        updated_at=float(from_json.get("updated_at") or from_json["created_at"]),
    )
