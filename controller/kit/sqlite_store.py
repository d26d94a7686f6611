"""The SQLite conventions every durable store of the controller shares (the journal, the Grafana outbox).

One connection per store, shared by threads under the store's lock; transactions are explicit
(`BEGIN IMMEDIATE ... COMMIT`), the log is WAL and every COMMIT is fsynced (synchronous=FULL), so a
committed row survives a crash of the process or of the machine.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def open_durable(path: Path, error: Callable[[str], Exception], what: str) -> sqlite3.Connection:
    """Open (creating its folder) a store; an unusable path raises `error` with a message naming `what`."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT).
        db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30.0)
    except (OSError, sqlite3.Error) as exc:
        raise error(f"{what} {path}: cannot open: {exc}") from exc
    db.row_factory = sqlite3.Row
    return db


def open_reader(path: Path, error: Callable[[str], Exception], what: str) -> sqlite3.Connection:
    """A second connection to a store (WAL), for reads only (`query_only`): readers take their own lock, so they
    never wait on the writer's nor make it wait; each `read_snapshot` sees one committed state."""
    try:
        db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30.0)
        db.execute("PRAGMA query_only=ON")
    except sqlite3.Error as exc:
        raise error(f"{what} {path}: cannot open for reading: {exc}") from exc
    db.row_factory = sqlite3.Row
    return db


@contextmanager
def read_snapshot(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """Several reads in one snapshot (a deferred transaction: in WAL it blocks no writer)."""
    db.execute("BEGIN")
    try:
        yield db
    finally:
        db.execute("COMMIT")


def make_durable(db: sqlite3.Connection, page_size: int | None = None) -> None:
    """WAL and an fsync per COMMIT. Raises sqlite3.DatabaseError when the file is not a database.

    `page_size` (bytes, a power of two from 512 to 65536): the page size of a NEW file; every page a commit
    changes is one WAL frame of that size (+24 bytes), so a commit that touches one small row writes one page.
    An existing file keeps its page size (changing it would take a full `VACUUM` outside WAL mode).

    A NEW file gets auto_vacuum=INCREMENTAL (it must be set before the first table): `PRAGMA incremental_vacuum`
    then gives pages freed by a purge back to the file system. On an existing file the pragma changes nothing
    (auto_vacuum=NONE stays NONE until a full `VACUUM`); such a file reuses its free pages but never shrinks.
    The WAL file is truncated back to 64 MiB after a checkpoint that found it larger."""
    if page_size is not None:
        db.execute(f"PRAGMA page_size={int(page_size)}")  # a no-op on a file that has tables already
    db.execute("PRAGMA auto_vacuum=INCREMENTAL")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA journal_size_limit=67108864")
    db.execute("PRAGMA synchronous=FULL")


@contextmanager
def immediate_transaction(db: sqlite3.Connection, lock: threading.RLock) -> Iterator[sqlite3.Connection]:
    """One write transaction: takes the write lock up front, rolls back on any exception."""
    with lock:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            # SQLite has already rolled back on some errors (SQLITE_FULL: a full disk); a second ROLLBACK would
            # raise "no transaction is active" and hide the cause.
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")


def incremental_vacuum(db: sqlite3.Connection) -> int:
    """Give the free pages back to the file system (a file with auto_vacuum=INCREMENTAL; 0 for the others).
    Returns the number of pages freed. Call it under the store's lock with no transaction open: it runs as its
    own transaction (executescript: `execute` would free one page per call, the pragma steps once per page)."""
    if db.in_transaction:
        raise RuntimeError("incremental_vacuum runs outside a transaction")
    if int(db.execute("PRAGMA auto_vacuum").fetchone()[0]) != 2:  # 2: INCREMENTAL
        return 0
    before = int(db.execute("PRAGMA freelist_count").fetchone()[0])
    db.executescript("PRAGMA incremental_vacuum;")
    return before - int(db.execute("PRAGMA freelist_count").fetchone()[0])


def finite(value: Any) -> Any:
    """JSON has no NaN/Infinity: store them as null rather than fail the whole transaction."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(key): finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def json_column(value: Any) -> str:
    """The one JSON text form of a stored column: sorted keys, compact, NaN as null."""
    return json.dumps(finite(value), sort_keys=True, separators=(",", ":"), allow_nan=False, default=str)
