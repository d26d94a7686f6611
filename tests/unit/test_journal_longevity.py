"""A journal that lives for months (issue 16, item 7): per-target state rows written only when they change,
the migration of a whole-state journal, retention, incremental vacuum and an index for every hot query."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tailguard.controller.adapters.stores.journal import JOURNAL_PAGE_SIZE, SCHEMA_VERSION, Journal, JournalError
from tailguard.controller.adapters.stores.outbox import DeliveryResult, Outbox
from tailguard.controller.core.actions import ActionStatus
from tailguard.controller.core.engine import ConditionState, Phase, PolicyState
from tailguard.controller.core.model import TargetKey, target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.housekeeping import Housekeeper
from tailguard.controller.testing import make_decision

NOW = 1_700_000_000.0
DAY = 86_400.0


def _target(index: int) -> TargetKey:
    return target_key({"service": f"svc-{index:04d}", "model": "llama"})


def _healthy(targets: int, at: float, value: float = 0.25) -> dict[tuple[str, TargetKey], ConditionState]:
    return {("p99", _target(i)): ConditionState(last_data_at=at, last_value=value + i / 1000) for i in range(targets)}


def _rich_state(at: float) -> PolicyState:
    """Every kind of field: pending with evidence, firing (stale, errors), idle, several conditions, action times."""
    conditions = _healthy(20, at)
    conditions[("p99", _target(3))] = ConditionState(
        phase=Phase.PENDING,
        breach_count=2,
        onset=at - 15,
        last_data_at=at,
        last_value=2.5,
        evidence=((at - 15, 2.25), (at, 2.5)),
    )
    conditions[("p99", _target(4))] = ConditionState(
        phase=Phase.FIRING,
        breach_count=4,
        onset=at - 60,
        last_data_at=at - 30,
        last_value=3.0,
        stale=True,
        error_count=2,
        errors_since=at - 15,
        evidence=((at - 60, 2.0), (at - 45, 2.5), (at - 30, 3.0)),
        decision_id="p:p99:abc",
        fired_at=at - 30,
        recover_count=1,
        recover_since=at,
        suppression_reported=True,
    )
    conditions[("queue", _target(5))] = ConditionState(errored=True, error_count=7, errors_since=at - 100)
    conditions[("queue", ())] = ConditionState(last_data_at=at - 7.5, last_value=None)
    return PolicyState(
        conditions=conditions,
        actions_at={_target(4): (at - 30.0,), _target(7): (at - 3000.0, at - 1200.5)},
        evaluations=42,
        last_evaluated_at=at,
    )


def _old_whole_state_text(state: PolicyState) -> str:
    """What the journal stored before (schema 1): the whole state's JSON in one policy_state row."""
    return json.dumps(state.to_json(), sort_keys=True, separators=(",", ":"), allow_nan=False)


def _text(state: PolicyState | None) -> str:
    assert state is not None
    return json.dumps(state.to_json(), sort_keys=True)


# -- per-target state ----------------------------------------------------------------------------------------


def test_a_committed_state_loads_byte_identical_to_the_whole_state_row(tmp_path: Path) -> None:
    state = _rich_state(NOW)
    with Journal(tmp_path / "j.db") as journal:
        journal.commit_evaluation("p", state, [], NOW)
    with Journal(tmp_path / "j.db") as reopened:
        loaded = reopened.load_state("p")
    assert _text(loaded) == _text(state)
    # ... and the same as the whole-state row of the old write path gave back.
    assert _text(loaded) == _text(PolicyState.from_json(json.loads(_old_whole_state_text(state))))
    assert loaded == state


def test_only_changed_targets_are_rewritten_and_the_state_still_loads_exactly(tmp_path: Path) -> None:
    first = _rich_state(NOW)
    with Journal(tmp_path / "j.db") as journal:
        journal.commit_evaluation("p", first, [], NOW)
        assert journal.last_state_rows == 1 + len(first.conditions)
        later = NOW + 15
        conditions = dict(first.conditions)
        # Healthy targets observed again (same values here, so the loaded state is exact to the byte).
        for key, state in first.conditions.items():
            if state.phase is Phase.OK and state.last_data_at == NOW and not state.errored:
                conditions[key] = ConditionState(last_data_at=later, last_value=state.last_value)
        # One target got worse, one stopped reporting, one disappeared, one is new.
        conditions[("p99", _target(3))] = ConditionState(
            phase=Phase.PENDING, breach_count=3, onset=NOW - 15, last_data_at=later, last_value=2.75,
            evidence=((NOW - 15, 2.25), (NOW, 2.5), (later, 2.75)),
        )  # fmt: skip
        conditions[("p99", _target(8))] = first.conditions[("p99", _target(8))]  # not observed: stays at NOW
        del conditions[("p99", _target(9))]
        conditions[("p99", _target(99))] = ConditionState(last_data_at=later, last_value=0.1)
        second = PolicyState(
            conditions=conditions, actions_at=first.actions_at, evaluations=43, last_evaluated_at=later
        )
        journal.commit_evaluation("p", second, [], later)
        # The policy row, target 3 (worse), target 8 (its data is now older than the evaluation), 9 (removed),
        # 99 (new): nothing else.
        assert journal.last_state_rows == 5
    with Journal(tmp_path / "j.db") as reopened:
        assert _text(reopened.load_state("p")) == _text(second)


def test_a_healthy_cycle_writes_one_small_row_whatever_the_number_of_targets(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with Journal(path) as journal:
        db = journal._db  # the bytes and rows this connection writes
        db.execute("PRAGMA wal_autocheckpoint=0")  # the WAL only grows: its growth is what a commit wrote
        journal.commit_evaluation("p", PolicyState(conditions=_healthy(1000, NOW), last_evaluated_at=NOW), [], NOW)
        wal = Path(f"{path}-wal")
        for cycle in range(1, 4):
            at = NOW + 15 * cycle
            state = PolicyState(
                # every value changes at every evaluation, as a healthy target's latency does
                conditions=_healthy(1000, at, value=0.25 + cycle / 100),
                evaluations=cycle,
                last_evaluated_at=at,
            )
            changes, size = db.total_changes, wal.stat().st_size
            journal.commit_evaluation("p", state, [], at)
            assert journal.last_state_rows == 1
            assert db.total_changes - changes == 1
            page = int(db.execute("PRAGMA page_size").fetchone()[0])
            assert page == JOURNAL_PAGE_SIZE  # a new journal's pages
            assert wal.stat().st_size - size <= page + 24  # one WAL frame: the policy row's page
            assert wal.stat().st_size - size < 4096  # issue 15: < 4 KB for a healthy cycle
        row = db.execute("SELECT length(actions_at) + 64 AS size FROM policy_meta").fetchone()
        assert row["size"] < 4096
        # 5 flapping targets: 1 + 5 rows.
        conditions = _healthy(1000, NOW + 60)
        for i in range(5):
            conditions[("p99", _target(i))] = ConditionState(
                phase=Phase.PENDING, breach_count=1, onset=NOW + 60, last_data_at=NOW + 60, last_value=9.0,
                evidence=((NOW + 60, 9.0),),
            )  # fmt: skip
        journal.commit_evaluation("p", PolicyState(conditions=conditions, last_evaluated_at=NOW + 60), [], NOW + 60)
        assert journal.last_state_rows == 6


def test_a_value_only_refresh_is_not_rewritten_and_loads_the_value_of_the_last_write(tmp_path: Path) -> None:
    key = ("p99", _target(1))
    with Journal(tmp_path / "j.db") as journal:
        journal.commit_evaluation(
            "p", PolicyState({key: ConditionState(last_data_at=NOW, last_value=0.5)}, {}, 1, NOW), [], NOW
        )
        refreshed = PolicyState({key: ConditionState(last_data_at=NOW + 15, last_value=0.7)}, {}, 2, NOW + 15)
        journal.commit_evaluation("p", refreshed, [], NOW + 15)
        assert journal.last_state_rows == 1
    with Journal(tmp_path / "j.db") as reopened:
        loaded = reopened.load_state("p")
    assert loaded is not None
    # Everything the engine reads is exact (last_data_at included); last_value is the one last written.
    assert loaded.condition(*key) == ConditionState(last_data_at=NOW + 15, last_value=0.5)
    assert (loaded.evaluations, loaded.last_evaluated_at) == (2, NOW + 15)


def test_a_failed_commit_leaves_the_rows_and_the_next_commit_writes_them(tmp_path: Path) -> None:
    key = ("p99", _target(1))
    with Journal(tmp_path / "j.db") as journal:
        journal.commit_evaluation("p", PolicyState({key: ConditionState(last_data_at=NOW)}, {}, 1, NOW), [], NOW)
        pending = ConditionState(phase=Phase.PENDING, breach_count=1, onset=NOW + 15, last_data_at=NOW + 15)
        bad = make_decision([("annotate", {"text": "x"})])
        journal._db.execute(
            "CREATE TRIGGER no_decisions BEFORE INSERT ON decisions BEGIN SELECT RAISE(ABORT, 'x'); END"
        )
        with pytest.raises(JournalError, match="cannot write: x"):  # one line, the cause kept
            journal.commit_evaluation("p", PolicyState({key: pending}, {}, 2, NOW + 15), [bad], NOW + 15)
        journal._db.execute("DROP TRIGGER no_decisions")
        assert journal.load_state("p") == PolicyState({key: ConditionState(last_data_at=NOW)}, {}, 1, NOW)
        journal.commit_evaluation("p", PolicyState({key: pending}, {}, 2, NOW + 15), [], NOW + 15)
        assert journal.last_state_rows == 2
    with Journal(tmp_path / "j.db") as reopened:
        assert reopened.load_state("p") == PolicyState({key: pending}, {}, 2, NOW + 15)


# -- migration of a schema-1 journal -------------------------------------------------------------------------

_SCHEMA_1 = (
    "PRAGMA journal_mode=WAL",
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE policy_state (policy TEXT PRIMARY KEY, state TEXT NOT NULL, updated_at REAL NOT NULL)",
    """CREATE TABLE decisions (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, kind TEXT NOT NULL,
        policy TEXT NOT NULL, condition TEXT NOT NULL, target TEXT NOT NULL, at REAL NOT NULL, value REAL,
        threshold REAL NOT NULL, evidence TEXT NOT NULL, reason TEXT NOT NULL, dry_run INTEGER NOT NULL,
        body TEXT NOT NULL, recorded_at REAL NOT NULL, UNIQUE (id, kind))""",
    """CREATE TABLE actions (idempotency_key TEXT PRIMARY KEY, decision_id TEXT NOT NULL,
        decision_kind TEXT NOT NULL, policy TEXT NOT NULL, resource TEXT NOT NULL, type TEXT NOT NULL,
        params TEXT NOT NULL, dry_run INTEGER NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
        result TEXT, error TEXT, plan TEXT, created_at REAL NOT NULL, started_at REAL, finished_at REAL,
        updated_at REAL NOT NULL, seq INTEGER NOT NULL)""",
    "CREATE INDEX actions_by_status ON actions (status, seq)",
    "CREATE INDEX actions_by_resource ON actions (resource, started_at)",
    "CREATE INDEX actions_by_decision ON actions (decision_id, seq)",
    "INSERT INTO meta (key, value) VALUES ('schema_version', '1')",
)


def test_a_schema_1_journal_with_whole_state_rows_is_migrated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    for statement in _SCHEMA_1:
        db.execute(statement)
    states = {"p": _rich_state(NOW), "q": PolicyState(conditions=_healthy(3, NOW - 15), evaluations=1)}
    for policy, state in states.items():
        db.execute("INSERT INTO policy_state VALUES (?, ?, ?)", (policy, _old_whole_state_text(state), NOW))
    db.close()
    with Journal(path) as journal:
        assert journal.schema_version() == SCHEMA_VERSION == 2
        for policy, state in states.items():
            assert _text(journal.load_state(policy)) == _text(state)
        tables = {row[0] for row in journal._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "policy_state" not in tables
        # The old file (auto_vacuum NONE) keeps working: evaluations, retention, a vacuum that frees nothing.
        journal.commit_evaluation("p", states["p"], [make_decision([("annotate", {"text": "x"})])], NOW)
        assert journal.last_state_rows == 1
        assert journal.purge(NOW + 40 * DAY, 30 * DAY).freed_pages == 0
    with Journal(path) as reopened:
        assert _text(reopened.load_state("p")) == _text(states["p"])


# -- retention -----------------------------------------------------------------------------------------------


def _decide(journal: Journal, onset: float, recorded: float, status: ActionStatus | None) -> str:
    decision = make_decision([("annotate", {"text": "x"}), ("notify", {"receiver": "r"})], onset=onset)
    journal.record_decision(decision, recorded)
    for action in decision.actions:
        if status is not None:
            journal.mark_started(action.idempotency_key, recorded)
            journal.finish(action.idempotency_key, status, recorded)
    return decision.id


def test_retention_removes_old_finished_decisions_and_never_an_unfinished_action(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.db") as journal:
        journal._db.execute("PRAGMA synchronous=OFF")  # speed only
        old_done = [_decide(journal, float(i), NOW - 40 * DAY + i, ActionStatus.SUCCEEDED) for i in range(30)]
        old_failed = _decide(journal, 100.0, NOW - 40 * DAY, ActionStatus.FAILED)
        old_open = _decide(journal, 101.0, NOW - 40 * DAY, None)  # planned for 40 days: kept
        recent = _decide(journal, 102.0, NOW - DAY, ActionStatus.SUCCEEDED)
        # One action of an old decision finished, the other still started: the decision and both actions stay.
        half = make_decision([("annotate", {"text": "x"}), ("notify", {"receiver": "r"})], onset=103.0)
        journal.record_decision(half, NOW - 40 * DAY)
        first, second = (action.idempotency_key for action in half.actions)
        journal.mark_started(first, NOW - 40 * DAY)
        journal.finish(first, ActionStatus.SUCCEEDED, NOW - 40 * DAY)
        journal.mark_started(second, NOW - 40 * DAY)
        report = journal.purge(NOW, 30 * DAY)
        assert (report.decisions, report.actions, report.kept_open) == (31, 62, 2)
        for gone in [*old_done, old_failed]:
            assert journal.actions_for(gone) == []
            assert journal.decision(gone, "fire") is None
        assert len(journal.actions_for(old_open)) == 2
        assert journal.decision(old_open, "fire") is not None
        assert len(journal.actions_for(recent)) == 2
        assert len(journal.actions_for(half.id)) == 2
        assert journal.pending_actions()  # still resumable
        last = json.loads(journal._db.execute("SELECT value FROM meta WHERE key = 'last_purge'").fetchone()[0])
        assert last["decisions"] == 31 and last["retention"] == 30 * DAY
        # Idempotent.
        assert journal.purge(NOW, 30 * DAY).decisions == 0


def test_retention_removes_the_events_of_the_actions_it_removes(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.db") as journal:
        journal._db.execute(
            "INSERT INTO action_events (idempotency_key, at, event, detail) VALUES (?, ?, 'deferred', 'x')",
            ("k-old", NOW - 40 * DAY),
        )
        decision = make_decision([("annotate", {"text": "x"})], onset=1.0)
        journal.record_decision(decision, NOW - 40 * DAY)
        key = decision.actions[0].idempotency_key
        journal._db.execute("UPDATE action_events SET idempotency_key = ? WHERE idempotency_key = 'k-old'", (key,))
        journal.mark_started(key, NOW - 40 * DAY)
        journal.finish(key, ActionStatus.SUCCEEDED, NOW - 40 * DAY)
        report = journal.purge(NOW, 30 * DAY)
        assert report.events >= 1
        assert journal._db.execute("SELECT COUNT(*) FROM action_events").fetchone()[0] == 0


def test_a_new_journal_gives_freed_pages_back_to_the_file_system(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with Journal(path) as journal:
        assert journal._db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # INCREMENTAL
        journal._db.execute("PRAGMA synchronous=OFF")  # speed only: the bytes are the same
        for i in range(300):
            _decide(journal, float(i), NOW - 40 * DAY, ActionStatus.SUCCEEDED)
        journal._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        full = path.stat().st_size
        report = journal.purge(NOW, 30 * DAY)
        journal._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert report.decisions == 300 and report.freed_pages > 0
        assert path.stat().st_size < full / 2


def test_the_outbox_purges_delivered_entries_only(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db") as outbox:
        for key in ("a", "b", "c"):
            outbox.enqueue(key, "k", {"n": 1}, NOW - 40 * DAY)
        outbox.mark_attempt("a", NOW - 40 * DAY)
        outbox.record("a", DeliveryResult(True), NOW - 40 * DAY, NOW)
        outbox.mark_attempt("b", NOW - 40 * DAY)
        outbox.record("b", DeliveryResult(False, error="500", transient=True), NOW - 40 * DAY, NOW)
        report = outbox.purge(NOW - 30 * DAY)
        assert report["delivered"] == 1
        assert [item.key for item in outbox.items()] == ["b", "c"]


# -- every hot query uses an index -------------------------------------------------------------------------


def test_every_query_of_the_journal_is_served_by_an_index(tmp_path: Path) -> None:
    statements: list[str] = []
    with Journal(tmp_path / "j.db") as journal:
        journal._db.execute("PRAGMA synchronous=OFF")  # speed only
        for i in range(200):
            _decide(journal, float(i), NOW - 40 * DAY + i, ActionStatus.SUCCEEDED)
        # No ANALYZE: the journal never runs it, so the planner's choices are the ones made here.
        journal._db.set_trace_callback(statements.append)
        state = _rich_state(NOW)
        decision = make_decision([("rollback", {"service": "chat"}), ("annotate", {"text": "x"})], onset=9999.0)
        journal.commit_evaluation("p", state, [decision], NOW)
        journal.load_state("p")
        key = decision.actions[0].idempotency_key
        journal.get_action(key)
        journal.pending_actions()
        journal.actions_for(decision.id)
        journal.actions_since("chat", NOW - 3600)
        journal.mark_started(key, NOW)
        journal.finish(key, ActionStatus.SUCCEEDED, NOW)
        journal.decision(decision.id, "fire")
        journal.recent_decisions(10)
        for optional in ("deferred_actions", "action_events"):
            if hasattr(journal, optional):
                getattr(journal, optional)(*(() if optional == "deferred_actions" else (key,)))
        journal.purge(NOW, 30 * DAY)
        journal._db.set_trace_callback(None)
        plans: dict[str, list[str]] = {}
        for statement in statements:
            verb = statement.lstrip().split(None, 1)[0].upper()
            if verb not in ("SELECT", "UPDATE", "DELETE", "INSERT") or "sqlite_master" in statement:
                continue
            rows: list[Any] = journal._db.execute(f"EXPLAIN QUERY PLAN {statement}").fetchall()
            plans[statement] = [str(row[3]) for row in rows]
    assert plans
    for statement, plan in plans.items():
        scans = [step for step in plan if step.startswith("SCAN") and ("decisions" in step or "actions" in step)]
        if statement.startswith("SELECT body, recorded_at FROM decisions ORDER BY seq DESC LIMIT"):
            # The newest N decisions: a walk of the rowid b-tree from its end that stops after N rows.
            assert scans == ["SCAN decisions"] and not any("TEMP B-TREE" in step for step in plan)
            continue
        assert scans == [], f"{statement}\n{plan}"


def test_the_next_action_seq_is_found_without_a_scan(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.db") as journal:
        plan = journal._db.execute("EXPLAIN QUERY PLAN SELECT COALESCE(MAX(seq), 0) FROM actions").fetchall()
    assert "USING COVERING INDEX actions_by_seq" in str(plan[0][3])


def test_nan_values_stay_null(tmp_path: Path) -> None:
    key = ("p99", _target(1))
    state = PolicyState({key: ConditionState(last_data_at=NOW, last_value=math.nan)}, {}, 1, NOW)
    with Journal(tmp_path / "j.db") as journal:
        journal.commit_evaluation("p", state, [], NOW)
        loaded = journal.load_state("p")
    assert loaded is not None and loaded.condition(*key).last_value is None


def test_housekeeping_runs_every_task_and_survives_a_failing_one(tmp_path: Path) -> None:
    def broken(now: float) -> dict[str, int]:
        raise sqlite3.OperationalError("database is locked")

    with Journal(tmp_path / "j.db") as journal:
        _decide(journal, 1.0, NOW - 40 * DAY, ActionStatus.SUCCEEDED)
        keeper = Housekeeper(
            [("broken", broken), ("journal retention", lambda now: journal.purge(now, 30 * DAY).to_json())],
            ManualClock(NOW),
        )
        reports = keeper.run_once()
    assert reports["broken"] == "OperationalError: database is locked"
    assert reports["journal retention"]["decisions"] == 1  # type: ignore[index]
    assert keeper.passes == 1
