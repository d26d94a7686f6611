"""The journal under flapping (issue 24, item 8): at 1,000 targets with 0.5% of them changing phase per
evaluation and 200 firing throughout (tests/support/flapping.py), an evaluation writes the rows of the targets
whose state changed, not one row per firing target; counted in rows and in WAL bytes, never in time."""

from __future__ import annotations

from pathlib import Path

from tailguard.controller.adapters.stores.journal import JOURNAL_PAGE_SIZE, Journal
from tailguard.controller.core.engine import Phase, PolicyState, transition
from tailguard.controller.core.model import SignalResult
from tests.support.flapping import CHANGING, INCIDENT, flapping_policy, flapping_targets, flapping_values

INTERVAL = 15.0
NOW = 1_700_000_000.0
WAL_HEADER, FRAME_HEADER = 32, 24


def _wal_frames(path: Path) -> int:
    wal = Path(f"{path}-wal")
    size = wal.stat().st_size if wal.exists() else 0
    return max(0, size - WAL_HEADER) // (JOURNAL_PAGE_SIZE + FRAME_HEADER)


def test_a_flapping_evaluation_writes_only_the_rows_of_targets_whose_state_changed(tmp_path: Path) -> None:
    policy, keys = flapping_policy(), flapping_targets()
    path = tmp_path / "journal.db"
    journal = Journal(path)
    journal._db.execute("PRAGMA wal_autocheckpoint=0")  # every frame a commit writes stays countable
    state, now = PolicyState(), NOW
    rows: list[int] = []
    frames: list[int] = []
    for cycle in range(60):
        values = flapping_values(cycle, keys)
        state, decisions = transition(policy, {"p99": SignalResult(values=values)}, state, now)
        before = _wal_frames(path)
        journal.commit_evaluation(policy.name, state, decisions, now)
        if cycle >= 10:  # the incident's targets fired at cycle 1
            assert decisions == []
            rows.append(journal.last_state_rows)
            frames.append(_wal_frames(path) - before)
        now += INTERVAL
    reloaded = Journal(path)
    loaded = reloaded.load_state(policy.name)
    reloaded.close()
    journal.close()
    firing = [key for key, s in state.conditions.items() if s.phase is Phase.FIRING]
    assert len(firing) == INCIDENT  # the load this is about: their evidence window slides at every evaluation
    # Per evaluation: the policy row, 5 targets entering PENDING and 5 back to OK; none of the 200 firing ones.
    assert max(rows) == 1 + 2 * CHANGING, rows
    # Bytes: WAL frames of 2 KiB pages (+24). 300 MB/day at a 15 s interval is 52 KB per evaluation, the
    # checkpoint's copy included, i.e. 12 frames written and copied; the commit writes 8 on average (its rows'
    # pages, a B-tree split now and then) and never more than 20 (it was 211 or more: one row per firing target).
    assert sum(frames) / len(frames) <= 8, frames
    assert max(frames) <= 20, frames
    # What a restart reads back: every phase, streak and fire as committed; a firing target's evidence as written
    # at its fire (the window's slide since is not rewritten at every evaluation).
    assert loaded is not None
    for key, condition_state in state.conditions.items():
        back = loaded.conditions[key]
        assert (back.phase, back.breach_count, back.onset, back.decision_id, back.fired_at) == (
            condition_state.phase, condition_state.breach_count, condition_state.onset,
            condition_state.decision_id, condition_state.fired_at,
        )  # fmt: skip
        if condition_state.phase is Phase.FIRING:
            assert back.evidence == ((NOW, 1.0), (NOW + INTERVAL, 1.01))
