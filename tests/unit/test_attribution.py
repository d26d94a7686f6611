"""Attribution and the rollback-or-scale choice, as tables over the pure engine."""

from __future__ import annotations

from typing import Any

import pytest

from tailguard.controller.core.attribution import (
    AttributedDecision,
    AttributionStatus,
    Rollout,
    attribute,
    attribution_of,
    describe_diff,
)
from tailguard.controller.core.engine import PolicyState, transition
from tailguard.controller.core.model import Decision, DecisionKind, SignalResult, target_key
from tailguard.controller.core.policy import AttributionSpec, Policy
from tailguard.controller.core.policy_files import parse_policy_text

ONSET = 1_700_000_000.0
WEB = target_key({"service": "web"})
API = target_key({"service": "api"})


def policy_doc(**condition_extra: Any) -> dict[str, Any]:
    condition: dict[str, Any] = {
        "name": "p99-high",
        "signal": "p99",
        "when": {"op": ">", "value": 0.8},
        "for": 1,
        "noData": "hold",
        "attribution": {"window": "30m", "labels": ["service"]},
        "choose": [
            {
                "name": "rollback-the-rollout",
                "if": {"attributedToRollout": True},
                "actions": [
                    {"type": "rollback", "service": "{{ service }}"},
                    {"type": "annotate", "text": "{{ branch }} [{{ rollout_revision }}: {{ rollout_diff }}]"},
                ],
            },
            {
                "name": "scale-out",
                "if": {"signal": "queue", "op": ">", "value": 20},
                "actions": [{"type": "scale", "service": "{{ service }}", "delta": 1, "max": 8}],
            },
            {"name": "notify", "actions": [{"type": "notify", "receiver": "oncall"}]},
        ],
    }
    condition.update(condition_extra)
    return {
        "apiVersion": "tailguard.io/v1alpha1",
        "kind": "Policy",
        "name": "attributed",
        "targets": {"groupBy": ["service"]},
        "signals": [{"name": "p99", "query": "p99_query"}, {"name": "queue", "query": "queue_query"}],
        "conditions": [condition],
        "limits": {"cooldown": "0s", "maxActionsPerHour": 100},
    }


POLICY = Policy.model_validate(policy_doc())


def rollout(revision: str, at: float, service: str = "web", **diff: tuple[Any, Any]) -> Rollout:
    return Rollout(
        labels={"service": service},
        revision=revision,
        previous_revision=None,
        at=at,
        source="argocd",
        diff={name: {"from": old, "to": new} for name, (old, new) in diff.items()},
    )


def fire(
    rollouts: list[Rollout], queue: float | None = 5.0, *, rollouts_error: str | None = None, policy: Policy = POLICY
) -> Decision:
    observations = {
        "p99": SignalResult({WEB: 1.5}),
        "queue": SignalResult({WEB: queue} if queue is not None else {}),
    }
    _, decisions = transition(policy, observations, PolicyState(), ONSET, rollouts, rollouts_error=rollouts_error)
    assert len(decisions) == 1 and decisions[0].kind is DecisionKind.FIRE
    return decisions[0]


@pytest.mark.parametrize(
    ("rollouts", "queue", "branch", "revision"),
    [
        pytest.param([rollout("r7", ONSET - 42)], 5.0, "rollback-the-rollout", "r7", id="inside-window"),
        pytest.param([rollout("r7", ONSET - 1800)], 5.0, "rollback-the-rollout", "r7", id="window-edge"),
        pytest.param([rollout("r7", ONSET - 1801)], 5.0, "notify", None, id="outside-window"),
        pytest.param([rollout("r7", ONSET + 5)], 5.0, "notify", None, id="after-onset"),
        pytest.param([rollout("r7", ONSET - 42, service="api")], 5.0, "notify", None, id="other-target"),
        pytest.param(
            [rollout("r6", ONSET - 600), rollout("r8", ONSET + 10), rollout("r7", ONSET - 60)],
            5.0,
            "rollback-the-rollout",
            "r7",
            id="most-recent-before-onset",
        ),
        pytest.param([], 35.0, "scale-out", None, id="no-rollout-saturated"),
        pytest.param([rollout("r7", ONSET - 42)], 35.0, "rollback-the-rollout", "r7", id="rollout-beats-scale"),
        pytest.param([], 5.0, "notify", None, id="neither"),
        pytest.param([], None, "notify", None, id="saturation-no-data"),
    ],
)
def test_attribution_table(rollouts: list[Rollout], queue: float | None, branch: str, revision: str | None) -> None:
    decision = fire(rollouts, queue)
    assert isinstance(decision, AttributedDecision)
    assert decision.branch is not None and decision.branch.name == branch
    assert decision.attribution is not None
    attributed = decision.attribution.rollout
    assert (attributed.revision if attributed else None) == revision
    types = [action.type.value for action in decision.actions]
    expected = {"rollback-the-rollout": ["rollback", "annotate"], "scale-out": ["scale"], "notify": ["notify"]}
    assert types == expected[branch]


def test_reason_and_annotation_text_name_the_rollout_the_diff_and_the_choice() -> None:
    decision = fire([rollout("r7", ONSET - 42, max_num_seqs=(64, 2))])
    assert (
        decision.reason == "> 0.8 for 1 consecutive evaluations; attributed to rollout r7 (max_num_seqs 64 -> 2) "
        "42 s before onset -> rollback-the-rollout"
    )
    rollback, annotate = decision.actions
    assert rollback.params["rollout_revision"] == "r7"
    assert annotate.params["text"] == (
        "attributed to rollout r7 (max_num_seqs 64 -> 2) 42 s before onset -> rollback-the-rollout "
        "[r7: max_num_seqs 64 -> 2]"
    )


def test_scale_reason_says_why_not_rollback() -> None:
    decision = fire([], 35.0)
    assert isinstance(decision, AttributedDecision) and decision.branch is not None
    assert decision.branch.reason == (
        "not rollback-the-rollout (not attributed (no rollout of service=web within 30m before onset)); "
        "queue 35 > 20 -> scale-out"
    )


def test_change_source_error_is_unknown_never_attributed() -> None:
    decision = fire([rollout("r7", ONSET - 42)], 5.0, rollouts_error="argocd: HTTP 500")
    assert isinstance(decision, AttributedDecision) and decision.attribution is not None
    assert decision.attribution.status is AttributionStatus.UNKNOWN
    assert decision.attribution.reason == "unknown (change source error: argocd: HTTP 500)"
    assert decision.branch is not None and decision.branch.name == "notify"


def test_to_json_only_adds_keys_and_round_trips_the_rollout() -> None:
    decision = fire([rollout("r7", ONSET - 42, max_num_seqs=(64, 2))])
    body = decision.to_json()
    plain = Decision.to_json(decision)
    assert {k: v for k, v in body.items() if k in plain} == plain
    assert set(body) - set(plain) == {"attribution", "branch"}
    assert body["branch"]["name"] == "rollback-the-rollout"
    recovered = attribution_of(body)
    assert recovered is not None and recovered.revision == "r7" and recovered.at == ONSET - 42


def test_conditions_without_attribution_keep_plain_decisions() -> None:
    doc = policy_doc(choose=None, attribution=None, actions=[{"type": "rollback"}])
    del doc["conditions"][0]["choose"], doc["conditions"][0]["attribution"]
    decision = fire([rollout("r7", ONSET - 42)], policy=Policy.model_validate(doc))
    assert type(decision) is Decision
    assert "attribution" not in decision.to_json()
    assert "rollout_revision" not in decision.actions[0].params


def test_attribution_without_choose_is_recorded_and_actions_run() -> None:
    doc = policy_doc(actions=[{"type": "annotate", "text": "suspect {{ rollout_revision }}"}])
    del doc["conditions"][0]["choose"]
    decision = fire([rollout("r7", ONSET - 42)], policy=Policy.model_validate(doc))
    assert isinstance(decision, AttributedDecision) and decision.branch is None
    assert decision.actions[0].params["text"] == "suspect r7"


def test_no_branch_holds_runs_nothing_and_says_why() -> None:
    doc = policy_doc()
    doc["conditions"][0]["choose"] = doc["conditions"][0]["choose"][:2]
    decision = fire([], 5.0, policy=Policy.model_validate(doc))
    assert decision.actions == ()
    assert decision.branch is not None and decision.branch.reason.endswith("-> no branch holds, no action")


def test_attribute_tie_in_time_is_independent_of_order() -> None:
    spec = AttributionSpec(window=60, labels=["service"])
    a, b = rollout("r1", ONSET - 10), rollout("r2", ONSET - 10)
    assert attribute(spec, {"service": "web"}, ONSET, [a, b]) == attribute(spec, {"service": "web"}, ONSET, [b, a])


def test_describe_diff_is_bounded() -> None:
    diff = {f"arg{i}": {"from": i, "to": i + 1} for i in range(6)}
    assert describe_diff(diff) == "arg0 0 -> 1, arg1 1 -> 2, arg2 2 -> 3, arg3 3 -> 4, +2 more"
    assert describe_diff({}) == "no engine-argument change recorded"


BASE = """apiVersion: tailguard.io/v1alpha1
kind: Policy
name: p
targets: {groupBy: [service]}
signals:
  - {name: p99, query: q}
conditions:
  - name: c
    signal: p99
    when: {op: ">", value: 1}
    for: 1
    noData: hold
"""


@pytest.mark.parametrize(
    ("tail", "field", "message"),
    [
        (
            (
                "    attribution: {labels: [service]}\n    choose:\n      - name: a\n"
                "        actions: [{type: rollback}]\n"
                "      - name: b\n        if: {attributedToRollout: true}\n        actions: [{type: rollback}]\n"
            ),
            "conditions[0].choose[0]",
            "branch 'a' has no `if` (otherwise) but is not the last branch; the branches after it could never run",
        ),
        (
            (
                "    choose:\n      - name: a\n        if: {signal: nope, op: '>', value: 1}\n"
                "        actions: [{type: rollback}]\n"
            ),
            "conditions[0].choose[0].if.signal",
            "undefined signal 'nope'; expected one of p99",
        ),
        (
            (
                "    choose:\n      - name: a\n        if: {attributedToRollout: true}\n"
                "        actions: [{type: rollback}]\n"
            ),
            "conditions[0].choose[0].if.attributedToRollout",
            "`attributedToRollout` needs the condition's `attribution` (window and labels)",
        ),
        (
            "    actions: [{type: rollback}]\n    choose:\n      - name: a\n        actions: [{type: rollback}]\n",
            "conditions[0]",
            "a condition needs exactly one of `actions` (a non-empty list) or `choose` (branches)",
        ),
        (
            "    attribution: {labels: [zone]}\n    actions: [{type: rollback}]\n",
            "conditions[0].attribution.labels[0]",
            "attribution label 'zone' is not a target label; expected one of service",
        ),
        (
            "    choose:\n      - name: a\n        if: {signal: p99, op: '>'}\n        actions: [{type: rollback}]\n",
            "conditions[0].choose[0].if",
            "a signal test needs all of `signal`, `op` and `value`",
        ),
    ],
)
def test_invalid_choose_is_located(tail: str, field: str, message: str) -> None:
    _, errors = parse_policy_text(BASE + tail, "p.yaml")
    assert len(errors) == 1, errors
    assert (errors[0].field, errors[0].message) == (field, message)


def test_example_policy_is_valid() -> None:
    from pathlib import Path

    from tailguard.controller.core.policy_files import load_policies

    path = Path(__file__).resolve().parents[2] / "rules" / "examples" / "attributed-rollback-or-scale.yaml"
    policies, errors = load_policies([path])
    assert errors == [] and len(policies) == 1
    condition = policies[0].policy.conditions[0]
    assert condition.attribution is not None
    assert [branch.name for branch in condition.choose or []] == ["rollback-the-rollout", "scale-out", "notify"]
