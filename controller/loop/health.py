"""The running controller's view of its sources (controller/core/source_health.py): fed by every evaluation's
readings, exported as metrics, logged at WARNING when a source's status changes (up -> degraded -> blind and
back: one line per transition, never one per evaluation), read by the status document."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from tailguard.controller.core.source_health import SourceHealth, SourceReading, SourceStatus, keep_policies, record
from tailguard.controller.loop.metrics import ControllerMetrics

logger = logging.getLogger("tailguard.health")


class SourceHealthTracker:
    """Thread-safe: evaluations of different policies record concurrently."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self._metrics = metrics
        self._lock = threading.Lock()
        self._health: dict[str, SourceHealth] = {}

    def record(self, readings: Iterable[SourceReading]) -> None:
        for reading in readings:
            with self._lock:
                before = self._health.get(reading.source, SourceHealth(reading.source))
                after = record(before, reading)
                self._health[reading.source] = after
            if after is before:
                continue
            self._metrics.record_source_health(after)
            if after.status is not before.status:
                _log_transition(before, after)

    def keep_policies(self, policies: Iterable[str], now: float) -> None:
        """After a reload: removed policies' readings are dropped (their source may be up again)."""
        names = list(policies)
        for source in list(self._health):
            with self._lock:
                before = self._health[source]
                after = keep_policies(before, names, now)
                self._health[source] = after
            if after is not before:
                self._metrics.record_source_health(after)
                if after.status is not before.status:
                    _log_transition(before, after)

    def snapshot(self) -> dict[str, SourceHealth]:
        with self._lock:
            return dict(self._health)


def _log_transition(before: SourceHealth, after: SourceHealth) -> None:
    fields = {"event": "source_health", **after.to_json(), "previous": before.status.value}
    if after.status is SourceStatus.UP:
        if before.since is None:
            return  # the first reading, healthy: nothing to say
        logger.warning("source %s is up again (was %s): %s", after.title(), before.status.value, after.summary(),
                       extra={"fields": fields})  # fmt: skip
        return
    logger.warning("source %s is %s: %s", after.title(), after.status.value, after.summary(), extra={"fields": fields})


# A journal that cannot be written is said once when it starts failing, then at most once per this many seconds
# (with the count since), and once when it writes again: never a traceback per evaluation.
JOURNAL_ERROR_LOG_SECONDS = 300.0


class JournalTrouble:
    """The journal's write failures (a full disk, a read-only volume): the evaluation that hit one decided nothing
    and acted on nothing (journal first), so the controller keeps running and says it without flooding the log."""

    def __init__(self, metrics: ControllerMetrics, interval: float = JOURNAL_ERROR_LOG_SECONDS) -> None:
        self._metrics = metrics
        self._interval = interval
        self._lock = threading.Lock()
        self._failing_since: float | None = None
        self._logged_at = 0.0
        self._unlogged = 0

    def failed(self, policy: str, error: BaseException, now: float) -> None:
        self._metrics.record_journal_error("commit_evaluation")
        with self._lock:
            first = self._failing_since is None
            if first:
                self._failing_since = now
            due = first or now - self._logged_at >= self._interval
            self._unlogged += 1
            count, self._unlogged = (self._unlogged, 0) if due else (0, self._unlogged)
            if due:
                self._logged_at = now
        if first:
            logger.error("journal write failed; evaluations decide and act on nothing until it writes again "
                         "(policy %s): %s", policy, error)  # fmt: skip
        elif due:
            logger.error("journal writes still failing: %d evaluations failed in the last %.0fs (latest: policy "
                         "%s): %s", count, self._interval, policy, error)  # fmt: skip

    def wrote(self, now: float) -> None:
        with self._lock:
            since, self._failing_since, self._unlogged = self._failing_since, None, 0
        if since is not None:
            logger.warning("journal writes again after %.0fs of failures", now - since)
