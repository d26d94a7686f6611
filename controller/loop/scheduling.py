"""When evaluations run: the policies' interval jobs and the reload job (APScheduler), the pool that runs alert-
triggered evaluations, and the per-policy locks that keep two evaluations of one policy from interleaving.

An evaluation runs under its policy's lock, so a scheduled evaluation and one triggered by an Alertmanager
webhook never interleave for the same policy (two evaluations interleaving could both decide on the same breach
from the same old state). What an evaluation does is not this module's: it calls the `EvaluateLocked` it is given
(controller/loop/runtime.py), holding the policy's lock.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime

from apscheduler.schedulers.background import BackgroundScheduler

from tailguard.controller.core.model import TargetKey
from tailguard.controller.core.policy import TIME_TOLERANCE
from tailguard.controller.core.ports import Clock
from tailguard.controller.kit.clock import ShutdownInterrupt
from tailguard.controller.loop.evaluation import EvaluationOutcome
from tailguard.controller.loop.ports import TRIGGER_SCHEDULE

logger = logging.getLogger("tailguard.controller")


# One evaluation of a policy, its lock held: (policy name, trigger, the anchor naming a scheduled evaluation by its
# nominal time or None, the only targets an alert named or None for every target).
EvaluateLocked = Callable[
    [str, str, tuple[float, float] | None, Collection[TargetKey] | None], EvaluationOutcome | None
]


class EvaluationScheduler:
    """The interval jobs, the alert pool and the policy locks; `run` is the evaluation they call."""

    def __init__(self, clock: Clock, run: EvaluateLocked, *, alert_workers: int = 4) -> None:
        self._clock = clock
        self._run = run
        self._lock = threading.Lock()  # guards the fields below, never held during an evaluation
        self._policy_locks: dict[str, threading.Lock] = {}
        # Queued alert-triggered evaluations: policy -> the targets its alerts named (None: every target).
        self._pending_alerts: dict[str, set[TargetKey] | None] = {}
        # The scheduled times of each policy: (first scheduled evaluation, interval); see scheduled_time().
        self._anchors: dict[str, tuple[float, float]] = {}
        self._futures: set[Future[EvaluationOutcome | None]] = set()
        self._scheduler: BackgroundScheduler | None = None
        self._closed = False
        self._executor = ThreadPoolExecutor(max_workers=max(1, alert_workers), thread_name_prefix="tailguard-alert")

    # ----- the jobs --------------------------------------------------------------------------------

    def apply(self, intervals: Mapping[str, float], added: Iterable[str], removed: Iterable[str],
              updated: Iterable[str]) -> None:  # fmt: skip
        """After a (re)load: `intervals` are the loaded policies'; a new policy, or one whose interval changed,
        starts its schedule now (its first evaluation right away when the jobs run), a removed one has none."""
        now = self._clock.now()
        with self._lock:
            for name in removed:
                self._anchors.pop(name, None)
                if self._scheduler is not None:
                    job = self._scheduler.get_job(f"policy:{name}")
                    if job is not None:
                        job.remove()
            for name in [*added, *updated]:
                interval = intervals[name]
                if name in self._anchors and self._anchors[name][1] == interval:
                    continue
                self._anchors[name] = (now, interval)
                if self._scheduler is not None:
                    self._schedule(name, interval)

    def start(self, intervals: Mapping[str, float], reload: Callable[[], None], reload_interval: float) -> None:
        """Run each policy every interval (the first at once) and `reload` every `reload_interval` seconds."""
        scheduler = BackgroundScheduler(timezone=UTC)
        with self._lock:
            self._scheduler = scheduler
            for name, interval in intervals.items():
                self._schedule(name, interval)
            scheduler.add_job(reload, "interval", seconds=reload_interval, id="reload", max_instances=1, coalesce=True)
        scheduler.start()

    def _schedule(self, name: str, interval: float) -> None:
        """(caller holds self._lock)"""
        assert self._scheduler is not None
        # The job runs at start + k x interval, never before (the scheduler's time); scheduled_time() names those
        # runs anchor + k x interval in the clock's time, read at the same moment (the same time for the system
        # clock, up to microseconds: within the millisecond streak times are compared at).
        start = datetime.now(UTC)
        self._anchors[name] = (self._clock.now(), interval)
        self._scheduler.add_job(
            self.run_scheduled,
            "interval",
            args=[name],
            seconds=interval,
            start_date=start,
            id=f"policy:{name}",
            replace_existing=True,
            max_instances=1,
            coalesce=True,
            # First evaluation right away: /readyz and a restarted controller should not wait an interval.
            next_run_time=start,
        )

    def stop(self) -> None:
        """No more jobs or queued evaluations; returns once the running ones finished."""
        with self._lock:
            self._closed = True
            scheduler = self._scheduler
        if scheduler is not None and scheduler.running:
            scheduler.shutdown(wait=True)
        self._executor.shutdown(wait=True, cancel_futures=True)
        # Any evaluation still inside a policy lock (a direct evaluate() call) finishes before the caller goes on.
        with self._lock:
            locks = list(self._policy_locks.values())
        for lock in locks:
            with lock:
                pass

    # ----- evaluations -----------------------------------------------------------------------------

    def policy_lock(self, name: str) -> threading.Lock:
        with self._lock:
            lock = self._policy_locks.get(name)
            if lock is None:
                lock = self._policy_locks[name] = threading.Lock()
            return lock

    def evaluate(self, policy_name: str, trigger: str = TRIGGER_SCHEDULE) -> EvaluationOutcome | None:
        with self.policy_lock(policy_name):
            return self._run(policy_name, trigger, None, None)

    def evaluate_scheduled(self, policy_name: str) -> EvaluationOutcome | None:
        """The scheduler's evaluation of one policy, at its nominal scheduled time (scheduled_time()): a run that
        starts a few ms late is still exactly one interval after the previous one, so jitter never costs a `for`
        streak a whole interval."""
        with self.policy_lock(policy_name):
            with self._lock:
                anchor = self._anchors.get(policy_name)
            return self._run(policy_name, TRIGGER_SCHEDULE, anchor, None)

    def run_scheduled(self, name: str) -> None:
        try:
            self.evaluate_scheduled(name)
        except ShutdownInterrupt:
            log_interrupted(name)
        except Exception:  # one failed evaluation must not stop the schedule of the others
            logger.exception("evaluation of policy %s failed", name)

    def queue(self, policy_names: Iterable[str], trigger: str,
              targets: Mapping[str, Collection[TargetKey]] | None) -> list[str]:  # fmt: skip
        """Queue an evaluation of each policy (an evaluation already queued is reused and takes the union of the
        targets); returns the policies queued (none once stopped)."""
        queued: list[str] = []
        with self._lock:
            if self._closed:
                return []
            for name in policy_names:
                queued.append(name)
                scope = None if targets is None or name not in targets else set(targets[name])
                if name in self._pending_alerts:
                    # An evaluation that has not started yet will see the newest data anyway; it also looks at
                    # these targets.
                    pending = self._pending_alerts[name]
                    if pending is not None:
                        self._pending_alerts[name] = None if scope is None else pending | scope
                    continue
                self._pending_alerts[name] = scope
                future = self._executor.submit(self._run_triggered, name, trigger)
                self._futures.add(future)
                future.add_done_callback(self._forget)
        return queued

    def _run_triggered(self, name: str, trigger: str) -> EvaluationOutcome | None:
        try:
            with self.policy_lock(name):
                # Still "pending" while it waits for a running evaluation of the same policy, so alerts
                # arriving meanwhile coalesce into this one instead of queueing another.
                with self._lock:
                    scope = self._pending_alerts.pop(name, None)
                return self._run(name, trigger, None, scope)
        except ShutdownInterrupt:
            log_interrupted(name)
            return None
        except Exception:
            logger.exception("%s-triggered evaluation of policy %s failed", trigger, name)
            return None

    def _forget(self, future: Future[EvaluationOutcome | None]) -> None:
        with self._lock:
            self._futures.discard(future)

    def wait_for_triggered(self, timeout: float) -> bool:
        """Wait until the queued triggered evaluations finished (tests, orderly shutdown). False on timeout."""
        with self._lock:
            futures = list(self._futures)
        _done, not_done = wait(futures, timeout=timeout)
        return not not_done


def log_interrupted(policy_name: str) -> None:
    logger.info(
        "evaluation of policy %s interrupted by shutdown; its unfinished actions are in the journal and resume "
        "at the next start",
        policy_name,
    )


def scheduled_time(anchor: float, interval: float, real: float, last: float | None = None) -> float:
    """The time a scheduled evaluation stands for: the latest nominal run time anchor + k x interval at or before
    `real` (to the millisecond), never before the policy's previous evaluation (`last`: monotonic per policy)
    and never after `real`. The scheduler never starts a run early, so a run late by some ms still names its
    own tick; a run that missed ticks (a slow evaluation) names the latest one."""
    ticks = max(0, math.floor((real - anchor + TIME_TOLERANCE) / interval))
    nominal = anchor + ticks * interval
    if last is not None:
        nominal = max(nominal, last)
    return min(real, nominal)
