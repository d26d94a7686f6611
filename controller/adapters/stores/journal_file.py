"""Which file the journal opens (issue 24, item 8): a new journal is created whole or not at all, and an existing
file that is not a tailguard journal is refused with one line, never silently started on as an empty journal.

A zero-length file, a file that is not SQLite, or a SQLite database without `meta.schema_version` (another
program's database) at the journal path means the journal the operator expects is not there (a volume not
mounted, a restore that went wrong, a wrong path): starting on it as a new journal would forget every planned
action, cooldown and pause without a word. `--new-journal` says otherwise: the file is set aside (renamed
`<name>.set-aside-<unix time>`, with its -wal and -shm) and a new journal is created.

A new journal is written under a temporary name and renamed into place once its schema committed, so a process
killed while creating it leaves no half-made file at the journal path (which the next start would refuse).
"""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

logger = logging.getLogger("tailguard.journal")

NEW_JOURNAL_HINT = "pass --new-journal to set it aside and start a new journal"
_SIDE_FILES = ("-wal", "-shm")


# Tables that other tailguard stores keep in the journal's file (adapters/stores/incidents.py: the incidents of a
# controller without a cluster); a file holding only these is tailguard's, not a foreign database.
COMPANION_TABLES = frozenset({"incidents"})


def journal_file_problem(path: Path) -> str | None:
    """Why the existing file at `path` is not a tailguard journal, or None when it is one (any schema version)."""
    try:
        size = path.stat().st_size
    except OSError as unreadable:
        return f"cannot be read: {unreadable.strerror or unreadable}"
    if size == 0 and not Path(f"{path}-wal").exists():
        return "is an empty file (0 bytes), not a journal"
    try:
        db = sqlite3.connect(str(path), isolation_level=None, timeout=30.0)
    except sqlite3.Error as unusable:
        return f"cannot be opened: {unusable}"
    try:
        tables = sorted(row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        if "meta" in tables and db.execute("SELECT 1 FROM meta WHERE key = 'schema_version'").fetchone():
            return None
    except sqlite3.DatabaseError as unusable:
        return f"is not a SQLite database ({unusable})"
    finally:
        db.close()
    if not tables:
        return "is a SQLite database with no tables, not a journal"
    if set(tables) <= COMPANION_TABLES:
        return None  # tailguard's own file, its journal tables not made yet: the journal adds them in place
    shown = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
    return f"is a SQLite database but not a tailguard journal (no meta.schema_version; its tables: {shown})"


def set_aside(path: Path, now: float) -> Path:
    """Rename the file (and its -wal/-shm; those alone when the file itself is gone) out of the journal's way;
    returns the new name."""
    aside = path.with_name(f"{path.name}.set-aside-{int(now)}")
    for suffix in _SIDE_FILES:
        side = Path(f"{path}{suffix}")
        if side.exists():
            os.replace(side, Path(f"{aside}{suffix}"))
    if path.exists():
        os.replace(path, aside)
    return aside


def creating_path(path: Path) -> Path:
    """Where a new journal is built before it is renamed into place."""
    return path.with_name(f"{path.name}.creating")


def discard(path: Path) -> None:
    """Remove a half-made file (and its -wal/-shm) a killed creation left."""
    for candidate in (path, *(Path(f"{path}{suffix}") for suffix in _SIDE_FILES)):
        candidate.unlink(missing_ok=True)


def move_into_place(built: Path, path: Path) -> None:
    """The new journal (closed: its WAL checkpointed) becomes the journal path, durably."""
    os.replace(built, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
