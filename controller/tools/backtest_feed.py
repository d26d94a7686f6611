"""The backtest's answers, streamed chunk by chunk, and the skip over evaluations in which nothing can happen.

`PolicyFeed`: one policy's signals over the backtest window, one chunk of its evaluation grid at a time (CHUNK_POINTS
per series, core/signals.range_chunks), each signal's answer held as a RangeGrid (arrays,
no dict per sample: adapters/metrics/grid.py); the next chunk is fetched on a background thread while the engine
replays the current one, so only two chunks per policy are ever held. A chunk a query fails for is errored for that
chunk's evaluations alone (the live controller sees an error only while Prometheus fails).

`QuietRun`: most evaluations of a healthy fleet change nothing but each target's last value. When every condition
state of the policy is in phase OK, none of its actions is deferred, and at the next grid time every target the
policy holds state for is present with a number not breaching its condition (and every other target present is
too), the live evaluation would decide nothing and only refresh those values (engine.transition's fast path).
Those evaluations are counted instead of run; before the policy's next real evaluation (or at a chunk's end) they
are applied at once with engine.advance_healthy and committed to the journal, giving exactly the state the
evaluations one by one would have given. The check per time is a few list lookups, over arrays computed once per
chunk and condition.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from tailguard.controller.adapters.metrics.grid import BoolArray, FloatArray, RangeGrid, RangeGridSource, on_grid
from tailguard.controller.core.engine import Phase, PolicyState, StateKey, advance_healthy
from tailguard.controller.core.model import TargetKey
from tailguard.controller.core.policy import Condition, Policy
from tailguard.controller.core.ports import MetricsSource, RangeResult
from tailguard.controller.core.signals import MAX_POINTS_PER_QUERY, range_chunks, render_signal_queries

Grids = dict[str, RangeGrid]

# Evaluation times per range request: 12 hours at 15 s. Under Prometheus' 11,000-point limit by far, because the
# answer of one request is parsed whole (~150 bytes of Python objects per sample before it becomes arrays): 100
# targets x 2,880 points is ~45 MB at its peak, where 11,000 points were ~170 MB. Tests make it small.
CHUNK_POINTS = min(2_880, MAX_POINTS_PER_QUERY)
# A chunk's signal queries in flight at once (run_backtest's query pool): Prometheus evaluates them side by side
# while this process parses the previous answer. Two, not one per signal: each answer is parsed whole (~45 MB at
# its peak, above), so two at once keep a 7 days x 100 targets backtest well under 300 MiB.
QUERIES_AT_ONCE = 2


def chunk_times(start: float, end: float, step: float) -> list[tuple[float, ...]]:
    """The evaluation grid in chunks of at most Prometheus' points limit, rounded to the millisecond like the
    sources' sample timestamps (backtest.evaluation_times is their concatenation)."""
    out: list[tuple[float, ...]] = []
    for chunk_start, chunk_end in range_chunks(start, end, step, CHUNK_POINTS):
        count = round((chunk_end - chunk_start) / step) + 1
        out.append(tuple(round(chunk_start + index * step, 3) for index in range(count)))
    return out


class PolicyFeed:
    """One policy's signal answers on its evaluation grid, one chunk at a time (see the module docstring)."""

    def __init__(
        self,
        source: MetricsSource,
        policy: Policy,
        start: float,
        end: float,
        step: float,
        predicted: Mapping[str, RangeResult],
        fetcher: ThreadPoolExecutor,
        querier: ThreadPoolExecutor | None = None,
    ) -> None:
        """`fetcher` fetches the next chunk in the background; `querier` (optional) sends a chunk's signal queries
        at once (None: one after another). They must be different pools: a fetch waits on its queries."""
        self.policy = policy
        self._querier = querier
        self._source = source
        self._step = step
        self._queries = render_signal_queries(policy)
        self._predicted = dict(predicted)
        self._fetcher = fetcher
        self._chunks = chunk_times(start, end, step)
        self._chunk = -1
        self._next: Future[Grids] | None = None
        self.grids: Grids = {}
        self.times: tuple[float, ...] = ()
        self.index = -1

    def first(self) -> Grids:
        """Load the first chunk (before the replay starts); its grids."""
        self._load(0)
        return self.grids

    def locate(self, at: float) -> bool:
        """Move to the scheduled evaluation at `at` (times only move forward); True when that moved to a new chunk."""
        moved = False
        while True:
            while self.index + 1 < len(self.times):
                self.index += 1
                if self.times[self.index] == at:
                    return moved
            if self._chunk + 1 >= len(self._chunks):
                raise LookupError(f"{self.policy.name}: {at} is not on the evaluation grid")
            self._load(self._chunk + 1)
            moved = True

    def current(self) -> tuple[Grids, int]:
        return self.grids, self.index

    def _load(self, chunk: int) -> None:
        pending, self._next = self._next, None
        grids = pending.result() if pending is not None and self._chunk + 1 == chunk else self._fetch(chunk)
        self._chunk, self.grids, self.times, self.index = chunk, grids, self._chunks[chunk], -1
        if chunk + 1 < len(self._chunks):
            self._next = self._fetcher.submit(self._fetch, chunk + 1)

    def _fetch(self, chunk: int) -> Grids:
        times = self._chunks[chunk]
        if self._querier is None:
            grids: Grids = {name: self._grid(query, times) for name, query in self._queries.items()}
        else:
            pending = {name: self._querier.submit(self._grid, query, times) for name, query in self._queries.items()}
            grids = {name: future.result() for name, future in pending.items()}  # _grid never raises
        for name, result in self._predicted.items():
            grids[name] = on_grid(result, times)
        return grids

    def _grid(self, query: str, times: tuple[float, ...]) -> RangeGrid:
        """One signal's answer on the chunk's grid; anything the source raises is that chunk's error."""
        group_by = list(self.policy.targets.groupBy)
        try:
            if isinstance(self._source, RangeGridSource):
                return self._source.range_grid(query, group_by, times, self._step)
            return on_grid(self._source.range(query, group_by, times[0], times[-1], self._step), times)
        except Exception as unexpected:  # noqa: BLE001 - sources answer errors as data; one raised is one too
            return RangeGrid.failed(times, f"source raised {type(unexpected).__name__}: {unexpected}")

    def close(self) -> None:
        if self._next is not None:
            self._next.cancel()


@dataclass
class _Watch:
    """One condition over the current chunk: per time, whether some present target is not healthy, and how many
    targets are present; the targets the policy holds state for (`seen`)."""

    condition: Condition
    grid: RangeGrid
    bad: list[bool]
    present_count: list[int]
    present: BoolArray
    seen: BoolArray
    all_seen: bool


class QuietRun:
    """One policy's skipped evaluations (see the module docstring)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.count = 0  # evaluations skipped and not yet applied
        self._last = -1  # the grid index of the last one
        self._watches: list[_Watch] | None = None  # None: the next evaluation runs for real
        self._cache: dict[tuple[int, str], tuple[list[bool], list[int]]] = {}
        self._cached_grids: Grids | None = None  # the chunk the caches are for (held: ids stay unique)
        self._indexes: dict[int, dict[TargetKey, int]] = {}

    def arm(self, state: PolicyState, grids: Grids, deferred: bool) -> None:
        """After a real evaluation, or on a new chunk (nothing pending): may the next evaluations be skipped?"""
        assert self.count == 0
        self._watches = None
        if deferred or any(s.phase is not Phase.OK for s in state.conditions.values()):
            return
        if self._cached_grids is not grids:
            self._cache.clear()
            self._indexes.clear()
            self._cached_grids = grids
        held: dict[str, list[TargetKey]] = {}
        for name, target in state.conditions:
            held.setdefault(name, []).append(target)
        watches: list[_Watch] = []
        for condition in self.policy.conditions:
            grid = grids.get(condition.signal)
            if grid is None or grid.error is not None:
                return
            key = (id(grid), condition.name)
            if key not in self._cache:
                healthy = grid.healthy(condition.when)
                bad: list[bool] = np.any(grid.present & ~healthy, axis=1).tolist()
                counts: list[int] = grid.present.sum(axis=1).tolist()
                self._cache[key] = (bad, counts)
            bad, counts = self._cache[key]
            index = self._indexes.setdefault(id(grid), {target: k for k, target in enumerate(grid.targets)})
            seen = np.zeros(len(grid.targets), dtype=np.bool_)
            for target in held.get(condition.name, ()):
                k = index.get(target)
                if k is None:  # state for a target this chunk never answers: every evaluation is a real one
                    return
                seen[k] = True
            watches.append(_Watch(condition, grid, bad, counts, grid.present, seen, bool(seen.all())))
        self._watches = watches

    def skip(self, i: int) -> bool:
        """At grid index `i`: True when the evaluation can be skipped (it is counted), False when it must run."""
        watches = self._watches
        if watches is None:
            return False
        for watch in watches:
            if watch.bad[i]:
                return False
            if watch.all_seen:
                if watch.present_count[i] != len(watch.seen):
                    return False
            elif (watch.seen & ~watch.present[i]).any():
                return False
        for watch in watches:
            if not watch.all_seen:
                watch.seen |= watch.present[i]
                watch.all_seen = bool(watch.seen.all())
        self.count += 1
        self._last = i
        return True

    def apply(self, state: PolicyState, commit: Callable[[PolicyState, float], None]) -> PolicyState:
        """The skipped evaluations applied to `state` (engine.advance_healthy) and committed at the last one's time;
        nothing pending afterwards (and the next evaluation runs for real unless armed again)."""
        watches, count, last = self._watches, self.count, self._last
        self._watches, self.count = None, 0
        if count == 0 or watches is None:
            return state
        observed: dict[StateKey, float] = {}
        for watch in watches:
            row: FloatArray = watch.grid.values[last]
            values = row.tolist()
            for k in np.flatnonzero(watch.seen).tolist():
                observed[(watch.condition.name, watch.grid.targets[k])] = values[k]
        at = watches[0].grid.times[last]
        state = advance_healthy(self.policy, state, at, count, observed)
        commit(state, at)
        return state
