"""Cooldown and action budget: the one rule, as pure functions of action times.

Two callers count the same way: the engine per policy and target (`Policy.limits`, the times it keeps in
`PolicyState.actions_at`), and the dispatcher per service across all policies (`GlobalLimits`, the times of
the actions in the journal). Each words its own message; the arithmetic is here:

* cooldown: the last mutating action happened less than `cooldown` seconds ago;
* budget: `max_actions` or more mutating actions started within the budget window (one hour);
* retention: times must be kept for the budget window, or for the cooldown when that is longer (a 2h cooldown
  must still see an action taken 61 minutes ago).

No clock, no I/O, nothing from the rest of the controller.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

BUDGET_WINDOW_SECONDS = 3600.0


@dataclass(frozen=True)
class Cooling:
    """The cooldown is running: the last action was `since` seconds ago, `left` seconds remain."""

    since: float
    left: float


def retention(cooldown: float) -> float:
    """How long action times must be kept: the budget window, or the cooldown when it is longer."""
    return max(BUDGET_WINDOW_SECONDS, cooldown)


def kept(times: Iterable[float], now: float, cooldown: float) -> tuple[float, ...]:
    """The times still needed at `now` (see `retention`), in their order."""
    keep = retention(cooldown)
    return tuple(t for t in times if now - t < keep)


def cooling(times: Iterable[float], now: float, cooldown: float) -> Cooling | None:
    """The running cooldown after the latest of `times`, or None when there is none (or no times)."""
    latest = max(times, default=None)
    if latest is None or now - latest >= cooldown:
        return None
    since = now - latest
    return Cooling(since, cooldown - since)


def in_budget_window(times: Iterable[float], now: float) -> list[float]:
    """The times that count against the budget at `now` (the last hour)."""
    return [t for t in times if now - t < BUDGET_WINDOW_SECONDS]


def over_budget(times: Iterable[float], now: float, max_actions: int | None) -> int | None:
    """How many actions the last hour holds when that reaches `max_actions` (no budget: None), else None."""
    if max_actions is None:
        return None
    used = len(in_budget_window(times, now))
    return used if used >= max_actions else None
