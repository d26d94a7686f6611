"""The operator's abort of a decision's actions (`tailguard abort DECISION`; controller/loop/dispatcher.py).

Each planned or deferred action of the decision ends `aborted` at once and never runs (nor after a restart); a
started one is told through its AbortSignal (core/ports/outcomes.py), passed into the port call, and stops at its
next step. One guard serialises an abort with a start, a deferral or a plan of the same action: an action is either
started (and told) or cancelled, never both.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tailguard.controller.core.actions import ActionRecord, ActionStatus
from tailguard.controller.core.controls import AbortRequest, AbortResult, AbortState
from tailguard.controller.core.ports import ActionJournalPort, Clock
from tailguard.controller.loop.action_log import ActionLog
from tailguard.controller.loop.ports import WakeableClock

log = logging.getLogger("tailguard.controller.loop.dispatcher")


class ActionAbort:
    """The AbortSignal (controller/core/ports/outcomes.py) of one action: `Aborts.abort` sets it, the action's port
    asks it between steps. Its hold is the clock's sleep, cut short when an abort arrives (a WakeableClock)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._event = threading.Event()
        self._request: AbortRequest | None = None

    def set(self, request: AbortRequest) -> None:
        if self._request is None:  # the first abort is the one that stopped it
            self._request = request
        self._event.set()

    def requested(self) -> AbortRequest | None:
        return self._request

    def hold(self, seconds: float) -> AbortRequest | None:
        if self._request is not None:
            return self._request
        if isinstance(self._clock, WakeableClock):
            self._clock.sleep_unless(seconds, self._event)
        else:
            self._clock.sleep(seconds)
        return self._request


class Aborts:
    """The signal of each action started in this process (by key), the guard an abort shares with a start, a
    deferral and a plan, and the abort itself."""

    def __init__(self, journal: ActionJournalPort, clock: Clock, actions: ActionLog) -> None:
        self.journal = journal
        self.clock = clock
        self.actions = actions
        # Held while an action is started, deferred or planned, and while an abort ends actions: never interleaved.
        self.guard = threading.Lock()
        self._signals: dict[str, ActionAbort] = {}

    @contextmanager
    def signal_for(self, key: str) -> Iterator[ActionAbort]:
        """The abort signal of an action while it executes (an abort that came first is already set in it)."""
        with self.guard:
            signal = self._signals.setdefault(key, ActionAbort(self.clock))
        try:
            yield signal
        finally:
            with self.guard:
                self._signals.pop(key, None)

    def abort(self, request: AbortRequest) -> AbortResult:
        """Stop the actions of `request.decision_id` (`tailguard abort`): each planned or deferred one ends `aborted`
        at once and never runs (nor after a restart); a started one is told through its AbortSignal and stops at its
        next step (a ramp before its next weight step, an Argo CD wait at its next poll), its outcome saying what it
        left; a started one a restart left behind ends `aborted` when resumed, without acting. Never a retry."""
        decision_id = request.decision_id
        with self.guard:
            before = self.journal.actions_for(decision_id)
            if not before:
                return AbortResult(
                    decision_id,
                    AbortState.UNKNOWN,
                    f"no action of decision {decision_id!r} is in the journal (an unknown id, or a decision that "
                    "acted on nothing)",
                )
            if all(record.terminal for record in before):
                ended = ", ".join(f"{record.type.value} {record.status.value}" for record in before)
                return AbortResult(
                    decision_id,
                    AbortState.FINISHED,
                    f"decision {decision_id!r} has already finished ({ended}); nothing to abort",
                    tuple(_brief(record) for record in before),
                )
            after = self.journal.abort_actions(request, self.clock.now())
            running = [record for record in after if record.status is ActionStatus.STARTED]
            for record in running:
                self._signals.setdefault(record.idempotency_key, ActionAbort(self.clock)).set(request)
        was_open = {record.idempotency_key for record in before if not record.terminal}
        cancelled = [r for r in after if r.idempotency_key in was_open and r.status is ActionStatus.ABORTED]
        for record in cancelled:
            log.warning("%s on %s aborted before it ran (%s): %s", record.type.value, record.resource,
                        record.idempotency_key, request.phrase())  # fmt: skip
            self.actions.report(record)
        actions = tuple(_brief(record) for record in after)
        if running:
            names = ", ".join(f"{record.type.value} on {record.resource}" for record in running)
            log.warning("abort of %s: %s in flight, stops at its next step (%s)", decision_id, names, request.phrase())
            return AbortResult(
                decision_id,
                AbortState.IN_FLIGHT,
                f"{names} in flight: stops at its next step (its outcome will say what it left in place); "
                f"{len(cancelled)} queued or deferred action(s) cancelled",
                actions,
            )
        return AbortResult(
            decision_id,
            AbortState.CANCELLED,
            f"{len(cancelled)} queued or deferred action(s) cancelled before they ran",
            actions,
        )


def _brief(record: ActionRecord) -> dict[str, Any]:
    """An action as an abort's answer lists it."""
    return {
        "idempotency_key": record.idempotency_key,
        "type": record.type.value,
        "resource": record.resource,
        "status": record.status.value,
        "error": record.error,
    }
