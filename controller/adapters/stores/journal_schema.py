"""The journal's schema (its tables, their version and migration) and the creation of a new journal file: built
whole under another name and renamed into place (journal_file.py), or not at all."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

from tailguard.controller.adapters.stores.journal_file import (
    NEW_JOURNAL_HINT,
    creating_path,
    discard,
    journal_file_problem,
    move_into_place,
    set_aside,
)
from tailguard.controller.adapters.stores.journal_retention import RETENTION_INDEXES
from tailguard.controller.adapters.stores.journal_state import STATE_SCHEMA, StateStore, migrate_whole_states
from tailguard.controller.kit.errors import StoreError, StoreWriteError
from tailguard.controller.kit.sqlite_store import immediate_transaction, make_durable, open_durable

logger = logging.getLogger("tailguard.journal")

# 2: the engine state per (policy, condition, target) (journal_state.py) instead of one whole-state row per
# policy (`policy_state`, migrated when a version-1 file is opened); retention indexes (journal_retention.py).
SCHEMA_VERSION = 2
# A new journal's page size: a healthy evaluation rewrites one small row (policy_meta), i.e. one WAL frame of a
# page; at 2 KiB that is 2,072 bytes per cycle (4,120 at SQLite's default 4 KiB), and a condition_state row of a
# few hundred bytes still fits a page (rows up to ~490 bytes stay local; longer evidence spills to overflow).
JOURNAL_PAGE_SIZE = 2048


class JournalError(StoreError):
    """The journal file cannot be used (not a database, a newer schema, ...); the message says why."""


class JournalWriteError(JournalError, StoreWriteError):
    """An evaluation's commit was refused (a full disk, a read-only volume): nothing of it was kept."""


SCHEMA = (
    """CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS decisions (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL,
        kind TEXT NOT NULL,
        policy TEXT NOT NULL,
        condition TEXT NOT NULL,
        target TEXT NOT NULL,
        at REAL NOT NULL,
        value REAL,
        threshold REAL NOT NULL,
        evidence TEXT NOT NULL,
        reason TEXT NOT NULL,
        dry_run INTEGER NOT NULL,
        body TEXT NOT NULL,
        recorded_at REAL NOT NULL,
        UNIQUE (id, kind))""",
    """CREATE TABLE IF NOT EXISTS actions (
        idempotency_key TEXT PRIMARY KEY,
        decision_id TEXT NOT NULL,
        decision_kind TEXT NOT NULL,
        policy TEXT NOT NULL,
        resource TEXT NOT NULL,
        type TEXT NOT NULL,
        params TEXT NOT NULL,
        dry_run INTEGER NOT NULL,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        result TEXT,
        error TEXT,
        plan TEXT,
        created_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        updated_at REAL NOT NULL,
        seq INTEGER NOT NULL)""",
    """CREATE INDEX IF NOT EXISTS actions_by_status ON actions (status, seq)""",
    """CREATE INDEX IF NOT EXISTS actions_by_resource ON actions (resource, started_at)""",
    """CREATE INDEX IF NOT EXISTS actions_by_decision ON actions (decision_id, seq)""",
    """CREATE TABLE IF NOT EXISTS action_events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        idempotency_key TEXT NOT NULL,
        at REAL NOT NULL,
        event TEXT NOT NULL,
        detail TEXT)""",
    """CREATE INDEX IF NOT EXISTS action_events_by_key ON action_events (idempotency_key, seq)""",
    # Operator controls (pause, resume, abort): who did what, when and why (the current set is in meta).
    """CREATE TABLE IF NOT EXISTS controls (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        action TEXT NOT NULL,
        subject TEXT NOT NULL,
        by TEXT NOT NULL,
        reason TEXT NOT NULL)""",
)


def migrate(db: sqlite3.Connection, lock: threading.RLock, path: Path, states: StateStore) -> None:
    """Create what is missing and bring an older journal up to SCHEMA_VERSION, in one transaction; a newer or
    unreadable schema version is refused (JournalError)."""
    with immediate_transaction(db, lock):
        db.execute(SCHEMA[0])
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is not None:
            try:
                version = int(row["value"])
            except ValueError:
                raise JournalError(
                    f"journal {path}: meta.schema_version is {row['value']!r}, expected an integer"
                ) from None
            if version > SCHEMA_VERSION:
                raise JournalError(
                    f"journal {path}: schema version {version} is newer than this tailguard "
                    f"supports ({SCHEMA_VERSION}); upgrade tailguard or use another journal path"
                )
        for statement in (*SCHEMA[1:], *STATE_SCHEMA, *RETENTION_INDEXES):
            db.execute(statement)
        migrate_whole_states(db, states)
        db.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
            (str(SCHEMA_VERSION),),
        )


def create_if_missing(path: Path, new_journal: bool, now: float | None) -> None:
    """A journal file at `path`: an existing journal is kept; a file that is not one is refused (JournalError, one
    line) or, with `new_journal`, set aside (journal_file.py); a new journal is built whole under another name and
    renamed into place. `now` names the set-aside file."""
    if path.is_dir():
        raise JournalError(f"journal {path} is a directory; the journal path names a file")
    if path.exists():
        problem = journal_file_problem(path)
        if problem is None:
            return
        if not new_journal:
            raise JournalError(f"journal {path} {problem}; refusing to start on it ({NEW_JOURNAL_HINT})")
        aside = set_aside(path, time.time() if now is None else now)
        logger.warning("journal %s %s: set aside as %s (--new-journal); starting a new journal", path,
                       problem, aside)  # fmt: skip
    elif Path(f"{path}-wal").exists():
        problem = f"is missing but its write-ahead log {path}-wal is there"
        if not new_journal:
            raise JournalError(f"journal {path} {problem}; refusing to start on it ({NEW_JOURNAL_HINT})")
        aside = set_aside(path, time.time() if now is None else now)
        logger.warning("journal %s %s: set aside as %s-wal (--new-journal); starting a new journal", path,
                       problem, aside)  # fmt: skip
    built = creating_path(path)
    discard(built)  # what a creation killed half-way left
    db = open_durable(built, JournalError, "journal")
    try:
        make_durable(db, page_size=JOURNAL_PAGE_SIZE)
        migrate(db, threading.RLock(), path, StateStore())
    except sqlite3.DatabaseError as exc:
        raise JournalError(f"journal {built}: cannot create a new journal: {exc}") from exc
    finally:
        db.close()
    try:
        move_into_place(built, path)
    except OSError as exc:
        raise JournalError(f"journal {path}: cannot create a new journal: {exc}") from exc


# ----- rows of the actions tables, inside a transaction ----------------------------------------------------------


def action_status(db: sqlite3.Connection, idempotency_key: str) -> str | None:
    row = db.execute("SELECT status FROM actions WHERE idempotency_key = ?", (idempotency_key,)).fetchone()
    return str(row["status"]) if row is not None else None


def has_events(db: sqlite3.Connection, idempotency_key: str) -> bool:
    row = db.execute("SELECT 1 FROM action_events WHERE idempotency_key = ? LIMIT 1", (idempotency_key,)).fetchone()
    return row is not None


def add_event(db: sqlite3.Connection, idempotency_key: str, at: float, event: str, detail: str | None) -> None:
    db.execute(
        "INSERT INTO action_events (idempotency_key, at, event, detail) VALUES (?, ?, ?, ?)",
        (idempotency_key, at, event, detail),
    )
