"""Operator controls in the journal (controller/core/controls.py): the control set in force, kept in `meta`, and
every control (pause, resume, abort, inherit) as a row of `controls`: who, what, when and why."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from tailguard.controller.adapters.stores.journal_retention import Transaction
from tailguard.controller.adapters.stores.journal_schema import JournalError
from tailguard.controller.core.controls import CONTROLS_META_KEY, Controls, ControlsError


def load_controls(db: sqlite3.Connection, lock: threading.RLock, path: Path) -> Controls:
    """The pauses in force (and the resumes that ended earlier ones), as last saved; none in a new journal."""
    with lock:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (CONTROLS_META_KEY,)).fetchone()
    if row is None:
        return Controls()
    try:
        return Controls.decode(row["value"])
    except ControlsError as unreadable:
        raise JournalError(f"journal {path}: meta.{CONTROLS_META_KEY} is unreadable: {unreadable}") from None


def record_control(transaction: Transaction, controls: Controls | None, row: tuple[float, str, str, str, str]) -> None:
    """One control `row` (at, action, subject, by, reason) and, in the same transaction, the control set it leaves
    (None: unchanged, e.g. an abort)."""
    with transaction() as db:
        db.execute("INSERT INTO controls (at, action, subject, by, reason) VALUES (?, ?, ?, ?, ?)", row)
        if controls is not None:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (CONTROLS_META_KEY, controls.encode()))
