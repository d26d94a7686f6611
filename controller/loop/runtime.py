"""The long-running controller: the wiring of the policy set, the scheduler, the leadership and the operator facade.

One evaluation is `evaluate(policy, state, now, ports)` (controller/loop/evaluation.py): query the policy's
signals -> engine.transition -> journal commit (state + decisions + planned actions, one transaction) ->
dispatch. It runs under the policy's lock (controller/loop/scheduling.py), so a scheduled evaluation and one
triggered by an Alertmanager webhook never interleave for the same policy.

The rooms it wires, each knowing only what it is given:
- `PolicySet` (controller/loop/policy_set.py): the loaded policies, their engine state, reload as a diff;
- `EvaluationScheduler` (controller/loop/scheduling.py): APScheduler's jobs, the alert pool, the policy locks;
- `Leadership` (controller/loop/leadership.py): the leader elector as the evaluations see it;
- `Operator` (controller/loop/operator.py): controls, abort, status and readiness;
- `LeaseHandover` (here): what the leader elector carries to the next leader, from the policy set (action times)
  and the operator (controls); the controller attaches it, never itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tailguard.controller.core.controls import AbortResult, Control, Controls, effective_policy
from tailguard.controller.core.engine import PolicyState, with_action_times
from tailguard.controller.core.handover import ActionTimes
from tailguard.controller.core.incidents import Incident
from tailguard.controller.core.model import TargetKey
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.policy_files import PolicyError
from tailguard.controller.core.ports import (
    ChangeTrackerPort,
    Clock,
    DispatcherPort,
    JournalPort,
    LeaderPort,
    MetricsSource,
    PredictionPort,
)
from tailguard.controller.kit.errors import StoreWriteError
from tailguard.controller.loop.evaluation import (
    EvaluationOutcome,
    EvaluationPorts,
    QuerySignals,
    UnconfiguredPredictions,
    action_labels,
    evaluate,
)
from tailguard.controller.loop.health import JournalTrouble, SourceHealthTracker
from tailguard.controller.loop.leadership import Leadership
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.operator import Lifecycle, Operator, OperatorView
from tailguard.controller.loop.policy_set import PolicyCheck, PolicySet, ReloadOutcome
from tailguard.controller.loop.ports import (
    TRIGGER_ALERT,
    TRIGGER_SCHEDULE,
    ActionWorkersPort,
    ControlsStorePort,
    Readiness,
    RolloutAnnotatorPort,
)
from tailguard.controller.loop.scheduling import EvaluationScheduler, scheduled_time

logger = logging.getLogger("tailguard.controller")

# How long stop() waits for a running action (its waits are cut short by the clock's interrupt).
ACTION_STOP_SECONDS = 30


class LeaseHandover:
    """What the Lease carries from one leader to the next (HandoverPort and ControlsHandoverPort,
    controller/core/ports.py): the policy set's mutating-action times and the operator's controls."""

    def __init__(self, policies: PolicySet, operator: Operator) -> None:
        self._policies = policies
        self._operator = operator

    def handover_snapshot(self) -> ActionTimes:
        return self._policies.handover_snapshot()

    def inherit_handover(self, times: ActionTimes) -> None:
        self._policies.inherit_handover(times)

    def controls_snapshot(self) -> Controls:
        return self._operator.controls_snapshot()

    def inherit_controls(self, controls: Controls) -> None:
        self._operator.inherit_controls(controls)


class Controller:
    """Evaluates policies on a schedule and on demand; the face the API and the app see (ControllerPort,
    OperatorPort, AbortControlPort: the operator's calls are the Operator's)."""

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
        policy_check: PolicyCheck | None = None,
        action_workers: ActionWorkersPort | None = None,
        controls_store: ControlsStorePort | None = None,
        open_incidents: Callable[[], Sequence[Incident]] | None = None,
    ) -> None:
        self._journal = journal
        self._dispatcher = dispatcher
        # The dispatcher's workers when actions run outside the evaluations (the app's); stopped before the
        # journal closes.
        self._action_workers = action_workers
        self._clock = clock
        self._reload_interval = reload_interval
        self._schedule = schedule
        self.metrics = metrics if metrics is not None else ControllerMetrics()
        # What the controller sees of its sources (up / degraded / blind): status page, /metrics, WARNING lines.
        self.health = SourceHealthTracker(self.metrics)
        self._journal_trouble = JournalTrouble(self.metrics)
        # With a leader elector, a follower skips its evaluations (counted) and resumes nothing.
        self._leadership = Leadership(leader)
        self.metrics.watch_leadership(self._leadership.leads_any, self._leadership.shard_leadership())
        # What the configuration refuses in a loaded set (e.g. an action no actuator can run): on a reload, the
        # same as a file error, so the last good set keeps running.
        self._policies = PolicySet(
            policy_paths,
            source=source,
            journal=journal,
            clock=clock,
            metrics=self.metrics,
            health=self.health,
            dry_run=dry_run,
            policy_check=policy_check,
        )
        # No prediction port wired (the app always wires one, tailguard.predictors.serving.PredictionProvider): every
        # prediction signal is no-data ("model not configured"), each model logged once.
        predictions = predictions if predictions is not None else UnconfiguredPredictions()
        # What an evaluation reaches (controller/loop/evaluation.py); the Lease gates acting. Rollouts for
        # attribution are read once per evaluation of a policy that attributes
        # (tailguard.controller.adapters.changes.tracker); every rollout the tracker reports becomes a `rollout`
        # annotation (the outbox drops repeats).
        self._ports = EvaluationPorts(
            source=source,
            journal=journal,
            dispatcher=dispatcher,
            clock=clock,
            metrics=self.metrics,
            predictions=predictions,
            **({"query_signals": query_signals} if query_signals is not None else {}),
            change_tracker=change_tracker,
            change_window=change_window,
            rollout_annotator=rollout_annotator,
            before_acting=self._leadership.publish_before_acting,
        )
        self._lifecycle = Lifecycle()
        self.operator = Operator(
            OperatorView(self._policies, self._lifecycle, self._leadership, self.health, predictions, journal,
                         open_incidents),
            dispatcher,
            clock,
            controls_store,
        )  # fmt: skip
        self._scheduler = EvaluationScheduler(clock, self._evaluate_holding_lock, alert_workers=alert_workers)
        # One reload (and what the scheduler and the dispatcher make of it) at a time.
        self._reload_lock = threading.Lock()
        if leader is not None:
            # The Lease carries the action times and the controls to the next leader (and back from the last).
            leader.attach_handover(LeaseHandover(self._policies, self.operator))

    # ----- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Load the policies (errors -> PolicyLoadError), finish what a previous process left, schedule."""
        lifecycle = self._lifecycle
        with self._reload_lock:
            with lifecycle.lock:
                if lifecycle.started:
                    return
            loaded = self._policies.load()
            self._scheduler.apply(self._policies.intervals(), added=loaded, removed=(), updated=())
            with lifecycle.lock:
                lifecycle.started = True
        if self._leadership.leads_any():
            self._resume_actions()
        else:
            self._leadership.resume_later()  # done by the first evaluation as leader
        if self._schedule:
            self._scheduler.start(self._policies.intervals(), self._run_reload, self._reload_interval)
        logger.info("controller started with %d policies: %s", len(loaded), ", ".join(loaded))

    def stop(self) -> None:
        """Stop scheduling, wait for running evaluations to finish, close the journal. Idempotent.

        Waits inside actions (a traffic ramp's hold, an Argo CD sync poll, a retry backoff) are cut short
        through the clock: the action stays "started" in the journal and the next process resumes it with
        the same idempotency key, so stopping takes seconds, not a ramp's length.
        """
        with self._lifecycle.lock:
            if self._lifecycle.stopped:
                return
            self._lifecycle.stopped = True
        self._policies.close()
        self._clock.interrupt()
        self._scheduler.stop()
        if self._action_workers is not None and not self._action_workers.close(ACTION_STOP_SECONDS):
            logger.warning("an action did not stop within %ds; it resumes at the next start", ACTION_STOP_SECONDS)
        with self._lifecycle.lock:
            if self._lifecycle.journal_open:
                self._journal.close()
                self._lifecycle.journal_open = False
        logger.info("controller stopped")

    @property
    def running(self) -> bool:
        return self._lifecycle.running

    # ----- policy set ------------------------------------------------------------------------------

    def policies(self) -> dict[str, Policy]:
        return self._policies.policies()

    def reload_errors(self) -> list[PolicyError]:
        return self._policies.reload_errors()

    def states(self) -> dict[str, PolicyState]:
        return self._policies.states()

    def reload(self) -> ReloadOutcome:
        """Re-read the policy files if they changed (PolicySet.reload); what changed is scheduled, and the deferred
        actions of a removed policy end suppressed."""
        with self._reload_lock:
            outcome = self._policies.reload()
            if outcome.applied:
                self._scheduler.apply(self._policies.intervals(), outcome.added, outcome.removed, outcome.updated)
                self._end_deferred(outcome.removed)
            return outcome

    def _run_reload(self) -> None:
        try:
            self.reload()
        except Exception:  # the reload job must survive anything a bad file system throws at it
            logger.exception("policy reload failed unexpectedly; keeping the last good set")

    # ----- evaluation ------------------------------------------------------------------------------

    def evaluate(self, policy_name: str, trigger: str = TRIGGER_SCHEDULE) -> EvaluationOutcome | None:
        """Evaluate one policy now. None when the policy is not (or no longer) loaded or the controller stopped."""
        return self._scheduler.evaluate(policy_name, trigger)

    def evaluate_scheduled(self, policy_name: str) -> EvaluationOutcome | None:
        """The scheduler's evaluation of one policy, at its nominal scheduled time (scheduling.scheduled_time)."""
        return self._scheduler.evaluate_scheduled(policy_name)

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
        if not self.running:
            return []
        loaded = self._policies.names()
        return self._scheduler.queue([name for name in policy_names if name in loaded], trigger, targets)

    def wait_for_actions(self, timeout: float) -> bool:
        """Wait until the action workers are idle (tests); True at once when actions run inside evaluations."""
        return self._action_workers.wait_idle(timeout) if self._action_workers is not None else True

    def wait_for_triggered(self, timeout: float) -> bool:
        """Wait until the queued triggered evaluations finished (tests, orderly shutdown). False on timeout."""
        return self._scheduler.wait_for_triggered(timeout)

    def _evaluate_holding_lock(
        self,
        policy_name: str,
        trigger: str,
        anchor: tuple[float, float] | None,
        targets: Collection[TargetKey] | None,
    ) -> EvaluationOutcome | None:
        """One evaluation, the policy's lock held (EvaluationScheduler calls it; `anchor`: a scheduled one's)."""
        start = self._policies.evaluation_input(policy_name)
        with self._lifecycle.lock:
            closed = self._lifecycle.stopped or not self._lifecycle.journal_open
        if start is None or closed:
            return None
        policy = effective_policy(start.loaded.policy, self.operator.controls())  # paused: runs suspended
        state, inherited = start.state, start.inherited
        if inherited:
            state = with_action_times(state, inherited)  # the previous leader's actions count for our limits
        if self._leadership.elected:
            if not self._leadership.leads(policy_name):
                self._leadership.skipped(policy_name)
                return None
            if self._leadership.take_resume():
                self._resume_actions()
        now = self._clock.now()
        if anchor is not None:
            now = scheduled_time(*anchor, now, state.last_evaluated_at)

        def committed(new_state: PolicyState) -> None:
            self._policies.committed(policy_name, new_state, now, inherited)

        try:
            outcome = evaluate(policy, state, now, self._ports, trigger=trigger, committed=committed, targets=targets)
        except StoreWriteError as unwritable:  # nothing was committed, so nothing was decided or acted on
            self._journal_trouble.failed(policy_name, unwritable, self._clock.now())
            return None
        self._journal_trouble.wrote(self._clock.now())
        self.health.record(outcome.readings)
        self._policies.record_policy_errors(policy_name, outcome.policy_errors)
        return outcome

    def _resume_actions(self) -> None:
        for record in self._dispatcher.resume():
            self.metrics.record_action(*action_labels(record))
            logger.info("resumed action %s -> %s", *action_labels(record))
        # Deferred actions are not resumed: those of a loaded policy wait for its next evaluation (they run only
        # if their condition still holds then); those of a policy no longer loaded end suppressed now.
        self._end_deferred(sorted(self._dispatcher.deferred_policies() - self._policies.names()))

    def _end_deferred(self, policies: Iterable[str]) -> None:
        """The deferred actions of policies no longer loaded end suppressed ("policy removed while deferred")."""
        for name in policies:
            with self._scheduler.policy_lock(name):
                for record in self._dispatcher.retry_deferred(name, None):
                    self.metrics.record_action(*action_labels(record))

    @property
    def skipped_not_leader(self) -> dict[str, int]:
        """Evaluations skipped as a follower, by policy."""
        return self._leadership.skipped_not_leader

    # ----- the operator's calls (controller/loop/operator.py) ---------------------------------------

    def controls(self) -> Controls:
        return self.operator.controls()

    def set_paused(self, policy: str | None, paused: bool, *, by: str, reason: str) -> Control:
        return self.operator.set_paused(policy, paused, by=by, reason=reason)

    def abort_decision(self, decision_id: str, *, by: str, reason: str) -> AbortResult:
        return self.operator.abort_decision(decision_id, by=by, reason=reason)

    def recent_controls(self, limit: int = 50) -> list[dict[str, Any]]:
        return self.operator.recent_controls(limit)

    def recent_decisions(self, limit: int = 100, before: int | None = None) -> list[dict[str, Any]]:
        return self.operator.recent_decisions(limit, before)

    def status(self, decisions: int = 20) -> dict[str, Any]:
        return self.operator.status(decisions)

    def readiness(self) -> Readiness:
        return self.operator.readiness()
