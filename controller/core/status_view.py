"""What `GET /api/v1/status`, `tailguard status` and the status page show: per policy and target, the phase,
the last value against the threshold, the streak, the cooldown left, the budget used, and whether the policy
is suspended or paused (by whom, why); and the open incidents (controller/core/incidents.py) with their stage and
next step. Pure: built from the policies, their engine states, the controls and the incidents.

Phase of a (condition, target): `errored` (its source failed past `maxSourceErrors`), `stale` (firing on data
older than `staleAfter`), else the engine's `ok` / `pending` / `firing`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tailguard.controller.core.controls import Controls
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.incidents import Incident
from tailguard.controller.core.limits import cooling, in_budget_window
from tailguard.controller.core.model import target_labels
from tailguard.controller.core.policy import Condition, ForSpec, Policy
from tailguard.controller.core.source_health import SourceHealth, health_json

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
                **_condition_terms(policy, condition),
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
        # The policy's own pause, apart from the kill switch (which `paused` shows first): lifting the kill switch
        # leaves this one in force.
        "policyPause": own.to_json() if (own := controls.latest.get(name)) is not None and own.paused else None,
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
    health: Mapping[str, SourceHealth] | None = None,
    incidents: Sequence[Incident] = (),
) -> dict[str, Any]:
    killed = controls.killed
    return {
        "version": STATUS_VERSION,
        "now": now,
        # First: whether the controller can see at all (controller/core/source_health.py).
        "health": health_json(health or {}),
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


# The opposite of a breach comparison: what "the threshold does not hold" means (a recovery without its own `when`).
_NEGATION = {">": "<=", ">=": "<", "<": ">=", "<=": ">"}
# Prometheus' naming convention puts the base unit at the end of a metric's name (before _bucket/_sum/_count/_total).
_UNIT_SUFFIXES = (("_seconds", "s"), ("_bytes", "B"), ("_ratio", "ratio"), ("_percent", "%"), ("_perc", "ratio"))


def signal_unit(policy: Policy, signal_name: str) -> str:
    """The unit of a signal's values, for people: a `predict` signal is a probability; a query's from the metric
    names it reads (Prometheus' convention: `_seconds`, `_bytes`, `_ratio`), '' when they do not say or disagree."""
    signal = next((s for s in policy.signals if s.name == signal_name), None)
    if signal is None:
        return ""
    if signal.predict is not None:
        return "probability"
    names = re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", signal.query or "")
    units = {
        unit
        for name in names
        for suffix, unit in _UNIT_SUFFIXES
        if re.search(rf"{suffix}(_bucket|_sum|_count|_total)?$", name)
    }
    return units.pop() if len(units) == 1 else ""


def describe_for(spec: ForSpec) -> str:
    if spec.count is not None:
        return f"{spec.count} evaluation{'s' if spec.count != 1 else ''}"
    return f"{spec.seconds:g} s" if spec.seconds is not None else ""


def _condition_terms(policy: Policy | None, condition: Condition | None) -> dict[str, Any]:
    """What the condition means, spelled for a person: when it fires, what ends it, in which unit."""
    if policy is None or condition is None:
        return {}
    recovery = condition.recovery
    recover_op = recovery.when.op.value if recovery.when is not None else _NEGATION[condition.when.op.value]
    recover_value = recovery.when.value if recovery.when is not None else condition.when.value
    return {
        "signal": condition.signal,
        "unit": signal_unit(policy, condition.signal),
        "for": describe_for(condition.for_),
        "recoverOp": recover_op,
        "recoverThreshold": recover_value,
        "recoverFor": describe_for(recovery.for_),
    }
