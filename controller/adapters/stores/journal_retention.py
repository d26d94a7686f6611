"""Retention of the journal (controller/adapters/stores/journal.py): old decisions, their actions and events go.

The unit is a decision with its actions (and their `action_events`): it is removed when the decision was recorded
before the cutoff AND every one of its actions is terminal and last changed before the cutoff. So an action that
is not terminal (planned, started, deferred) is never removed, nor is the decision it belongs to. Removal runs in
small transactions (`BATCH` decisions each), so an evaluation waits for one batch at most; the pages freed are
given back to the file system by an incremental vacuum when the file has auto_vacuum=INCREMENTAL (every journal
created since; an older file reuses its free pages for new rows but does not shrink: docs/deploy.md, "The journal
over months").
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

from tailguard.controller.core.actions import TERMINAL_STATUSES
from tailguard.controller.kit.sqlite_store import incremental_vacuum, json_column

BATCH = 500
# The smallest retention accepted: longer than any cooldown or budget window the journal's actions answer for.
MIN_RETENTION = 86_400.0
DEFAULT_RETENTION = 30 * 86_400.0

RETENTION_INDEXES = (
    # The cutoff range of retention, oldest first.
    "CREATE INDEX IF NOT EXISTS decisions_by_recorded_at ON decisions (recorded_at)",
    # The next action seq of every decision insert (MAX(seq)) without scanning the actions table.
    "CREATE INDEX IF NOT EXISTS actions_by_seq ON actions (seq)",
)

_TERMINAL = frozenset(status.value for status in TERMINAL_STATUSES)


@dataclass(frozen=True)
class PurgeReport:
    cutoff: float
    decisions: int = 0
    actions: int = 0
    events: int = 0
    kept_open: int = 0  # old decisions kept because an action of theirs is not terminal (or changed recently)
    freed_pages: int = 0

    def to_json(self) -> dict[str, float | int]:
        return {
            "cutoff": self.cutoff,
            "decisions": self.decisions,
            "actions": self.actions,
            "events": self.events,
            "kept_open": self.kept_open,
            "freed_pages": self.freed_pages,
        }


Transaction = Callable[[], AbstractContextManager[sqlite3.Connection]]


def purge(transaction: Transaction, cutoff: float, *, batch: int = BATCH) -> PurgeReport:
    """Remove what is older than `cutoff` (see the module docstring), `batch` decisions per transaction."""
    decisions = actions = events = kept = 0
    after: tuple[float, int] | None = None  # where the previous batch ended (the old decisions kept stay behind)
    while True:
        with transaction() as db:
            has_events = _has_table(db, "action_events")
            rows = db.execute(
                "SELECT seq, id, kind, recorded_at FROM decisions WHERE recorded_at < ? "
                + ("AND (recorded_at, seq) > (?, ?) " if after is not None else "")
                + "ORDER BY recorded_at, seq LIMIT ?",
                (cutoff, *(after or ()), batch),
            ).fetchall()
            if not rows:
                break
            after = (rows[-1]["recorded_at"], rows[-1]["seq"])
            for row in rows:
                keys = list(_removable_actions(db, row["id"], row["kind"], cutoff))
                if any(key is None for key in keys):
                    kept += 1
                    continue
                for key in keys:
                    if has_events:
                        events += db.execute("DELETE FROM action_events WHERE idempotency_key = ?", (key,)).rowcount
                    actions += db.execute("DELETE FROM actions WHERE idempotency_key = ?", (key,)).rowcount
                decisions += db.execute("DELETE FROM decisions WHERE seq = ?", (row["seq"],)).rowcount
        if len(rows) < batch:
            break
    return PurgeReport(cutoff, decisions, actions, events, kept)


def _removable_actions(db: sqlite3.Connection, decision_id: str, kind: str, cutoff: float) -> Iterator[str | None]:
    """The keys of a decision's actions; None for one that must stay (not terminal, or changed after cutoff)."""
    for action in db.execute(
        "SELECT idempotency_key, status, updated_at FROM actions WHERE decision_id = ? AND decision_kind = ?",
        (decision_id, kind),
    ):
        terminal = action["status"] in _TERMINAL and action["updated_at"] < cutoff
        yield action["idempotency_key"] if terminal else None


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


def purge_and_vacuum(
    transaction: Transaction, db: sqlite3.Connection, lock: threading.RLock, now: float, retention: float
) -> PurgeReport:
    """`purge` what is older than `retention` seconds, then give the freed pages back (incremental vacuum); the
    report is kept in `meta` (`last_purge`) too."""
    report = purge(transaction, now - retention)
    with lock:
        report = replace(report, freed_pages=incremental_vacuum(db))
    with transaction() as writing:
        writing.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('last_purge', ?)",
            (json_column({"at": now, "retention": retention, **report.to_json()}),),
        )
    return report
