"""The journal's read side (issue 24, item 6): what the decisions API and the status page read, through a second,
query-only connection under its own lock, so a read storm never holds the lock an evaluation commits under (WAL
gives each read a snapshot while the writer goes on). A page of decisions is three queries in one snapshot (the
decisions, their actions, the actions' events), never one per decision."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from typing import Any

from tailguard.controller.core.actions import ActionRecord, ActionStatus, ActionType
from tailguard.controller.kit.sqlite_store import read_snapshot

# Bound variables per IN (...) list: far below SQLite's limit (32,766), so a page of 1,000 decisions with many
# actions each still runs in a few statements.
_IN_CHUNK = 500


class JournalReader:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._db = connection
        self._lock = threading.Lock()

    def recent_decisions(self, limit: int = 100, before: int | None = None) -> list[dict[str, Any]]:
        """Newest first: each decision's JSON plus `recorded_at`, `seq` (pass the last one as `before` for the next
        page) and its journaled `action_records`. On the read connection, in one snapshot: three queries per page
        (the decisions, their actions, the actions' events), never one per decision."""
        with self._lock, read_snapshot(self._db) as db:
            rows = db.execute(
                "SELECT seq, body, recorded_at FROM decisions WHERE seq < ? ORDER BY seq DESC LIMIT ?",
                (before if before is not None else 2**63 - 1, max(0, limit)),
            ).fetchall()
            bodies: list[dict[str, Any]] = []
            for row in rows:
                body: dict[str, Any] = json.loads(row["body"])
                body["recorded_at"] = row["recorded_at"]
                body["seq"] = row["seq"]
                bodies.append(body)
            actions = _chunked_select(
                db, "SELECT * FROM actions WHERE decision_id IN ({}) ORDER BY seq", sorted({b["id"] for b in bodies})
            )
            events = _chunked_select(
                db,
                "SELECT idempotency_key, at, event, detail FROM action_events WHERE idempotency_key IN ({}) "
                "ORDER BY seq",
                [action["idempotency_key"] for action in actions],
            )
        events_of: dict[str, list[dict[str, Any]]] = {}
        for event in events:
            events_of.setdefault(event["idempotency_key"], []).append(
                {"at": event["at"], "event": event["event"], "detail": event["detail"]}
            )
        actions_of: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for action in actions:
            actions_of.setdefault((action["decision_id"], action["decision_kind"]), []).append(
                {**action_record(action).to_json(), "events": events_of.get(action["idempotency_key"], [])}
            )
        for body in bodies:
            body["action_records"] = actions_of.get((body["id"], body["kind"]), [])
        return bodies

    def recent_controls(self, limit: int = 50) -> list[dict[str, Any]]:
        """The operator controls, newest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT at, action, subject, by, reason FROM controls ORDER BY seq DESC LIMIT ?", (max(0, limit),)
            ).fetchall()
        return [dict(row) for row in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _chunked_select(db: sqlite3.Connection, query: str, keys: Sequence[str]) -> list[sqlite3.Row]:
    rows: list[sqlite3.Row] = []
    for start in range(0, len(keys), _IN_CHUNK):
        chunk = keys[start : start + _IN_CHUNK]
        rows.extend(db.execute(query.format(",".join("?" * len(chunk))), chunk).fetchall())
    return rows


def _loads(text: str | None) -> Any:
    return json.loads(text) if text is not None else None


def action_record(row: sqlite3.Row) -> ActionRecord:
    """An `actions` row as an ActionRecord (the journal's writer and reader share it)."""
    return ActionRecord(
        idempotency_key=row["idempotency_key"],
        decision_id=row["decision_id"],
        decision_kind=row["decision_kind"],
        policy=row["policy"],
        resource=row["resource"],
        type=ActionType(row["type"]),
        params=json.loads(row["params"]),
        dry_run=bool(row["dry_run"]),
        status=ActionStatus(row["status"]),
        attempts=int(row["attempts"]),
        result=_loads(row["result"]),
        error=row["error"],
        plan=_loads(row["plan"]),
        created_at=float(row["created_at"]),
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        updated_at=float(row["updated_at"]),
    )
