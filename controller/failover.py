"""Failover of one backend (a service's version) on health checks: remove from rotation, return in two steps.

The pattern from the seed design:

    in rotation --3 consecutive failed checks--> removed (weight 0)
    removed     --healthy again-->               returning (half its weight: 50%)
    returning   --healthy for hold_seconds-->    in rotation (its full weight)
    returning   --one failed check-->            removed (weight 0) again: it has not earned any patience

A health check is healthy (True), failed (False) or unknown (None: the probe itself could not run, e.g. the
metrics source is down). Unknown never counts as a failure nor as a recovery: source errors are not breaches.

`next_state` is pure (state, check, now, config) -> (state, weight to set or None). `FailoverDriver` keeps
one state per backend and applies the weights through any `TrafficRouter`; a state advances only when the
weight was set, so a failed write is tried again at the next check with the same idempotency key.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from enum import StrEnum

from controller.protocols import ActionOutcome, Clock, OutcomeStatus, TrafficRouter

log = logging.getLogger(__name__)


class Phase(StrEnum):
    IN_ROTATION = "in-rotation"
    REMOVED = "removed"
    RETURNING = "returning"


@dataclass(frozen=True)
class FailoverConfig:
    failures_to_remove: int = 3
    successes_to_return: int = 1
    return_fraction: float = 0.5  # of the backend's full weight, when it first comes back
    hold_seconds: float = 60.0  # healthy at the reduced weight this long before the full weight

    def __post_init__(self) -> None:
        if self.failures_to_remove < 1 or self.successes_to_return < 1:
            raise ValueError("failures_to_remove and successes_to_return must be at least 1")
        if not 0 < self.return_fraction <= 1:
            raise ValueError(f"return_fraction must be in (0, 1], got {self.return_fraction}")


@dataclass(frozen=True)
class BackendState:
    full_weight: int  # the weight the backend has when healthy (percent)
    phase: Phase = Phase.IN_ROTATION
    failures: int = 0  # consecutive failed checks
    successes: int = 0  # consecutive healthy checks
    since: float = 0.0  # when the current phase began


def returning_weight(full_weight: int, config: FailoverConfig) -> int:
    return max(1, round(full_weight * config.return_fraction))


def next_state(
    state: BackendState, healthy: bool | None, now: float, config: FailoverConfig
) -> tuple[BackendState, int | None]:
    """The state after one health check, and the weight to set (None: leave the weight alone)."""
    if healthy is None:
        return state, None
    failures = 0 if healthy else state.failures + 1
    successes = state.successes + 1 if healthy else 0
    counted = replace(state, failures=failures, successes=successes)
    if state.phase is Phase.IN_ROTATION:
        if failures >= config.failures_to_remove:
            return replace(counted, phase=Phase.REMOVED, since=now, successes=0), 0
        return counted, None
    if state.phase is Phase.REMOVED:
        if successes >= config.successes_to_return:
            back = replace(counted, phase=Phase.RETURNING, since=now, failures=0)
            return back, returning_weight(state.full_weight, config)
        return counted, None
    # RETURNING
    if not healthy:
        return replace(counted, phase=Phase.REMOVED, since=now, successes=0), 0
    if now - state.since >= config.hold_seconds - 1e-9:
        return replace(counted, phase=Phase.IN_ROTATION, since=now, failures=0), state.full_weight
    return counted, None


class FailoverDriver:
    """Feeds health checks into the state machine and sets the weights through a TrafficRouter."""

    def __init__(self, router: TrafficRouter, clock: Clock, config: FailoverConfig | None = None) -> None:
        self.router = router
        self.clock = clock
        self.config = config or FailoverConfig()
        self._states: dict[tuple[str, str], BackendState] = {}
        self._lock = threading.Lock()

    def track(self, service: str, version: str, full_weight: int) -> None:
        with self._lock:
            self._states[(service, version)] = BackendState(full_weight=full_weight, since=self.clock.now())

    def state(self, service: str, version: str) -> BackendState:
        with self._lock:
            return self._states[(service, version)]

    def observe(self, service: str, version: str, healthy: bool | None) -> ActionOutcome | None:
        """One health check of a tracked backend; the outcome of the weight change it caused, if any."""
        now = self.clock.now()
        with self._lock:
            current = self._states[(service, version)]
            new, weight = next_state(current, healthy, now, self.config)
            if weight is None:
                self._states[(service, version)] = new
                return None
        # Deterministic per transition (phase entered, and when the phase being left began), so the retry
        # of a failed write at the next check reuses the key and a replay after a restart is recognised.
        key = f"failover:{service}:{version}:{new.phase.value}:{current.since:.3f}"
        outcome = self.router.set_weight(service, version, weight, idempotency_key=key)
        with self._lock:
            if outcome.status is OutcomeStatus.FAILED:
                # Keep the counts (the next check tries again) but not the phase change.
                self._states[(service, version)] = replace(current, failures=new.failures, successes=new.successes)
                log.warning("failover of %s %s to %d%% failed: %s", service, version, weight, outcome.error)
            else:
                self._states[(service, version)] = new
                log.info("failover: %s %s %s, weight %d%%", service, version, new.phase.value, weight)
        return outcome
