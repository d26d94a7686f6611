"""The durable journal: decisions, their evidence, their actions and each policy's engine state.

SQLite (stdlib) in WAL mode with synchronous=FULL: a transaction that returned
from COMMIT survives a crash of the process or the machine, so a new process
can open the same file and finish what the old one left `planned` or `started`.

Idempotency rests on the actions table: its primary key is the action's
idempotency key (`"{decision_id}:{kind}:{index}"`, deterministic), inserted with
INSERT OR IGNORE, and an action whose status is terminal is never run again.

An action the global limits refuse is `deferred` (not terminal): each refusal is a row of `action_events`
(created with IF NOT EXISTS, so a journal written before it keeps working), and so are the start of a deferred
action once allowed and its final outcome (e.g. `suppressed`: its condition resolved while it was deferred).
An operator's abort is journaled the same way: `aborted` for an action it stopped before it ran, and
`abort_requested` (who, why, when, as JSON) for a started one, which a resume after a restart honours.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from tailguard.controller.adapters.stores.journal_aborts import abort_actions, abort_requested
from tailguard.controller.adapters.stores.journal_controls import load_controls, record_control
from tailguard.controller.adapters.stores.journal_reads import JournalReader
from tailguard.controller.adapters.stores.journal_reads import action_record as _record
from tailguard.controller.adapters.stores.journal_retention import PurgeReport, purge_and_vacuum
from tailguard.controller.adapters.stores.journal_schema import (
    JOURNAL_PAGE_SIZE,
    SCHEMA_VERSION,
    JournalError,
    JournalWriteError,
    create_if_missing,
    migrate,
)
from tailguard.controller.adapters.stores.journal_schema import action_status as _status
from tailguard.controller.adapters.stores.journal_schema import add_event as _event
from tailguard.controller.adapters.stores.journal_schema import has_events as _has_events
from tailguard.controller.adapters.stores.journal_state import StateStore, StateWrite
from tailguard.controller.core.actions import (
    MUTATING_ACTIONS,
    TERMINAL_STATUSES,
    ActionRecord,
    ActionRequest,
    ActionStatus,
)
from tailguard.controller.core.controls import AbortRequest, Controls
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.model import Decision, target_labels
from tailguard.controller.kit.sqlite_store import (
    immediate_transaction,
    json_column,
    make_durable,
    open_durable,
    open_reader,
)

logger = logging.getLogger("tailguard.journal")

# The journal's schema, version and errors live in journal_schema.py; here for those who open a Journal.
__all__ = [
    "JOURNAL_PAGE_SIZE",
    "SCHEMA_VERSION",
    "ActionRecord",
    "ActionStatus",
    "Journal",
    "JournalError",
    "JournalWriteError",
    "action_resource",
]


def action_resource(action: ActionRequest, decision: Decision) -> str:
    """The service an action is about: its `service` parameter, else the target's `service` label."""
    service = action.params.get("service")
    if isinstance(service, str) and service:
        return service
    labels = target_labels(decision.target)
    if labels.get("service"):
        return labels["service"]
    return ",".join(f"{name}={value}" for name, value in decision.target) or decision.policy


# The statuses an action can be started or finished from (a deferred one is retried with its key).
_OPEN = (ActionStatus.PLANNED.value, ActionStatus.STARTED.value, ActionStatus.DEFERRED.value)


def _json_value(value: float | None) -> float | None:
    # SQLite stores NaN as NULL anyway; be explicit so JSON bodies stay valid JSON.
    if value is None or not math.isfinite(value):
        return None
    return value


def _decision_body(decision: Decision) -> dict[str, Any]:
    body = decision.to_json()
    body["value"] = _json_value(decision.value)
    body["evidence"] = [[t, v] for t, v in decision.evidence if math.isfinite(v)]
    return body


class Journal:
    """Thread-safe: one writing connection guarded by a lock (scheduler threads evaluate policies concurrently), and
    one query-only connection under its own lock for the decisions API and the status page (issue 24)."""

    def __init__(self, path: str | Path, *, new_journal: bool = False, now: float | None = None) -> None:
        """Open the journal at `path`, creating it when no file is there. An existing file that is not a journal
        (empty, not SQLite, another program's database) is refused (JournalError, one line), or with
        `new_journal` set aside for a new journal (journal_file.py); `now` names the set-aside file."""
        self.path = Path(path)
        self._lock = threading.RLock()
        self._closed = False
        self._states = StateStore()
        # Rows written by the last commit_evaluation (the policy row + condition rows changed or removed).
        self.last_state_rows = 0
        create_if_missing(self.path, new_journal, now)
        self._db = open_durable(self.path, JournalError, "journal")
        try:
            make_durable(self._db, page_size=JOURNAL_PAGE_SIZE)
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise JournalError(f"journal {self.path}: not a usable SQLite database: {exc}") from exc
        except JournalError:
            self._db.close()
            raise
        # The read side (issue 24, item 6): the decisions API and the status page read through their own
        # connection under their own lock, so a read storm never holds the lock an evaluation commits under; WAL
        # gives each read a snapshot while the writer goes on.
        self._reader = JournalReader(open_reader(self.path, JournalError, "journal"))

    # -- schema -----------------------------------------------------------------------------------------

    def _migrate(self) -> None:
        migrate(self._db, self._lock, self.path, self._states)

    def schema_version(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row["value"])

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with immediate_transaction(self._db, self._lock) as db:
            yield db

    # -- engine state ---------------------------------------------------------------------------------

    def load_state(self, policy: str) -> PolicyState | None:
        with self._lock:
            return self._states.load(self._db, policy)

    def commit_evaluation(self, policy: str, state: PolicyState, decisions: Sequence[Decision], now: float) -> None:
        """ONE transaction: the engine state's changed rows (journal_state.py), the decisions and their actions as
        `planned`."""
        with self._lock:
            try:
                with self._transaction() as db:
                    write: StateWrite = self._states.write(db, policy, state, now)
                    for decision in decisions:
                        self._insert_decision(db, decision, now)
            except sqlite3.Error as failed:  # a full disk, a read-only volume: one line, no traceback (loop/health.py)
                self._states.rolled_back(policy)  # what it holds is read again from the file
                raise JournalWriteError(f"journal {self.path}: cannot write: {failed}") from failed
            except BaseException:
                self._states.rolled_back(policy)
                raise
            self._states.committed(write)
            self.last_state_rows = write.rows

    # -- retention (journal_retention.py) -----------------------------------------------------------------

    def purge(self, now: float, retention: float) -> PurgeReport:
        """Remove decisions (with their actions and events) older than `retention` seconds whose actions are all
        terminal; then give the freed pages back (incremental vacuum). The report is kept in `meta` too."""
        return purge_and_vacuum(self._transaction, self._db, self._lock, now, retention)

    def record_decision(self, decision: Decision, now: float) -> None:
        """Journal a decision and its actions without engine state (idempotent: existing rows are kept)."""
        with self._transaction() as db:
            self._insert_decision(db, decision, now)

    def _insert_decision(self, db: sqlite3.Connection, decision: Decision, now: float) -> None:
        db.execute(
            "INSERT OR IGNORE INTO decisions (id, kind, policy, condition, target, at, value, threshold, "
            "evidence, reason, dry_run, body, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                decision.id,
                decision.kind.value,
                decision.policy,
                decision.condition,
                json_column(target_labels(decision.target)),
                decision.at,
                _json_value(decision.value),
                decision.threshold,
                json_column([[t, v] for t, v in decision.evidence if math.isfinite(v)]),
                decision.reason,
                int(decision.dry_run),
                json_column(_decision_body(decision)),
                now,
            ),
        )
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) FROM actions").fetchone()[0]
        for action in decision.actions:
            seq += 1
            db.execute(
                "INSERT OR IGNORE INTO actions (idempotency_key, decision_id, decision_kind, policy, "
                "resource, type, params, dry_run, status, attempts, created_at, updated_at, seq) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
                (
                    action.idempotency_key,
                    decision.id,
                    decision.kind.value,
                    decision.policy,
                    action_resource(action, decision),
                    action.type.value,
                    json_column(dict(action.params)),
                    int(decision.dry_run),
                    ActionStatus.PLANNED.value,
                    now,
                    now,
                    seq,
                ),
            )

    def adopt(self, action: Mapping[str, Any], decision: Mapping[str, Any], now: float) -> bool:
        """An unfinished action of the previous leader (controller/loop/adoption.py): its decision (marked
        `adopted_from`) and the action, `planned` with the plan its decision made (none: it waits for an evaluation
        of this replica), with the same idempotency key. False when this journal already has that key."""
        body = {**dict(decision), "adopted": True}
        with self._transaction() as db:
            if _status(db, str(action["idempotency_key"])) is not None:
                return False
            db.execute(
                "INSERT OR IGNORE INTO decisions (id, kind, policy, condition, target, at, value, threshold, "
                "evidence, reason, dry_run, body, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    str(body["id"]), str(body["kind"]), str(body["policy"]), str(body.get("condition", "")),
                    json_column(dict(body.get("target") or {})), float(body.get("at") or now),
                    body.get("value"), float(body.get("threshold") or 0.0), json_column(body.get("evidence") or []),
                    str(body.get("reason", "")), int(bool(body.get("dry_run"))), json_column(body), now,
                ),
            )  # fmt: skip
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) FROM actions").fetchone()[0] + 1
            plan = action.get("plan")
            db.execute(
                "INSERT INTO actions (idempotency_key, decision_id, decision_kind, policy, resource, type, params, "
                "dry_run, status, attempts, plan, created_at, updated_at, seq) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, 0, ?, ?, ?, ?)",
                (
                    str(action["idempotency_key"]), str(action["decision_id"]), str(action["decision_kind"]),
                    str(action["policy"]), str(action["resource"]), str(action["type"]),
                    json_column(dict(action.get("params") or {})), ActionStatus.PLANNED.value,
                    json_column(dict(plan)) if isinstance(plan, Mapping) else None,
                    float(action.get("created_at") or now), now, seq,
                ),
            )  # fmt: skip
            _event(db, str(action["idempotency_key"]), now, "adopted",
                   f"from the previous leader, where it was {action.get('status')}")  # fmt: skip
        return True

    # -- actions ------------------------------------------------------------------------------------------

    def get_action(self, idempotency_key: str) -> ActionRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM actions WHERE idempotency_key = ?", (idempotency_key,)).fetchone()
        return _record(row) if row is not None else None

    def pending_actions(self) -> list[ActionRecord]:
        """Actions left planned or started, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM actions WHERE status IN (?, ?) ORDER BY seq",
                (ActionStatus.PLANNED.value, ActionStatus.STARTED.value),
            ).fetchall()
        return [_record(row) for row in rows]

    def deferred_actions(self, policy: str | None = None) -> list[ActionRecord]:
        """Actions the global limits deferred (of `policy`, or of every policy), oldest first."""
        query, args = "SELECT * FROM actions WHERE status = ?", [ActionStatus.DEFERRED.value]
        if policy is not None:
            query, args = query + " AND policy = ?", [*args, policy]
        with self._lock:
            rows = self._db.execute(query + " ORDER BY seq", args).fetchall()
        return [_record(row) for row in rows]

    def defer(self, idempotency_key: str, now: float, reason: str) -> ActionRecord:
        """A refusal by the global limits: the action is (still) deferred, `reason` journaled as an event and kept
        as the action's error (the latest refusal). Only a planned or deferred action can be deferred."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE actions SET status = ?, error = ?, updated_at = ? WHERE idempotency_key = ? "
                "AND status IN (?, ?)",
                (
                    ActionStatus.DEFERRED.value,
                    reason,
                    now,
                    idempotency_key,
                    ActionStatus.PLANNED.value,
                    ActionStatus.DEFERRED.value,
                ),
            )
            if cursor.rowcount != 1:
                raise JournalError(f"journal {self.path}: action {idempotency_key!r} is not planned or deferred")
            _event(db, idempotency_key, now, ActionStatus.DEFERRED.value, reason)
            row = db.execute("SELECT * FROM actions WHERE idempotency_key = ?", (idempotency_key,)).fetchone()
        return _record(row)

    def action_events(self, idempotency_key: str) -> list[dict[str, Any]]:
        """What happened to a deferred action, oldest first: {"at", "event", "detail"} (none for the others)."""
        with self._lock:
            return self._events(idempotency_key)

    def actions_for(self, decision_id: str) -> list[ActionRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM actions WHERE decision_id = ? ORDER BY seq", (decision_id,)
            ).fetchall()
        return [_record(row) for row in rows]

    def actions_since(self, resource: str, since: float) -> list[ActionRecord]:
        """Mutating actions on `resource` (from any policy) whose first attempt began at or after `since`."""
        mutating = sorted(action.value for action in MUTATING_ACTIONS)
        with self._lock:
            rows = self._db.execute(
                f"SELECT * FROM actions WHERE resource = ? AND started_at IS NOT NULL AND started_at >= ? "
                f"AND type IN ({','.join('?' * len(mutating))}) ORDER BY started_at, seq",
                (resource, since, *mutating),
            ).fetchall()
        return [_record(row) for row in rows]

    def all_actions(self) -> list[ActionRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM actions ORDER BY seq").fetchall()
        return [_record(row) for row in rows]

    def mark_started(self, idempotency_key: str, now: float, plan: Mapping[str, Any] | None = None) -> ActionRecord:
        """Committed BEFORE the actuator is called: attempts+1, status started (first start time is kept).
        A deferred action starting (the limits allow it now) is journaled as an event too."""
        with self._transaction() as db:
            was_deferred = _status(db, idempotency_key) == ActionStatus.DEFERRED.value
            cursor = db.execute(
                "UPDATE actions SET status = ?, attempts = attempts + 1, "
                "started_at = COALESCE(started_at, ?), "
                "plan = COALESCE(?, plan), updated_at = ? WHERE idempotency_key = ? AND status IN (?, ?, ?)",
                (
                    ActionStatus.STARTED.value,
                    now,
                    json_column(dict(plan)) if plan is not None else None,
                    now,
                    idempotency_key,
                    *_OPEN,
                ),
            )
            if cursor.rowcount != 1:
                raise JournalError(
                    f"journal {self.path}: action {idempotency_key!r} is not planned or started (or deferred)"
                )
            if was_deferred:
                _event(db, idempotency_key, now, ActionStatus.STARTED.value, "the global limits allow it now")
            row = db.execute("SELECT * FROM actions WHERE idempotency_key = ?", (idempotency_key,)).fetchone()
        return _record(row)

    def set_plan(self, idempotency_key: str, plan: Mapping[str, Any], now: float) -> ActionRecord:
        """Journal the plan of a planned or deferred action (made from the world its decision saw; it carries the
        precondition and the deadline: controller/loop/preconditions.py) before the action is queued. A started or
        finished action keeps its plan (a resume never plans again)."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE actions SET plan = ?, updated_at = ? WHERE idempotency_key = ? AND status IN (?, ?)",
                (json_column(dict(plan)), now, idempotency_key, ActionStatus.PLANNED.value,
                 ActionStatus.DEFERRED.value),
            )  # fmt: skip
            if cursor.rowcount != 1:
                raise JournalError(f"journal {self.path}: action {idempotency_key!r} is not planned or deferred")
            row = db.execute("SELECT * FROM actions WHERE idempotency_key = ?", (idempotency_key,)).fetchone()
        return _record(row)

    def record_event(self, idempotency_key: str, now: float, event: str, detail: str | None) -> None:
        with self._transaction() as db:
            _event(db, idempotency_key, now, event, detail)

    def finish(
        self,
        idempotency_key: str,
        status: ActionStatus,
        now: float,
        *,
        result: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> ActionRecord:
        """Record a terminal status. A terminal action is never changed again (first result wins). The final
        outcome of an action that was deferred is journaled as an event too."""
        if status not in TERMINAL_STATUSES:
            raise ValueError(f"finish() needs a terminal status, got {status.value!r}")
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE actions SET status = ?, result = ?, error = ?, finished_at = ?, updated_at = ? "
                "WHERE idempotency_key = ? AND status IN (?, ?, ?)",
                (
                    status.value,
                    json_column(dict(result)) if result is not None else None,
                    error,
                    now,
                    now,
                    idempotency_key,
                    *_OPEN,
                ),
            )
            if cursor.rowcount == 1 and _has_events(db, idempotency_key):
                _event(db, idempotency_key, now, status.value, error)
            row = db.execute("SELECT * FROM actions WHERE idempotency_key = ?", (idempotency_key,)).fetchone()
        if row is None:
            raise JournalError(f"journal {self.path}: no action {idempotency_key!r}")
        return _record(row)

    # -- abort (controller/core/controls.py AbortRequest) ----------------------------------------------------

    def abort_actions(self, request: AbortRequest, now: float) -> list[ActionRecord]:
        """One transaction: the decision's planned and deferred actions end `aborted`, each started one gets an
        `abort_requested` event (journal_aborts.py). Every action of the decision, as it is after, oldest first."""
        return abort_actions(self._transaction, request, now)

    def abort_requested(self, idempotency_key: str) -> AbortRequest | None:
        """The abort journaled for a started action (its latest `abort_requested` event), or None."""
        return abort_requested(self._db, self._lock, idempotency_key)

    # -- decisions ----------------------------------------------------------------------------------------

    def decision(self, decision_id: str, kind: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT body FROM decisions WHERE id = ? AND kind = ?", (decision_id, kind)
            ).fetchone()
        return json.loads(row["body"]) if row is not None else None

    def recent_decisions(self, limit: int = 100, before: int | None = None) -> list[dict[str, Any]]:
        """Newest first, paged (journal_reads.py: on the read connection, never under the writer's lock)."""
        return self._reader.recent_decisions(limit, before)

    # -- operator controls (controller/core/controls.py) ---------------------------------------------------

    def load_controls(self) -> Controls:
        """The pauses in force (and the resumes that ended earlier ones), as last saved; none in a new journal."""
        return load_controls(self._db, self._lock, self.path)

    def record_control(
        self, controls: Controls | None, action: str, subject: str, by: str, reason: str, now: float
    ) -> None:
        """Journal one operator control and, in the same transaction, the control set it leaves (None: unchanged,
        e.g. an abort)."""
        record_control(self._transaction, controls, (now, action, subject, by, reason))

    def policy_names(self) -> list[str]:
        """The policies whose engine state the journal holds."""
        with self._lock:
            rows = self._db.execute("SELECT policy FROM policy_meta ORDER BY policy").fetchall()
        return [str(row["policy"]) for row in rows]

    def recent_controls(self, limit: int = 50) -> list[dict[str, Any]]:
        """Newest first (journal_reads.py: on the read connection)."""
        return self._reader.recent_controls(limit)

    def _events(self, idempotency_key: str) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT at, event, detail FROM action_events WHERE idempotency_key = ? ORDER BY seq", (idempotency_key,)
        ).fetchall()
        return [{"at": row["at"], "event": row["event"], "detail": row["detail"]} for row in rows]

    def close(self) -> None:
        with self._lock:
            self._reader.close()
            self._db.close()
            self._closed = True

    @property
    def closed(self) -> bool:
        """Whether `close` ran (the controller closes its journal on stop, before the elector's last rounds)."""
        return self._closed

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
