"""What `GET /api/v1/status`, `tailguard status` and the status page show: per policy and target, the phase,
the last value against the threshold, the streak, the cooldown left, the budget used, and whether the policy
is suspended or paused (by whom, why); and the open incidents (controller/core/incidents.py) with their stage and
next step. Pure: built from the policies, their engine states, the controls and the incidents.

Phase of a (condition, target): `errored` (its source failed past `maxSourceErrors`), `stale` (firing on data
older than `staleAfter`), else the engine's `ok` / `pending` / `firing`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from controller.core.controls import Controls
from controller.core.engine import PolicyState
from controller.core.incidents import Incident
from controller.core.limits import cooling, in_budget_window
from controller.core.model import target_labels
from controller.core.policy import Policy

STATUS_VERSION = 1


def _number(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def policy_status(policy: Policy, state: PolicyState, controls: Controls, now: float) -> dict[str, Any]:
    return _status(policy.name, policy, state, controls, now)


def journal_policy_status(name: str, state: PolicyState, controls: Controls, now: float) -> dict[str, Any]:
    """A policy's status from its journaled state alone (`tailguard status --journal` without the policy files):
    no threshold, cooldown or budget limit is known."""
    return _status(name, None, state, controls, now)


def _status(name: str, policy: Policy | None, state: PolicyState, controls: Controls, now: float) -> dict[str, Any]:
    pause = controls.pause_of(name)
    targets: list[dict[str, Any]] = []
    for (condition_name, target), condition_state in sorted(state.conditions.items()):
        condition = None
        if policy is not None:
            condition = next((c for c in policy.conditions if c.name == condition_name), None)
            if condition is None:
                continue
        phase = condition_state.phase.value
        if condition_state.errored:
            phase = "errored"
        elif condition_state.stale:
            phase = "stale"
        times = state.actions_at.get(target, ())
        cool = cooling(times, now, policy.limits.cooldown) if policy is not None else None
        targets.append(
            {
                "condition": condition_name,
                "target": target_labels(target),
                "phase": phase,
                "value": _number(condition_state.last_value),
                "op": condition.when.op.value if condition is not None else None,
                "threshold": condition.when.value if condition is not None else None,
                "observedAt": condition_state.last_data_at,
                "streak": condition_state.breach_count,
                "onset": condition_state.onset,
                "cooldownLeft": round(cool.left, 3) if cool is not None else 0.0,
                "budgetUsed": len(in_budget_window(times, now)),
                "budget": policy.limits.maxActionsPerHour if policy is not None else None,
                "decisionId": condition_state.decision_id,
                "firedAt": condition_state.fired_at,
            }
        )
    return {
        "name": name,
        "description": policy.description if policy is not None else "",
        "interval": policy.interval if policy is not None else None,
        "dryRun": policy.dryRun if policy is not None else None,
        "suspended": (policy is not None and policy.suspend) or pause is not None,
        "suspend": policy.suspend if policy is not None else None,
        "paused": pause.to_json() if pause is not None else None,
        "evaluations": state.evaluations,
        "lastEvaluatedAt": state.last_evaluated_at,
        "targets": targets,
    }


def status_document(
    policies: Mapping[str, Policy],
    states: Mapping[str, PolicyState],
    controls: Controls,
    now: float,
    *,
    decisions: Sequence[Mapping[str, Any]] = (),
    recent_controls: Sequence[Mapping[str, Any]] = (),
    leader: Mapping[str, Any] | None = None,
    links: Mapping[str, str] | None = None,
    incidents: Sequence[Incident] = (),
) -> dict[str, Any]:
    killed = controls.killed
    return {
        "version": STATUS_VERSION,
        "now": now,
        "leader": dict(leader) if leader is not None else None,
        "killSwitch": killed.to_json() if killed is not None else None,
        "policies": [
            policy_status(policy, states.get(name, PolicyState()), controls, now)
            for name, policy in sorted(policies.items())
        ],
        "decisions": [dict(decision) for decision in decisions],
        "controls": [dict(control) for control in recent_controls],
        "links": dict(links or {}),
        "incidents": [incident_status(incident) for incident in incidents],
    }


def incident_status(incident: Incident) -> dict[str, Any]:
    """An open incident as the status shows it: its scope, phase, cause, last action, stage and next step (the
    columns of `kubectl get tgi`), what fired, and what it found."""
    summary = incident.summary()
    return {
        "id": incident.id,
        "service": incident.service,
        "scope": dict(incident.scope),
        "openedAt": incident.opened_at,
        "phase": incident.phase.value,
        "cause": summary["cause"],
        "action": summary["action"],
        "stage": incident.stage,
        "next": incident.next_step,
        "policies": list(incident.policies),
        "notes": list(incident.notes),
    }
