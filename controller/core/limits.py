"""Cooldown and action budget: the one rule, as pure functions of action times.

Two callers count the same way: the engine per policy and target (`Policy.limits`, the times it keeps in
`PolicyState.actions_at`), and the dispatcher per service across all policies (`GlobalLimits`, the times of
the actions in the journal). Each words its own message; the arithmetic is here:

* cooldown: the last mutating action happened less than `cooldown` seconds ago;
* budget: `max_actions` or more mutating actions started within the budget window (one hour);
* retention: times must be kept for the budget window, or for the cooldown when that is longer (a 2h cooldown
  must still see an action taken 61 minutes ago).

The global limits add precedence between action types on one service (`global_refusal`, the dispatcher's and
the backtest's one answer to "may this action start now, and if not, why"): the cooldown holds an action back
only for earlier actions of EQUAL OR HIGHER precedence (a recent scale never delays the rollback that fixes the
cause), while the budget counts every mutating action. Actions of one decision are one intervention: they never
cool each other down.

No clock, no I/O, nothing from the rest of the controller.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

BUDGET_WINDOW_SECONDS = 3600.0

# Mutating action types, highest precedence first (the controller YAML's `limits.precedence` default).
DEFAULT_PRECEDENCE: tuple[str, ...] = ("rollback", "shift_traffic", "scale")


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


# ----- the global limits: per service, across all policies, with precedence ---------------------------------


@dataclass(frozen=True)
class PastAction:
    """An earlier mutating action on the same service, as the global limits see it.

    `at` is when its first attempt began; `decision` names its decision (id and kind, e.g. "abc:fire"), so the
    actions of one decision do not cool each other down.
    """

    type: str
    at: float
    policy: str = ""
    decision: str = ""


@dataclass(frozen=True)
class Refusal:
    """Why an action may not start now: `limit` is "cooldown" or "budget", `reason` the sentence journaled."""

    limit: str
    reason: str


def rank(action_type: str, precedence: Sequence[str] = DEFAULT_PRECEDENCE) -> int:
    """0 is the highest precedence; a type the order does not list ranks below all listed ones."""
    try:
        return list(precedence).index(action_type)
    except ValueError:
        return len(precedence)


def global_refusal(
    action_type: str,
    decision: str,
    recent: Iterable[PastAction],
    now: float,
    *,
    service: str,
    cooldown: float,
    max_actions: int | None,
    precedence: Sequence[str] = DEFAULT_PRECEDENCE,
) -> Refusal | None:
    """Whether a mutating `action_type` of `decision` may start on `service` at `now`, given the `recent`
    mutating actions on that service (those that happened or may have; the action itself left out).

    Cooldown: refused while an action of another decision with equal or higher precedence started less than
    `cooldown` ago. Budget: refused when `max_actions` or more actions of any type started in the last hour.
    None: allowed.
    """
    recent = list(recent)
    own = rank(action_type, precedence)
    holding = [a for a in recent if (not decision or a.decision != decision) and rank(a.type, precedence) <= own]
    running = cooling([a.at for a in holding], now, cooldown)
    if running is not None and cooldown > 0:
        latest = max(holding, key=lambda a: a.at)
        return Refusal(
            "cooldown",
            f"global cooldown: {latest.type} on {service} by policy {latest.policy!r} "
            f"{running.since:.0f}s ago, {running.left:.0f}s left (cooldown {cooldown:.0f}s)",
        )
    used = over_budget([a.at for a in recent], now, max_actions)
    if used is not None:
        return Refusal(
            "budget",
            f"global budget: {used} mutating action(s) on {service} in the last hour "
            f"across all policies (max {max_actions})",
        )
    return None
