"""The incident layer at the ports: how the incident reconciler (controller/loop/incidents.py) meets the loop
without the dispatcher or the controller class holding incident logic.

* `IncidentDispatcher` wraps the DispatcherPort: every decision opens or joins its scope's incident (a fire) or
  recovers a policy of it (a resolve) before its actions run; after each evaluation (`retry_deferred`, called with
  the state just committed) the open incidents of that policy are verified, and an escalation step that is due is
  dispatched as its own decision (journaled, annotated, notified, idempotent by its id);
* `IncidentRollback` wraps the RollbackPort: a rollback the incident refuses (a second one, one onto a known-bad
  revision, one past the last known good) is SKIPPED with the reason, writing nothing; one it admits is counted
  in the incident before the port is called, and its outcome marks the revision it left bad;
* `IncidentScale` and `IncidentRouter` wrap the ScalePort and the TrafficRouter: a scale or a shift is counted in
  its incident (and verified); a restore skipped because the object changed says so in the incident;
* `IncidentChanges` wraps the change tracker: a rollout an incident rolled back is no longer a cause;
* `incident_layer` wires them around the ports (controller/app/build.py, and the backtest the same way).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tailguard.controller.core import incidents as model
from tailguard.controller.core.attribution import ChangeFeed
from tailguard.controller.core.controls import AbortRequest, AbortResult, AbortState
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.model import Decision
from tailguard.controller.core.ports import (
    AbortSignal,
    ActionOutcome,
    ChangeTrackerPort,
    DispatcherPort,
    OutcomeStatus,
    RollbackPlan,
    RollbackPort,
    RollbackRequest,
    ScalePort,
    ScaleRequest,
    ScaleState,
    TrafficRequest,
    TrafficRouter,
)
from tailguard.controller.loop.dispatcher import Actuators
from tailguard.controller.loop.incidents import IncidentKeeper
from tailguard.controller.loop.ports import DecisionAborterPort

log = logging.getLogger(__name__)


class IncidentDispatcher:
    """DispatcherPort: every decision reaches its incident first; after each evaluation, escalations due
    (`on_escalation` hears each step's decision: the backtest reports them as the live loop journals them)."""

    def __init__(
        self,
        inner: DispatcherPort,
        keeper: IncidentKeeper,
        on_escalation: Callable[[Decision], None] | None = None,
    ) -> None:
        self.inner = inner
        self.keeper = keeper
        self.on_escalation = on_escalation

    def dispatch(self, decision: Decision) -> Sequence[Any]:
        try:
            self.keeper.on_decision(decision)
        except Exception:  # an unreachable store must not stop the actions the journal already holds
            log.exception("decision %s: its incident could not be updated", decision.id)
        return self.inner.dispatch(decision)

    def resume(self) -> Sequence[Any]:
        return self.inner.resume()

    def retry_deferred(self, policy: str, state: PolicyState | None) -> Sequence[Any]:
        records = list(self.inner.retry_deferred(policy, state))
        try:
            due = self.keeper.reconcile(policy, state)
        except Exception:
            log.exception("incidents of %s: not reconciled this evaluation", policy)
            due = []
        for decision in due:
            if self.on_escalation is not None:
                self.on_escalation(decision)
            records.extend(self.inner.dispatch(decision))
        return records

    def deferred_policies(self) -> set[str]:
        return self.inner.deferred_policies()

    def abort(self, request: AbortRequest) -> AbortResult:
        """The wrapped dispatcher's abort (spelled out: a runtime-checkable Protocol does not see `__getattr__`)."""
        if not isinstance(self.inner, DecisionAborterPort):
            return AbortResult(request.decision_id, AbortState.UNKNOWN, "this dispatcher cannot abort actions")
        return self.inner.abort(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # wait_idle, close: the wrapped dispatcher's


class IncidentRollback:
    """RollbackPort: a rollback only as its incident allows it (controller/core/incidents.py, rollback_refusal)."""

    def __init__(self, inner: RollbackPort, keeper: IncidentKeeper) -> None:
        self.inner = inner
        self.keeper = keeper

    def plan_rollback(self, service: str, *, rollout_revision: str | None = None) -> RollbackPlan | ActionOutcome:
        planned = self.inner.plan_rollback(service, rollout_revision=rollout_revision)
        if isinstance(planned, ActionOutcome):
            return planned
        refusal = self.keeper.rollback_refusal(service, planned.to_json())
        if refusal is not None:
            return _refused(planned.to_json(), refusal)
        return planned

    def rollback(self, request: RollbackRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        service, idempotency_key = request.service, request.idempotency_key
        plan = request.plan
        if plan is None:
            planned = self.plan_rollback(service, rollout_revision=request.rollout_revision)
            if isinstance(planned, ActionOutcome):
                return planned
            plan = planned
        refusal = self.keeper.rollback_starting(service, plan.to_json(), idempotency_key)
        if refusal is not None:
            return _refused(plan.to_json(), refusal)
        outcome = self.inner.rollback(replace(request, plan=plan), abort)
        try:
            self.keeper.action_ended(service, idempotency_key, "rollback", plan.to_json(), outcome)
        except Exception:
            log.exception("rollback %s: its incident could not be updated", idempotency_key)
        return outcome

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _refused(plan: Mapping[str, Any], reason: str) -> ActionOutcome:
    log.warning("rollback refused by its incident: %s", reason)
    return ActionOutcome(OutcomeStatus.SKIPPED, {**dict(plan), "reason": reason, "refused_by": "incident"})


class IncidentScale:
    """ScalePort: a change counted in its incident; a restore skipped because a human changed the object said
    so in the incident (with what it found)."""

    def __init__(self, inner: ScalePort, keeper: IncidentKeeper) -> None:
        self.inner = inner
        self.keeper = keeper

    def restore_scale(
        self, service: str, state: ScaleState, *, expected: ScaleState | None, idempotency_key: str
    ) -> ActionOutcome:
        outcome = self.inner.restore_scale(service, state, expected=expected, idempotency_key=idempotency_key)
        _note_skipped_restore(self.keeper, service, outcome, idempotency_key)
        return outcome

    def set_replicas(self, request: ScaleRequest) -> ActionOutcome:
        service, replicas, idempotency_key = request.service, request.replicas, request.idempotency_key
        outcome = self.inner.set_replicas(request)
        try:
            self.keeper.action_ended(service, idempotency_key, "scale", {"replicas": replicas}, outcome)
        except Exception:
            log.exception("scale %s: its incident could not be updated", idempotency_key)
        return outcome

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _note_skipped_restore(keeper: IncidentKeeper, service: str, outcome: ActionOutcome, idempotency_key: str) -> None:
    """A restore skipped because someone changed the object since tailguard did: said in the incident, with what
    was found there (a failure to write it is logged, never the action's)."""
    if outcome.status is not OutcomeStatus.SKIPPED:
        return
    found = restore_skip_text(service, outcome)
    if found is not None:
        try:
            keeper.note(service, found)
        except Exception:
            log.exception("restore %s: its incident could not be updated", idempotency_key)


class IncidentRouter:
    """TrafficRouter: a shift counted in its incident (verified like a rollback); a restore of the weights skipped
    because someone changed the route said so in the incident (with what it found)."""

    def __init__(self, inner: TrafficRouter, keeper: IncidentKeeper) -> None:
        self.inner = inner
        self.keeper = keeper

    def set_weight(self, request: TrafficRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        service, version, weight = request.service, request.version, request.weight
        idempotency_key = request.idempotency_key
        outcome = self.inner.set_weight(request, abort)
        try:
            plan = {"version": version, "weight": weight}
            self.keeper.action_ended(service, idempotency_key, "shift_traffic", plan, outcome)
        except Exception:
            log.exception("shift %s: its incident could not be updated", idempotency_key)
        return outcome

    def set_weights(
        self,
        service: str,
        weights: Mapping[str, int],
        *,
        expected: Mapping[str, int] | None,
        idempotency_key: str,
        abort: AbortSignal | None = None,
    ) -> ActionOutcome:
        outcome = self.inner.set_weights(
            service, weights, expected=expected, idempotency_key=idempotency_key, abort=abort
        )
        _note_skipped_restore(self.keeper, service, outcome, idempotency_key)
        return outcome

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # weights: the wrapped router's


def restore_skip_text(service: str, outcome: ActionOutcome) -> str | None:
    """`restore of chat skipped: changed by someone else (found minReplicas 5, maxReplicas 20; tailguard left
    minReplicas 5, maxReplicas 10)`, or None when the skip was not a human's change."""
    detail = outcome.detail
    reason = str(detail.get("reason") or "")
    if "someone else" not in reason and "changed" not in reason:
        return None
    found = detail.get("found") or detail.get("from")
    parts = [f"restore of {service} skipped: {reason}"]
    if isinstance(found, Mapping) and "found" not in reason:
        parts.append(f"found {_fields(found)}")
    return "; ".join(parts)


def _fields(state: Mapping[str, Any]) -> str:
    return ", ".join(f"{name} {value}" for name, value in sorted(state.items()) if not isinstance(value, Mapping))


class IncidentChanges:
    """ChangeTrackerPort: the rollouts an incident rolled back are no longer causes (a later load incident on the
    service scales instead of "rolling back" a rollout already undone)."""

    def __init__(self, inner: ChangeTrackerPort, keeper: IncidentKeeper) -> None:
        self.inner = inner
        self.keeper = keeper

    def rollouts(self, since: float) -> ChangeFeed:
        feed = self.inner.rollouts(since)
        kept = []
        ledgers: dict[str, frozenset[str]] = {}  # one read per service and call
        for rollout in feed.rollouts:
            service = rollout.labels.get("service")
            if service is not None and service not in ledgers:
                ledgers[service] = self.keeper.undone(service)
            undone = ledgers.get(service or "", frozenset())
            if any(model.same_revision(rollout.revision, revision) for revision in undone):
                continue
            kept.append(rollout)
        return ChangeFeed(tuple(kept), feed.errors)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)



# ----- the layer, as the composition root (and the backtest) wires it ---------------------------------------------


@dataclass(frozen=True)
class IncidentLayer:
    """The ports as the controller gets them: rollbacks and scales through their incident, the change feed without
    the rollouts an incident undid, and `dispatcher(inner)` wrapping the dispatcher."""

    keeper: IncidentKeeper
    actuators: Actuators
    change_tracker: ChangeTrackerPort | None
    on_escalation: Callable[[Decision], None] | None = None

    def dispatcher(self, inner: DispatcherPort) -> IncidentDispatcher:
        return IncidentDispatcher(inner, self.keeper, self.on_escalation)


def incident_layer(
    keeper: IncidentKeeper,
    actuators: Actuators,
    change_tracker: ChangeTrackerPort | None,
    on_escalation: Callable[[Decision], None] | None = None,
) -> IncidentLayer:
    wrapped = replace(
        actuators,
        rollback=IncidentRollback(actuators.rollback, keeper),
        scale=IncidentScale(actuators.scale, keeper),
        router=IncidentRouter(actuators.router, keeper),
    )
    tracker = IncidentChanges(change_tracker, keeper) if change_tracker is not None else None
    return IncidentLayer(keeper, wrapped, tracker, on_escalation)
