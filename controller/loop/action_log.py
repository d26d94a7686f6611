"""What every part of the dispatcher shares: how an action's end leaves it (journaled, logged, reported to
`on_action`), the crash hooks of the chaos tests, and one lock per service.

The dispatcher's parts (controller/loop/dispatcher.py: planning, deferral and abort, execution) each hold these;
none of them holds another part to reach them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from tailguard.controller.core.actions import ActionRecord, ActionStatus
from tailguard.controller.core.ports import ActionJournalPort, Clock

log = logging.getLogger("tailguard.controller.loop.dispatcher")


class ActionLog:
    """An action's transitions as they leave the dispatcher: the journal's row, a log line, `on_action`."""

    def __init__(
        self,
        journal: ActionJournalPort,
        clock: Clock,
        on_action: Callable[[ActionRecord], None] | None = None,
        crash_hook: Callable[[str, ActionRecord], None] | None = None,
    ) -> None:
        self.journal = journal
        self.clock = clock
        self.on_action = on_action
        self.crash_hook = crash_hook

    def hook(self, point: str, record: ActionRecord) -> None:
        if self.crash_hook is not None:
            self.crash_hook(point, record)

    def finish(
        self, record: ActionRecord, status: ActionStatus, result: Mapping[str, Any] | None, error: str | None
    ) -> ActionRecord:
        finished = self.journal.finish(record.idempotency_key, status, self.clock.now(), result=result, error=error)
        if status in (ActionStatus.FAILED, ActionStatus.SUPPRESSED, ActionStatus.ABORTED):
            log.warning(
                "%s %s on %s: %s (%s)",
                record.type.value,
                status.value,
                record.resource,
                error,
                record.idempotency_key,
            )
        else:
            log.info("%s %s on %s (%s)", record.type.value, status.value, record.resource, record.idempotency_key)
        self.report(finished)
        return finished

    def report(self, record: ActionRecord) -> None:
        if self.on_action is not None:
            try:
                self.on_action(record)
            except Exception:
                log.exception("on_action callback failed for %s", record.idempotency_key)


class ServiceLocks:
    """One lock per service across all policies (they evaluate on separate threads): the limits check and the start
    of a mutating action are atomic, and two changes to one service never interleave. Per service, not global: a
    slow change (a traffic ramp holding between steps) on one service must not delay a rollback of another."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def lock(self, resource: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(resource, threading.Lock())
