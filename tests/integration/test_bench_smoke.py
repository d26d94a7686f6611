"""Issue 22 (4): benches that cannot rot. Every script in tests/bench/ runs end to end with `--smoke` (a tiny
configuration, seconds each: real Prometheus, real processes, the same code paths as the full run); nothing of
what it prints is asserted but that it finished (exit 0). A new bench script without `--smoke` fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted((ROOT / "tests" / "bench").glob("bench_*.py"))


def test_every_bench_is_here() -> None:
    assert {path.name for path in BENCHES} >= {"bench_backtest.py", "bench_cycle.py", "bench_journal_soak.py"}
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert [path.name for path in BENCHES if f"tests/bench/{path.name}" not in makefile] == []  # make bench runs all


@pytest.mark.timeout(240)
@pytest.mark.parametrize("bench", BENCHES, ids=[path.stem for path in BENCHES])
def test_the_bench_runs_end_to_end(bench: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(bench), "--smoke"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    shown = f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert done.returncode == 0, f"{bench.name} --smoke exited {done.returncode}:\n{shown}"
    assert done.stdout.strip(), f"{bench.name} --smoke printed nothing"
