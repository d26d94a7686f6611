"""The engine state in the journal, written per CHANGED target (controller/adapters/stores/journal.py).

Two tables, written in the same transaction as the evaluation's decisions and actions:

- `policy_meta`: one small row per policy (its `actions_at`, `evaluations`, `last_evaluated_at`), rewritten on
  every evaluation;
- `condition_state`: one row per (policy, condition, target) with that condition state's JSON, written only when
  the state changed.

What "changed" means: any field except those an observation refreshes on every evaluation without changing
what the engine decides: `last_data_at` is stored symbolically (`fresh = 1`: "the policy's `last_evaluated_at`"),
so a target observed at every evaluation keeps an unchanged row; `last_value` (shown in the evaluation log, never
read by the engine) is the value of the row's last write; and the `evidence` window of a FIRING target, which
slides by one point at every breaching evaluation (issue 24, item 8: at 1,000 targets, 200 of them firing, each
firing row was rewritten at every evaluation: 211 rows, 669 KB, 3.85 GB/day; tests/support/flapping.py). A firing
row's evidence is written with every other change of the row (the fire itself, a recovery streak, staleness,
errors, the resolve), so the journal holds at least the evidence the fire decision recorded, and a resolve
decision after a restart carries the points of the row's last write plus those observed after the restart. So a
row is rewritten when the phase, streaks, a pending target's evidence, errors, staleness... change, or when a
target stops (or starts again) being observed, and a cycle of healthy or steadily firing targets writes the policy
row alone. `load_state` reassembles a `PolicyState` whose `to_json()` is byte-identical to the committed one's,
except `last_value` of a row not rewritten since (the value it had then; the next evaluation refreshes it) and a
firing row's evidence (as above).

A journal written before this (one `policy_state` row holding the whole state JSON per policy) is migrated when it
is opened: each whole state becomes these rows, and the old table is dropped.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any

from tailguard.controller.core.engine import ConditionState, Phase, PolicyState, StateKey
from tailguard.controller.core.model import TargetKey
from tailguard.controller.kit.sqlite_store import finite, json_column

STATE_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS policy_meta (
        policy TEXT PRIMARY KEY,
        actions_at TEXT NOT NULL,
        evaluations INTEGER NOT NULL,
        last_evaluated_at REAL,
        updated_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS condition_state (
        policy TEXT NOT NULL,
        condition TEXT NOT NULL,
        target TEXT NOT NULL,
        state TEXT NOT NULL,
        fresh INTEGER NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (policy, condition, target)) WITHOUT ROWID""",
)

# The fields whose change makes a row worth writing: all but the two a healthy observation refreshes, and for a
# firing target also its sliding evidence window (the phase is in both, so the two forms never compare equal).
_REFRESHED = ("last_data_at", "last_value")
_DURABLE = attrgetter(*(f.name for f in fields(ConditionState) if f.name not in _REFRESHED))
_DURABLE_FIRING = attrgetter(*(f.name for f in fields(ConditionState) if f.name not in (*_REFRESHED, "evidence")))
_FRESH = "fresh"  # in a signature: last_data_at == the policy's last_evaluated_at

Signature = tuple[Any, Any]


def _signature(state: ConditionState, evaluated_at: float | None) -> Signature:
    last = state.last_data_at
    durable = _DURABLE_FIRING(state) if state.phase is Phase.FIRING else _DURABLE(state)
    return durable, (_FRESH if last == evaluated_at else last)




def _target_text(target: TargetKey) -> str:
    return json.dumps([list(pair) for pair in target], separators=(",", ":"))


def _target_key(text: str) -> TargetKey:
    return tuple((str(name), str(value)) for name, value in json.loads(text))


@dataclass
class StateWrite:
    """What one commit wrote (applied to the cache once the transaction committed)."""

    policy: str
    written: dict[StateKey, Signature] = field(default_factory=dict)
    deleted: list[StateKey] = field(default_factory=list)

    @property
    def rows(self) -> int:
        """Rows written: the policy row plus each condition row upserted or deleted."""
        return 1 + len(self.written) + len(self.deleted)


class StateStore:
    """The per-target state tables; remembers, per policy, the signature of each row it holds (not thread-safe:
    the journal calls it under its lock)."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[StateKey, Signature]] = {}

    def forget(self) -> None:
        self._rows.clear()

    def load(self, db: sqlite3.Connection, policy: str) -> PolicyState | None:
        meta = db.execute(
            "SELECT actions_at, evaluations, last_evaluated_at FROM policy_meta WHERE policy = ?", (policy,)
        ).fetchone()
        if meta is None:
            return None
        evaluated_at = meta["last_evaluated_at"]
        conditions: list[dict[str, Any]] = []
        signatures: dict[StateKey, Signature] = {}
        for row in db.execute(
            "SELECT condition, target, state, fresh FROM condition_state WHERE policy = ?", (policy,)
        ):
            data = json.loads(row["state"])
            if row["fresh"]:
                data["last_data_at"] = evaluated_at
            state = ConditionState.from_json(data)
            target = _target_key(row["target"])
            signatures[(row["condition"], target)] = _signature(state, evaluated_at)
            conditions.append({"condition": row["condition"], "target": [list(p) for p in target], "state": data})
        self._rows[policy] = signatures
        return PolicyState.from_json(
            {
                "conditions": conditions,
                "actions_at": json.loads(meta["actions_at"]),
                "evaluations": meta["evaluations"],
                "last_evaluated_at": evaluated_at,
            }
        )

    def write(self, db: sqlite3.Connection, policy: str, state: PolicyState, now: float) -> StateWrite:
        """Inside the caller's transaction: the policy row and every condition row whose state changed."""
        if policy not in self._rows:
            self.load(db, policy)
            self._rows.setdefault(policy, {})
        held = self._rows[policy]
        evaluated_at = state.last_evaluated_at
        out = StateWrite(policy)
        upserts: list[tuple[str, str, str, str, int, float]] = []
        new_keys = 0
        held_signature = held.get
        durable, durable_firing, firing = _DURABLE, _DURABLE_FIRING, Phase.FIRING
        for key, condition_state in state.conditions.items():
            # _signature, inlined: this runs for every (condition, target) of every evaluation
            last = condition_state.last_data_at
            signature = (
                durable_firing(condition_state) if condition_state.phase is firing else durable(condition_state),
                _FRESH if last == evaluated_at else last,
            )
            before = held_signature(key)
            if before == signature:
                continue
            if before is None:
                new_keys += 1
            data = condition_state.to_json()
            fresh = signature[1] == _FRESH
            if fresh:
                data["last_data_at"] = None
            upserts.append((policy, key[0], _target_text(key[1]), json_column(data), int(fresh), now))
            out.written[key] = signature
        if len(held) > len(state.conditions) - new_keys:  # some held row is no longer in the state
            out.deleted = [key for key in held if key not in state.conditions]
        db.execute(
            "INSERT INTO policy_meta (policy, actions_at, evaluations, last_evaluated_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (policy) DO UPDATE SET actions_at = excluded.actions_at, "
            "evaluations = excluded.evaluations, last_evaluated_at = excluded.last_evaluated_at, "
            "updated_at = excluded.updated_at",
            (policy, json_column(_actions_at(state)), state.evaluations, finite(evaluated_at), now),
        )
        if upserts:
            db.executemany(
                "INSERT INTO condition_state (policy, condition, target, state, fresh, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (policy, condition, target) DO UPDATE SET "
                "state = excluded.state, fresh = excluded.fresh, updated_at = excluded.updated_at",
                upserts,
            )
        if out.deleted:
            db.executemany(
                "DELETE FROM condition_state WHERE policy = ? AND condition = ? AND target = ?",
                [(policy, name, _target_text(target)) for name, target in out.deleted],
            )
        return out

    def committed(self, write: StateWrite) -> None:
        """The transaction holding `write` committed: the rows it wrote are now the ones held."""
        held = self._rows.setdefault(write.policy, {})
        held.update(write.written)
        for key in write.deleted:
            held.pop(key, None)

    def rolled_back(self, policy: str) -> None:
        """The transaction failed: what is held for `policy` is read again on its next write."""
        self._rows.pop(policy, None)


def _actions_at(state: PolicyState) -> list[dict[str, Any]]:
    """The same form (and order) as PolicyState.to_json()'s "actions_at"."""
    return [
        {"target": [list(pair) for pair in target], "times": list(times)}
        for target, times in sorted(state.actions_at.items())
    ]


def migrate_whole_states(db: sqlite3.Connection, store: StateStore) -> int:
    """A journal written before per-target state: each `policy_state` row (the whole state JSON) becomes the
    per-target rows, then the old table is dropped. Returns the number of policies migrated."""
    exists = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'policy_state'").fetchone()
    if exists is None:
        return 0
    migrated = 0
    for row in db.execute("SELECT policy, state, updated_at FROM policy_state").fetchall():
        state = PolicyState.from_json(json.loads(row["state"]))
        store.rolled_back(row["policy"])
        db.execute("DELETE FROM condition_state WHERE policy = ?", (row["policy"],))
        db.execute("DELETE FROM policy_meta WHERE policy = ?", (row["policy"],))
        store.write(db, row["policy"], state, float(row["updated_at"]))
        migrated += 1
    db.execute("DROP TABLE policy_state")
    store.forget()  # re-read from the rows on the next write (the migration's transaction may still fail)
    return migrated
