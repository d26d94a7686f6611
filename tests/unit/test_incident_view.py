"""The status page's incident view, piece by piece (controller/app/incident_view.py): durations, values in their
unit, the condition and recovery as rules, the action's detail from the adapters' plans and results, the next
action, and the sparkline."""

from __future__ import annotations

import pytest

from tailguard.controller.app.incident_view import (
    action_text,
    condition_text,
    human_duration,
    incidents_section,
    next_action_text,
    recovery_text,
    sparkline,
    with_unit,
)
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.status_view import signal_unit


@pytest.mark.parametrize(
    ("seconds", "text"), [(592.2, "9 m 52 s"), (45, "45 s"), (7500, "2 h 5 m"), (0, "-"), (None, "-")]
)
def test_human_duration(seconds: float | None, text: str) -> None:
    assert human_duration(seconds) == text


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [(0.4756, "s", "476 ms"), (2.5, "s", "2.5 s"), (0.125, "ratio", "12.5 %"), (0.62, "probability", "62 %"),
     (3 * 2**30, "B", "3 GiB"), (17.0, "", "17"), (None, "s", "-")],
)  # fmt: skip
def test_values_in_their_unit(value: float | None, unit: str, text: str) -> None:
    assert with_unit(value, unit) == text


def test_the_condition_reads_as_a_rule_not_a_comparison_with_the_value() -> None:
    target = {"op": ">", "threshold": 0.8, "unit": "s", "for": "2 evaluations", "value": 0.4756,
              "recoverOp": "<=", "recoverThreshold": 0.8, "recoverFor": "2 evaluations"}  # fmt: skip
    assert condition_text(target) == "fires when > 800 ms for 2 evaluations"
    assert recovery_text(target) == "recovers when <= 800 ms for 2 evaluations"


def test_the_unit_comes_from_the_metric_names() -> None:
    def policy(query: str) -> Policy:
        return Policy.model_validate({
            "apiVersion": "tailguard.io/v1alpha1", "kind": "Policy", "name": "p", "targets": {"groupBy": ["service"]},
            "signals": [{"name": "s", "query": query}],
            "conditions": [{"name": "c", "signal": "s", "when": {"op": ">", "value": 1}, "for": 1, "noData": "hold",
                            "actions": [{"type": "annotate", "text": "x"}]}],
        })  # fmt: skip

    latency = "histogram_quantile(0.99, rate(vllm:e2e_request_latency_seconds_bucket[1m]))"
    assert signal_unit(policy(latency), "s") == "s"
    assert signal_unit(policy("sum(rate(errors_total[1m])) / sum(rate(requests_total[1m]))"), "s") == ""
    assert signal_unit(policy("x_bytes / y_seconds"), "s") == "", "two units: none claimed"


def test_the_action_detail_from_plans_and_results() -> None:
    rollback = {
        "type": "rollback",
        "params": {"service": "chat", "rollout_revision": "2"},
        "plan": {"service": "chat", "from_revision": 2, "to_revision": 1},
        "result": {"image": "vllm:0.6.3"},
    }
    assert action_text(rollback) == "rollback chat: r2 -> r1, image vllm:0.6.3"
    moved = {"from": {"minReplicas": 2}, "to": {"minReplicas": 3}}
    scale = {"type": "scale", "params": {"service": "chat"}, "result": moved}
    assert action_text(scale) == "scale chat: minReplicas 2 -> 3"
    shift = {"type": "shift_traffic", "params": {"service": "chat", "weights": {"stable": 100, "canary": 0}}}
    assert action_text(shift) == "shift_traffic chat: weights {'stable': 100, 'canary': 0}"


def test_the_next_action_says_why_none_may_come() -> None:
    target = {"cooldownLeft": 592.2, "budget": 3, "budgetUsed": 1}
    assert next_action_text({}, target, None) == "cooldown 9 m 52 s (then, if it still breaches)"
    assert next_action_text({}, {"budget": 3, "budgetUsed": 3}, None).startswith("none this hour")
    paused = {"policyPause": {"by": "alice", "reason": "INC-7"}}
    assert next_action_text(paused, target, None) == "none while the policy is paused (by alice: INC-7)"
    assert next_action_text({}, target, {"by": "oncall", "reason": "freeze"}).startswith("none while the kill switch")


def test_a_firing_target_is_an_incident_card_with_its_commands_and_a_sparkline() -> None:
    document = {
        "policies": [{"name": "p99", "targets": [{"phase": "firing", "condition": "slow", "target": {"service": "chat"},
                      "decisionId": "abc", "value": 0.97, "op": ">", "threshold": 0.8, "unit": "s"}]}],
        "decisions": [{"id": "abc", "kind": "fire", "evidence": [[1.0, 0.9], [16.0, 0.97]], "action_records": []}],
    }  # fmt: skip
    page = incidents_section(document)
    assert 'data-incident="abc"' in page and "<svg" in page
    assert 'kubectl tailguard abort abc --reason "..."' in page and 'kubectl tailguard pause p99' in page
    assert incidents_section({"policies": [], "decisions": []}).endswith("none: nothing is firing</p>")
    assert sparkline([[1.0, 0.5]], 0.8, "s") == "", "one point is no line"
