"""Table tests of the pure transition function.

Each case is a policy and a list of steps: (time, observation) -> expected phase of the
(condition, target) state and the decision kinds produced at that step. Observations:
a float is a value, NAN a NaN value, ABSENT no series for the target, ERR a source error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tailguard.controller.core.actions import ActionType
from tailguard.controller.core.engine import ConditionState, Phase, PolicyState, transition
from tailguard.controller.core.model import (
    Decision,
    DecisionKind,
    SignalResult,
    TargetKey,
    decision_id,
    target_key,
)
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.policy_files import load_policies

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "rules" / "examples"

A = target_key({"service": "a"})
B = target_key({"service": "b"})
NAN = math.nan
ABSENT = "absent"
ERR = "error"
GONE = "gone"  # the (condition, target) state was dropped

Obs = float | str


def make_policy(
    *,
    for_: int | str = 3,
    no_data: str = "hold",
    stale_after: str = "2m",
    max_source_errors: int = 4,
    recovery: dict[str, Any] | None = None,
    actions: list[dict[str, Any]] | None = None,
    cooldown: str = "0s",
    budget: int = 100,
    dry_run: bool = False,
    extra_conditions: list[dict[str, Any]] | None = None,
) -> Policy:
    condition: dict[str, Any] = {
        "name": "slow",
        "signal": "p99",
        "when": {"op": ">", "value": 0.8},
        "for": for_,
        "noData": no_data,
        "staleAfter": stale_after,
        "maxSourceErrors": max_source_errors,
        "actions": actions if actions is not None else [{"type": "rollback"}],
    }
    if recovery is not None:
        condition["recovery"] = recovery
    return Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": "table",
            "dryRun": dry_run,
            "targets": {"groupBy": ["service"], "match": {"namespace": "llm"}},
            "signals": [{"name": "p99", "query": "p99{ {{ selector }} }"}],
            "conditions": [condition, *(extra_conditions or [])],
            "limits": {"cooldown": cooldown, "maxActionsPerHour": budget},
        }
    )


def result(observations: dict[TargetKey, Obs]) -> SignalResult:
    if any(obs == ERR for obs in observations.values()):
        return SignalResult.failed("connection refused")
    return SignalResult({t: float(v) for t, v in observations.items() if not isinstance(v, str)})


@dataclass
class Run:
    policy: Policy
    state: PolicyState = field(default_factory=PolicyState)
    decisions: list[Decision] | None = None
    roundtrip: bool = False

    def step(self, now: float, observations: dict[TargetKey, Obs], signal: str = "p99") -> list[Decision]:
        self.state, decisions = transition(self.policy, {signal: result(observations)}, self.state, now)
        if self.roundtrip:
            self.state = PolicyState.from_json(json.loads(json.dumps(self.state.to_json())))
        self.decisions = (self.decisions or []) + decisions
        return decisions

    def phase(self, target: TargetKey = A, condition: str = "slow") -> str:
        found = self.state.conditions.get((condition, target))
        return GONE if found is None else found.phase.value


Step = tuple[float, Obs, str, list[str]]  # time, observation of target A, expected phase, decision kinds


def drive(policy: Policy, steps: list[Step], *, roundtrip: bool = False) -> Run:
    run = Run(policy, roundtrip=roundtrip)
    for now, obs, phase, kinds in steps:
        decisions = run.step(now, {} if obs == ABSENT else {A: obs})
        assert (now, run.phase(), [d.kind.value for d in decisions]) == (now, phase, kinds)
    return run


P, F, OK = "pending", "firing", "ok"
TABLES: dict[str, tuple[dict[str, Any], list[Step]]] = {
    "three consecutive breaches fire once": (
        {},
        [(0, 0.9, P, []), (15, 0.9, P, []), (30, 0.9, F, ["fire"]), (45, 0.95, F, []), (60, 2.0, F, [])],
    ),
    "ok resets the streak": (
        {},
        [
            (0, 0.9, P, []),
            (15, 0.9, P, []),
            (30, 0.5, OK, []),
            (45, 0.9, P, []),
            (60, 0.9, P, []),
            (75, 0.9, F, ["fire"]),
        ],
    ),
    "value equal to the threshold is not a breach (op >)": (
        {"for_": 1},
        [(0, 0.8, OK, []), (15, 0.81, F, ["fire"])],
    ),
    "no-data hold neither advances nor resets": (
        {"no_data": "hold"},
        [(0, 0.9, P, []), (15, 0.9, P, []), (30, ABSENT, P, []), (45, ABSENT, P, []), (60, 0.9, F, ["fire"])],
    ),
    "no-data breach counts absence as a breach": (
        {"no_data": "breach"},
        [(0, 0.9, P, []), (15, ABSENT, P, []), (30, ABSENT, F, ["fire"])],
    ),
    "no-data ok counts absence as healthy": (
        {"no_data": "ok"},
        [(0, 0.9, P, []), (15, 0.9, P, []), (30, ABSENT, GONE, []), (45, 0.9, P, [])],
    ),
    "no-data ok resolves a firing condition": (
        {"no_data": "ok", "for_": 1},
        [(0, 0.9, F, ["fire"]), (15, ABSENT, GONE, ["resolve"])],
    ),
    "no-data ok forgets an absent, healthy target": (
        {"no_data": "ok"},
        [(0, 0.5, OK, []), (15, ABSENT, GONE, []), (30, 0.9, P, []), (45, ABSENT, GONE, [])],
    ),
    "NaN is no-data under hold, never a breach": (
        {"no_data": "hold"},
        [(0, 0.9, P, []), (15, NAN, P, []), (30, 0.9, P, []), (45, NAN, P, []), (60, 0.9, F, ["fire"])],
    ),
    "NaN is no-data under ok": (
        {"no_data": "ok"},
        [(0, 0.9, P, []), (15, NAN, GONE, [])],
    ),
    "NaN is no-data under breach": (
        {"no_data": "breach", "for_": 2},
        [(0, NAN, P, []), (15, NAN, F, ["fire"])],
    ),
    "a held streak goes stale and is dropped; stale data never completes a breach": (
        {"stale_after": "30s"},
        [
            (0, 0.9, P, []),
            (15, 0.9, P, []),
            (30, ABSENT, P, []),
            (45, ABSENT, P, []),
            (60, ABSENT, GONE, []),
            (75, 0.9, P, []),
            (90, 0.9, P, []),
            (105, 0.9, F, ["fire"]),
        ],
    ),
    "absence never resolves a firing condition, even when stale": (
        {"for_": 1, "stale_after": "30s"},
        [
            (0, 0.9, F, ["fire"]),
            (15, ABSENT, F, []),
            (60, ABSENT, F, []),
            (600, ABSENT, F, []),
            (615, 0.5, OK, ["resolve"]),
        ],
    ),
    "an idle target is forgotten once stale": (
        {"stale_after": "30s"},
        [(0, 0.5, OK, []), (15, ABSENT, OK, []), (45, ABSENT, GONE, []), (60, ABSENT, GONE, [])],
    ),
    "source errors are not breaches": (
        {"for_": 1, "max_source_errors": 100},
        [(0, ERR, GONE, []), (15, ERR, GONE, []), (30, 0.5, OK, []), (45, ERR, OK, []), (60, ERR, OK, [])],
    ),
    "source errors keep a streak until the limit, then report errored once and drop it": (
        {"max_source_errors": 2},
        [
            (0, 0.9, P, []),
            (15, 0.9, P, []),
            (30, ERR, P, []),
            (45, ERR, P, []),
            (60, ERR, OK, ["errored"]),
            (75, ERR, OK, []),
            (90, 0.9, P, []),
            (105, 0.9, P, []),
            (120, 0.9, F, ["fire"]),
        ],
    ),
    "errors within the limit do not break a streak": (
        {"max_source_errors": 2},
        [(0, 0.9, P, []), (15, ERR, P, []), (30, ERR, P, []), (45, 0.9, P, []), (60, 0.9, F, ["fire"])],
    ),
    "source errors never resolve a firing condition": (
        {"for_": 1, "max_source_errors": 1},
        [
            (0, 0.9, F, ["fire"]),
            (15, ERR, F, []),
            (30, ERR, F, ["errored"]),
            (45, ERR, F, []),
            (60, 0.5, OK, ["resolve"]),
        ],
    ),
    "for as a duration": (
        {"for_": "60s"},
        [(0, 0.9, P, []), (15, 0.9, P, []), (30, 0.9, P, []), (45, 0.9, P, []), (60, 0.9, F, ["fire"])],
    ),
    "for as a duration restarts its clock after an ok": (
        {"for_": "30s"},
        [
            (0, 0.9, P, []),
            (15, 0.9, P, []),
            (30, 0.1, OK, []),
            (45, 0.9, P, []),
            (60, 0.9, P, []),
            (75, 0.9, F, ["fire"]),
        ],
    ),
    "recovery needs its own streak; a breach in between restarts it": (
        {"for_": 1, "recovery": {"for": 2}},
        [
            (0, 0.9, F, ["fire"]),
            (15, 0.5, F, []),
            (30, 0.9, F, []),
            (45, 0.5, F, []),
            (60, 0.5, OK, ["resolve"]),
            (75, 0.9, F, ["fire"]),
        ],
    ),
    "cooldown suppresses once, then fires when it has passed": (
        {"for_": 1, "cooldown": "10m"},
        [
            (0, 0.9, F, ["fire"]),
            (15, 0.5, OK, ["resolve"]),
            (30, 0.9, P, ["suppressed"]),
            (45, 0.9, P, []),
            (585, 0.9, P, []),
            (600, 0.9, F, ["fire"]),
        ],
    ),
    "a suppressed breach that ends does not fire later": (
        {"for_": 1, "cooldown": "10m"},
        [
            (0, 0.9, F, ["fire"]),
            (15, 0.5, OK, ["resolve"]),
            (30, 0.9, P, ["suppressed"]),
            (45, 0.5, OK, []),
            (700, 0.5, OK, []),
            (715, 0.9, F, ["fire"]),
        ],
    ),
    "budget: at most N mutating actions per hour per target": (
        {"for_": 1, "budget": 2},
        [
            (0, 0.9, F, ["fire"]),
            (15, 0.5, OK, ["resolve"]),
            (30, 0.9, F, ["fire"]),
            (45, 0.5, OK, ["resolve"]),
            (60, 0.9, P, ["suppressed"]),
            (3599, 0.9, P, []),
            (3600, 0.9, F, ["fire"]),
        ],
    ),
    "budget 0 never acts": (
        {"for_": 1, "budget": 0},
        [(0, 0.9, P, ["suppressed"]), (15, 0.9, P, []), (7200, 0.9, P, [])],
    ),
    "non-mutating actions are not limited": (
        {"for_": 1, "budget": 0, "cooldown": "1h", "actions": [{"type": "annotate", "text": "slow"}]},
        [(0, 0.9, F, ["fire"]), (15, 0.5, OK, ["resolve"]), (30, 0.9, F, ["fire"])],
    ),
    "mutating recovery actions wait for the cooldown": (
        {
            "for_": 1,
            "cooldown": "60s",
            "recovery": {"actions": [{"type": "shift_traffic", "version": "v1", "weight": 100}]},
        },
        [(0, 0.9, F, ["fire"]), (15, 0.5, F, []), (45, 0.5, F, []), (60, 0.5, OK, ["resolve"])],
    ),
    "a cooldown longer than the budget window is still honoured": (
        {"for_": 1, "cooldown": "2h"},
        [
            (0, 0.9, F, ["fire"]),
            (15, 0.5, OK, ["resolve"]),
            (3700, 0.9, P, ["suppressed"]),
            (7199, 0.9, P, []),
            (7200, 0.9, F, ["fire"]),
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(TABLES))
def test_transition_table(case: str) -> None:
    overrides, steps = TABLES[case]
    drive(make_policy(**overrides), steps)


@pytest.mark.parametrize("case", sorted(TABLES))
def test_state_json_roundtrip_changes_nothing(case: str) -> None:
    overrides, steps = TABLES[case]
    direct = drive(make_policy(**overrides), steps)
    persisted = drive(make_policy(**overrides), steps, roundtrip=True)
    assert persisted.state == direct.state
    assert persisted.decisions == direct.decisions


def test_state_json_is_plain_json_and_restores_equal() -> None:
    run = drive(make_policy(for_=2), [(0, 0.9, P, []), (15, 0.9, F, ["fire"])])
    text = json.dumps(run.state.to_json())
    restored = PolicyState.from_json(json.loads(text))
    assert restored == run.state
    assert restored.condition("slow", A).phase is Phase.FIRING
    assert restored.condition("slow", A).evidence == ((0.0, 0.9), (15.0, 0.9))
    assert restored.actions_at == {A: (15.0,)}
    condition = run.state.condition("slow", A)
    assert ConditionState.from_json(condition.to_json()) == condition


ERROR_RATE: list[Step] = [
    (0, 0.20, P, []),
    (15, 0.20, P, []),
    (30, 0.20, P, []),
    (45, 0.20, P, []),
    (60, 0.20, F, ["fire"]),
    (75, 0.10, F, []),  # between 3% and 15%: still firing
    (90, 0.02, F, []),
    (105, 0.02, F, []),
    (120, 0.05, F, []),  # back between the thresholds: the recovery clock restarts
    (135, 0.02, F, []),
    (150, 0.02, F, []),
    (165, 0.01, OK, ["resolve"]),  # <3% for 30s
]


def _example(name: str) -> Policy:
    policies, errors = load_policies([EXAMPLES / f"{name}.yaml"])
    assert errors == []
    return policies[0].policy


def test_error_rate_example_has_hysteresis() -> None:
    # >15% for 60s fires; <3% for 30s resolves; values in between keep it firing.
    policy = _example("error-rate-shift")
    run = Run(policy)
    target = target_key({"service": "chat", "version": "r2"})
    for now, value, phase, kinds in ERROR_RATE:
        decisions = run.step(now, {target: value}, signal="error-ratio")
        assert (now, run.phase(target, "error-rate-above-15pct"), [d.kind.value for d in decisions]) == (
            now,
            phase,
            kinds,
        )
    fire, resolve = run.decisions or []
    assert [a.params["weight"] for a in fire.actions if a.type is ActionType.SHIFT_TRAFFIC] == [10]
    # The recovery restores the journaled pre-incident weights (issue 12), no longer a fixed 100%.
    assert [a.type for a in resolve.actions] == [ActionType.RESTORE, ActionType.ANNOTATE]
    assert resolve.actions[0].params == {"service": "chat"}
    assert resolve.id == fire.id and resolve.fired_at == 60 and resolve.resolved_at == 165


def test_p99_example_fires_rollback_after_three_evaluations() -> None:
    policy = _example("p99-rollback")
    run = Run(policy)
    target = target_key({"service": "chat"})
    kinds = [
        [d.kind.value for d in run.step(t, {target: v}, "p99-e2e-latency")]
        for t, v in [(0, 0.9), (15, 1.2), (30, 0.95), (45, 0.5), (60, 0.4)]
    ]
    assert kinds == [[], [], ["fire"], [], ["resolve"]]
    fire = (run.decisions or [])[0]
    assert [a.type for a in fire.actions] == [ActionType.ANNOTATE, ActionType.ROLLBACK]
    assert fire.actions[0].params["text"] == "P99 e2e latency 0.95s > 0.8s on chat: rolling back"
    assert fire.evidence == ((0.0, 0.9), (15.0, 1.2), (30.0, 0.95))


def test_dry_run_decisions_are_flagged() -> None:
    run = drive(
        make_policy(for_=1, dry_run=True, cooldown="10m"),
        [(0, 0.9, F, ["fire"]), (15, 0.5, OK, ["resolve"]), (30, 0.9, P, ["suppressed"])],
    )
    assert [d.dry_run for d in run.decisions or []] == [True, True, True]
    wet = drive(make_policy(for_=1), [(0, 0.9, F, ["fire"])])
    assert [d.dry_run for d in wet.decisions or []] == [False]


def test_decision_ids_are_deterministic_and_shared_by_an_incident() -> None:
    steps: list[Step] = [
        (100, 0.9, P, []),
        (115, 0.9, P, []),
        (130, 0.9, F, ["fire"]),
        (145, 0.1, OK, ["resolve"]),
        (160, 0.9, P, []),
    ]
    first = drive(make_policy(), steps).decisions or []
    second = drive(make_policy(), steps).decisions or []
    assert [d.id for d in first] == [d.id for d in second]
    fire, resolve = first
    assert fire.id == resolve.id == decision_id("table", "slow", A, 100.0)
    assert fire.onset == 100 and fire.at == 130
    assert [a.idempotency_key for a in fire.actions] == [f"{fire.id}:fire:0"]
    assert decision_id("table", "slow", A, 100) == fire.id  # an int onset names the same incident
    assert decision_id("table", "slow", B, 100.0) != fire.id
    assert decision_id("table", "slow", A, 115.0) != fire.id


def test_suppressed_and_later_fire_share_the_incident_id() -> None:
    run = drive(
        make_policy(for_=1, cooldown="10m"),
        [
            (0, 0.9, F, ["fire"]),
            (15, 0.5, OK, ["resolve"]),
            (30, 0.9, P, ["suppressed"]),
            (600, 0.9, F, ["fire"]),
        ],
    )
    decisions = run.decisions or []
    assert decisions[2].id == decisions[3].id == decision_id("table", "slow", A, 30.0)
    assert decisions[2].actions == ()
    assert decisions[2].reason.startswith("breach held for 1 consecutive evaluations but cooldown:")


def test_errored_decision_explains_the_source_error() -> None:
    steps: list[Step] = [(0, 0.9, P, []), (15, ERR, P, []), (30, ERR, OK, ["errored"])]
    run = drive(make_policy(max_source_errors=1), steps)
    errored = (run.decisions or [])[0]
    assert errored.reason == "2 consecutive source errors (limit 1): connection refused"
    assert errored.actions == () and errored.value is None


def test_targets_appear_and_disappear_independently() -> None:
    run = Run(make_policy(for_=2, stale_after="30s"))
    steps: list[tuple[float, dict[TargetKey, Obs], list[tuple[str, str]]]] = [
        (0, {A: 0.9}, []),
        (15, {A: 0.9, B: 0.9}, [("fire", "a")]),
        (30, {B: 0.9}, [("fire", "b")]),
        (45, {B: 0.1}, [("resolve", "b")]),
        (60, {}, []),
        (75, {}, []),
        (90, {}, []),
    ]
    for now, observations, expected in steps:
        decisions = run.step(now, observations)
        assert [(d.kind.value, dict(d.target)["service"]) for d in decisions] == expected
    assert run.phase(A) == F  # absence never resolves
    assert run.phase(B) == GONE  # idle and stale


def test_multiple_conditions_on_one_signal() -> None:
    warn = {
        "name": "warn",
        "signal": "p99",
        "when": {"op": ">", "value": 0.5},
        "for": 1,
        "noData": "hold",
        "actions": [{"type": "notify", "receiver": "team"}],
    }
    run = Run(make_policy(for_=2, extra_conditions=[warn]))
    kinds = []
    for now, value in [(0, 0.6), (15, 0.9), (30, 0.9), (45, 0.4)]:
        kinds.append([(d.condition, d.kind.value) for d in run.step(now, {A: value})])
    assert kinds == [
        [("warn", "fire")],
        [],
        [("slow", "fire")],
        [("slow", "resolve"), ("warn", "resolve")],
    ]


def test_rendered_action_params() -> None:
    actions: list[dict[str, Any]] = [
        {
            "type": "annotate",
            "text": "{{ policy }}/{{ condition }} {{ target }} in {{ namespace }}: "
            "{{ value }} > {{ threshold }} onset {{ onset }} id {{ decision_id }}",
            "tags": ["{{ service }}", "fixed"],
        },
        {"type": "scale", "targetPerReplica": 20, "max": 8},
        {"type": "shift_traffic", "version": "{{ service }}-canary", "weight": 5},
        {"type": "notify", "receiver": "team"},
    ]
    run = Run(make_policy(for_=1, actions=actions))
    (fire,) = run.step(1_700_000_000.25, {A: 1234567.891})
    annotate, scale, shift, notify = fire.actions
    assert annotate.params == {
        "text": f'table/slow {{service="a"}} in llm: 1.235e+06 > 0.8 onset 1700000000.250 id {fire.id}',
        "tags": ["a", "fixed"],
    }
    assert scale.params == {
        "service": "a",
        "replicas": None,
        "delta": None,
        "targetPerReplica": 20.0,
        "min": 1,
        "max": 8,
        "observed": 1234567.891,
    }
    assert shift.params == {"service": "a", "version": "a-canary", "weight": 5}
    assert notify.params == {"receiver": "team", "message": 'table/slow on {service="a"}: 1.235e+06'}
    assert [a.mutating for a in fire.actions] == [False, True, True, False]
    assert [a.idempotency_key for a in fire.actions] == [f"{fire.id}:fire:{i}" for i in range(4)]


@pytest.mark.parametrize(("value", "text"), [(0.91234, "0.9123"), (12.0, "12"), (1e9, "1e+09")])
def test_value_formatting(value: float, text: str) -> None:
    run = Run(make_policy(for_=1, actions=[{"type": "annotate", "text": "{{ value }}"}]))
    (fire,) = run.step(0, {A: value})
    assert fire.actions[0].params["text"] == text


def test_no_data_breach_renders_value_as_no_data() -> None:
    run = Run(make_policy(for_=1, no_data="breach", actions=[{"type": "annotate", "text": "v={{ value }}"}]))
    run.step(0, {A: 0.1})
    (fire,) = run.step(15, {})
    assert fire.value is None and fire.actions[0].params["text"] == "v=no-data"


def test_unqueried_signal_is_a_source_error_not_a_breach() -> None:
    policy = make_policy(for_=1, max_source_errors=1)
    state, _ = transition(policy, {"p99": result({A: 0.5})}, PolicyState(), 0)
    for now in (15, 30):
        state, decisions = transition(policy, {}, state, now)
    assert [d.kind for d in decisions] == [DecisionKind.ERRORED]
    assert "signal was not queried" in decisions[0].reason
    assert state.condition("slow", A).phase is Phase.OK


def test_transition_does_not_mutate_its_input_state() -> None:
    policy = make_policy(for_=1)
    before, _ = transition(policy, {"p99": result({A: 0.5})}, PolicyState(), 0)
    snapshot = yaml.safe_dump(before.to_json())
    transition(policy, {"p99": result({A: 0.9})}, before, 15)
    assert yaml.safe_dump(before.to_json()) == snapshot
    assert before.evaluations == 1
