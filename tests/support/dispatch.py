"""Driving one adapter call through a real `Dispatcher` (controller/loop/dispatcher.py), as the controller does.

Adapters make one attempt and report `transient`; the dispatcher alone retries actions. An adapter test that
counts retries (requests sent, backoff slept, `detail["attempts"]`) therefore drives the call through a
Dispatcher with a real journal and the test's ManualClock, and reads the outcome back from the journaled result.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.ports import (
    AbortSignal,
    ActionOutcome,
    Clock,
    OutcomeStatus,
    RollbackPlan,
    RollbackRequest,
)
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.testing import make_decision


class _OneCall:
    """A RollbackPort whose rollback is the adapter call under test (the call names its own key and arguments)."""

    def __init__(self, act: Callable[[], ActionOutcome]) -> None:
        self.act = act
        self.calls = 0

    def plan_rollback(self, service: str, *, rollout_revision: str | None = None) -> RollbackPlan:
        return RollbackPlan(service=service)

    def rollback(self, request: RollbackRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        self.calls += 1
        return self.act()


def dispatched(
    act: Callable[[], ActionOutcome],
    *,
    clock: Clock,
    attempts: int = 3,
    backoff: float = 0.5,
    max_backoff: float = 30.0,
) -> ActionOutcome:
    """The outcome the dispatcher journals for `act` (one call per attempt, transient failures retried with the
    dispatcher's backoff through `clock`), with the dispatcher's `attempts` in its detail."""
    port = _OneCall(act)
    with tempfile.TemporaryDirectory() as scratch, Journal(Path(scratch) / "journal.db") as journal:
        dispatcher = Dispatcher(
            journal,
            Actuators(rollback=port),
            clock,
            GlobalLimits(),
            attempts=attempts,
            backoff=backoff,
            max_backoff=max_backoff,
            # Exactly `attempts`: a deadline shorter than any backoff never adds one (issue 24's retries within
            # an action's deadline are tests/integration/test_write_preconditions.py's).
            deadline_for=lambda _policy: 1e-3,
        )
        [record] = dispatcher.dispatch(make_decision([("rollback", {"service": "under-test"})]))
    assert port.calls <= attempts, f"the port was called {port.calls} times for {attempts} attempts"
    result = record.result or {}
    return ActionOutcome(
        OutcomeStatus(result["status"]), dict(result["detail"]), result.get("error"), bool(result.get("transient"))
    )
