from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tailguard.controller.adapters.stores.journal import SCHEMA_VERSION, ActionStatus, Journal, JournalError
from tailguard.controller.core.engine import ConditionState, Phase, PolicyState
from tailguard.controller.core.model import target_key
from tailguard.controller.testing import make_decision

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_700_000_100.0


def _state() -> PolicyState:
    target = target_key({"service": "chat"})
    return PolicyState(
        conditions={
            ("p99-above-800ms", target): ConditionState(
                phase=Phase.FIRING, breach_count=3, onset=1.0, evidence=((1.0, 1.2),), decision_id="abc"
            )
        },
        actions_at={target: (NOW,)},
        evaluations=7,
        last_evaluated_at=NOW,
    )


def test_round_trip_state_decision_and_actions(tmp_path: Path) -> None:
    decision = make_decision([("annotate", {"text": "t", "tags": ["x"]}), ("rollback", {"service": "chat"})])
    with Journal(tmp_path / "j.db") as journal:
        assert journal.load_state("p99-rollback") is None
        journal.commit_evaluation("p99-rollback", _state(), [decision], NOW)
    with Journal(tmp_path / "j.db") as journal:
        assert journal.schema_version() == SCHEMA_VERSION
        assert journal.load_state("p99-rollback") == _state()
        records = journal.actions_for(decision.id)
        assert [r.type.value for r in records] == ["annotate", "rollback"]
        assert all(r.status is ActionStatus.PLANNED and r.attempts == 0 for r in records)
        assert records[1].resource == "chat" and records[0].resource == "chat"
        assert records[1].idempotency_key == f"{decision.id}:fire:1"
        recent = journal.recent_decisions()
        assert len(recent) == 1
        assert recent[0]["id"] == decision.id and recent[0]["kind"] == "fire"
        assert recent[0]["evidence"] == [[t, v] for t, v in decision.evidence]
        assert recent[0]["value"] == 1.2
        assert [a["status"] for a in recent[0]["action_records"]] == ["planned", "planned"]
        assert [r.idempotency_key for r in journal.pending_actions()] == [r.idempotency_key for r in records]


def test_commit_is_idempotent_and_keeps_progress(tmp_path: Path) -> None:
    decision = make_decision([("rollback", {"service": "chat"})])
    with Journal(tmp_path / "j.db") as journal:
        journal.commit_evaluation("p", PolicyState(), [decision], NOW)
        key = decision.actions[0].idempotency_key
        journal.mark_started(key, NOW + 1)
        journal.finish(key, ActionStatus.SUCCEEDED, NOW + 2, result={"ok": True})
        # A replayed evaluation (after a crash before the dispatch finished) re-commits the same decision.
        journal.commit_evaluation("p", PolicyState(), [decision], NOW + 3)
        records = journal.actions_for(decision.id)
        assert len(records) == 1
        assert records[0].status is ActionStatus.SUCCEEDED and records[0].attempts == 1
        assert records[0].result == {"ok": True}
        assert len(journal.recent_decisions()) == 1
        assert journal.pending_actions() == []


def test_started_and_finish_semantics(tmp_path: Path) -> None:
    decision = make_decision([("rollback", {"service": "chat"})])
    with Journal(tmp_path / "j.db") as journal:
        journal.commit_evaluation("p", PolicyState(), [decision], NOW)
        key = decision.actions[0].idempotency_key
        first = journal.mark_started(key, NOW + 1, plan={"desired": 3})
        second = journal.mark_started(key, NOW + 5)
        assert (first.attempts, second.attempts) == (1, 2)
        assert second.started_at == NOW + 1  # the first start counts for the limits
        assert second.plan == {"desired": 3}  # a later start without a plan keeps the first
        done = journal.finish(key, ActionStatus.FAILED, NOW + 6, error="boom")
        assert done.status is ActionStatus.FAILED and done.error == "boom" and done.finished_at == NOW + 6
        # First terminal result wins; a terminal action cannot be started again.
        again = journal.finish(key, ActionStatus.SUCCEEDED, NOW + 7)
        assert again.status is ActionStatus.FAILED
        with pytest.raises(JournalError, match="not planned or started"):
            journal.mark_started(key, NOW + 8)
        with pytest.raises(ValueError, match="terminal"):
            journal.finish(key, ActionStatus.STARTED, NOW + 9)


def test_actions_since_counts_mutating_actions_per_resource_across_policies(tmp_path: Path) -> None:
    rollback = make_decision([("rollback", {"service": "chat"}), ("annotate", {"text": "x"})], policy="a")
    shift = make_decision([("shift_traffic", {"service": "chat", "version": "r2", "weight": 10})], policy="b")
    other = make_decision([("scale", {"service": "code", "replicas": 2, "max": 4})], policy="c", service="code")
    with Journal(tmp_path / "j.db") as journal:
        journal.commit_evaluation("a", PolicyState(), [rollback], NOW)
        journal.commit_evaluation("b", PolicyState(), [shift], NOW)
        journal.commit_evaluation("c", PolicyState(), [other], NOW)
        for decision, at in ((rollback, NOW + 10), (shift, NOW + 20), (other, NOW + 30)):
            for action in decision.actions:
                journal.mark_started(action.idempotency_key, at)
        chat = journal.actions_since("chat", NOW)
        assert [(r.policy, r.type.value) for r in chat] == [("a", "rollback"), ("b", "shift_traffic")]
        assert [r.policy for r in journal.actions_since("chat", NOW + 15)] == ["b"]
        assert [r.policy for r in journal.actions_since("code", NOW)] == ["c"]


def test_nan_value_is_stored_as_null(tmp_path: Path) -> None:
    decision = make_decision([("annotate", {"text": "x"})], value=float("nan"))
    with Journal(tmp_path / "j.db") as journal:
        journal.commit_evaluation("p", PolicyState(), [decision], NOW)
        assert journal.recent_decisions()[0]["value"] is None


def test_committed_evaluation_survives_a_killed_process(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    script = textwrap.dedent(
        f"""
        import os
        from tailguard.controller.testing import make_decision
        from tailguard.controller.core.engine import PolicyState
        from tailguard.controller.adapters.stores.journal import Journal
        journal = Journal({str(path)!r})
        decision = make_decision([("rollback", {{"service": "chat"}})])
        journal.commit_evaluation("p", PolicyState(evaluations=3), [decision], 1.0)
        journal.mark_started(decision.actions[0].idempotency_key, 2.0)
        os._exit(9)  # no close, no checkpoint: only what COMMIT made durable remains
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 9, proc.stderr
    with Journal(path) as journal:
        state = journal.load_state("p")
        assert state is not None and state.evaluations == 3
        pending = journal.pending_actions()
        assert [(r.status, r.attempts) for r in pending] == [(ActionStatus.STARTED, 1)]


def test_failed_transaction_leaves_nothing(tmp_path: Path) -> None:
    good = make_decision([("rollback", {"service": "chat"})])
    with Journal(tmp_path / "j.db") as journal:

        class Broken(ConditionState):
            def to_json(self) -> dict[str, object]:
                raise RuntimeError("unserialisable")

        broken = PolicyState(conditions={("c", ()): Broken()})
        with pytest.raises(RuntimeError):
            journal.commit_evaluation("p", broken, [good], NOW)
        assert journal.load_state("p") is None
        assert journal.actions_for(good.id) == []


def test_concurrent_commits_from_threads(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.db") as journal:

        def worker(policy: str) -> None:
            for index in range(10):
                decision = make_decision([("annotate", {"text": "x"})], policy=policy, onset=float(index))
                journal.commit_evaluation(policy, PolicyState(evaluations=index), [decision], NOW)

        threads = [threading.Thread(target=worker, args=(f"p{n}",)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(journal.all_actions()) == 40
        assert all(journal.load_state(f"p{n}") == PolicyState(evaluations=9) for n in range(4))


def test_newer_schema_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    Journal(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    newer = rf"schema version 99 is newer than this tailguard supports \({SCHEMA_VERSION}\)"
    with pytest.raises(JournalError, match=newer):
        Journal(path)


def test_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    path.write_text("this is not sqlite, just some text that is long enough to be a header" * 10)
    with pytest.raises(JournalError, match=r"j\.db is not a SQLite database"):
        Journal(path)


def test_wal_and_full_sync(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.db")
    try:
        assert journal._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert journal._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    finally:
        journal.close()
