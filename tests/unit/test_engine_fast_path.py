"""The engine's fast path for healthy targets in phase OK (engine.FAST_HEALTHY) leaves byte-identical state.

A seeded random run (breaches, recoveries, no-data, source errors, targets coming and going, several conditions
with hysteresis and cooldowns) is driven twice, fast path on and off; every step's PolicyState JSON and decisions
must be the same bytes; and again with the fast paths computed ahead of transition (prepare_condition).
"""

from __future__ import annotations

import json
import random

import pytest

from tailguard.controller.core import engine
from tailguard.controller.core.engine import PolicyState, PreparedCondition, held_targets, prepare_condition, transition
from tailguard.controller.core.model import SignalResult, TargetKey
from tailguard.controller.core.policy import Policy

TARGETS: list[TargetKey] = [(("service", f"svc-{i}"),) for i in range(12)]


def _policy() -> Policy:
    return Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": "fast",
            "targets": {"groupBy": ["service"], "match": {"namespace": "llm"}},
            "signals": [{"name": "p99", "query": "p99{ {{ selector }} }"}, {"name": "err", "query": "err"}],
            "conditions": [
                {
                    "name": "slow",
                    "signal": "p99",
                    "when": {"op": ">", "value": 0.8},
                    "for": 2,
                    "noData": "hold",
                    "staleAfter": "1m",
                    "maxSourceErrors": 2,
                    "recovery": {"when": {"op": "<", "value": 0.6}, "for": 2},
                    "actions": [{"type": "rollback"}],
                },
                {
                    "name": "errors",
                    "signal": "err",
                    "when": {"op": ">=", "value": 0.5},
                    "for": 1,
                    "noData": "ok",
                    "actions": [{"type": "rollback"}],
                },
            ],
            "limits": {"cooldown": "30s", "maxActionsPerHour": 5},
        }
    )


def _observations(rng: random.Random) -> dict[str, SignalResult]:
    answers: dict[str, SignalResult] = {}
    for signal in ("p99", "err"):
        if rng.random() < 0.05:
            answers[signal] = SignalResult.failed("connection refused")
            continue
        values: dict[TargetKey, float] = {}
        for target in TARGETS:
            roll = rng.random()
            if roll < 0.1:
                continue  # absent
            values[target] = rng.choice([0.1, 0.5, 0.7, 0.9, 1.5]) if roll < 0.5 else rng.uniform(0.0, 0.75)
        if rng.random() < 0.05:
            values[TARGETS[0]] = float("nan")
        answers[signal] = SignalResult(values)
    return answers


def _prepared(
    policy: Policy,
    observations: dict[str, SignalResult],
    state: PolicyState,
    now: float,
    stale: PolicyState | None,
) -> dict[str, PreparedCondition]:
    """The conditions' fast paths computed ahead, as the evaluation does while queries are in flight (last
    condition first); every third step the first one is computed from another (empty) state: never used."""
    held = held_targets(state)
    prepared = {
        condition.name: prepare_condition(condition, observations.get(condition.signal), state, held, now)
        for condition in reversed(policy.conditions)
    }
    if stale is not None:
        first = policy.conditions[0]
        prepared[first.name] = prepare_condition(first, observations.get(first.signal), stale, held_targets(stale), now)
    return prepared


def _run(seed: int, monkeypatch: pytest.MonkeyPatch, fast: bool, ahead: bool = False) -> list[str]:
    monkeypatch.setattr(engine, "FAST_HEALTHY", fast)
    rng = random.Random(seed)
    policy = _policy()
    state = PolicyState()
    trail: list[str] = []
    for step in range(150):
        now = 1_700_000_000.0 + 15.0 * step
        observations = _observations(rng)
        prepared = (
            _prepared(policy, observations, state, now, PolicyState() if step % 3 == 0 else None) if ahead else None
        )
        state, decisions = transition(policy, observations, state, now, prepared=prepared)
        trail.append(json.dumps(state.to_json(), sort_keys=False))
        trail.append(json.dumps([decision.to_json() for decision in decisions]))
    return trail


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fast_path_state_is_byte_identical_to_the_slow_path(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    slow = _run(seed, monkeypatch, fast=False)
    fast = _run(seed, monkeypatch, fast=True)
    assert fast == slow
    assert _run(seed, monkeypatch, fast=True, ahead=True) == slow  # fast paths computed ahead (evaluation.py)
    # the run exercised more than the healthy path
    assert any('"firing"' in line for line in slow)
    assert any('"pending"' in line for line in slow)
