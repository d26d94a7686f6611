"""The breach engine: a pure transition function.

    transition(policy, observations, state, now) -> (state, decisions)

No clock, no I/O: the live controller, the backtest and the tests all drive
the same function, so a backtest shows exactly what the controller would do.

Per (condition, target) the engine keeps a small state machine:

    ok --breach--> pending --`for` satisfied--> firing --recovery `for` satisfied--> ok
         pending --ok--> ok (streak broken)

* `for: N` (count form) is satisfied by N breaching observations spanning at
  least (N-1) x the policy's `interval`: now - onset >= (N-1) x interval, onset
  being the streak's first breaching observation (times compared to the
  millisecond). Scheduled evaluations, one interval apart, fire at the N-th
  breach exactly; observations of triggered evaluations in between count but
  never shorten the span. The same rule holds for a recovery's `for: N`.
* `transition(..., targets=...)` limits an evaluation to the targets an alert
  names: every other target's state is untouched.
* no-data is mapped by the condition's `noData` policy: `breach`, `ok`, or
  `hold` (the streak neither advances nor resets). Held state older than
  `staleAfter` is dropped: stale data never completes a breach, and absence of
  data never resolves a firing condition.
* source errors never count as breaches and never resolve anything; after
  `maxSourceErrors` in a row the condition reports `errored` once and its
  pending streak is dropped (the evidence is no longer continuous).
* a suspended policy (`suspend: true`; the runtime also sets it for a paused policy) decides no new
  mutating action: the breach is reported once as `suppressed` with reason "suspended", and fires once
  resumed if it still holds.
* cooldown and the per-target action budget gate every decision that carries
  a mutating action (rollback, scale, shift_traffic, restore); a gated decision is
  reported once as `suppressed` and fires when the limits allow, if the breach
  still holds.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from math import isnan
from typing import Any

from tailguard.controller.core.actions import MUTATING_ACTIONS, ActionRequest, ActionType
from tailguard.controller.core.attribution import (
    AttributedDecision,
    Attribution,
    BranchChoice,
    Rollout,
    attribute,
    choose_branch,
    no_branch_choice,
    text_variables,
)
from tailguard.controller.core.limits import cooling, kept, over_budget, retention
from tailguard.controller.core.model import (
    Decision,
    DecisionKind,
    ObservationKind,
    SignalResult,
    TargetKey,
    classify,
    decision_id,
    format_target,
    target_labels,
)
from tailguard.controller.core.policy import Comparison, Condition, NoDataPolicy, Policy
from tailguard.controller.kit.templating import render_text

EVIDENCE_POINTS = 20
SUSPENDED_REASON = "suspended"  # the reason of a breach suppressed because its policy is suspended or paused


class Phase(StrEnum):
    OK = "ok"
    PENDING = "pending"
    FIRING = "firing"


@dataclass(frozen=True)
class ConditionState:
    phase: Phase = Phase.OK
    breach_count: int = 0
    onset: float | None = None
    last_data_at: float | None = None
    last_value: float | None = None
    stale: bool = False
    error_count: int = 0
    errors_since: float | None = None
    errored: bool = False
    evidence: tuple[tuple[float, float], ...] = ()
    decision_id: str | None = None
    fired_at: float | None = None
    recover_count: int = 0
    recover_since: float | None = None
    suppression_reported: bool = False

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["phase"] = self.phase.value
        data["evidence"] = [list(point) for point in self.evidence]
        return data

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> ConditionState:
        values = dict(data)
        values["phase"] = Phase(values["phase"])
        values["evidence"] = tuple((float(t), float(v)) for t, v in values.get("evidence", []))
        return ConditionState(**values)


StateKey = tuple[str, TargetKey]


@dataclass(frozen=True)
class PolicyState:
    conditions: Mapping[StateKey, ConditionState] = field(default_factory=dict)
    # When mutating actions were decided, per target: the input of cooldown and budget.
    actions_at: Mapping[TargetKey, tuple[float, ...]] = field(default_factory=dict)
    evaluations: int = 0
    last_evaluated_at: float | None = None

    def condition(self, name: str, target: TargetKey) -> ConditionState:
        return self.conditions.get((name, target), ConditionState())

    def to_json(self) -> dict[str, Any]:
        return {
            "conditions": [
                {"condition": name, "target": [list(pair) for pair in target], "state": state.to_json()}
                for (name, target), state in sorted(self.conditions.items())
            ],
            "actions_at": [
                {"target": [list(pair) for pair in target], "times": list(times)}
                for target, times in sorted(self.actions_at.items())
            ],
            "evaluations": self.evaluations,
            "last_evaluated_at": self.last_evaluated_at,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> PolicyState:
        def key(raw: list[list[str]]) -> TargetKey:
            return tuple((str(name), str(value)) for name, value in raw)

        return PolicyState(
            conditions={
                (entry["condition"], key(entry["target"])): ConditionState.from_json(entry["state"])
                for entry in data.get("conditions", [])
            },
            actions_at={key(entry["target"]): tuple(entry["times"]) for entry in data.get("actions_at", [])},
            evaluations=int(data.get("evaluations", 0)),
            last_evaluated_at=data.get("last_evaluated_at"),
        )


def _format_value(value: float | None) -> str:
    if value is None:
        return "no-data"
    return f"{value:.4g}"


def render_actions(
    policy: Policy,
    condition: Condition,
    actions: list[Any],
    target: TargetKey,
    *,
    kind: DecisionKind,
    incident: str,
    value: float | None,
    threshold: float,
    onset: float,
    extra_variables: Mapping[str, str] | None = None,
) -> tuple[ActionRequest, ...]:
    variables = {
        **(extra_variables or {}),
        **policy.targets.match,
        **policy.vars,
        **target_labels(target),
        "value": _format_value(value),
        "threshold": _format_value(threshold),
        "policy": policy.name,
        "condition": condition.name,
        "target": format_target(target),
        "onset": f"{onset:.3f}",
        "decision_id": incident,
    }
    rendered: list[ActionRequest] = []
    for index, action in enumerate(actions):
        params: dict[str, Any] = {}
        omitted: frozenset[str] = getattr(type(action), "OMITTED_WHEN_NONE", frozenset())
        for name, raw in action:
            if name == "type" or (raw is None and name in omitted):
                continue
            if isinstance(raw, str):
                params[name] = render_text(raw, variables)
            elif isinstance(raw, list):
                params[name] = [render_text(item, variables) if isinstance(item, str) else item for item in raw]
            else:
                params[name] = raw
        if action.type == ActionType.SCALE:
            params["observed"] = value
        attributed_revision = (extra_variables or {}).get("rollout_revision", "none")
        if action.type == ActionType.ROLLBACK and attributed_revision != "none":
            # The revision the breach is attributed to: the deployer rolls back to the one before it.
            params["rollout_revision"] = attributed_revision
        rendered.append(ActionRequest.of(ActionType(action.type), params, f"{incident}:{kind.value}:{index}"))
    return tuple(rendered)


def action_retention(policy: Policy) -> float:
    """How long action times must be kept: the budget window, or the cooldown when it is longer."""
    return retention(policy.limits.cooldown)


def with_action_times(state: PolicyState, times: Mapping[TargetKey, Sequence[float]]) -> PolicyState:
    """`state` with more mutating-action times (another leader's, handed over): the union per target. The next
    transition prunes them like its own, so cooldown and budget count both leaders' actions."""
    actions_at = dict(state.actions_at)
    for target, stamps in times.items():
        actions_at[target] = union_times(actions_at.get(target, ()), stamps)
    return replace(state, actions_at=actions_at)


def union_times(a: Sequence[float], b: Sequence[float]) -> tuple[float, ...]:
    """Sorted union of two lists of action times. Handed-over times travel as JSON at millisecond precision, so
    they are compared at that precision: the same action counts once in a budget, whichever way it came."""
    seen: dict[float, float] = {}
    for stamp in (*a, *b):
        seen.setdefault(round(stamp, 3), stamp)
    return tuple(sorted(seen.values()))


def _limits_block(policy: Policy, state: PolicyState, target: TargetKey, now: float) -> str | None:
    all_times = state.actions_at.get(target, ())
    cooldown = cooling(all_times, now, policy.limits.cooldown)
    if cooldown is not None:
        return f"cooldown: last mutating action {cooldown.since:.0f}s ago, {cooldown.left:.0f}s left"
    used = over_budget(all_times, now, policy.limits.maxActionsPerHour)
    if used is not None:
        return f"budget: {used} mutating actions in the last hour (max {policy.limits.maxActionsPerHour})"
    return None


def _with_evidence(state: ConditionState, now: float, value: float | None) -> tuple[tuple[float, float], ...]:
    if value is None:
        return state.evidence
    return (*state.evidence, (now, value))[-EVIDENCE_POINTS:]


class _Step:
    """Accumulates the new state and decisions of one evaluation."""

    def __init__(
        self,
        policy: Policy,
        state: PolicyState,
        now: float,
        observations: Mapping[str, SignalResult] | None = None,
        rollouts: Sequence[Rollout] = (),
        rollouts_error: str | None = None,
    ):
        self.policy = policy
        self.now = now
        self.observations: Mapping[str, SignalResult] = observations or {}
        self.rollouts = rollouts
        self.rollouts_error = rollouts_error
        self.conditions: dict[StateKey, ConditionState] = dict(state.conditions)
        # Pruned to the budget window, or to the cooldown when that is longer (a 2h cooldown must
        # still see an action taken 61 minutes ago).
        self.actions_at: dict[TargetKey, tuple[float, ...]] = {
            target: kept(times, now, policy.limits.cooldown) for target, times in state.actions_at.items()
        }
        self.decisions: list[Decision] = []

    def limits_block(self, target: TargetKey) -> str | None:
        return _limits_block(self.policy, PolicyState(actions_at=self.actions_at), target, self.now)

    def record_actions(self, target: TargetKey, actions: tuple[ActionRequest, ...]) -> None:
        if any(action.mutating for action in actions):
            self.actions_at[target] = (*self.actions_at.get(target, ()), self.now)

    def decide(
        self,
        kind: DecisionKind,
        condition: Condition,
        target: TargetKey,
        state: ConditionState,
        *,
        incident: str,
        value: float | None,
        actions: tuple[ActionRequest, ...] = (),
        fired_at: float | None = None,
        resolved_at: float | None = None,
        reason: str,
        attribution: Attribution | None = None,
        branch: BranchChoice | None = None,
    ) -> None:
        attributed = attribution is not None or branch is not None
        self.decisions.append(
            (AttributedDecision if attributed else Decision)(
                id=incident,
                kind=kind,
                policy=self.policy.name,
                condition=condition.name,
                target=target,
                onset=state.onset if state.onset is not None else self.now,
                at=self.now,
                fired_at=fired_at,
                resolved_at=resolved_at,
                value=value,
                threshold=condition.when.value,
                evidence=state.evidence,
                actions=actions,
                dry_run=self.policy.dryRun,
                reason=reason,
                **({"attribution": attribution, "branch": branch} if attributed else {}),
            )
        )

    def choose(
        self, condition: Condition, target: TargetKey, onset: float
    ) -> tuple[list[Any], Attribution | None, BranchChoice | None]:
        """The actions to run when `condition` fires on `target`: its own, or those of the first branch that holds."""
        attribution = None
        if condition.attribution is not None:
            attribution = attribute(
                condition.attribution,
                target_labels(target),
                onset,
                self.rollouts,
                source_error=self.rollouts_error,
            )
        if condition.choose is None:
            return list(condition.actions), attribution, None
        chosen = choose_branch(condition, attribution, self.observations, target, self.now)
        if chosen is None:
            return [], attribution, no_branch_choice(condition, attribution, self.observations, target, self.now)
        branch, choice = chosen
        return list(branch.actions), attribution, choice


def _needs_limits(actions: list[Any]) -> bool:
    # A recovery's `restore` changes the tier as much as the scale-out it undoes: the cooldown and the budget gate
    # it too (a scale-in right after a scale-out is the flapping the cooldown exists to stop).
    return any(ActionType(action.type) in MUTATING_ACTIONS for action in actions)


def _on_error(
    step: _Step, condition: Condition, target: TargetKey, state: ConditionState, error: str
) -> ConditionState:
    state = replace(
        state,
        error_count=state.error_count + 1,
        errors_since=state.errors_since if state.errors_since is not None else step.now,
    )
    if state.error_count > condition.maxSourceErrors and not state.errored:
        incident = decision_id(step.policy.name, condition.name, target, state.errors_since or step.now)
        step.decide(
            DecisionKind.ERRORED,
            condition,
            target,
            state,
            incident=incident,
            value=None,
            reason=(f"{state.error_count} consecutive source errors (limit {condition.maxSourceErrors}): {error}"),
        )
        state = replace(state, errored=True)
        if state.phase is Phase.PENDING:
            state = replace(state, phase=Phase.OK, breach_count=0, onset=None, evidence=(), suppression_reported=False)
    return state


def _on_hold(step: _Step, condition: Condition, state: ConditionState) -> ConditionState | None:
    """No data under `hold`: keep the streak, unless what is held has gone stale. None drops the entry."""
    if state.last_data_at is None or step.now - state.last_data_at <= condition.staleAfter:
        return state
    if state.phase is Phase.FIRING:
        # Absence of data is not a recovery: a firing condition stays firing, marked stale.
        return replace(state, stale=True)
    return None  # pending streaks and idle targets are forgotten once stale


def _on_breach(
    step: _Step, condition: Condition, target: TargetKey, state: ConditionState, value: float | None
) -> ConditionState:
    now = step.now
    state = replace(state, last_data_at=now, last_value=value, stale=False)
    if state.phase is Phase.FIRING:
        return replace(state, recover_count=0, recover_since=None, evidence=_with_evidence(state, now, value))
    if state.phase is Phase.OK:
        state = replace(state, phase=Phase.PENDING, breach_count=1, onset=now, evidence=(), suppression_reported=False)
        state = replace(state, evidence=_with_evidence(state, now, value))
    else:
        state = replace(state, breach_count=state.breach_count + 1, evidence=_with_evidence(state, now, value))
    onset = state.onset
    assert onset is not None
    if not condition.for_.satisfied(state.breach_count, onset, now, interval=step.policy.interval):
        return state
    incident = decision_id(step.policy.name, condition.name, target, onset)
    chosen_actions, attribution, branch = step.choose(condition, target, onset)
    if step.policy.suspend and _needs_limits(chosen_actions):
        # Suspended (spec.suspend, `tailguard pause`, or the global kill switch): no new mutating action.
        if not state.suppression_reported:
            step.decide(
                DecisionKind.SUPPRESSED,
                condition,
                target,
                state,
                incident=incident,
                value=value,
                reason=SUSPENDED_REASON,
                attribution=attribution,
                branch=branch,
            )
            state = replace(state, suppression_reported=True)
        return state
    block = step.limits_block(target) if _needs_limits(chosen_actions) else None
    if block is not None:
        if not state.suppression_reported:
            step.decide(
                DecisionKind.SUPPRESSED,
                condition,
                target,
                state,
                incident=incident,
                value=value,
                reason=f"breach held for {condition.for_.describe()} but {block}",
                attribution=attribution,
                branch=branch,
            )
            state = replace(state, suppression_reported=True)
        return state
    actions = render_actions(
        step.policy,
        condition,
        chosen_actions,
        target,
        kind=DecisionKind.FIRE,
        incident=incident,
        value=value,
        threshold=condition.when.value,
        onset=onset,
        extra_variables=text_variables(attribution, branch)
        if condition.attribution is not None or condition.choose is not None
        else None,
    )
    step.record_actions(target, actions)
    state = replace(state, phase=Phase.FIRING, fired_at=now, decision_id=incident, recover_count=0, recover_since=None)
    step.decide(
        DecisionKind.FIRE,
        condition,
        target,
        state,
        incident=incident,
        value=value,
        actions=actions,
        fired_at=now,
        reason=f"{condition.when.op.value} {condition.when.value} for {condition.for_.describe()}"
        + (f"; {branch.reason}" if branch is not None else ""),
        attribution=attribution,
        branch=branch,
    )
    return state


def _on_ok(
    step: _Step, condition: Condition, target: TargetKey, state: ConditionState, value: float | None
) -> ConditionState:
    now = step.now
    state = replace(state, last_data_at=now, last_value=value, stale=False)
    if state.phase is Phase.PENDING:
        return replace(state, phase=Phase.OK, breach_count=0, onset=None, evidence=(), suppression_reported=False)
    if state.phase is Phase.OK:
        return state
    healthy = True
    if value is not None and condition.recovery.when is not None:
        healthy = condition.recovery.when.holds(value)
    if not healthy:
        # Between the breach and the recovery thresholds: still firing, recovery streak broken.
        return replace(state, recover_count=0, recover_since=None)
    state = replace(
        state,
        recover_count=state.recover_count + 1,
        recover_since=state.recover_since if state.recover_since is not None else now,
    )
    assert state.recover_since is not None
    if not condition.recovery.for_.satisfied(
        state.recover_count, state.recover_since, now, interval=step.policy.interval
    ):
        return state
    assert state.decision_id is not None and state.onset is not None
    block = step.limits_block(target) if _needs_limits(condition.recovery.actions) else None
    if block is not None:
        return state  # recovery actions wait for the limits; the condition stays firing until then
    actions = render_actions(
        step.policy,
        condition,
        condition.recovery.actions,
        target,
        kind=DecisionKind.RESOLVE,
        incident=state.decision_id,
        value=value,
        threshold=condition.when.value,
        onset=state.onset,
        extra_variables=text_variables(None, None)
        if condition.attribution is not None or condition.choose is not None
        else None,
    )
    step.record_actions(target, actions)
    step.decide(
        DecisionKind.RESOLVE,
        condition,
        target,
        state,
        incident=state.decision_id,
        value=value,
        actions=actions,
        fired_at=state.fired_at,
        resolved_at=now,
        reason=f"recovered for {condition.recovery.for_.describe()}",
    )
    return ConditionState(last_data_at=now, last_value=value)


def _effective(condition: Condition, kind: ObservationKind, value: float | None) -> ObservationKind:
    if kind is ObservationKind.OK:
        assert value is not None
        return ObservationKind.BREACH if condition.when.holds(value) else ObservationKind.OK
    if kind is ObservationKind.NO_DATA:
        if condition.noData is NoDataPolicy.BREACH:
            return ObservationKind.BREACH
        if condition.noData is NoDataPolicy.OK:
            return ObservationKind.OK
    return kind


def observe(
    policy: Policy, condition: Condition, result: SignalResult | None, target: TargetKey, now: float
) -> tuple[ObservationKind, float | None, str | None]:
    """One condition's observation for one target: ok / breach / no-data / error (before noData mapping)."""
    kind, value, error = classify(result, target, now)
    if kind is ObservationKind.OK and value is not None and condition.when.holds(value):
        return ObservationKind.BREACH, value, None
    return kind, value, error


# transition()'s fast path for healthy targets in phase OK (tests turn it off to compare with the slow path).
FAST_HEALTHY = True


_RESET_ERRORS = {"stale": False, "error_count": 0, "errors_since": None, "errored": False}


def _healthy(state: ConditionState, now: float, value: float) -> ConditionState:
    """replace(replace(state, error_count=0, errors_since=None, errored=False), last_data_at=now,
    last_value=value, stale=False) for a state in phase OK. Built from a copy of the instance dict (what copy.copy
    does): a frozen dataclass' __init__ sets each of its 15 fields through object.__setattr__, 5x slower, and this
    runs for every healthy target of every evaluation."""
    fields = state.__dict__.copy()
    fields.update(_RESET_ERRORS)
    fields["last_data_at"] = now
    fields["last_value"] = value
    healthy: ConditionState = _new_state(ConditionState)
    object.__setattr__(healthy, "__dict__", fields)
    return healthy


_new_state = object.__new__
_EMPTY = ConditionState()
_COMPARE: dict[Comparison, Callable[[float, float], bool]] = {
    Comparison.GT: operator.gt,
    Comparison.GE: operator.ge,
    Comparison.LT: operator.lt,
    Comparison.LE: operator.le,
}


def advance_healthy(
    policy: Policy, state: PolicyState, now: float, evaluations: int, observed: Mapping[StateKey, float]
) -> PolicyState:
    """The state after `evaluations` scheduled evaluations (the last at `now`) in which nothing could happen:
    every condition state is in phase OK and stays OK, each (condition, target) of `observed` was observed as a
    number not breaching its condition at every one of them from its first (at `now` with the value given),
    and it includes every key of `state`. That is exactly what `transition` gives evaluation by evaluation
    (its fast path: last_data_at/last_value refreshed, errors reset; no decision; action times pruned at `now`),
    computed once: the backtest's skip over quiet stretches (controller/tools/backtest.py)."""
    conditions = dict(state.conditions)
    empty = ConditionState()
    for key, value in observed.items():
        conditions[key] = _healthy(conditions.get(key, empty), now, value)
    actions_at = {target: kept(times, now, policy.limits.cooldown) for target, times in state.actions_at.items()}
    return PolicyState(
        conditions=conditions,
        actions_at={target: times for target, times in actions_at.items() if times},
        evaluations=state.evaluations + evaluations,
        last_evaluated_at=now,
    )


@dataclass(frozen=True)
class PreparedCondition:
    """transition()'s fast path for one condition, computed ahead: the condition states of its healthy targets
    (in phase OK, observed as a number not breaching `when`: only last_data_at/last_value/stale and the error
    fields change, no decision) and the targets left for the full path. It depends only on the condition, its
    signal's result, the input state's conditions and `now`, so the evaluation computes it for each signal as its
    answer arrives, while the policy's slower queries are still in flight (controller/loop/evaluation.py);
    transition() uses it only when it was computed from the same result object, state, `now` and target set."""

    condition: str
    result: SignalResult | None
    basis: Mapping[StateKey, ConditionState]
    now: float
    allowed: frozenset[TargetKey] | None
    healthy: Mapping[StateKey, ConditionState]
    rest: tuple[TargetKey, ...]

    def fits(
        self, result: SignalResult | None, state: PolicyState, now: float, allowed: frozenset[TargetKey] | None
    ) -> bool:
        return self.result is result and self.basis is state.conditions and self.now == now and self.allowed == allowed


def held_targets(state: PolicyState) -> dict[str, list[TargetKey]]:
    """The targets the state holds, by condition name (prepare_condition's `held`)."""
    held: dict[str, list[TargetKey]] = {}
    for name, target in state.conditions:
        held.setdefault(name, []).append(target)
    return held


def prepare_condition(
    condition: Condition,
    result: SignalResult | None,
    state: PolicyState,
    held: Mapping[str, Sequence[TargetKey]],
    now: float,
    allowed: frozenset[TargetKey] | None = None,
) -> PreparedCondition:
    """The fast path of `condition` (PreparedCondition): `held` is held_targets(state)."""
    name = condition.name
    seen = set(held.get(name, ()))
    if result is not None and result.ok:
        seen.update(result.values)
    if allowed is not None:
        seen &= allowed
    healthy: dict[StateKey, ConditionState] = {}
    if FAST_HEALTHY and result is not None and result.ok:
        # The common case, in any order: a healthy target staying OK is built at once by _healthy. The rest go
        # through transition's full path in target order (their decisions come out in that order).
        # Local names: this loop runs for every (condition, target) of every evaluation.
        held_state = state.conditions.get
        value_of = result.values.get
        holds, threshold = _COMPARE[condition.when.op], condition.when.value
        ok, empty, refreshed = Phase.OK, _EMPTY, _healthy
        rest: list[TargetKey] = []
        for target in seen:
            value = value_of(target)
            if value is not None and not isnan(value) and not holds(value, threshold):
                key = (name, target)
                current = held_state(key, empty)
                if current.phase is ok:
                    healthy[key] = refreshed(current, now, value)
                    continue
            rest.append(target)
    else:
        rest = list(seen)
    return PreparedCondition(name, result, state.conditions, now, allowed, healthy, tuple(rest))


def transition(
    policy: Policy,
    observations: Mapping[str, SignalResult],
    state: PolicyState,
    now: float,
    rollouts: Sequence[Rollout] = (),
    *,
    rollouts_error: str | None = None,
    targets: Collection[TargetKey] | None = None,
    prepared: Mapping[str, PreparedCondition] | None = None,
) -> tuple[PolicyState, list[Decision]]:
    """`rollouts`: what the change tracker saw (data, fetched by the runtime); `rollouts_error`: it failed,
    so attribution is "unknown" (never "attributed"), and nothing else changes.

    `targets`: the only targets this evaluation may touch (an alert-triggered evaluation: the targets its alerts
    name); every other target's state is left exactly as it was (no streak advance, no resolve, no error count).
    None: every target (a scheduled evaluation).

    `prepared`: conditions' fast paths computed ahead by prepare_condition (by condition name); one that does not
    fit this call (another result, state, time or target set) is computed again here."""
    step = _Step(policy, state, now, observations, rollouts, rollouts_error)
    allowed = None if targets is None else frozenset(targets)
    held: dict[str, list[TargetKey]] | None = None
    conditions = step.conditions
    for condition in policy.conditions:
        result = observations.get(condition.signal)
        name = condition.name
        part = prepared.get(name) if prepared is not None else None
        if part is None or not part.fits(result, state, now, allowed):
            if held is None:
                held = held_targets(state)
            part = prepare_condition(condition, result, state, held, now, allowed)
        # Only this condition's keys: the full path of another condition never writes them (equivalent to
        # building them here, in this order).
        conditions.update(part.healthy)
        rest = part.rest
        for target in sorted(rest):
            key = (name, target)
            current = conditions.get(key, _EMPTY)
            kind, value, error = classify(result, target, now)
            if kind is ObservationKind.ERROR:
                conditions[key] = _on_error(step, condition, target, current, error or "source error")
                continue
            current = replace(current, error_count=0, errors_since=None, errored=False)
            effective = _effective(condition, kind, value)
            if effective is ObservationKind.NO_DATA:
                kept_state = _on_hold(step, condition, current)
                if kept_state is None:
                    conditions.pop(key, None)
                else:
                    conditions[key] = kept_state
            elif effective is ObservationKind.BREACH:
                conditions[key] = _on_breach(step, condition, target, current, value)
            else:
                updated = _on_ok(step, condition, target, current, value)
                if kind is ObservationKind.NO_DATA and updated.phase is Phase.OK:
                    # Absent and healthy under `noData: ok` is exactly "no state": forget the target,
                    # so state does not grow with every version that ever existed.
                    conditions.pop(key, None)
                else:
                    conditions[key] = updated
    new_state = PolicyState(
        conditions=step.conditions,
        actions_at={target: times for target, times in step.actions_at.items() if times},
        evaluations=state.evaluations + 1,
        last_evaluated_at=now,
    )
    return new_state, step.decisions


def is_finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
