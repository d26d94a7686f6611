"""Every interface between the pure core and the outside world (one port per external capability), and the
data those interfaces carry that is not the core's own.

Each port has real implementations (controller/adapters/, one folder per port), a "not configured" one
(controller/core/unconfigured.py) where the controller runs without it, and a public fake (controller/testing).
The kit's Clock protocol is the one Protocol defined below the core (the kit's HTTP call waits through it); it is
re-exported here. Implementations never raise for
expected failures: they return data (SignalResult with an error, ActionOutcome with status "failed").

The top of the core: it may import the rest of the core and the kit, nothing above.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

import numpy as np

from controller.core.actions import ActionRecord, ActionStatus
from controller.core.attribution import ChangeFeed, Rollout
from controller.core.controls import AbortRequest, AbortResult, Controls
from controller.core.engine import PolicyState
from controller.core.grid import RangeGrid
from controller.core.handover import ActionTimes
from controller.core.incidents import Incident, Ledger
from controller.core.model import Decision, SignalResult, TargetKey
from controller.core.policy import Policy

# The kit's clock protocol (the kit's HTTP call waits through it too), re-exported so every port is found here.
from controller.kit.clock import Clock as Clock  # noqa: PLC0414 - the explicit re-export idiom
from controller.kit.http import HttpAnswer


@dataclass(frozen=True)
class RangeResult:
    """A range query's answer: per target, the samples (timestamp -> value), or an error."""

    series: Mapping[TargetKey, Mapping[float, float]] = field(default_factory=dict)
    error: str | None = None
    policy_error: bool = False  # as SignalResult.policy_error: the source refused the query itself

    def at(self, timestamp: float) -> SignalResult:
        if self.error is not None:
            return SignalResult(values={}, error=self.error, policy_error=self.policy_error)
        return SignalResult(
            {target: samples[timestamp] for target, samples in self.series.items() if timestamp in samples}
        )

    def on_grid(self, times: Sequence[float]) -> RangeGrid:
        """The samples at exactly `times` (one chunk of an evaluation grid) as arrays: `grid.at(i)` is
        `self.at(times[i])`."""
        if self.error is not None:
            return RangeGrid.failed(times, self.error, self.policy_error)
        index = {at: i for i, at in enumerate(times)}
        targets = tuple(self.series)
        present = np.zeros((len(times), len(targets)), dtype=np.bool_)
        values = np.full((len(times), len(targets)), np.nan, dtype=np.float64)
        for k, target in enumerate(targets):
            for at, value in self.series[target].items():
                i = index.get(at)
                if i is not None:
                    present[i, k] = True
                    values[i, k] = value
        return RangeGrid(tuple(times), targets, present, values)


class MetricsSource(Protocol):
    """A PromQL endpoint. One call is one HTTP request; results are grouped by `group_by` labels."""

    def instant(self, query: str, group_by: Sequence[str], at: float | None = None) -> SignalResult: ...

    def range(self, query: str, group_by: Sequence[str], start: float, end: float, step: float) -> RangeResult: ...


@runtime_checkable
class RangeGridSource(Protocol):
    """A MetricsSource that can answer a range query straight onto an evaluation grid, without a dict per sample
    (the backtest's fast path; PrometheusSource). Sources without it are read through range() + on_grid()."""

    def range_grid(self, query: str, group_by: Sequence[str], times: Sequence[float], step: float) -> RangeGrid:
        """One range request over [times[0], times[-1]] at `step`; exactly range(...).on_grid(times)."""
        ...


class OutcomeStatus(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"  # nothing to do (e.g. already at that weight, no earlier good revision)
    # An operator's abort stopped it between steps (AbortSignal); the detail says exactly what it left behind.
    ABORTED = "aborted"
    # The precondition the plan carries (what the decision saw: the running revision, the ReplicaSet) no longer
    # holds right before the write: nothing was written; the decision is not retried.
    WORLD_CHANGED = "world-changed"


@dataclass(frozen=True)
class ActionOutcome:
    status: OutcomeStatus
    detail: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    # Only transient failures (timeouts, 5xx, connection refused) are retried.
    transient: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "detail": dict(self.detail),
            "error": self.error,
            "transient": self.transient,
        }


@runtime_checkable
class WakeableClock(Clock, Protocol):
    """A clock whose wait another thread can end early (the kit's SystemClock and ManualClock are): an operator's
    abort cuts a ramp's hold or a sync poll short instead of waiting it out."""

    def sleep_unless(self, seconds: float, wake: threading.Event) -> bool:
        """Wait `seconds`, or less once `wake` is set: True when woken (at once when already set). Raises
        ShutdownInterrupt like sleep()."""
        ...


class AbortSignal(Protocol):
    """The operator's abort of the action in flight (`tailguard abort DECISION`), as a port that works in steps sees
    it: a traffic ramp asks before each weight step, an Argo CD sync wait at each poll. A port stops only BETWEEN
    steps (a step's write is never cut in half) and answers OutcomeStatus.ABORTED with the state it left."""

    def requested(self) -> AbortRequest | None:
        """The abort, once an operator asked for it; None until then."""
        ...

    def hold(self, seconds: float) -> AbortRequest | None:
        """Wait `seconds` through the clock (a ramp's hold, a poll interval), cut short by an abort: the abort, or
        None after the whole wait. Raises ShutdownInterrupt like the clock's sleep."""
        ...


class RollbackPort(Protocol):
    """Rolls a service back to its last good revision (Argo CD; the local tier)."""

    def plan_rollback(self, service: str, *, rollout_revision: str | None = None) -> Mapping[str, Any] | ActionOutcome:
        """The rollback to make, as JSON the dispatcher journals before acting: at least `service`,
        `from_revision` (what runs now) and `to_revision` (the revision before `rollout_revision`, the one the
        breach is attributed to, None: the current one; never one recorded as bad). An outcome (SKIPPED: nothing
        to roll back to; FAILED, maybe transient: unreadable) when there is none."""
        ...

    def rollback(
        self,
        service: str,
        *,
        idempotency_key: str,
        rollout_revision: str | None = None,
        plan: Mapping[str, Any] | None = None,
        abort: AbortSignal | None = None,
    ) -> ActionOutcome:
        """Make the rollback `plan` describes (None: plan it now). Idempotent against the world: SUCCEEDED without
        acting when the service already runs `to_revision`; WORLD_CHANGED, writing nothing, when it runs neither
        `from_revision` nor `to_revision` (changed by someone else since the plan); never a new target. One that
        waits for the rollback to finish stops waiting on `abort` (ABORTED, saying what was sent)."""
        ...


class ScalePort(Protocol):
    """Reads and sets a service's replica count (the HPA's floor; the local tier)."""

    def replicas(self, service: str) -> int:
        """The current count; raises (an exception with `transient`) when it cannot be read."""
        ...

    def set_replicas(self, service: str, replicas: int, *, idempotency_key: str) -> ActionOutcome: ...

    def scale_state(self, service: str) -> Mapping[str, Any]:
        """Everything a scale may change, as JSON (an HPA: minReplicas, maxReplicas, metric targets; the local
        tier: replicas), plus the current `replicas` for the record. Raises (with `transient`) when unreadable."""
        ...

    def restore_scale(
        self,
        service: str,
        state: Mapping[str, Any],
        *,
        expected: Mapping[str, Any] | None,
        idempotency_key: str,
    ) -> ActionOutcome:
        """Set exactly `state` (a `scale_state` answer; `replicas` of an HPA is not settable and ignored), never
        below the floor the operator set. SKIPPED, writing nothing, when the current state is not `expected`
        (someone else changed it since tailguard did) or already is `state`."""
        ...


class ScaleLimitsPort(Protocol):
    """Sets an HPA's ceiling and metric targets (a `scale` action's `ceiling` and `metricTargets`; the HPA only)."""

    def set_limits(
        self,
        service: str,
        *,
        max_replicas: int | None,
        metric_targets: Mapping[str, float],
        idempotency_key: str,
    ) -> ActionOutcome:
        """Set maxReplicas (never below minReplicas) and the AverageValue target of each named metric, within the
        bounds the operator configured (clamped; a metric with no configured bounds is refused)."""
        ...


class TrafficRouter(Protocol):
    def set_weight(
        self, service: str, version: str, weight: int, *, idempotency_key: str, abort: AbortSignal | None = None
    ) -> ActionOutcome:
        """Set `version`'s share (percent) of `service`'s traffic, then read it back to verify. A ramped router
        stops before its next step on `abort` (ABORTED, with the weights of the last whole step in place)."""
        ...

    def weights(self, service: str) -> Mapping[str, int]:
        """Every version's weight (percent); raises (with `transient`) when the route cannot be read."""
        ...

    def set_weights(
        self,
        service: str,
        weights: Mapping[str, int],
        *,
        expected: Mapping[str, int] | None,
        idempotency_key: str,
        abort: AbortSignal | None = None,
    ) -> ActionOutcome:
        """Set every version's weight at once (ramped where the router ramps, stopping on `abort` like set_weight),
        then verify. SKIPPED, writing
        nothing, when the current weights are not `expected` (changed by someone else) or already `weights`."""
        ...


@dataclass(frozen=True)
class Annotation:
    time: float
    text: str
    tags: Sequence[str]
    time_end: float | None = None
    decision_id: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


class Annotator(Protocol):
    def annotate(self, annotation: Annotation, *, idempotency_key: str) -> ActionOutcome: ...


class Notifier(Protocol):
    def notify(self, receiver: str, payload: Mapping[str, Any], *, idempotency_key: str) -> ActionOutcome: ...


class GrafanaPort(Protocol):
    """The Grafana HTTP API as the annotation adapters need it (controller/adapters/annotations/grafana.py's
    GrafanaHttp): one call, its answer as data; `retry` only for idempotent requests (GET, PATCH)."""

    def call(
        self, method: str, path: str, body: Mapping[str, Any] | None = None, *, retry: bool = False
    ) -> HttpAnswer: ...


# ----- the loop's collaborators ----------------------------------------------------------------------------

TRIGGER_SCHEDULE = "schedule"
TRIGGER_ALERT = "alert"


class RecentDecisions(Protocol):
    def recent_decisions(self, limit: int = 100, before: int | None = None) -> list[dict[str, Any]]:
        """Newest first, at most `limit`; `before`: only decisions older than that `seq` (the next page)."""
        ...


class JournalPort(RecentDecisions, Protocol):
    """What the controller needs of the journal (controller/adapters/stores/journal.py)."""

    def load_state(self, policy: str) -> PolicyState | None: ...

    def commit_evaluation(self, policy: str, state: PolicyState, decisions: Sequence[Decision], now: float) -> None: ...

    def close(self) -> None: ...


class ControlsStorePort(Protocol):
    """Where the operator controls persist (the journal: the set in its meta table, each control as a row)."""

    def load_controls(self) -> Controls: ...

    def record_control(
        self, controls: Controls | None, action: str, subject: str, by: str, reason: str, now: float
    ) -> None: ...

    def recent_controls(self, limit: int = 50) -> list[dict[str, Any]]: ...


class ActionJournalPort(Protocol):
    """What the dispatcher needs of the journal: the actions' rows, their decisions, their transitions."""

    def record_decision(self, decision: Decision, now: float) -> None: ...

    def get_action(self, idempotency_key: str) -> ActionRecord | None: ...

    def pending_actions(self) -> list[ActionRecord]: ...

    def actions_for(self, decision_id: str) -> list[ActionRecord]: ...

    def actions_since(self, resource: str, since: float) -> list[ActionRecord]: ...

    def deferred_actions(self, policy: str | None = None) -> list[ActionRecord]: ...

    def defer(self, idempotency_key: str, now: float, reason: str) -> ActionRecord: ...

    def mark_started(self, idempotency_key: str, now: float, plan: Mapping[str, Any] | None = None) -> ActionRecord: ...

    def set_plan(self, idempotency_key: str, plan: Mapping[str, Any], now: float) -> ActionRecord:
        """The plan of a planned or deferred action, made from the world its decision saw (its precondition and
        deadline in it), journaled before it is queued."""
        ...

    def record_event(self, idempotency_key: str, now: float, event: str, detail: str | None) -> None:
        """One `action_events` row (e.g. each failed attempt of a retried action)."""
        ...

    def load_state(self, policy: str) -> PolicyState | None:
        """The engine state the latest evaluation of `policy` committed (whether an action's condition holds)."""
        ...

    def finish(
        self,
        idempotency_key: str,
        status: ActionStatus,
        now: float,
        *,
        result: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> ActionRecord: ...

    def decision(self, decision_id: str, kind: str) -> dict[str, Any] | None: ...

    def abort_actions(self, request: AbortRequest, now: float) -> list[ActionRecord]:
        """One transaction: the decision's planned and deferred actions end `aborted` (they never run), its started
        ones get an `abort_requested` event (the next step, or the next process, ends them); every action of the
        decision is returned as it is after."""
        ...

    def abort_requested(self, idempotency_key: str) -> AbortRequest | None:
        """The abort journaled for a started action (its `abort_requested` event), or None."""
        ...


class IncidentStorePort(Protocol):
    """Where incidents live (controller/core/incidents.py): the journal's SQLite locally, `TailguardIncident`
    resources in a cluster. Every write is a compare-and-set on the version read."""

    def current(self, scope_key: str) -> tuple[Incident, Ledger] | None:
        """The open incident of the scope (at most one) and the ledger stored with it, or None."""
        ...

    def ledger(self, service: str) -> Ledger:
        """The service's revision ledger as its latest incident left it (an empty one when it has none)."""
        ...

    def latest(self, service: str, *, open_only: bool) -> Incident | None:
        """The service's newest incident (with `open_only`: its newest open one), or None."""
        ...

    def save(self, incident: Incident, ledger: Ledger) -> Incident:
        """Write the incident and the service's ledger with it, only if the stored incident still has
        `incident.version` ("" = create it). Returns it with its new version; IncidentConflict otherwise."""
        ...

    def incidents(self, *, open_only: bool = True, limit: int = 50) -> list[Incident]:
        """Newest first."""
        ...


class DispatcherPort(Protocol):
    """What the controller needs of controller.loop.dispatcher.Dispatcher (and of wrappers around it)."""

    def dispatch(self, decision: Decision) -> Sequence[Any]: ...

    def resume(self) -> Sequence[Any]: ...

    def retry_deferred(self, policy: str, state: PolicyState | None) -> Sequence[Any]:
        """After an evaluation of `policy` committed `state` (None: the policy is gone): run each of its deferred
        actions again (same key) whose condition still holds; end the others suppressed, with why."""
        ...

    def deferred_policies(self) -> set[str]:
        """The policies that have deferred actions in the journal."""
        ...


@runtime_checkable
class DecisionAborterPort(Protocol):
    """Optional next to DispatcherPort: the abort of one decision's actions (controller/loop/dispatcher.py)."""

    def abort(self, request: AbortRequest) -> AbortResult:
        """Stop the decision's actions: the queued and deferred never run; the one running stops at its next step."""
        ...


class ActionWorkersPort(Protocol):
    """The dispatcher's background workers (controller/loop/workers.py), as the controller waits for and stops them."""

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no action is queued or running; False on timeout."""
        ...

    def close(self, timeout: float = 30.0) -> bool:
        """Take no more actions; queued ones stay in the journal (resumed later); wait for the running ones."""
        ...


class DecisionSink(Protocol):
    """Gets every decision as it leaves the process (the Grafana region of an incident)."""

    def annotate_decision(self, decision: Mapping[str, Any]) -> ActionOutcome: ...


class RolloutAnnotatorPort(Protocol):
    def annotate_rollout(self, rollout: Rollout) -> Any: ...


class ChangeSource(Protocol):
    """One system that knows rollouts (Argo CD history, Deployments, the local tier)."""

    name: str

    def rollouts(self, since: float) -> list[Rollout]:
        """Rollouts at or after `since` (epoch seconds), any order. Raises ChangeSourceError when unreadable."""
        ...


class TierReader(Protocol):
    """The local tier's read side, as the tier's change source needs it."""

    def services(self) -> list[dict[str, Any]]: ...

    def revisions(self, service: str) -> list[dict[str, Any]]: ...


class ChangeTrackerPort(Protocol):
    """What the controller needs of controller.adapters.changes.tracker.ChangeTracker."""

    def rollouts(self, since: float) -> ChangeFeed: ...


class PredictionPort(Protocol):
    """What the controller needs of predictors.serving.PredictionProvider (the SLA model's signals)."""

    def predict(self, source: MetricsSource, policy: Policy, at: float | None = None) -> Mapping[str, SignalResult]: ...

    def warnings(self) -> list[str]: ...


class HistoricalPredictionPort(Protocol):
    """What the backtest needs of predictors.history.HistoricalPredictions (the SLA model over history)."""

    def predict_range(
        self, source: MetricsSource, policy: Policy, times: Sequence[float], step: float
    ) -> tuple[dict[str, RangeResult], list[str]]:
        """Every prediction signal of `policy` at every time of `times`, and why any is no-data."""
        ...


class HandoverPort(Protocol):
    """What the leader elector needs of the controller (controller/loop/runtime.py implements it)."""

    def handover_snapshot(self) -> ActionTimes: ...

    def inherit_handover(self, times: ActionTimes) -> None: ...


class LoopJournalPort(JournalPort, ActionJournalPort, Protocol):
    """The journal an embedded loop writes (controller/loop/embedding.py): the evaluation's side (states, decisions)
    and the dispatcher's (actions, their events); the adapters' SQLite `Journal` is both."""


class AdoptingJournalPort(ActionJournalPort, Protocol):
    """What adoption (controller/loop/adoption.py) needs of the journal besides the dispatcher's needs."""

    def adopt(self, action: Mapping[str, Any], decision: Mapping[str, Any], now: float) -> bool:
        """The previous leader's unfinished action and its decision, journaled `planned` (False: already here)."""
        ...

    @property
    def closed(self) -> bool: ...


class PendingHandoverPort(Protocol):
    """What the leader elector hands over besides the action times: the leader's unfinished mutating actions (with
    their plans and deadlines), published in the Lease (`tailguard.io/pending-actions`) and adopted by whoever
    acquires it (controller/loop/adoption.py): a successor continues them instead of counting them as done."""

    def pending_snapshot(self) -> list[dict[str, Any]]: ...

    def adopt_pending(self, entries: Sequence[Mapping[str, Any]]) -> int: ...


@runtime_checkable
class ControlsHandoverPort(Protocol):
    """Optional next to HandoverPort: the operator controls (pauses, the kill switch) the Lease carries from one
    leader to the next (annotation `tailguard.io/controls`, controller/core/controls.py)."""

    def controls_snapshot(self) -> Controls: ...

    def inherit_controls(self, controls: Controls) -> None: ...


class LeaderPort(Protocol):
    """What the controller needs of controller.adapters.lease.leader.LeaderElector: only the leader evaluates and
    acts, and the Lease carries its mutating-action times to the next leader (controller/core/handover.py)."""

    def is_leader(self) -> bool: ...

    def attach_handover(self, handover: HandoverPort) -> None: ...

    def publish(self) -> bool: ...


@runtime_checkable
class LeaderDirectoryPort(Protocol):
    """Optional next to LeaderPort: who this replica is and where the leader's API answers, so a standby can give
    the leader's answer to a read, a control or an alert (controller/app/forwarding.py). The elector implements it
    from the Lease annotation `tailguard.io/api-url`."""

    identity: str

    def leader_endpoint(self) -> tuple[str, str] | None:
        """(the Lease holder's identity, the API URL it published), read together; None when another replica
        does not hold an unexpired Lease or published no URL."""
        ...


@runtime_checkable
class PeerCheckPort(Protocol):
    """Whether `url` may receive what a standby forwards to the Lease holder `identity`: its host must be the IP of
    the pod of that name, a pod of this controller's own Deployment, and its port the API's
    (controller/adapters/lease/peers.py). None: yes; else why not (a sentence for the log and the 503)."""

    def check(self, identity: str, url: str) -> str | None: ...


@runtime_checkable
class ShardedLeaderPort(LeaderPort, Protocol):
    """A LeaderPort whose leadership is per policy: the policies are split into shards, each owned through its
    own Lease (controller/adapters/lease/shards.py, controller/core/sharding.py). `is_leader()` is whether this
    replica holds any shard; a policy is evaluated and acted on only while `leads(policy)`, and `publish_for`
    renews only that policy's shard Lease (never taking a shard this replica does not hold)."""

    def leads(self, policy: str) -> bool: ...

    def publish_for(self, policy: str) -> bool: ...

    def shard_leadership(self) -> dict[int, bool]:
        """Each shard's index -> whether this replica holds its Lease now (tailguard_shard_leader)."""
        ...


# ----- what the HTTP API needs of the controller -----------------------------------------------------------


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reasons: tuple[str, ...]
    reload_errors: tuple[str, ...]
    policies: Mapping[str, float | None] = field(default_factory=dict)
    # Listed on /readyz without making the controller unready (e.g. an unusable prediction model).
    warnings: tuple[str, ...] = ()
    # Policy errors found at run time (a signal query Prometheus refuses as bad data): "policy P: signal S: ...".
    # Listed without making the controller unready, like a rejected reload: every other policy still works.
    policy_errors: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "reasons": list(self.reasons),
            "reload_errors": list(self.reload_errors),
            "policy_errors": list(self.policy_errors),
            "warnings": list(self.warnings),
            "policies": {name: {"last_evaluation": at} for name, at in sorted(self.policies.items())},
        }


class MetricsExposition(Protocol):
    def exposition(self) -> bytes: ...


class ControllerPort(Protocol):
    """What the API needs of controller.loop.runtime.Controller."""

    @property
    def metrics(self) -> MetricsExposition: ...

    def policies(self) -> dict[str, Policy]: ...

    def readiness(self) -> Readiness: ...

    def trigger(
        self,
        policy_names: Sequence[str],
        trigger: str = TRIGGER_ALERT,
        *,
        targets: Mapping[str, Collection[TargetKey]] | None = None,
    ) -> list[str]:
        """Queue evaluations of `policy_names`; `targets`: per policy, the only targets it may touch (an alert's)."""
        ...

    def recent_decisions(self, limit: int = 100, before: int | None = None) -> list[dict[str, Any]]: ...


@runtime_checkable
class OperatorPort(Protocol):
    """What the operator endpoints (status, pause/resume, the kill switch) need of the controller."""

    def status(self, decisions: int = 20) -> dict[str, Any]: ...

    def set_paused(self, policy: str | None, paused: bool, *, by: str, reason: str) -> Any: ...


@runtime_checkable
class AbortControlPort(Protocol):
    """What `POST /api/v1/decisions/ID/abort` needs of the controller: the abort, journaled as a control."""

    def abort_decision(self, decision_id: str, *, by: str, reason: str) -> AbortResult: ...
