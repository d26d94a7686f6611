"""The abort of a decision's actions in the journal (controller/core/controls.py `AbortRequest`): the planned and
deferred ones end `aborted` in one transaction, a started one gets an `abort_requested` event that its next step
(or the resume by the next process) reads."""

from __future__ import annotations

import json
import sqlite3
import threading

from tailguard.controller.adapters.stores.journal_reads import action_record as _record
from tailguard.controller.adapters.stores.journal_retention import Transaction
from tailguard.controller.adapters.stores.journal_schema import add_event
from tailguard.controller.core.actions import ActionRecord, ActionStatus
from tailguard.controller.core.controls import AbortRequest
from tailguard.controller.kit.sqlite_store import json_column

ABORT_REQUESTED = "abort_requested"  # the action_events row of an abort of a started action


def abort_actions(transaction: Transaction, request: AbortRequest, now: float) -> list[ActionRecord]:
    """One transaction: the decision's planned and deferred actions end `aborted` (they never ran; the event and
    the error say who and why), each started one gets an `abort_requested` event (its next step, or a resume
    by the next process, ends it). Every action of the decision is returned as it is after, oldest first."""
    phrase = request.phrase()
    with transaction() as db:
        rows = db.execute(
            "SELECT idempotency_key, status FROM actions WHERE decision_id = ? ORDER BY seq", (request.decision_id,)
        ).fetchall()
        for row in rows:
            key, status = row["idempotency_key"], row["status"]
            if status in (ActionStatus.PLANNED.value, ActionStatus.DEFERRED.value):
                result = {
                    "status": ActionStatus.ABORTED.value,
                    "detail": {"aborted": request.to_json(), "ran": False},
                    "error": None,
                    "transient": False,
                }
                db.execute(
                    "UPDATE actions SET status = ?, result = ?, error = ?, finished_at = ?, updated_at = ? "
                    "WHERE idempotency_key = ?",
                    (ActionStatus.ABORTED.value, json_column(result), f"{phrase}; never ran", now, now, key),
                )
                add_event(db, key, now, ActionStatus.ABORTED.value, f"{phrase}; never ran (was {status})")
            elif status == ActionStatus.STARTED.value:
                add_event(db, key, now, ABORT_REQUESTED, json.dumps(request.to_json(), sort_keys=True))
        found = db.execute(
            "SELECT * FROM actions WHERE decision_id = ? ORDER BY seq", (request.decision_id,)
        ).fetchall()
    return [_record(row) for row in found]


def abort_requested(db: sqlite3.Connection, lock: threading.RLock, idempotency_key: str) -> AbortRequest | None:
    """The abort journaled for a started action (its latest `abort_requested` event), or None."""
    with lock:
        row = db.execute(
            "SELECT detail FROM action_events WHERE idempotency_key = ? AND event = ? ORDER BY seq DESC LIMIT 1",
            (idempotency_key, ABORT_REQUESTED),
        ).fetchone()
    if row is None:
        return None
    try:
        raw = json.loads(row["detail"])
        return AbortRequest(str(raw["decision_id"]), str(raw["by"]), str(raw["reason"]), float(raw["at"]))
    except (TypeError, ValueError, KeyError):
        # Unreadable, yet an operator asked for an abort: still honoured, without who and why.
        return AbortRequest("", "unknown", f"unreadable abort event: {row['detail']!r}"[:200], 0.0)
