"""Reads never slow the loop (issue 24, item 6): the decisions API and the status page read the journal through
its own connection, paged and bounded. The proof holds a reader INSIDE its read (a SQLite progress handler that
waits, in the reader's thread only) and counts the evaluations that complete meanwhile: all of them, since the loop
never waits on the reader's lock (at 7710821 a reader held the journal's one lock, and none completed)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.core.actions import ActionStatus
from tailguard.controller.core.model import SignalResult, target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDispatcher, FakeSource, make_decision
from tests.unit.test_runtime import policy_yaml

T0 = 1_767_362_520.0
DECISIONS = 1000
EVALUATIONS = 20
LIVENESS_SECONDS = 20.0  # a bound for a stuck thread to be reported as a failure, not a speed limit


def _controller(tmp_path: Path) -> tuple[Controller, Journal, ManualClock]:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "a.yaml").write_text(policy_yaml("lat-a", for_=1))
    journal = Journal(tmp_path / "journal.db")
    journal._db.execute("PRAGMA synchronous=OFF")  # the setup's 5,000 commits need no fsync each
    for index in range(DECISIONS):  # what a read of 1,000 decisions has to go through: actions and their events
        decision = make_decision([("annotate", {"text": "x"}), ("notify", {"receiver": "oncall"})],
                                 service=f"svc-{index}", onset=T0 - 86_400 + index)  # fmt: skip
        journal.record_decision(decision, T0 - 86_400 + index)
        for action in decision.actions:
            journal.mark_started(action.idempotency_key, T0)
            journal.finish(action.idempotency_key, ActionStatus.SUCCEEDED, T0)
    journal._db.execute("PRAGMA synchronous=FULL")
    clock = ManualClock(T0)
    healthy = SignalResult({target_key({"service": f"chat-{i}"}): 0.1 for i in range(50)})
    controller = Controller(
        policy_paths=[rules], source=FakeSource(default=healthy), journal=journal, dispatcher=FakeDispatcher(),
        clock=clock, metrics=ControllerMetrics(CollectorRegistry()), schedule=False,
    )  # fmt: skip
    return controller, journal, clock


def _hold_reads_of(
    thread_of: Callable[[], threading.Thread | None], journal: Journal
) -> tuple[threading.Event, threading.Event]:
    """Every SQLite connection of the journal pauses, in the reader's thread only, once it is inside a read."""
    entered, released = threading.Event(), threading.Event()

    def progress() -> int:
        if threading.current_thread() is thread_of() and not released.is_set():
            entered.set()
            released.wait()
        return 0

    for connection in _connections(journal):
        connection.set_progress_handler(progress, 1000)
    return entered, released


def _connections(journal: Journal) -> list[sqlite3.Connection]:
    """Every SQLite connection the journal holds, itself or in one of its parts (its reader)."""
    found: list[sqlite3.Connection] = []
    for value in vars(journal).values():
        for item in (value, *(vars(value).values() if hasattr(value, "__dict__") else ())):
            if isinstance(item, sqlite3.Connection):
                found.append(item)
    return found


@pytest.mark.parametrize("read", ["decisions", "status"])
def test_evaluations_complete_while_a_reader_is_inside_its_read(tmp_path: Path, read: str) -> None:
    controller, journal, clock = _controller(tmp_path)
    controller.start()
    got: dict[str, Any] = {}
    reader: threading.Thread | None = None
    entered, released = _hold_reads_of(lambda: reader, journal)

    def read_once() -> None:
        got["answer"] = controller.recent_decisions(DECISIONS) if read == "decisions" else controller.status()

    reader = threading.Thread(target=read_once, name="reader")
    completed: list[int] = []

    def evaluate() -> None:
        for index in range(EVALUATIONS):
            controller.evaluate("lat-a")
            clock.advance(15)
            completed.append(index)

    try:
        reader.start()
        assert entered.wait(LIVENESS_SECONDS), "the reader never got inside its read"
        loop = threading.Thread(target=evaluate, name="loop")
        loop.start()
        loop.join(LIVENESS_SECONDS)
        held = len(completed)
        assert not released.is_set() and reader.is_alive()  # the reader is still inside its read...
        assert held == EVALUATIONS  # ...and every evaluation completed meanwhile
    finally:
        released.set()
        reader.join(LIVENESS_SECONDS)
        controller.stop()
    answer = got["answer"]
    decisions = answer if read == "decisions" else answer["decisions"]
    assert len(decisions) == (DECISIONS if read == "decisions" else 20)
    assert all(len(d["action_records"]) == 2 and d["action_records"][0]["status"] == "succeeded" for d in decisions)


def test_the_decisions_api_is_paged_and_bounded(tmp_path: Path) -> None:
    controller, _journal, _clock = _controller(tmp_path)
    api = ControllerAPI(controller, "127.0.0.1", 0)
    api.start()
    controller.start()
    try:
        first = requests.get(f"{api.url}/api/v1/decisions?limit=400", timeout=30).json()
        second = requests.get(f"{api.url}/api/v1/decisions?limit=400&before={first[-1]['seq']}", timeout=30).json()
        third = requests.get(f"{api.url}/api/v1/decisions?limit=400&before={second[-1]['seq']}", timeout=30).json()
        pages = [*first, *second, *third]
        assert [len(page) for page in (first, second, third)] == [400, 400, 200]
        assert len({d["seq"] for d in pages}) == DECISIONS  # every decision once, newest first
        assert [d["seq"] for d in pages] == sorted((d["seq"] for d in pages), reverse=True)
        assert all(len(d["action_records"]) == 2 for d in pages)
        for bad in ("limit=1001", "limit=0", "before=0", "before=x"):
            answer = requests.get(f"{api.url}/api/v1/decisions?{bad}", timeout=30)
            assert answer.status_code == 400, bad
    finally:
        api.stop()
        controller.stop()
