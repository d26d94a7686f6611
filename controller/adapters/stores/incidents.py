"""Incidents in the journal's SQLite file (the local tier, and any run without a cluster): IncidentStorePort.

One row per incident (its JSON and the service's ledger as the incident left it) and a version counter: a save
is `UPDATE ... WHERE version = ?` (a create an INSERT that fails on the id), the same compare-and-set the cluster
store makes with resourceVersion. The journal stays the audit log of decisions and actions; this table is the
incident's current state.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from tailguard.controller.core.incidents import Incident, IncidentConflict, Ledger, scope_key
from tailguard.controller.kit.errors import StoreError
from tailguard.controller.kit.sqlite_store import immediate_transaction, json_column, make_durable, open_durable

_SCHEMA = """
CREATE TABLE IF NOT EXISTS incidents (
    id TEXT PRIMARY KEY,
    scope TEXT NOT NULL,
    service TEXT NOT NULL,
    opened_at REAL NOT NULL,
    open INTEGER NOT NULL,
    version INTEGER NOT NULL,
    body TEXT NOT NULL,
    ledger TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS incidents_scope ON incidents (scope, open);
CREATE INDEX IF NOT EXISTS incidents_service ON incidents (service, opened_at);
"""


class SqliteIncidentStore:
    """IncidentStorePort on a SQLite file (the journal's: `tailguard run` passes the journal path)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._db = open_durable(self.path, StoreError, "incident store")
        try:
            make_durable(self._db)
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreError(f"incident store {self.path}: not a usable SQLite database: {exc}") from exc

    def current(self, scope_key: str) -> tuple[Incident, Ledger] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM incidents WHERE scope = ? AND open = 1 ORDER BY opened_at DESC LIMIT 1", (scope_key,)
            ).fetchone()
        if row is None:
            return None
        return _incident(row), _ledger(row)

    def ledger(self, service: str) -> Ledger:
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM incidents WHERE service = ? ORDER BY opened_at DESC, id DESC LIMIT 1", (service,)
            ).fetchone()
        return _ledger(row) if row is not None else Ledger(service)

    def latest(self, service: str, *, open_only: bool) -> Incident | None:
        where = " AND open = 1" if open_only else ""
        with self._lock:
            row = self._db.execute(
                f"SELECT * FROM incidents WHERE service = ?{where} ORDER BY opened_at DESC, id DESC LIMIT 1", (service,)
            ).fetchone()
        return _incident(row) if row is not None else None

    def save(self, incident: Incident, ledger: Ledger) -> Incident:
        body = json_column(incident.to_json())
        stored_ledger = json_column(ledger.to_json())
        with immediate_transaction(self._db, self._lock) as db:
            if incident.version == "":
                try:
                    db.execute(
                        "INSERT INTO incidents (id, scope, service, opened_at, open, version, body, ledger) "
                        "VALUES (?, ?, ?, ?, ?, 1, ?, ?)",
                        (
                            incident.id,
                            scope_key(incident.scope),
                            incident.service,
                            incident.opened_at,
                            int(incident.open),
                            body,
                            stored_ledger,
                        ),
                    )
                except sqlite3.IntegrityError as exc:
                    raise IncidentConflict(f"incident {incident.id} exists already") from exc
                version = 1
            else:
                version = int(incident.version) + 1
                changed = db.execute(
                    "UPDATE incidents SET open = ?, version = ?, body = ?, ledger = ? WHERE id = ? AND version = ?",
                    (int(incident.open), version, body, stored_ledger, incident.id, int(incident.version)),
                ).rowcount
                if changed != 1:
                    raise IncidentConflict(f"incident {incident.id} changed since version {incident.version}")
        return Incident.from_json(incident.to_json(), str(version))

    def incidents(self, *, open_only: bool = True, limit: int = 50) -> list[Incident]:
        where = "WHERE open = 1 " if open_only else ""
        with self._lock:
            rows = self._db.execute(
                f"SELECT * FROM incidents {where}ORDER BY opened_at DESC, id DESC LIMIT ?", (int(limit),)
            ).fetchall()
        return [_incident(row) for row in rows]

    def purge(self, before: float) -> int:
        """Delete the incidents that ended before `before`, except each service's latest (it holds the service's
        ledger: the revisions known bad outlive any retention). Returns how many were deleted."""
        with immediate_transaction(self._db, self._lock) as db:
            return int(
                db.execute(
                    "DELETE FROM incidents WHERE open = 0 AND json_extract(body, '$.ended_at') < ? AND id NOT IN "
                    "(SELECT id FROM incidents AS latest WHERE latest.service = incidents.service "
                    "ORDER BY opened_at DESC, id DESC LIMIT 1)",
                    (before,),
                ).rowcount
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _incident(row: Any) -> Incident:
    return Incident.from_json(json.loads(row["body"]), str(row["version"]))


def _ledger(row: Any) -> Ledger:
    return Ledger.from_json(json.loads(row["ledger"]), str(row["version"]))
