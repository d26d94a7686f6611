"""Soak benchmark of the journal: a month at 1,000 targets, 0.5% flapping, a 15 s interval (issue 16, item 7).

The journal is driven directly (no engine, no Prometheus) with a ManualClock, as fast as it writes: each cycle
commits the policy's state (1,000 healthy targets whose value changes at every evaluation, 5 flapping ones that
fire for 4 cycles and resolve, every 12 cycles), the flaps' fire/resolve decisions (an annotate and a notify
action each, started and finished as the dispatcher would) and, hourly, retention. Bytes written are the process's
write() bytes (/proc/self/io wchar: WAL frames and checkpoints), file size is the database plus its WAL.

- after: this journal (per changed target rows), a simulated day (`--days`), extrapolated to a month;
- before: the whole-state write path of schema 1 (one policy_state row of the whole state JSON, rewritten at every
  evaluation, no actions_by_seq index), a simulated hour (`--before-hours`), extrapolated to a day and a month.

synchronous=OFF in both (fsync changes how long a commit takes, not the bytes it writes), so the bench is bounded
(about a minute on 2 cores). Figures are printed, not asserted (tests/unit/test_journal_longevity.py asserts).

Issue 24 (item 8) adds its load (tests/support/flapping.py: 200 targets firing throughout, 0.5% changing phase per
evaluation) through the engine at synchronous=FULL, with each commit timed (`--engine-hours`).

    python tests/bench/bench_journal_soak.py [--days 1] [--before-hours 1] [--targets 1000] [--engine-hours 2]
                                             [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.actions import ActionStatus
from tailguard.controller.core.engine import ConditionState, Phase, PolicyState, transition
from tailguard.controller.core.model import Decision, SignalResult, TargetKey, target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.kit.sqlite_store import json_column  # the same serialisation as schema 1's
from tailguard.controller.testing import make_decision
from tests.support.flapping import flapping_policy, flapping_targets, flapping_values

INTERVAL = 15.0
DAY = 86_400.0
PERIOD = 12  # a flapping target: breaching for cycles 0-3 of every 12 (fires at 2), resolved at 6
RETENTION = 30 * DAY


def wchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


def file_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def targets(count: int) -> list[TargetKey]:
    return [
        target_key({"service": f"svc-{i:04d}", "model": "llama-3-8b", "namespace": "serving"}) for i in range(count)
    ]


class Simulation:
    def __init__(self, count: int, flapping: int, clock: ManualClock) -> None:
        self.keys = targets(count)
        self.flapping = set(range(flapping))
        self.clock = clock
        self.cycle = 0
        self.actions_at: dict[TargetKey, tuple[float, ...]] = {}
        self.conditions: dict[tuple[str, TargetKey], ConditionState] = {}
        self.onsets: dict[int, float] = {}

    def step(self) -> tuple[PolicyState, list[Decision]]:
        now = self.clock.now()
        phase_of = self.cycle % PERIOD
        decisions: list[Decision] = []
        for i, key in enumerate(self.keys):
            value = 0.2 + ((i * 7919 + self.cycle * 104729) % 1000) / 10_000  # changes at every evaluation
            if i in self.flapping and phase_of < 6:
                if phase_of == 0:
                    self.onsets[i] = now
                onset = self.onsets[i]
                evidence = tuple((onset + k * INTERVAL, 1.5) for k in range(min(phase_of, 3) + 1))
                if phase_of < 2:
                    state = ConditionState(Phase.PENDING, phase_of + 1, onset, now, 1.5, evidence=evidence)
                else:
                    state = ConditionState(
                        Phase.FIRING, 2, onset, now, 1.5 if phase_of < 4 else value, evidence=evidence,
                        decision_id=f"d-{i}-{onset}", fired_at=onset + 2 * INTERVAL,
                        recover_count=max(0, phase_of - 3),
                        recover_since=onset + 4 * INTERVAL if phase_of > 3 else None,
                    )  # fmt: skip
                if phase_of == 2:
                    decisions.append(self._decision(i, onset, now, "fire"))
                self.conditions[("p99", key)] = state
            else:
                if i in self.flapping and phase_of == 6:
                    decisions.append(self._decision(i, self.onsets[i], now, "resolve"))
                self.conditions[("p99", key)] = ConditionState(last_data_at=now, last_value=value)
        self.cycle += 1
        return PolicyState(dict(self.conditions), dict(self.actions_at), self.cycle, now), decisions

    @staticmethod
    def _decision(i: int, onset: float, now: float, kind: str) -> Decision:
        return make_decision(
            [("annotate", {"text": "p99 {{ value }} on {{ service }}"}), ("notify", {"receiver": "oncall"})],
            policy="p99",
            condition="p99",
            service=f"svc-{i:04d}",
            onset=onset,
            at=now,
            kind=kind,
        )


def legacy_commit(journal: Journal) -> Callable[[str, PolicyState, list[Decision], float], None]:
    """The schema-1 write path: the whole state's JSON (through the recursive NaN walk) in one row per policy."""
    db = journal._db
    db.execute(
        "CREATE TABLE IF NOT EXISTS policy_state (policy TEXT PRIMARY KEY, state TEXT NOT NULL, updated_at REAL)"
    )
    db.execute("DROP INDEX IF EXISTS actions_by_seq")
    db.execute("DROP INDEX IF EXISTS decisions_by_recorded_at")

    def commit(policy: str, state: PolicyState, decisions: list[Decision], now: float) -> None:
        with journal._transaction() as tx:
            tx.execute(
                "INSERT INTO policy_state (policy, state, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (policy) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at",
                (policy, json_column(state.to_json()), now),
            )
            for decision in decisions:
                journal._insert_decision(tx, decision, now)

    return commit


def run(path: Path, seconds: float, count: int, flapping: int, *, legacy: bool) -> dict[str, Any]:
    clock = ManualClock()
    journal = Journal(path)
    journal._db.execute("PRAGMA synchronous=OFF")
    commit = legacy_commit(journal) if legacy else journal.commit_evaluation
    sim = Simulation(count, flapping, clock)
    cycles = int(seconds / INTERVAL)
    rows = decisions = 0
    started, written = time.perf_counter(), wchar()
    first_size = 0
    for cycle in range(cycles):
        state, new = sim.step()
        commit("p99", state, new, clock.now())
        rows += journal.last_state_rows if not legacy else 1
        decisions += len(new)
        for decision in new:  # the dispatcher: started, then finished
            for action in decision.actions:
                journal.mark_started(action.idempotency_key, clock.now())
                journal.finish(action.idempotency_key, ActionStatus.SUCCEEDED, clock.now())
        if not legacy and cycle and cycle % 240 == 0:
            journal.purge(clock.now(), RETENTION)  # hourly, as the Housekeeper does
        clock.advance(INTERVAL)
        if cycle == 0:  # the size with every target's state in it: what grows from here is decisions and actions
            journal._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            first_size = file_bytes(path)
            written, rows = wchar(), 0  # per-cycle figures from here: the first cycle's full write happens once
    journal._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wrote = wchar() - written
    wall = time.perf_counter() - started
    journal.close()
    return {
        "simulated_s": cycles * INTERVAL,
        "cycles": cycles,
        "decisions": decisions,
        "state_rows_per_cycle": rows / max(1, cycles - 1),
        "bytes_written": wrote,
        "bytes_per_cycle": wrote / max(1, cycles - 1),
        "file_bytes": file_bytes(path),
        "first_cycle_file_bytes": first_size,
        "wall_s": wall,
    }


def run_engine(path: Path, seconds: float) -> dict[str, Any]:
    """Issue 24's load (tests/support/flapping.py) through the engine: 1,000 targets, 200 firing throughout, 0.5%
    changing phase per evaluation; synchronous=FULL (the controller's setting), each commit timed."""
    policy, keys = flapping_policy(), flapping_targets()
    journal = Journal(path)
    state, now = PolicyState(), 1_700_000_000.0
    cycles = int(seconds / INTERVAL)
    commits: list[float] = []
    rows = 0
    written = wchar()
    for cycle in range(cycles):
        state, new = transition(policy, {"p99": SignalResult(values=flapping_values(cycle, keys))}, state, now)
        started = time.perf_counter()
        journal.commit_evaluation(policy.name, state, new, now)
        elapsed = time.perf_counter() - started
        if cycle >= 2:  # from the third: the incident's targets fired, every row written once
            commits.append(elapsed)
            rows += journal.last_state_rows
        else:
            written = wchar()
        now += INTERVAL
    journal._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wrote = wchar() - written
    journal.close()
    commits.sort()
    return {
        "cycles": cycles,
        "state_rows_per_cycle": rows / max(1, len(commits)),
        "bytes_per_cycle": wrote / max(1, len(commits)),
        "bytes_written_per_day": wrote / max(1, len(commits)) * DAY / INTERVAL,
        "commit_ms_p50": 1e3 * commits[len(commits) // 2],
        "commit_ms_p99": 1e3 * commits[int(len(commits) * 0.99)],
        "commit_ms_max": 1e3 * commits[-1],
    }


def mb(value: float) -> str:
    return f"{value / 1e6:,.1f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=float, default=1.0, help="simulated days of the new journal")
    parser.add_argument("--before-hours", type=float, default=1.0, help="simulated hours of the old write path")
    parser.add_argument("--targets", type=int, default=1000)
    parser.add_argument("--flapping", type=float, default=0.005, help="fraction of targets flapping")
    parser.add_argument("--engine-hours", type=float, default=2.0, help="simulated hours of issue 24's load")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds): that it runs, figures meaningless")
    args = parser.parse_args()
    if args.smoke:
        args.days, args.before_hours, args.targets = 0.01, 0.05, 40
    flapping = max(1, round(args.targets * args.flapping))
    with tempfile.TemporaryDirectory() as tmp:
        after = run(Path(tmp) / "after.db", args.days * DAY, args.targets, flapping, legacy=False)
        before = run(Path(tmp) / "before.db", args.before_hours * 3600, args.targets, flapping, legacy=True)
        healthy = run(Path(tmp) / "healthy.db", args.before_hours * 3600, args.targets, 0, legacy=False)
        engine = run_engine(Path(tmp) / "engine.db", args.engine_hours * 3600)
    results: dict[str, Any] = {"targets": args.targets, "flapping": flapping, "interval_s": INTERVAL}
    for name, figures in (("before", before), ("after", after), ("after_healthy", healthy)):
        days = figures["simulated_s"] / DAY
        per_day = figures["bytes_per_cycle"] * DAY / INTERVAL
        # Retention keeps 30 days: within a month nothing is purged, so the file grows by its decisions and
        # actions per day (measured from the size after the first cycle, which holds every target's state).
        growth = (figures["file_bytes"] - figures["first_cycle_file_bytes"]) / days
        month = figures["first_cycle_file_bytes"] + 30 * max(0.0, growth)
        results[name] = {
            **figures,
            "bytes_written_per_day": per_day,
            "file_growth_per_day": growth,
            "file_bytes_after_month": month,
        }
    print(
        f"journal soak: {args.targets} targets, {flapping} flapping ({args.flapping:.1%}), {INTERVAL:.0f} s interval; "
        f"after: {args.days:g} simulated day(s), before and 0 flapping: {args.before_hours:g} simulated hour(s); "
        "all extrapolated "
        "linearly to a day and a month (30 d retention: nothing is purged within the month)"
    )
    print(f"{'':34}{'before (whole state)':>22}{'after (changed rows)':>22}{'after, 0 flapping':>22}")
    rows = [
        ("simulated cycles", lambda r: f"{r['cycles']:,}"),
        ("state rows written per cycle", lambda r: f"{r['state_rows_per_cycle']:.2f}"),
        ("bytes written per cycle", lambda r: f"{r['bytes_per_cycle'] / 1e3:,.1f} KB"),
        ("bytes written per day", lambda r: mb(r["bytes_written_per_day"])),
        ("file size after the simulated run", lambda r: mb(r["file_bytes"])),
        ("file growth per day", lambda r: mb(r["file_growth_per_day"])),
        ("file size after a month (extrap.)", lambda r: mb(r["file_bytes_after_month"])),
        ("wall time of the simulated run", lambda r: f"{r['wall_s']:.1f} s"),
    ]
    for label, show in rows:
        print(f"{label:34}" + "".join(f"{show(results[name]):>22}" for name in ("before", "after", "after_healthy")))
    ratio = results["before"]["bytes_written_per_day"] / max(1.0, results["after"]["bytes_written_per_day"])
    print(
        f"bytes written per day: {ratio:,.0f}x less at {args.flapping:.1%} flapping; a cycle with no changed target "
        f"writes the policy row's page: {results['after_healthy']['bytes_per_cycle'] / 1e3:,.1f} KB (its WAL frame "
        "and the checkpoint's copy); bytes are counted after the first cycle (every target's row, written once)"
    )
    results["issue24_engine"] = engine
    print(
        f"issue 24's load through the engine ({args.engine_hours:g} simulated hours, synchronous=FULL): 1,000 "
        "targets, 200 firing throughout, 0.5% changing phase per evaluation: "
        f"{engine['state_rows_per_cycle']:.1f} state rows and {engine['bytes_per_cycle'] / 1e3:,.1f} KB written per "
        f"evaluation = {mb(engine['bytes_written_per_day'])} per day (budget 300 MB); commit "
        f"p50 {engine['commit_ms_p50']:.1f} ms, p99 {engine['commit_ms_p99']:.1f} ms, max "
        f"{engine['commit_ms_max']:.1f} ms (budget 20 ms)"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    sqlite3.enable_callback_tracebacks(True)
    main()
