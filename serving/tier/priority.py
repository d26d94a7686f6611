"""Priority classes and their batching windows (the seed design), as a pure core: no I/O, no clock of its own.

A request's `priority` (vLLM's field: lower values are served first, default 0) puts it in a class:

| class         | priority | window | batch |
|---------------|----------|--------|-------|
| `interactive` | <= 0     | 5 ms   | 8     |
| `batch`       | >= 1     | 20 ms  | 32    |

Requests of a class are held in that class's window and released together (so they reach the engine in the
same scheduler step) when the window holds `max_batch` requests or `max_wait_s` after its first request,
whichever comes first. When several windows are due at once the interactive one goes first. The local
router (tailguard.serving.tier.router) and the virtual-time simulator (tailguard.serving.tier.batching.simulate) both
run this; the engine then serves the classes by priority when the profile sets `scheduling_policy: priority`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class PriorityClass:
    name: str
    max_wait_s: float
    max_batch: int
    # The highest request `priority` in this class (classes are tried in order; the last takes the rest).
    max_priority: int | None = None


INTERACTIVE = PriorityClass("interactive", 0.005, 8, max_priority=0)
BATCH = PriorityClass("batch", 0.020, 32)
SEED_CLASSES: tuple[PriorityClass, ...] = (INTERACTIVE, BATCH)


def classify(priority: int, classes: Sequence[PriorityClass] = SEED_CLASSES) -> PriorityClass:
    """The class of a request `priority` (vLLM's: lower is more urgent)."""
    for candidate in classes:
        if candidate.max_priority is None or priority <= candidate.max_priority:
            return candidate
    return classes[-1]


@dataclass(frozen=True)
class Release(Generic[T]):
    """One batch leaving its window: the class, when the window opened and closed, and the items in order."""

    priority_class: PriorityClass
    opened_at: float
    released_at: float
    items: tuple[T, ...]

    @property
    def full(self) -> bool:
        return len(self.items) >= self.priority_class.max_batch


@dataclass
class _Window(Generic[T]):
    opened_at: float
    items: list[T] = field(default_factory=list)


class BatchWindows(Generic[T]):
    """Per-class windows. `offer` adds an item (returns the batch when that filled its window); `due(now)`
    returns the windows whose wait ran out, interactive first; `next_deadline()` says when to call `due`."""

    def __init__(self, classes: Sequence[PriorityClass] = SEED_CLASSES):
        if not classes:
            raise ValueError("at least one priority class is needed")
        self.classes = tuple(classes)
        self._open: dict[str, _Window[T]] = {}

    def classify(self, priority: int) -> PriorityClass:
        return classify(priority, self.classes)

    def offer(self, item: T, priority: int, now: float) -> Release[T] | None:
        priority_class = self.classify(priority)
        window = self._open.get(priority_class.name)
        if window is None:
            window = self._open[priority_class.name] = _Window(now)
        window.items.append(item)
        if len(window.items) >= priority_class.max_batch:
            del self._open[priority_class.name]
            return Release(priority_class, window.opened_at, now, tuple(window.items))
        return None

    def due(self, now: float) -> list[Release[T]]:
        released = []
        for priority_class in self.classes:  # in class order: interactive before batch
            window = self._open.get(priority_class.name)
            if window is not None and window.opened_at + priority_class.max_wait_s <= now:
                del self._open[priority_class.name]
                released.append(Release(priority_class, window.opened_at, now, tuple(window.items)))
        return released

    def next_deadline(self) -> float | None:
        deadlines = [
            window.opened_at + priority_class.max_wait_s
            for priority_class in self.classes
            if (window := self._open.get(priority_class.name)) is not None
        ]
        return min(deadlines) if deadlines else None

    def flush(self, now: float) -> list[Release[T]]:
        """Release every open window now (shutdown)."""
        released = [
            Release(c, w.opened_at, now, tuple(w.items)) for c in self.classes if (w := self._open.pop(c.name, None))
        ]
        return released

    @property
    def pending(self) -> int:
        return sum(len(window.items) for window in self._open.values())
