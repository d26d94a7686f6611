"""The garbage collector's thresholds for a long-running controller process.

An evaluation builds a new condition state per (condition, target) and keeps it (the next state): at 5,000
targets x 4 conditions that is 20,000 objects that all survive, so CPython's default first-generation threshold
(700 allocations) starts ~190 collections per cycle, and every survivor is traversed again as it is promoted.
None of these objects form reference cycles (they are freed by reference counting), so those traversals find
nothing. A first-generation threshold of 50,000 cuts the engine's CPU per cycle by about a quarter to a third at
5,000 targets (tests/bench/bench_cycle.py prints the cycle's CPU); cyclic garbage, which is rare, waits at most
50,000 allocations to be collected. Older generations keep their default ratios.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000


def tune_for_long_running() -> tuple[int, int, int]:
    """Raise the first generation's threshold (only ever raise it); returns the thresholds now in force."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, old)
    return gc.get_threshold()
