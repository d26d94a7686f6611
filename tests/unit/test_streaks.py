"""`for: N` streaks do not depend on what triggered an evaluation (issue 12, item 2).

The rule (rules/README.md, `for`): a count-form `for: N` is satisfied by N breaching observations spanning at
least (N-1) x the policy's `interval` (now - onset, to the millisecond); an alert-triggered evaluation applies its
observations only to the targets its alert names. Scheduled evaluations, one interval apart, fire at the N-th
breach exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from tailguard.controller.core.engine import ConditionState, Phase, PolicyState, transition
from tailguard.controller.core.model import Decision, DecisionKind, SignalResult, TargetKey, target_key
from tailguard.controller.core.policy import TIME_TOLERANCE, ForSpec, Policy

A = target_key({"service": "a"})
B = target_key({"service": "b"})
T0 = 1_700_000_000.0  # epoch-sized times: float rounding of T0 + k x interval must not cost an interval
BREACH = 2.0
OK = 0.5


def make_policy(*, for_: int | str = 3, interval: str = "10s", recovery_for: int | str = 1) -> Policy:
    return Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": "streaks",
            "interval": interval,
            "targets": {"groupBy": ["service"], "match": {"namespace": "llm"}},
            "signals": [{"name": "p99", "query": "p99{ {{ selector }} }"}],
            "conditions": [
                {
                    "name": "slow",
                    "signal": "p99",
                    "when": {"op": ">", "value": 0.8},
                    "for": for_,
                    "noData": "hold",
                    # annotate: not gated by cooldown or budget, so every fire shows
                    "actions": [{"type": "annotate", "text": "slow {{ service }}"}],
                    "recovery": {"for": recovery_for},
                }
            ],
        }
    )


def observe(values: dict[TargetKey, float]) -> dict[str, SignalResult]:
    return {"p99": SignalResult(dict(values))}


def kinds(decisions: list[Decision]) -> list[tuple[DecisionKind, TargetKey]]:
    return [(d.kind, d.target) for d in decisions]


# ----- the reproduction from the issue ---------------------------------------------------------------------------


def test_one_scheduled_and_two_alert_evaluations_do_not_fire_a_for_3_condition() -> None:
    """Issue 12: 1 scheduled evaluation + 2 alert posts rolled back 0.9-4 s after the first breach (nominal 20 s
    at a 10 s interval). Now the streak has 3 observations but spans 4 s: nothing fires until it spans 20 s."""
    policy = make_policy(for_=3, interval="10s")
    state, decisions = transition(policy, observe({A: BREACH}), PolicyState(), T0)
    assert decisions == []
    for at in (T0 + 0.9, T0 + 4.0):
        state, decisions = transition(policy, observe({A: BREACH}), state, at, targets={A})
        assert decisions == []
    assert state.condition("slow", A).breach_count == 3
    assert state.condition("slow", A).phase is Phase.PENDING
    state, decisions = transition(policy, observe({A: BREACH}), state, T0 + 10)
    assert decisions == []
    state, decisions = transition(policy, observe({A: BREACH}), state, T0 + 20)
    assert kinds(decisions) == [(DecisionKind.FIRE, A)]
    assert decisions[0].onset == T0 and decisions[0].at == T0 + 20


def test_triggered_evaluations_without_a_target_scope_cannot_shorten_the_streak_either() -> None:
    """The span rule holds whatever the caller passes: an evaluation of every target at 1 s steps still needs the
    streak to span (N-1) x interval."""
    policy = make_policy(for_=3, interval="10s")
    state = PolicyState()
    fired_at = None
    for step in range(25):
        state, decisions = transition(policy, observe({A: BREACH}), state, T0 + step)
        if decisions:
            fired_at = decisions[0].at
            break
    assert fired_at == T0 + 20


def test_an_alert_about_service_a_does_not_advance_service_b() -> None:
    policy = make_policy(for_=3, interval="10s")
    state, _ = transition(policy, observe({A: BREACH, B: BREACH}), PolicyState(), T0)
    b_before = state.condition("slow", B)
    for at in (T0 + 1, T0 + 2, T0 + 12, T0 + 19):
        state, decisions = transition(policy, observe({A: BREACH, B: BREACH}), state, at, targets={A})
        assert all(d.target == A for d in decisions)
    assert state.condition("slow", B) == b_before  # untouched: no streak advance, no new evidence
    assert state.condition("slow", B).breach_count == 1
    assert state.condition("slow", A).breach_count == 5
    # B's streak goes on from its own observations only: its 3rd scheduled breach at T0 + 20 fires it.
    state, decisions = transition(policy, observe({A: BREACH, B: BREACH}), state, T0 + 10)
    assert kinds(decisions) == []
    state, decisions = transition(policy, observe({A: BREACH, B: BREACH}), state, T0 + 20)
    assert sorted(kinds(decisions)) == sorted([(DecisionKind.FIRE, A), (DecisionKind.FIRE, B)])


def test_an_alert_about_service_a_neither_breaks_nor_resolves_service_b() -> None:
    policy = make_policy(for_=2, interval="10s")
    state, _ = transition(policy, observe({A: BREACH, B: BREACH}), PolicyState(), T0)
    state, decisions = transition(policy, observe({A: BREACH, B: BREACH}), state, T0 + 10)
    assert sorted(kinds(decisions)) == sorted([(DecisionKind.FIRE, A), (DecisionKind.FIRE, B)])
    # B is healthy now, but the alert names A only: B stays firing (its recovery is the next scheduled look).
    state, decisions = transition(policy, observe({A: BREACH, B: OK}), state, T0 + 12, targets={A})
    assert decisions == []
    assert state.condition("slow", B).phase is Phase.FIRING
    state, decisions = transition(policy, observe({A: BREACH, B: OK}), state, T0 + 20)
    assert kinds(decisions) == [(DecisionKind.RESOLVE, B)]


def test_a_triggered_evaluation_completes_a_streak_once_it_spans_the_time() -> None:
    """The documented "confirm early": an alert evaluation after (N-1) x interval, before the next scheduled
    tick, may be the observation that completes the streak."""
    policy = make_policy(for_=3, interval="10s")
    state, _ = transition(policy, observe({A: BREACH}), PolicyState(), T0)
    state, _ = transition(policy, observe({A: BREACH}), state, T0 + 10)
    state, decisions = transition(policy, observe({A: BREACH}), state, T0 + 19.5, targets={A})
    assert decisions == []  # 19.5 s < 20 s
    state, decisions = transition(policy, observe({A: BREACH}), state, T0 + 20.5, targets={A})
    assert kinds(decisions) == [(DecisionKind.FIRE, A)]


def test_a_healthy_triggered_observation_breaks_the_streak_of_its_target() -> None:
    policy = make_policy(for_=3, interval="10s")
    state, _ = transition(policy, observe({A: BREACH}), PolicyState(), T0)
    state, _ = transition(policy, observe({A: OK}), state, T0 + 3, targets={A})
    assert state.condition("slow", A).phase is Phase.OK
    state, _ = transition(policy, observe({A: BREACH}), state, T0 + 10)
    state, decisions = transition(policy, observe({A: BREACH}), state, T0 + 20)
    assert decisions == []  # the streak began again at T0 + 10
    state, decisions = transition(policy, observe({A: BREACH}), state, T0 + 30)
    assert kinds(decisions) == [(DecisionKind.FIRE, A)]


def test_a_recovery_for_n_is_not_shortened_by_triggered_evaluations() -> None:
    policy = make_policy(for_=1, interval="10s", recovery_for=3)
    state, decisions = transition(policy, observe({A: BREACH}), PolicyState(), T0)
    assert kinds(decisions) == [(DecisionKind.FIRE, A)]
    state, _ = transition(policy, observe({A: OK}), state, T0 + 10)
    for at in (T0 + 11, T0 + 12, T0 + 13):
        state, decisions = transition(policy, observe({A: OK}), state, at, targets={A})
        assert decisions == []  # resolved alerts storm: 4 healthy observations spanning 3 s
    state, decisions = transition(policy, observe({A: OK}), state, T0 + 20)
    assert decisions == []
    state, decisions = transition(policy, observe({A: OK}), state, T0 + 30)
    assert kinds(decisions) == [(DecisionKind.RESOLVE, A)]


def test_the_duration_form_is_time_and_an_alert_touches_only_its_targets() -> None:
    policy = make_policy(for_="20s", interval="10s")
    state, _ = transition(policy, observe({A: BREACH, B: BREACH}), PolicyState(), T0)
    b_before = state.condition("slow", B)
    state, decisions = transition(policy, observe({A: BREACH, B: BREACH}), state, T0 + 5, targets={A})
    assert decisions == [] and state.condition("slow", B) == b_before
    state, decisions = transition(policy, observe({A: BREACH, B: BREACH}), state, T0 + 20, targets={B})
    assert kinds(decisions) == [(DecisionKind.FIRE, B)]
    assert state.condition("slow", A).phase is Phase.PENDING


def test_for_spec_without_an_interval_counts_observations_only() -> None:
    spec = ForSpec(count=3)
    assert spec.satisfied(3, T0, T0)  # the default interval 0: the count alone, as before
    assert not spec.satisfied(3, T0, T0 + 19.99, interval=10)
    assert spec.satisfied(3, T0, T0 + 20 - TIME_TOLERANCE / 2, interval=10)
    assert not spec.satisfied(2, T0, T0 + 100, interval=10)


# ----- properties over random schedules -----------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluation:
    at: float
    values: dict[TargetKey, float]
    targets: frozenset[TargetKey] | None  # None: a scheduled evaluation (every target)


INTERVALS = {"5s": 5.0, "10s": 10.0, "15s": 15.0, "30s": 30.0}


@st.composite
def schedules(draw: st.DrawFn, *, triggered: bool) -> tuple[Policy, float, list[Evaluation]]:
    n = draw(st.integers(min_value=1, max_value=5))
    interval_text = draw(st.sampled_from(sorted(INTERVALS)))
    interval = INTERVALS[interval_text]
    ticks = draw(st.integers(min_value=1, max_value=14))
    value = st.sampled_from([BREACH, OK])
    evaluations: list[Evaluation] = []
    for tick in range(ticks):
        at = T0 + tick * interval
        evaluations.append(Evaluation(at, {A: draw(value), B: draw(value)}, None))
        if not triggered:
            continue
        offsets = draw(
            st.lists(st.floats(min_value=0.0, max_value=interval, exclude_max=True), max_size=4, unique=True)
        )
        for offset in sorted(offsets):
            named = draw(st.sampled_from([frozenset({A}), frozenset({B}), frozenset({A, B})]))
            evaluations.append(Evaluation(at + offset, {A: draw(value), B: draw(value)}, named))
    return make_policy(for_=n, interval=interval_text), interval, evaluations


def run(policy: Policy, evaluations: list[Evaluation]) -> list[tuple[int, Decision]]:
    state = PolicyState()
    out: list[tuple[int, Decision]] = []
    for index, evaluation in enumerate(evaluations):
        state, decisions = transition(
            policy, observe(evaluation.values), state, evaluation.at, targets=evaluation.targets
        )
        out.extend((index, decision) for decision in decisions)
    return out


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(schedules(triggered=True))
def test_no_fire_before_n_minus_1_intervals_after_the_first_breach_of_its_streak(
    case: tuple[Policy, float, list[Evaluation]],
) -> None:
    policy, interval, evaluations = case
    n = policy.conditions[0].for_.count
    assert n is not None
    state = PolicyState()
    streak_start: dict[TargetKey, float | None] = {A: None, B: None}
    breaches: dict[TargetKey, int] = {A: 0, B: 0}
    for evaluation in evaluations:
        before = state
        state, decisions = transition(
            policy, observe(evaluation.values), state, evaluation.at, targets=evaluation.targets
        )
        for target in (A, B):
            if evaluation.targets is not None and target not in evaluation.targets:
                # not named: untouched
                assert state.conditions.get(("slow", target)) == before.conditions.get(("slow", target))
                continue
            if evaluation.values[target] == BREACH:
                if streak_start[target] is None:
                    streak_start[target] = evaluation.at
                breaches[target] += 1
            else:
                streak_start[target] = None  # a healthy observation breaks a streak or (recovery for: 1) resolves
                breaches[target] = 0
        for decision in decisions:
            if decision.kind is not DecisionKind.FIRE:
                continue
            start = streak_start[decision.target]
            assert start is not None
            assert decision.onset == start  # the onset is the first breaching observation of the streak
            assert decision.at - start >= (n - 1) * interval - TIME_TOLERANCE
            assert breaches[decision.target] >= n


def reference_fires(n: int, evaluations: list[Evaluation]) -> list[tuple[int, TargetKey, str]]:
    """The behaviour before issue 12 for scheduled evaluations: fire at the N-th consecutive breach; with the
    default recovery (`for: 1`) the first healthy observation resolves."""
    out: list[tuple[int, TargetKey, str]] = []
    count = {A: 0, B: 0}
    firing = {A: False, B: False}
    for index, evaluation in enumerate(evaluations):
        for target in sorted((A, B)):
            if evaluation.values[target] == BREACH:
                if firing[target]:
                    continue
                count[target] += 1
                if count[target] >= n:
                    firing[target] = True
                    out.append((index, target, "fire"))
            else:
                if firing[target]:
                    out.append((index, target, "resolve"))
                firing[target] = False
                count[target] = 0
    return out


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(schedules(triggered=False))
def test_with_only_scheduled_evaluations_the_fire_is_at_the_nth_breach_as_before(
    case: tuple[Policy, float, list[Evaluation]],
) -> None:
    policy, _interval, evaluations = case
    n = policy.conditions[0].for_.count
    assert n is not None
    got = [
        (index, decision.target, decision.kind.value)
        for index, decision in run(policy, evaluations)
        if decision.kind in (DecisionKind.FIRE, DecisionKind.RESOLVE)
    ]
    assert got == reference_fires(n, evaluations)


def test_condition_state_json_is_unchanged_by_the_rule() -> None:
    """No new state: old journals load, new ones are read by old code (the rule uses onset and breach_count)."""
    state = ConditionState(phase=Phase.PENDING, breach_count=2, onset=T0)
    assert ConditionState.from_json(state.to_json()) == state
