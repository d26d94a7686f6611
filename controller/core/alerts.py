"""Alertmanager alerts -> the policies they wake and the targets they name: one rule for the live API
(controller/app/api.py, `POST /api/v1/alerts`) and the backtest's recorded alerts (controller/tools/backtest.py).

Matching rule, alert -> policies (`policies_for_alert`):

1. if the alert carries a `tailguard_policy` label, only the policy of that name is considered (an explicit
   route wins; it must still pass 2 and 3);
2. every `targets.match` label of the policy is present in the alert's labels with exactly the same value
   (a policy without `match` passes);
3. every `targets.groupBy` label of the policy is present in the alert's labels (an alert that cannot name one
   of the policy's targets is about something else: a `service`-level policy is not woken by a node alert).

The evaluation an alert triggers touches only the targets the alerts name (`alert_target`: the values of the
policy's `groupBy` labels in the alert); `alert_scopes` gathers them per policy for a batch of alerts (one post).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tailguard.controller.core.model import TargetKey, target_key
from tailguard.controller.core.policy import Policy
from tailguard.controller.kit.errors import InputError

POLICY_LABEL = "tailguard_policy"


class _Payload(BaseModel):
    # Alertmanager adds fields over time; unknown ones are ignored, the ones used are checked.
    model_config = ConfigDict(extra="ignore", frozen=True)


class AlertmanagerAlert(_Payload):
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str = ""
    endsAt: str = ""
    generatorURL: str = ""
    fingerprint: str = ""


class AlertmanagerPayload(_Payload):
    """Alertmanager's webhook body, version 4 (the only version Alertmanager has ever sent)."""

    version: Literal["4"]
    status: Literal["firing", "resolved"]
    receiver: str = ""
    groupKey: str = ""
    truncatedAlerts: int = 0
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[AlertmanagerAlert]


class PayloadError(InputError, ValueError):
    """A webhook body that is not an Alertmanager v4 payload; the message says what is wrong, never the body."""


def parse_alertmanager_payload(body: bytes) -> AlertmanagerPayload:
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as bad:
        raise PayloadError(f"body is not valid JSON: {bad}") from None
    return alertmanager_payload(raw)


def alertmanager_payload(raw: object) -> AlertmanagerPayload:
    """An Alertmanager v4 payload from its decoded JSON; PayloadError says what is wrong (never the values)."""
    if not isinstance(raw, dict):
        raise PayloadError("expected a JSON object (an Alertmanager webhook payload)")
    version = raw.get("version")
    if version != "4":
        got = "missing" if version is None else repr(version)[:20]
        raise PayloadError(f'unsupported payload version {got}: expected "4" (Alertmanager webhook v4)')
    try:
        return AlertmanagerPayload.model_validate(raw)
    except ValidationError as invalid:
        # Field paths and messages only: the offending values may carry secrets (annotations, URLs).
        problems = [
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in invalid.errors()[:10]
        ]
        raise PayloadError("invalid Alertmanager payload: " + "; ".join(problems)) from None


def policy_matches_alert(policy: Policy, labels: Mapping[str, str]) -> bool:
    """Rules 1-3 of the module docstring for one policy and one alert's labels."""
    wanted = labels.get(POLICY_LABEL)
    if wanted is not None and wanted != policy.name:
        return False
    if any(labels.get(name) != value for name, value in policy.targets.match.items()):
        return False
    return all(name in labels for name in policy.targets.groupBy)


def policies_for_alert(policies: Mapping[str, Policy], labels: Mapping[str, str]) -> list[str]:
    return sorted(name for name, policy in policies.items() if policy_matches_alert(policy, labels))


def alert_target(policy: Policy, labels: Mapping[str, str]) -> TargetKey:
    """The one target of `policy` an alert that matches it names: its `targets.groupBy` labels (rule 3). A policy
    without `groupBy` has one target, (), which every matching alert names."""
    return target_key({name: labels[name] for name in policy.targets.groupBy})


def alert_scopes(policies: Mapping[str, Policy], alerts: Iterable[Mapping[str, str]]) -> dict[str, set[TargetKey]]:
    """Per policy a batch of alerts (their labels) wakes, the targets they name: what one post triggers."""
    named: dict[str, set[TargetKey]] = {}
    for labels in alerts:
        for name in policies_for_alert(policies, labels):
            named.setdefault(name, set()).add(alert_target(policies[name], labels))
    return named
