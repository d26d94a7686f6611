"""The durable outbox: dedup by key, in-order delivery with backoff, dead items, survival across a reopen."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tailguard.controller.adapters.stores.outbox import (
    Backoff,
    DeliveryResult,
    Outbox,
    OutboxError,
    OutboxItem,
    OutboxStatus,
    deliver_due,
)
from tailguard.controller.kit.clock import ManualClock


class Sender:
    def __init__(self, answers: list[DeliveryResult] | None = None) -> None:
        self.answers = list(answers or [])
        self.sent: list[tuple[str, int]] = []

    def __call__(self, item: OutboxItem) -> DeliveryResult:
        self.sent.append((item.key, item.attempts))
        return self.answers.pop(0) if self.answers else DeliveryResult(True, {"ok": 1})


def test_enqueue_is_idempotent_and_ordered(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db") as outbox:
        assert outbox.enqueue("a", "k", {"n": 1}, 10.0) is True
        assert outbox.enqueue("b", "k", {"n": 2}, 11.0) is True
        assert outbox.enqueue("a", "k", {"n": 99}, 12.0) is False
        assert [(i.key, i.payload["n"]) for i in outbox.pending()] == [("a", 1), ("b", 2)]


def test_transient_failure_blocks_later_items_until_due(tmp_path: Path) -> None:
    clock = ManualClock(100.0)
    sender = Sender([DeliveryResult(False, error="503", transient=True)])
    with Outbox(tmp_path / "o.db") as outbox:
        outbox.enqueue("first", "k", {}, clock.now())
        outbox.enqueue("second", "k", {}, clock.now())
        report = deliver_due(outbox, sender, clock, Backoff(initial=10.0))
        assert report.delivered == 0 and report.blocked_on == "first" and report.error == "503"
        assert sender.sent == [("first", 1)]  # "second" did not overtake
        assert outbox.head().next_attempt_at == pytest.approx(110.0)  # type: ignore[union-attr]
        assert deliver_due(outbox, sender, clock, Backoff(initial=10.0)).delivered == 0  # not due yet
        clock.advance(10)
        assert deliver_due(outbox, sender, clock, Backoff(initial=10.0)).delivered == 2
        assert sender.sent == [("first", 1), ("first", 2), ("second", 1)]
        assert all(i.status is OutboxStatus.DELIVERED for i in outbox.items())


def test_backoff_grows_and_is_bounded() -> None:
    backoff = Backoff(initial=1.0, factor=2.0, max_delay=5.0)
    assert [backoff.delay(n) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_permanent_failure_is_dead_and_does_not_block(tmp_path: Path) -> None:
    clock = ManualClock(0.0)
    sender = Sender([DeliveryResult(False, error="400 bad", transient=False)])
    with Outbox(tmp_path / "o.db") as outbox:
        outbox.enqueue("bad", "k", {}, 0.0)
        outbox.enqueue("good", "k", {}, 0.0)
        report = deliver_due(outbox, sender, clock, Backoff())
        assert (report.delivered, report.dead) == (1, 1)
        assert outbox.get("bad").status is OutboxStatus.DEAD  # type: ignore[union-attr]
        assert outbox.get("bad").last_error == "400 bad"  # type: ignore[union-attr]


def test_a_sender_that_raises_is_retried_not_lost(tmp_path: Path) -> None:
    def broken(item: OutboxItem) -> DeliveryResult:
        raise RuntimeError("bug")

    clock = ManualClock(0.0)
    with Outbox(tmp_path / "o.db") as outbox:
        outbox.enqueue("x", "k", {}, 0.0)
        report = deliver_due(outbox, broken, clock, Backoff())
        assert report.blocked_on == "x" and "RuntimeError: bug" in (report.error or "")
        assert outbox.get("x").status is OutboxStatus.PENDING  # type: ignore[union-attr]


def test_pending_items_and_refs_survive_a_reopen(tmp_path: Path) -> None:
    clock = ManualClock(0.0)
    path = tmp_path / "o.db"
    first = Outbox(path)
    first.enqueue("a", "k", {"v": 1}, 0.0)
    first.mark_attempt("a", 0.0)  # the process dies mid-send
    first.set_ref("decision:x", 41)
    first.close()
    with Outbox(path) as second:
        [item] = second.pending()
        assert item.key == "a" and item.attempts == 1 and item.in_flight
        assert second.ref("decision:x") == 41
        sender = Sender([DeliveryResult(True, refs={"decision:y": 7})])
        assert deliver_due(second, sender, clock, Backoff()).delivered == 1
        assert sender.sent == [("a", 2)]  # the sender sees that an earlier attempt may have landed
        assert second.ref("decision:y") == 7


def test_unusable_files_are_clear_errors(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all" * 100)
    with pytest.raises(OutboxError, match="not a usable SQLite database"):
        Outbox(garbage)
    newer = tmp_path / "newer.db"
    Outbox(newer).close()
    with sqlite3.connect(newer) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(OutboxError, match="schema version '99'"):
        Outbox(newer)
