"""What an operator sees and does: the controls (pause/resume, the kill switch), the abort of a decision's
actions, the status document and readiness (/readyz).

Controls (controller/core/controls.py) are persisted by the store (the journal's meta table) and carried in the
Lease by the leader elector (`controls_snapshot` / `inherit_controls`); an evaluation runs a paused policy
suspended (`controls()`, read by controller/loop/runtime.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tailguard.controller.core.controls import ABORT, ALL, AbortRequest, AbortResult, AbortState, Control, Controls
from tailguard.controller.core.incidents import Incident
from tailguard.controller.core.ports import (
    Clock,
    DispatcherPort,
    JournalPort,
    PredictionPort,
)
from tailguard.controller.core.source_health import SourceStatus
from tailguard.controller.core.status_view import status_document
from tailguard.controller.loop.health import SourceHealthTracker
from tailguard.controller.loop.leadership import Leadership
from tailguard.controller.loop.policy_set import PolicySet
from tailguard.controller.loop.ports import ControlsStorePort, DecisionAborterPort, Readiness

logger = logging.getLogger("tailguard.controller")

# A policy is "stale" for /readyz when it has not been evaluated for this many of its intervals.
READY_INTERVALS = 3


class Lifecycle:
    """Started, stopped, journal open: set by the controller, read by readiness and the journal's readers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = False
        self.stopped = False
        self.journal_open = True

    @property
    def running(self) -> bool:
        return self.started and not self.stopped

    def reasons(self) -> list[str]:
        """Why the controller is not ready, as far as its lifecycle goes."""
        with self.lock:
            return [
                reason
                for reason, applies in (
                    ("controller not started", not self.started),
                    ("controller stopped", self.stopped),
                    ("journal closed", not self.journal_open),
                )
                if applies
            ]


@dataclass(frozen=True)
class OperatorView:
    """What the operator facade reads of the rest of the controller."""

    policies: PolicySet
    lifecycle: Lifecycle
    leadership: Leadership
    health: SourceHealthTracker
    predictions: PredictionPort
    journal: JournalPort  # its read side: the recent decisions
    # The open incidents for the status (controller/loop/incidents.py IncidentKeeper; None: not shown).
    open_incidents: Callable[[], Sequence[Incident]] | None = None


class Operator:
    """Controls, abort, status and readiness of one replica."""

    def __init__(
        self,
        view: OperatorView,
        dispatcher: DispatcherPort,
        clock: Clock,
        controls_store: ControlsStorePort | None = None,
    ) -> None:
        self._view = view
        self._dispatcher = dispatcher  # the abort
        self._clock = clock
        # Operator controls (pause/resume, the kill switch): persisted by the store (the journal's meta table).
        self._controls_store = controls_store
        self._lock = threading.Lock()
        self._controls = controls_store.load_controls() if controls_store is not None else Controls()

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

    # ----- what the journal says -------------------------------------------------------------------

    def recent_controls(self, limit: int = 50) -> list[dict[str, Any]]:
        with self._view.lifecycle.lock:
            if not self._view.lifecycle.journal_open or self._controls_store is None:
                return []
        return self._controls_store.recent_controls(limit)

    def recent_decisions(self, limit: int = 100, before: int | None = None) -> list[dict[str, Any]]:
        """The journal's read side (its own connection: a reader never holds the lock an evaluation commits
        under)."""
        with self._view.lifecycle.lock:
            if not self._view.lifecycle.journal_open:
                return []
        return self._view.journal.recent_decisions(limit, before)

    # ----- status ----------------------------------------------------------------------------------

    def status(self, decisions: int = 20) -> dict[str, Any]:
        """The status document (controller/core/status_view.py) of this replica."""
        return status_document(
            self._view.policies.policies(),
            self._view.policies.states(),
            self.controls(),
            self._clock.now(),
            decisions=self.recent_decisions(decisions),
            recent_controls=self.recent_controls(20),
            health=self._view.health.snapshot(),
            incidents=self._incidents_shown(),
        )

    def _incidents_shown(self) -> Sequence[Incident]:
        if self._view.open_incidents is None:
            return ()
        try:
            return self._view.open_incidents()
        except Exception:  # an unreachable incident store must not take the status down with it
            logger.exception("the open incidents could not be read for the status")
            return ()

    def readiness(self) -> Readiness:
        now = self._clock.now()
        view = self._view
        reasons = view.lifecycle.reasons()
        policies = view.policies.readiness_view()
        if view.lifecycle.started and not policies.intervals:
            reasons.append("no policies loaded")
        # A follower skips evaluations on purpose: not being the leader is not being unready.
        following = view.leadership.following()
        sharded_elsewhere = 0
        late: list[str] = []
        for name, interval in policies.intervals.items():
            if following:
                continue
            if not view.leadership.leads(name):  # another replica holds this policy's shard
                sharded_elsewhere += 1
                continue
            limit = READY_INTERVALS * interval
            at = policies.last_evaluation[name]
            # Late evaluations are a warning, not unreadiness: they come from a slow or hung dependency (a
            # Prometheus that hangs holds each query for its timeout), and readiness means "serves its API"
            # (the pause, the status page and the webhook still work; restarting or cutting the pod off fixes
            # nothing). The status page's health and the TailguardBlind alert say it instead.
            if at is None:
                late.append(f"policy {name}: not evaluated yet")
            elif now - at > limit:
                late.append(f"policy {name}: last evaluation {now - at:.0f}s ago (limit {limit:.0f}s)")
        # A rejected reload is reported but does not make the controller unready: the last good set still runs.
        # Likewise an unusable prediction model: its conditions are no-data (they hold, never act) while every
        # other policy keeps working; an unready controller would be restarted or cut off, which fixes no model
        # file and stops the policies that do work.
        warnings = (
            *view.predictions.warnings(),
            *(h.summary() for h in view.health.snapshot().values() if h.status is not SourceStatus.UP),
            *late,
        )
        if following:
            warnings = (*warnings, "follower: another replica holds the leader lease; evaluations are skipped")
        elif sharded_elsewhere:
            warnings = (*warnings, f"sharded: {sharded_elsewhere} policies belong to shards other replicas hold")
        return Readiness(
            not reasons,
            tuple(reasons),
            policies.reload_errors,
            policies.last_evaluation,
            warnings,
            policies.policy_errors,
        )
