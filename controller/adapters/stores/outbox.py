"""A durable outbox: what must reach an outside system (Grafana) is committed here before any HTTP.

SQLite (stdlib) in WAL mode with synchronous=FULL, like controller/adapters/stores/journal.py: an
item that `enqueue` returned for survives a crash, and a new process that opens
the same file finds it still pending and delivers it.

Delivery is in order (by `seq`): a worker takes the oldest due item, marks the
attempt (committed before the call, so an attempt that crashed mid-send is
known to be *ambiguous*), calls the sender and records the result. A transient
failure stops the pass and retries the same item later with exponential
backoff, so a later item (a region's PATCH) never overtakes an earlier one (its
POST). Each item is keyed by an idempotency key (INSERT OR IGNORE), so enqueuing
the same thing twice delivers it once.

Retry waits are short and never outlive their cause: the backoff is capped at
MAX_RETRY_DELAY (30 s), so the first attempt after the remote comes back is at
most 30 s later; it starts again from `initial` for the next item once one is
delivered (each item counts its own attempts, and only the head is attempted);
and a new process does not inherit the last one's wait (`OutboxWorker.start`
makes every pending item due now: `Outbox.reset_backoff`).

`refs` maps a logical name (e.g. `decision:<id>`) to what the remote system
called it (Grafana's annotation id), so a later item can update it.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Self

from tailguard.controller.core.ports import Clock
from tailguard.controller.kit.clock import ShutdownInterrupt
from tailguard.controller.kit.errors import StoreError
from tailguard.controller.kit.http import backoff_delay
from tailguard.controller.kit.sqlite_store import immediate_transaction, incremental_vacuum, make_durable, open_durable

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
# The longest wait between two attempts at an item: a remote that comes back is used again within this.
MAX_RETRY_DELAY = 30.0


class OutboxStatus(StrEnum):
    PENDING = "pending"  # waiting for its (next) attempt
    DELIVERED = "delivered"
    DEAD = "dead"  # the remote refused it for good (a 4xx that retrying would only repeat)


class OutboxError(StoreError):
    """The outbox file cannot be used; the message names the file and why."""


@dataclass(frozen=True)
class OutboxItem:
    seq: int
    key: str
    kind: str
    payload: Mapping[str, Any]
    status: OutboxStatus
    attempts: int
    # An attempt was started and never recorded: the remote may or may not have it.
    in_flight: bool
    next_attempt_at: float
    last_error: str | None
    result: Mapping[str, Any] | None
    created_at: float
    delivered_at: float | None


@dataclass(frozen=True)
class DeliveryResult:
    """What a sender reports for one item. `transient` failures are retried; the others are dead."""

    ok: bool
    result: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    transient: bool = False
    # Names this delivery gave remote objects, stored in refs (e.g. {"decision:abc": 17}).
    refs: Mapping[str, int] = field(default_factory=dict)


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS outbox (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        key TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL,
        payload TEXT NOT NULL,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        in_flight INTEGER NOT NULL DEFAULT 0,
        next_attempt_at REAL NOT NULL,
        last_error TEXT,
        result TEXT,
        created_at REAL NOT NULL,
        delivered_at REAL)""",
    "CREATE INDEX IF NOT EXISTS outbox_by_status ON outbox (status, seq)",
    "CREATE TABLE IF NOT EXISTS refs (name TEXT PRIMARY KEY, remote_id INTEGER NOT NULL)",
)


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


class Outbox:
    """Thread-safe: one connection guarded by a lock (the dispatcher enqueues while the worker delivers)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._db = open_durable(self.path, OutboxError, "outbox")
        try:
            make_durable(self._db)
            with self._transaction() as db:
                for statement in _SCHEMA:
                    db.execute(statement)
                row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                if row is not None and (not row["value"].isdigit() or int(row["value"]) > SCHEMA_VERSION):
                    raise OutboxError(
                        f"outbox {self.path}: schema version {row['value']!r} is not one this tailguard supports "
                        f"({SCHEMA_VERSION}); use another outbox path"
                    )
                db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise OutboxError(f"outbox {self.path}: not a usable SQLite database: {exc}") from exc
        except OutboxError:
            self._db.close()
            raise

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with immediate_transaction(self._db, self._lock) as db:
            yield db

    # -- producers --------------------------------------------------------------------------------------

    def enqueue(self, key: str, kind: str, payload: Mapping[str, Any], now: float) -> bool:
        """Durably queue one item; False when `key` was queued before (it is then delivered only once)."""
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT OR IGNORE INTO outbox (key, kind, payload, status, next_attempt_at, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (key, kind, _dumps(dict(payload)), OutboxStatus.PENDING.value, now, now),
            )
            return cursor.rowcount == 1

    # -- the delivery side --------------------------------------------------------------------------------

    def get(self, key: str) -> OutboxItem | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM outbox WHERE key = ?", (key,)).fetchone()
        return _item(row) if row is not None else None

    def items(self) -> list[OutboxItem]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM outbox ORDER BY seq").fetchall()
        return [_item(row) for row in rows]

    def pending(self) -> list[OutboxItem]:
        """Every item not yet delivered nor dead, oldest first (due or not)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM outbox WHERE status = ? ORDER BY seq", (OutboxStatus.PENDING.value,)
            ).fetchall()
        return [_item(row) for row in rows]

    def head(self) -> OutboxItem | None:
        """The oldest pending item: deliveries are strictly in order."""
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM outbox WHERE status = ? ORDER BY seq LIMIT 1", (OutboxStatus.PENDING.value,)
            ).fetchone()
        return _item(row) if row is not None else None

    def mark_attempt(self, key: str, now: float) -> OutboxItem:
        """Committed BEFORE the call: attempts+1 and in_flight, so a crash mid-send is known to be ambiguous."""
        with self._transaction() as db:
            db.execute("UPDATE outbox SET attempts = attempts + 1, in_flight = 1 WHERE key = ?", (key,))
            row = db.execute("SELECT * FROM outbox WHERE key = ?", (key,)).fetchone()
        if row is None:
            raise KeyError(key)
        return _item(row)

    def record(self, key: str, outcome: DeliveryResult, now: float, retry_at: float) -> OutboxItem:
        """The attempt's result: delivered, dead, or pending again at `retry_at` (transient failures)."""
        if outcome.ok:
            status = OutboxStatus.DELIVERED
        elif outcome.transient:
            status = OutboxStatus.PENDING
        else:
            status = OutboxStatus.DEAD
        with self._transaction() as db:
            for name, remote_id in outcome.refs.items():
                db.execute(
                    "INSERT INTO refs (name, remote_id) VALUES (?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET remote_id = excluded.remote_id",
                    (name, int(remote_id)),
                )
            db.execute(
                "UPDATE outbox SET status = ?, in_flight = ?, next_attempt_at = ?, last_error = ?, result = ?, "
                "delivered_at = ? WHERE key = ?",
                (
                    status.value,
                    # A transient failure may still have reached the remote (timeout after send): stay ambiguous.
                    1 if status is OutboxStatus.PENDING else 0,
                    retry_at if status is OutboxStatus.PENDING else now,
                    outcome.error,
                    _dumps(dict(outcome.result)) if outcome.ok else None,
                    now if outcome.ok else None,
                    key,
                ),
            )
            row = db.execute("SELECT * FROM outbox WHERE key = ?", (key,)).fetchone()
        return _item(row)

    def reset_backoff(self, now: float) -> int:
        """Every pending item due at `now` at the latest (a new process does not wait out an old backoff);
        returns how many waits were cut short."""
        with self._transaction() as db:
            return db.execute(
                "UPDATE outbox SET next_attempt_at = ? WHERE status = ? AND next_attempt_at > ?",
                (now, OutboxStatus.PENDING.value, now),
            ).rowcount

    def purge(self, cutoff: float) -> dict[str, int | float]:
        """Retention: remove delivered items delivered before `cutoff` and dead items declared dead before it
        (a pending item is never removed), then give the freed pages back (incremental vacuum). `refs` stay (a
        later update of a remote object still finds its id). An item removed can be enqueued again with its key
        (and delivered again): the retention (journalRetention, >= 1 day) outlives every repeat the producers
        send (a rollout is re-announced only within the change-tracking window)."""
        with self._transaction() as db:
            delivered = db.execute(
                "DELETE FROM outbox WHERE status = ? AND delivered_at < ?", (OutboxStatus.DELIVERED.value, cutoff)
            ).rowcount
            dead = db.execute(
                "DELETE FROM outbox WHERE status = ? AND next_attempt_at < ?", (OutboxStatus.DEAD.value, cutoff)
            ).rowcount
        with self._lock:
            freed = incremental_vacuum(self._db)
        return {"cutoff": cutoff, "delivered": delivered, "dead": dead, "freed_pages": freed}

    def ref(self, name: str) -> int | None:
        with self._lock:
            row = self._db.execute("SELECT remote_id FROM refs WHERE name = ?", (name,)).fetchone()
        return int(row["remote_id"]) if row is not None else None

    def set_ref(self, name: str, remote_id: int) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO refs (name, remote_id) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET remote_id = excluded.remote_id",
                (name, int(remote_id)),
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _item(row: sqlite3.Row) -> OutboxItem:
    return OutboxItem(
        seq=int(row["seq"]),
        key=row["key"],
        kind=row["kind"],
        payload=json.loads(row["payload"]),
        status=OutboxStatus(row["status"]),
        attempts=int(row["attempts"]),
        in_flight=bool(row["in_flight"]),
        next_attempt_at=float(row["next_attempt_at"]),
        last_error=row["last_error"],
        result=json.loads(row["result"]) if row["result"] is not None else None,
        created_at=float(row["created_at"]),
        delivered_at=row["delivered_at"],
    )


Sender = Callable[[OutboxItem], DeliveryResult]


@dataclass(frozen=True)
class Backoff:
    initial: float = 1.0
    factor: float = 2.0
    max_delay: float = MAX_RETRY_DELAY

    def delay(self, attempts: int) -> float:
        return backoff_delay(attempts, backoff=self.initial, max_backoff=self.max_delay, factor=self.factor)


@dataclass(frozen=True)
class PassReport:
    delivered: int = 0
    dead: int = 0
    # Set when the pass stopped at an item that failed transiently (or is not due yet).
    blocked_on: str | None = None
    error: str | None = None


def deliver_due(outbox: Outbox, sender: Sender, clock: Clock, backoff: Backoff, limit: int = 100) -> PassReport:
    """One pass: deliver due items in order until one fails transiently, is not due yet, or `limit` is reached."""
    delivered = dead = 0
    for _ in range(max(1, limit)):
        item = outbox.head()
        if item is None:
            return PassReport(delivered, dead)
        now = clock.now()
        if item.next_attempt_at > now:
            return PassReport(delivered, dead, item.key, item.last_error)
        attempted = outbox.mark_attempt(item.key, now)
        try:
            outcome = sender(attempted)
        except Exception as exc:  # noqa: BLE001 - a sender bug must not kill the worker; the item is retried
            outcome = DeliveryResult(False, error=f"{type(exc).__name__}: {exc}", transient=True)
        finished = clock.now()
        recorded = outbox.record(item.key, outcome, finished, finished + backoff.delay(attempted.attempts))
        if recorded.status is OutboxStatus.DELIVERED:
            delivered += 1
        elif recorded.status is OutboxStatus.DEAD:
            dead += 1
        else:
            return PassReport(delivered, dead, item.key, outcome.error)
    return PassReport(delivered, dead)


class OutboxWorker:
    """A background thread running `deliver_due` passes; `wake()` after an enqueue skips the idle wait."""

    def __init__(
        self,
        outbox: Outbox,
        sender: Sender,
        clock: Clock,
        *,
        backoff: Backoff | None = None,
        idle_interval: float = 1.0,
        name: str = "tailguard-outbox",
    ) -> None:
        self.outbox = outbox
        self.sender = sender
        self.clock = clock
        self.backoff = backoff or Backoff()
        self.idle_interval = idle_interval
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.last_report = PassReport()

    def start(self) -> None:
        # A restart retries at once: the stored waits were the previous process's backoff, not this one's.
        cut = self.outbox.reset_backoff(self.clock.now())
        if cut:
            log.info(
                "outbox %s: %d pending item(s) due now (a stored backoff does not outlive a restart)",
                self.outbox.path,
                cut,
            )
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.last_report = deliver_due(self.outbox, self.sender, self.clock, self.backoff)
            except ShutdownInterrupt:
                return  # a delivery's retry wait was cut short by shutdown; the entry stays due for next time
            except Exception as exc:  # noqa: BLE001 - e.g. a locked database: try again next round
                self.last_report = PassReport(error=f"{type(exc).__name__}: {exc}")
            wait = self.idle_interval
            head = self.outbox.head() if self.last_report.blocked_on else None
            if head is not None:
                wait = min(self.backoff.max_delay, max(0.05, head.next_attempt_at - self.clock.now()))
            # A real-time wait on an Event: stop() and wake() interrupt it at once.
            self._wake.wait(wait)
