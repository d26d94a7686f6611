"""The long-running controller: schedules evaluations, reloads policies, serialises per policy.

One evaluation is `evaluate(policy, state, now, ports)` (controller/loop/evaluation.py): query the
policy's signals -> engine.transition -> journal commit (state + decisions + planned actions, one
transaction) -> dispatch. It runs under the policy's lock, so a scheduled evaluation and one triggered by an
Alertmanager webhook never interleave for the same policy (two evaluations interleaving could both decide on
the same breach from the same old state).

Policies are reloaded when their files change, as a diff of the policy sets (added, removed, updated:
`diff_policies`). A reload with any error keeps the last good set running: an SRE's typo must never switch
the controller off. An empty policy set (every file removed, no policy left) is such an error too, never a
silent stop. The signal queries of added and updated policies are checked once against the metrics source
before they are applied: a query the source refuses as bad data (a PromQL error) is a reload error for that
policy only, which keeps its last good version (or, for a new policy, is not loaded) while the rest applies.
At run time a refused query is a policy error: listed on /readyz (`policy_errors`) and in
tailguard_policy_errors{policy}.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from apscheduler.schedulers.background import BackgroundScheduler

from controller.core.controls import (
    ABORT,
    ALL,
    AbortRequest,
    AbortResult,
    AbortState,
    Control,
    Controls,
    effective_policy,
)
from controller.core.engine import PolicyState, action_retention, with_action_times
from controller.core.handover import ActionTimes, merge_action_times
from controller.core.incidents import Incident
from controller.core.limits import BUDGET_WINDOW_SECONDS
from controller.core.model import Decision, TargetKey
from controller.core.policy import TIME_TOLERANCE, Policy
from controller.core.policy_files import LoadedPolicy, PolicyError, load_policies, policy_paths
from controller.core.ports import (
    ChangeTrackerPort,
    Clock,
    DispatcherPort,
    JournalPort,
    LeaderPort,
    MetricsSource,
    PredictionPort,
    ShardedLeaderPort,
)
from controller.core.signals import refused_queries
from controller.core.source_health import SourceStatus
from controller.core.status_view import status_document
from controller.kit.clock import ShutdownInterrupt
from controller.kit.errors import ConfigError, StoreWriteError
from controller.loop.evaluation import (
    EvaluationOutcome,
    EvaluationPorts,
    QuerySignals,
    UnconfiguredPredictions,
    action_labels,
    evaluate,
)
from controller.loop.health import JournalTrouble, SourceHealthTracker
from controller.loop.metrics import ControllerMetrics
from controller.loop.ports import (
    TRIGGER_ALERT,
    TRIGGER_SCHEDULE,
    ActionWorkersPort,
    ControlsStorePort,
    DecisionAborterPort,
    Readiness,
    RolloutAnnotatorPort,
)

logger = logging.getLogger("tailguard.controller")

# A policy is "stale" for /readyz when it has not been evaluated for this many of its intervals.
READY_INTERVALS = 3
# How long stop() waits for a running action (its waits are cut short by the clock's interrupt).
ACTION_STOP_SECONDS = 30


class PolicyLoadError(ConfigError):
    """The initial policy set has errors; the controller refuses to start on a broken set."""

    def __init__(self, errors: Sequence[PolicyError]):
        super().__init__("; ".join(str(error) for error in errors))
        self.errors = list(errors)


@dataclass(frozen=True)
class ReloadOutcome:
    changed: bool
    applied: bool
    errors: tuple[PolicyError, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()


class PolicyDiff(NamedTuple):
    """How a new policy set differs from the running one, by policy name (each list sorted)."""

    added: list[str]
    removed: list[str]
    updated: list[str]  # in both sets, the policy changed


def diff_policies(old: Mapping[str, LoadedPolicy], new: Mapping[str, LoadedPolicy]) -> PolicyDiff:
    return PolicyDiff(
        added=sorted(set(new) - set(old)),
        removed=sorted(set(old) - set(new)),
        updated=sorted(name for name in set(new) & set(old) if new[name].policy != old[name].policy),
    )


def files_fingerprint(paths: Sequence[Path]) -> tuple[tuple[str, str], ...]:
    """What the policy files hold now: the file list and a hash of each (an unreadable file is its error)."""
    entries: list[tuple[str, str]] = []
    for path in policy_paths(paths):
        try:
            with open(path, "rb") as handle:  # streamed: an oversized file is refused by the loader, not read here
                entries.append((str(path), hashlib.file_digest(handle, "sha256").hexdigest()))
        except OSError as unreadable:
            entries.append((str(path), f"unreadable: {unreadable.strerror or unreadable}"))
    return tuple(entries)


class Controller:
    """Evaluates policies on a schedule and on demand; owns the policy set and the engine state."""

    def __init__(
        self,
        *,
        policy_paths: Sequence[str | Path],
        source: MetricsSource,
        journal: JournalPort,
        dispatcher: DispatcherPort,
        clock: Clock,
        metrics: ControllerMetrics | None = None,
        query_signals: QuerySignals | None = None,
        dry_run: bool | None = None,
        reload_interval: float = 5.0,
        schedule: bool = True,
        alert_workers: int = 4,
        predictions: PredictionPort | None = None,
        change_tracker: ChangeTrackerPort | None = None,
        change_window: float = 0.0,
        leader: LeaderPort | None = None,
        rollout_annotator: RolloutAnnotatorPort | None = None,
        policy_check: Callable[[Sequence[LoadedPolicy]], Sequence[PolicyError]] | None = None,
        action_workers: ActionWorkersPort | None = None,
        controls_store: ControlsStorePort | None = None,
        open_incidents: Callable[[], Sequence[Incident]] | None = None,
    ) -> None:
        self._paths = [Path(p) for p in policy_paths]
        # What the configuration refuses in a loaded set (e.g. an action no actuator can run): on a reload, the
        # same as a file error, so the last good set keeps running.
        self._policy_check = policy_check
        # Rollouts for attribution: read once per evaluation of a policy that attributes
        # (controller.adapters.changes.tracker).
        self._change_tracker = change_tracker
        self._change_window = change_window
        # Every rollout the tracker reports becomes a `rollout` annotation (the outbox drops repeats).
        self._rollout_annotator = rollout_annotator
        # With a leader elector, a follower skips its evaluations (counted here) and resumes nothing.
        self._leader = leader
        self.skipped_not_leader: dict[str, int] = {}
        self._resume_pending = False
        # Action times a previous leader handed over (policy -> target -> times), until an evaluation of that
        # policy has merged them into its state (and journal).
        self._inherited: dict[str, dict[TargetKey, tuple[float, ...]]] = {}
        self._source = source
        self._journal = journal
        # Operator controls (pause/resume, the kill switch): persisted by the store (the journal's meta table),
        # carried in the Lease by the leader elector (controls_snapshot / inherit_controls).
        self._controls_store = controls_store
        # The open incidents for the status (controller/loop/incidents.py IncidentKeeper; None: not shown).
        self._open_incidents = open_incidents
        self._controls = controls_store.load_controls() if controls_store is not None else Controls()
        self._dispatcher = dispatcher
        # The dispatcher's workers when actions run outside the evaluations (the app's); stopped before the
        # journal closes.
        self._action_workers = action_workers
        self._clock = clock
        self.metrics = metrics if metrics is not None else ControllerMetrics()
        # What the controller sees of its sources (up / degraded / blind): status page, /metrics, WARNING lines.
        self.health = SourceHealthTracker(self.metrics)
        self._journal_trouble = JournalTrouble(self.metrics)
        self.metrics.watch_leadership(
            self._leads_any, leader.shard_leadership if isinstance(leader, ShardedLeaderPort) else None
        )
        # No prediction port wired (the app always wires one, predictors.serving.PredictionProvider): every
        # prediction signal is no-data ("model not configured"), each model logged once.
        self._predictions: PredictionPort = predictions if predictions is not None else UnconfiguredPredictions()
        # What an evaluation reaches (controller/loop/evaluation.py); the Lease gates acting.
        self._ports = EvaluationPorts(
            source=source,
            journal=journal,
            dispatcher=dispatcher,
            clock=clock,
            metrics=self.metrics,
            predictions=self._predictions,
            **({"query_signals": query_signals} if query_signals is not None else {}),
            change_tracker=change_tracker,
            change_window=change_window,
            rollout_annotator=rollout_annotator,
            before_acting=self._publish_before_acting,
        )
        self._dry_run = dry_run
        self._reload_interval = reload_interval
        self._schedule = schedule
        self._lock = threading.RLock()  # guards the fields below, never held during an evaluation
        self._policy_locks: dict[str, threading.Lock] = {}
        self._policies: dict[str, LoadedPolicy] = {}
        self._states: dict[str, PolicyState] = {}
        self._loaded_at: dict[str, float] = {}
        self._last_evaluation: dict[str, float] = {}
        self._fingerprint: tuple[tuple[str, str], ...] = ()
        self._reload_errors: list[PolicyError] = []
        # Run-time policy errors by policy (a query the source refused as bad data at its last evaluation).
        self._policy_errors: dict[str, tuple[str, ...]] = {}
        # One reload at a time; the query check of a reload talks to the source outside self._lock.
        self._reload_lock = threading.Lock()
        # Queued alert-triggered evaluations: policy -> the targets its alerts named (None: every target).
        self._pending_alerts: dict[str, set[TargetKey] | None] = {}
        # The scheduled times of each policy: (first scheduled evaluation, interval); see scheduled_time().
        self._anchors: dict[str, tuple[float, float]] = {}
        self._futures: set[Future[EvaluationOutcome | None]] = set()
        self._started = False
        self._stopped = False
        self._journal_open = True
        self._scheduler: BackgroundScheduler | None = None
        self._executor = ThreadPoolExecutor(max_workers=max(1, alert_workers), thread_name_prefix="tailguard-alert")
        if leader is not None:
            leader.attach_handover(self)

    # ----- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Load the policies (errors -> PolicyLoadError), finish what a previous process left, schedule."""
        with self._lock:
            if self._started:
                return
        # Parsed outside self._lock, like a reload: /readyz answers (not started) meanwhile.
        fingerprint = files_fingerprint(self._paths)
        loaded, errors = load_policies(self._paths)
        if not errors and self._policy_check is not None:
            errors = list(self._policy_check(loaded))
        if errors:
            raise PolicyLoadError(errors)
        with self._lock:
            if self._started:
                return
            self._fingerprint = fingerprint
            self._apply(self._index(loaded))
            self._started = True
        if self._leader is None or self._leader.is_leader():
            self._resume_actions()
        else:
            with self._lock:
                self._resume_pending = True  # done by the first evaluation as leader
        if self._schedule:
            scheduler = BackgroundScheduler(timezone=UTC)
            with self._lock:
                self._scheduler = scheduler
                for name, loaded_policy in self._policies.items():
                    self._schedule_policy(name, loaded_policy.policy.interval)
                scheduler.add_job(
                    self._run_reload,
                    "interval",
                    seconds=self._reload_interval,
                    id="reload",
                    max_instances=1,
                    coalesce=True,
                )
            scheduler.start()
        logger.info("controller started with %d policies: %s", len(self._policies), ", ".join(sorted(self._policies)))

    def stop(self) -> None:
        """Stop scheduling, wait for running evaluations to finish, close the journal. Idempotent.

        Waits inside actions (a traffic ramp's hold, an Argo CD sync poll, a retry backoff) are cut short
        through the clock: the action stays "started" in the journal and the next process resumes it with
        the same idempotency key, so stopping takes seconds, not a ramp's length.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            scheduler = self._scheduler
        self._clock.interrupt()
        if scheduler is not None and scheduler.running:
            scheduler.shutdown(wait=True)
        self._executor.shutdown(wait=True, cancel_futures=True)
        # Any evaluation still inside a policy lock (a direct evaluate() call) finishes before the close.
        for lock in list(self._policy_locks.values()):
            with lock:
                pass
        if self._action_workers is not None and not self._action_workers.close(ACTION_STOP_SECONDS):
            logger.warning("an action did not stop within %ds; it resumes at the next start", ACTION_STOP_SECONDS)
        with self._lock:
            if self._journal_open:
                self._journal.close()
                self._journal_open = False
        logger.info("controller stopped")

    @property
    def running(self) -> bool:
        return self._started and not self._stopped

    # ----- policy set ------------------------------------------------------------------------------

    def policies(self) -> dict[str, Policy]:
        with self._lock:
            return {name: loaded.policy for name, loaded in self._policies.items()}

    def reload_errors(self) -> list[PolicyError]:
        with self._lock:
            return list(self._reload_errors)

    def _index(self, loaded: Iterable[LoadedPolicy]) -> dict[str, LoadedPolicy]:
        indexed: dict[str, LoadedPolicy] = {}
        for entry in loaded:
            policy = entry.policy
            if self._dry_run is not None and policy.dryRun != self._dry_run:
                # The controller-wide override (e.g. a dry-run deployment) wins over each policy's own flag.
                policy = policy.model_copy(update={"dryRun": self._dry_run})
            indexed[policy.name] = replace(entry, policy=policy)
        return indexed

    def _apply(self, new: dict[str, LoadedPolicy]) -> tuple[list[str], list[str], list[str]]:
        """Install a validated policy set (caller holds self._lock)."""
        old = self._policies
        added, removed, updated = diff_policies(old, new)
        now = self._clock.now()
        for name in added:
            self._states[name] = self._journal.load_state(name) or PolicyState()
            self._loaded_at[name] = now
        for name in [*added, *updated]:
            if name not in self._anchors or self._anchors[name][1] != new[name].policy.interval:
                self._anchors[name] = (now, new[name].policy.interval)
        for name in removed:
            self._states.pop(name, None)
            self._anchors.pop(name, None)
            self._policy_errors.pop(name, None)
            self._loaded_at.pop(name, None)
            self._last_evaluation.pop(name, None)
        gone_conditions: dict[str, list[str]] = {
            name: [c.name for c in old[name].policy.conditions] for name in removed
        }
        for name in updated:
            kept = {c.name for c in new[name].policy.conditions}
            gone = [c.name for c in old[name].policy.conditions if c.name not in kept]
            if gone:
                gone_conditions[name] = gone
                state = self._states.get(name, PolicyState())
                # State of a condition that no longer exists would otherwise linger in the journal forever.
                self._states[name] = PolicyState(
                    conditions={key: value for key, value in state.conditions.items() if key[0] in kept},
                    actions_at=state.actions_at,
                    evaluations=state.evaluations,
                    last_evaluated_at=state.last_evaluated_at,
                )
        self._policies = new
        self.metrics.set_policies(
            {name: [c.name for c in loaded.policy.conditions] for name, loaded in new.items()},
            gone_conditions,
        )
        self.metrics.set_intervals({name: loaded.policy.interval for name, loaded in new.items()})
        if removed:
            self.health.keep_policies(new, now)
        return added, removed, updated

    def reload(self) -> ReloadOutcome:
        """Re-read the policy files if they changed; on any error keep the last good set and report it.

        A set without any policy is an error. Added and updated policies' queries are checked against the source
        first: a refused query keeps that policy's last good version (a new one is not loaded) and is reported.
        """
        with self._reload_lock:
            return self._reload()

    def _reload(self) -> ReloadOutcome:
        fingerprint = files_fingerprint(self._paths)
        with self._lock:
            if self._stopped:
                return ReloadOutcome(changed=False, applied=False)
            if fingerprint == self._fingerprint:
                return ReloadOutcome(changed=False, applied=False, errors=tuple(self._reload_errors))
            self._fingerprint = fingerprint
        # Parsing and validating happen outside self._lock (one reload at a time: self._reload_lock), so a large or
        # hostile policy set never holds evaluations, alerts or /readyz; only installing the result takes the lock.
        loaded, errors = load_policies(self._paths)
        if not errors and self._policy_check is not None:
            errors = list(self._policy_check(loaded))
        if not errors and not loaded:
            errors = [self._empty_set_error()]
        with self._lock:
            if self._stopped:
                return ReloadOutcome(changed=False, applied=False)
            if errors:
                return self._reject(errors)
            current = dict(self._policies)
        # Outside self._lock: evaluations, alerts and /readyz go on while the source answers.
        checked, refusals = self._check_queries(current, self._index(loaded))
        with self._lock:
            if self._stopped:
                return ReloadOutcome(changed=False, applied=False)
            if not checked:
                return self._reject([*refusals, self._empty_set_error()])
            new = checked
            old_intervals = {name: entry.policy.interval for name, entry in self._policies.items()}
            added, removed, updated = self._apply(new)
            self._reload_errors = list(refusals)
            if refusals:
                self.metrics.reload_errors.inc()
                for error in refusals:
                    logger.error("policy reload: a refused query keeps that policy's last good version: %s", error)
            if self._scheduler is not None:
                for name in removed:
                    self._unschedule_policy(name)
                for name in added:
                    self._schedule_policy(name, new[name].policy.interval)
                for name in updated:
                    if new[name].policy.interval != old_intervals[name]:
                        self._schedule_policy(name, new[name].policy.interval)
        self._end_deferred(removed)
        logger.info(
            "policies reloaded: %d loaded; added %s; removed %s; updated %s",
            len(new),
            ", ".join(added) or "none",
            ", ".join(removed) or "none",
            ", ".join(updated) or "none",
        )
        return ReloadOutcome(
            changed=True,
            applied=True,
            errors=tuple(refusals),
            added=tuple(added),
            removed=tuple(removed),
            updated=tuple(updated),
        )

    def _reject(self, errors: Sequence[PolicyError]) -> ReloadOutcome:
        """A reload refused as a whole (caller holds self._lock): the last good set keeps running."""
        self._reload_errors = list(errors)
        self.metrics.reload_errors.inc()
        for error in errors:
            logger.error("policy reload rejected, keeping the last good set: %s", error)
        return ReloadOutcome(changed=True, applied=False, errors=tuple(errors))

    def _empty_set_error(self) -> PolicyError:
        where = ", ".join(str(path) for path in self._paths) or "(no policy paths)"
        return PolicyError(
            where, 1, "", "no policy left: an empty policy set is refused (the last good set keeps running)"
        )

    def _check_queries(
        self, current: Mapping[str, LoadedPolicy], new: Mapping[str, LoadedPolicy]
    ) -> tuple[dict[str, LoadedPolicy], list[PolicyError]]:
        """`new` with every added or updated policy whose query the source refuses (bad data) replaced by its last
        good version (dropped when it has none), and one error per refused query (file:line of the query)."""
        diff = diff_policies(current, new)
        checked = dict(new)
        errors: list[PolicyError] = []
        for name in [*diff.added, *diff.updated]:
            refused = refused_queries(self._source, new[name].policy)
            if not refused:
                continue
            kept = current.get(name)
            outcome = "keeping its last good version" if kept is not None else "not loaded"
            for signal, why in sorted(refused.items()):
                errors.append(
                    PolicyError(
                        new[name].file,
                        new[name].query_line(signal),
                        new[name].query_field(signal),
                        f"Prometheus refuses the query of signal {signal!r} ({why}); policy {name!r} {outcome}",
                    )
                )
            if kept is not None:
                checked[name] = kept
            else:
                del checked[name]
        return checked, sorted(errors, key=lambda error: (error.file, error.line))

    def _run_reload(self) -> None:
        try:
            self.reload()
        except Exception:  # the reload job must survive anything a bad file system throws at it
            logger.exception("policy reload failed unexpectedly; keeping the last good set")

    def _schedule_policy(self, name: str, interval: float) -> None:
        assert self._scheduler is not None
        # The job runs at start + k x interval, never before (the scheduler's time); scheduled_time() names those
        # runs anchor + k x interval in the clock's time, read at the same moment (the same time for the system
        # clock, up to microseconds: within the millisecond streak times are compared at).
        start = datetime.now(UTC)
        anchor = self._clock.now()
        self._anchors[name] = (anchor, interval)
        self._scheduler.add_job(
            self._run_scheduled,
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

    def _unschedule_policy(self, name: str) -> None:
        assert self._scheduler is not None
        job = self._scheduler.get_job(f"policy:{name}")
        if job is not None:
            job.remove()

    # ----- evaluation ------------------------------------------------------------------------------

    def _policy_lock(self, name: str) -> threading.Lock:
        with self._lock:
            lock = self._policy_locks.get(name)
            if lock is None:
                lock = self._policy_locks[name] = threading.Lock()
            return lock

    def evaluate(self, policy_name: str, trigger: str = TRIGGER_SCHEDULE) -> EvaluationOutcome | None:
        """Evaluate one policy now. None when the policy is not (or no longer) loaded or the controller stopped."""
        with self._policy_lock(policy_name):
            return self._evaluate_holding_lock(policy_name, trigger)

    def evaluate_scheduled(self, policy_name: str) -> EvaluationOutcome | None:
        """The scheduler's evaluation of one policy, at its nominal scheduled time (scheduled_time()): a run that
        starts a few ms late is still exactly one interval after the previous one, so jitter never costs a `for`
        streak a whole interval."""
        with self._policy_lock(policy_name):
            return self._evaluate_holding_lock(policy_name, TRIGGER_SCHEDULE, scheduled=True)

    # ----- handover between leaders (controller/core/handover.py) ---------------------------------------------

    def handover_snapshot(self) -> ActionTimes:
        """The mutating-action times that still count for a cooldown or budget: ours and those not merged yet."""
        now = self._clock.now()
        with self._lock:
            own = {name: state.actions_at for name, state in self._states.items()}
            merged = merge_action_times(own, self._inherited)
            retention = {name: action_retention(loaded.policy) for name, loaded in self._policies.items()}
        # A policy not loaded (yet, or any more) keeps its times as long as the longest loaded one would.
        longest = max([BUDGET_WINDOW_SECONDS, *retention.values()])
        return {
            policy: kept
            for policy, by_target in merged.items()
            if (kept := _recent(by_target, now - retention.get(policy, longest)))
        }

    def inherit_handover(self, times: ActionTimes) -> None:
        """Times read from the Lease (the previous leader's, or our own as published): merged into each policy's
        state by its next evaluation. Idempotent: a time we already count counts once."""
        with self._lock:
            self._inherited = merge_action_times(self._inherited, times)

    # ----- operator controls (controller/core/controls.py) ------------------------------------------------

    def controls(self) -> Controls:
        with self._lock:
            return self._controls

    def set_paused(self, policy: str | None, paused: bool, *, by: str, reason: str) -> Control:
        """Pause (or resume) `policy`, or every policy (None: the kill switch); journaled with who and why. Takes
        effect at the next evaluation of each policy (a pause stops its next mutating action)."""
        control = Control(paused, by, reason, self._clock.now())
        key = ALL if policy is None else policy
        with self._lock:
            self._controls = self._controls.with_control(key, control)
            controls = self._controls
        if self._controls_store is not None:
            self._controls_store.record_control(controls, "pause" if paused else "resume", key, by, reason, control.at)
        logger.warning("%s %s by %s: %s", "paused" if paused else "resumed", key, by, reason or "(no reason given)")
        return control

    def abort_decision(self, decision_id: str, *, by: str, reason: str) -> AbortResult:
        """Abort the actions of `decision_id` (controller/loop/dispatcher.py `abort`): journaled as a control (who,
        why, when, the decision) and as events of its actions, when there was something to abort."""
        request = AbortRequest(decision_id, by, reason, self._clock.now())
        if not isinstance(self._dispatcher, DecisionAborterPort):
            return AbortResult(decision_id, AbortState.UNKNOWN, "this controller's dispatcher cannot abort actions")
        result = self._dispatcher.abort(request)
        if result.state in (AbortState.IN_FLIGHT, AbortState.CANCELLED):
            if self._controls_store is not None:
                self._controls_store.record_control(None, ABORT, decision_id, by, reason, request.at)
            logger.warning("abort of decision %s by %s (%s): %s", decision_id, by, reason, result.message)
        return result

    def controls_snapshot(self) -> Controls:
        """What the Lease carries to the next leader."""
        return self.controls()

    def inherit_controls(self, controls: Controls) -> None:
        """Controls read from the Lease (a previous leader's): merged, the later control of each policy winning;
        persisted when they change ours."""
        with self._lock:
            merged = self._controls.merged(controls)
            changed = merged != self._controls
            self._controls = merged
        if changed and self._controls_store is not None:
            self._controls_store.record_control(merged, "inherit", "lease", "leader-election", "", self._clock.now())

    def recent_controls(self, limit: int = 50) -> list[dict[str, Any]]:
        with self._lock:
            if not self._journal_open or self._controls_store is None:
                return []
        return self._controls_store.recent_controls(limit)

    def states(self) -> dict[str, PolicyState]:
        with self._lock:
            return dict(self._states)

    def status(self, decisions: int = 20) -> dict[str, Any]:
        """The status document (controller/core/status_view.py) of this replica."""
        return status_document(
            self.policies(),
            self.states(),
            self.controls(),
            self._clock.now(),
            decisions=self.recent_decisions(decisions),
            recent_controls=self.recent_controls(20),
            health=self.health.snapshot(),
            incidents=self._incidents_shown(),
        )

    def _incidents_shown(self) -> Sequence[Incident]:
        if self._open_incidents is None:
            return ()
        try:
            return self._open_incidents()
        except Exception:  # an unreachable incident store must not take the status down with it
            logger.exception("the open incidents could not be read for the status")
            return ()

    def _resume_actions(self) -> None:
        for record in self._dispatcher.resume():
            self.metrics.record_action(*action_labels(record))
            logger.info("resumed action %s -> %s", *action_labels(record))
        # Deferred actions are not resumed: those of a loaded policy wait for its next evaluation (they run only
        # if their condition still holds then); those of a policy no longer loaded end suppressed now.
        with self._lock:
            loaded = set(self._policies)
        self._end_deferred(sorted(self._dispatcher.deferred_policies() - loaded))

    def _end_deferred(self, policies: Iterable[str]) -> None:
        """The deferred actions of policies no longer loaded end suppressed ("policy removed while deferred")."""
        for name in policies:
            with self._policy_lock(name):
                for record in self._dispatcher.retry_deferred(name, None):
                    self.metrics.record_action(*action_labels(record))

    def _evaluate_holding_lock(
        self,
        policy_name: str,
        trigger: str,
        *,
        scheduled: bool = False,
        targets: Collection[TargetKey] | None = None,
    ) -> EvaluationOutcome | None:
        with self._lock:
            loaded = self._policies.get(policy_name)
            if loaded is None or self._stopped or not self._journal_open:
                return None
            policy = effective_policy(loaded.policy, self._controls)  # paused: runs suspended
            state = self._states.get(policy_name, PolicyState())
            inherited = self._inherited.get(policy_name)
            anchor = self._anchors.get(policy_name) if scheduled else None
        if inherited:
            state = with_action_times(state, inherited)  # the previous leader's actions count for our limits
        if self._leader is not None:
            if not self._leads(policy_name):
                with self._lock:
                    self.skipped_not_leader[policy_name] = self.skipped_not_leader.get(policy_name, 0) + 1
                    # Leading again later (a failover back) resumes what is left: the journaled plans make it safe.
                    self._resume_pending = True
                return None
            with self._lock:
                resume, self._resume_pending = self._resume_pending, False
            if resume:
                self._resume_actions()
        now = self._clock.now()
        if anchor is not None:
            now = scheduled_time(*anchor, now, state.last_evaluated_at)

        def committed(new_state: PolicyState) -> None:
            with self._lock:
                if policy_name in self._policies:
                    self._states[policy_name] = new_state
                    self._last_evaluation[policy_name] = now
                    if inherited and self._inherited.get(policy_name) is inherited:
                        del self._inherited[policy_name]  # in the state (and journal) now

        try:
            outcome = evaluate(policy, state, now, self._ports, trigger=trigger, committed=committed, targets=targets)
        except StoreWriteError as unwritable:  # nothing was committed, so nothing was decided or acted on
            self._journal_trouble.failed(policy_name, unwritable, self._clock.now())
            return None
        self._journal_trouble.wrote(self._clock.now())
        self.health.record(outcome.readings)
        with self._lock:
            if outcome.policy_errors and policy_name in self._policies:
                self._policy_errors[policy_name] = outcome.policy_errors
            else:
                self._policy_errors.pop(policy_name, None)
        return outcome

    def _publish_before_acting(self, policy_name: str, decisions: Sequence[Decision]) -> bool:
        """With a leader elector and a mutating action to run: renew the Lease with the new action times first,
        so a successor that takes over right after still counts this action. Returns whether to dispatch:
        not when the renewal showed another replica holds the Lease (the actions stay planned in the journal
        and are resumed when this replica leads again); a failed renewal otherwise only warns, as the lease
        deadline still covers acting."""
        if self._leader is None or not any(a.mutating for d in decisions for a in d.actions):
            return True
        leader = self._leader
        if leader.publish_for(policy_name) if isinstance(leader, ShardedLeaderPort) else leader.publish():
            return True
        if self._leads(policy_name):
            logger.warning("%s: could not publish the action times to the Lease before acting", policy_name)
            return True
        logger.warning("%s: lost the Lease before acting; the decided actions stay planned in the journal",
                       policy_name)  # fmt: skip
        with self._lock:
            self._resume_pending = True
        return False

    def _leads_any(self) -> bool:
        return self._leader is None or self._leader.is_leader()

    def _leads(self, policy_name: str) -> bool:
        """Whether this replica evaluates and acts on `policy_name` now: it holds the Lease (with sharding, the
        Lease of the policy's shard: controller/adapters/lease/shards.py)."""
        if self._leader is None:
            return True
        if isinstance(self._leader, ShardedLeaderPort):
            return self._leader.leads(policy_name)
        return self._leader.is_leader()

    def _run_scheduled(self, name: str) -> None:
        try:
            self.evaluate_scheduled(name)
        except ShutdownInterrupt:
            _log_interrupted(name)
        except Exception:  # one failed evaluation must not stop the schedule of the others
            logger.exception("evaluation of policy %s failed", name)

    def trigger(
        self,
        policy_names: Iterable[str],
        trigger: str = TRIGGER_ALERT,
        *,
        targets: Mapping[str, Collection[TargetKey]] | None = None,
    ) -> list[str]:
        """Queue immediate evaluations; returns the policies queued (an evaluation already queued is reused).

        `targets`: per policy, the only targets its evaluation may touch (those the alerts name; a policy not in
        it, or no `targets` at all: every target). An evaluation already queued takes the union."""
        queued: list[str] = []
        with self._lock:
            if not self.running:
                return []
            for name in policy_names:
                if name not in self._policies:
                    continue
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
            with self._policy_lock(name):
                # Still "pending" while it waits for a running evaluation of the same policy, so alerts
                # arriving meanwhile coalesce into this one instead of queueing another.
                with self._lock:
                    scope = self._pending_alerts.pop(name, None)
                return self._evaluate_holding_lock(name, trigger, targets=scope)
        except ShutdownInterrupt:
            _log_interrupted(name)
            return None
        except Exception:
            logger.exception("%s-triggered evaluation of policy %s failed", trigger, name)
            return None

    def _forget(self, future: Future[EvaluationOutcome | None]) -> None:
        with self._lock:
            self._futures.discard(future)

    def wait_for_actions(self, timeout: float) -> bool:
        """Wait until the action workers are idle (tests); True at once when actions run inside evaluations."""
        return self._action_workers.wait_idle(timeout) if self._action_workers is not None else True

    def wait_for_triggered(self, timeout: float) -> bool:
        """Wait until the queued triggered evaluations finished (tests, orderly shutdown). False on timeout."""
        with self._lock:
            futures = list(self._futures)
        _done, not_done = wait(futures, timeout=timeout)
        return not not_done

    # ----- status ----------------------------------------------------------------------------------

    def readiness(self) -> Readiness:
        now = self._clock.now()
        reasons: list[str] = []
        with self._lock:
            if not self._started:
                reasons.append("controller not started")
            if self._stopped:
                reasons.append("controller stopped")
            if not self._journal_open:
                reasons.append("journal closed")
            if self._started and not self._policies:
                reasons.append("no policies loaded")
            last = {name: self._last_evaluation.get(name) for name in self._policies}
            # A follower skips evaluations on purpose: not being the leader is not being unready.
            following = self._leader is not None and not self._leader.is_leader()
            sharded_elsewhere = 0
            late: list[str] = []
            for name, loaded in sorted(self._policies.items()):
                if following:
                    continue
                if not self._leads(name):  # another replica holds this policy's shard
                    sharded_elsewhere += 1
                    continue
                limit = READY_INTERVALS * loaded.policy.interval
                at = last[name]
                # Late evaluations are a warning, not unreadiness: they come from a slow or hung dependency (a
                # Prometheus that hangs holds each query for its timeout), and readiness means "serves its API"
                # (the pause, the status page and the webhook still work; restarting or cutting the pod off fixes
                # nothing). The status page's health and the TailguardBlind alert say it instead.
                if at is None:
                    late.append(f"policy {name}: not evaluated yet")
                elif now - at > limit:
                    late.append(f"policy {name}: last evaluation {now - at:.0f}s ago (limit {limit:.0f}s)")
            reload_errors = tuple(str(error) for error in self._reload_errors)
            policy_errors = tuple(
                f"policy {name}: signal {error}"
                for name, errors in sorted(self._policy_errors.items())
                for error in errors
            )
            predictions = self._predictions
        # A rejected reload is reported but does not make the controller unready: the last good set still runs.
        # Likewise an unusable prediction model: its conditions are no-data (they hold, never act) while every
        # other policy keeps working; an unready controller would be restarted or cut off, which fixes no model
        # file and stops the policies that do work.
        warnings = (
            *predictions.warnings(),
            *(h.summary() for h in self.health.snapshot().values() if h.status is not SourceStatus.UP),
            *late,
        )
        if following:
            warnings = (*warnings, "follower: another replica holds the leader lease; evaluations are skipped")
        elif sharded_elsewhere:
            warnings = (*warnings, f"sharded: {sharded_elsewhere} policies belong to shards other replicas hold")
        return Readiness(not reasons, tuple(reasons), reload_errors, last, warnings, policy_errors)

    def recent_decisions(self, limit: int = 100, before: int | None = None) -> list[dict[str, Any]]:
        """The journal's read side (its own connection: a reader never holds the lock an evaluation commits
        under)."""
        with self._lock:
            if not self._journal_open:
                return []
        return self._journal.recent_decisions(limit, before)


def _log_interrupted(policy_name: str) -> None:
    logger.info(
        "evaluation of policy %s interrupted by shutdown; its unfinished actions are in the journal and resume "
        "at the next start",
        policy_name,
    )


def _recent(by_target: Mapping[TargetKey, tuple[float, ...]], since: float) -> dict[TargetKey, tuple[float, ...]]:
    return {target: kept for target, stamps in by_target.items() if (kept := tuple(t for t in stamps if t > since))}


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
