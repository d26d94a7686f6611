"""Attributing a breach to the rollout that caused it, and choosing between rollback and scaling.

Pure functions over data: the runtime fetches rollouts through the change tracker
(controller/adapters/changes/tracker.py) and passes them in; the engine calls `attribute` and
`choose_branch` when a condition fires and records both in the decision. The
answer "this breach began 42 s after rollout r7 changed max_num_seqs 64 -> 2" is
what makes a rollback the right action; without it, saturation says "scale out",
and without either a human is notified. A change source that failed makes the
attribution "unknown", which never counts as "attributed".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tailguard.controller.core.model import Decision, SignalResult, TargetKey, classify
from tailguard.controller.core.policy import AttributionSpec, Branch, Condition, Policy
from tailguard.controller.kit.durations import format_duration

# How much of a diff is spelled out in reasons and annotation text; the decision JSON keeps all of it.
DIFF_SHOWN = 4


@dataclass(frozen=True)
class Rollout:
    """One change of a serving target: `revision` replaced `previous_revision` at `at` (epoch seconds).

    `diff` is the vLLM engine-argument change, {argument: {"from": old, "to": new}}, empty when unknown.
    """

    labels: Mapping[str, str]
    revision: str
    previous_revision: str | None
    at: float
    source: str
    diff: Mapping[str, Any] = field(default_factory=dict)

    def describe_diff(self, limit: int = DIFF_SHOWN) -> str:
        return describe_diff(self.diff, limit)

    def to_json(self) -> dict[str, Any]:
        return {
            "labels": dict(self.labels),
            "revision": self.revision,
            "previous_revision": self.previous_revision,
            "at": self.at,
            "source": self.source,
            "diff": json.loads(json.dumps(dict(self.diff), default=str)),
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Rollout:
        previous = data.get("previous_revision")
        return Rollout(
            labels={str(k): str(v) for k, v in dict(data.get("labels") or {}).items()},
            revision=str(data["revision"]),
            previous_revision=None if previous is None else str(previous),
            at=float(data["at"]),
            source=str(data.get("source", "")),
            diff=dict(data.get("diff") or {}),
        )


def describe_diff(diff: Mapping[str, Any], limit: int = DIFF_SHOWN) -> str:
    """`max_num_seqs 64 -> 2, kv_cache_dtype auto -> fp8` (the first `limit` arguments, then a count)."""
    parts: list[str] = []
    for name in sorted(diff):
        change = diff[name]
        if isinstance(change, Mapping) and ("from" in change or "to" in change):
            parts.append(f"{name} {_short(change.get('from'))} -> {_short(change.get('to'))}")
        else:
            parts.append(f"{name} {_short(change)}")
    if not parts:
        return "no engine-argument change recorded"
    shown = parts[:limit]
    if len(parts) > limit:
        shown.append(f"+{len(parts) - limit} more")
    return ", ".join(shown)


def _short(value: Any) -> str:
    if value is None:
        return "unset"
    return str(value) if not isinstance(value, float) else f"{value:g}"


class AttributionStatus(StrEnum):
    ATTRIBUTED = "attributed"  # a rollout of the same target preceded the onset within the window
    NONE = "none"  # the change sources answered, and no such rollout exists
    UNKNOWN = "unknown"  # a change source failed: we cannot tell, and never act as if attributed


@dataclass(frozen=True)
class Attribution:
    status: AttributionStatus
    reason: str
    rollout: Rollout | None = None
    seconds_before_onset: float | None = None

    @property
    def attributed(self) -> bool:
        return self.status is AttributionStatus.ATTRIBUTED

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "reason": self.reason,
            "rollout": self.rollout.to_json() if self.rollout is not None else None,
            "seconds_before_onset": self.seconds_before_onset,
        }


@dataclass(frozen=True)
class BranchChoice:
    name: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason}


def _selector(spec: AttributionSpec, labels: Mapping[str, str]) -> dict[str, str]:
    return {name: labels[name] for name in spec.labels if name in labels}


def _window(seconds: float) -> str:
    """30m rather than 1800s: the window as the policy author wrote it."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return format_duration(seconds)


def _format_selector(selector: Mapping[str, str]) -> str:
    return ",".join(f"{name}={value}" for name, value in sorted(selector.items())) or "any target"


def attribute(
    spec: AttributionSpec,
    labels: Mapping[str, str],
    onset: float,
    rollouts: Sequence[Rollout],
    *,
    source_error: str | None = None,
) -> Attribution:
    """The most recent rollout of the same target (spec.labels) at or before `onset`, within `spec.window`."""
    selector = _selector(spec, labels)
    window = _window(spec.window)
    if source_error is not None:
        return Attribution(AttributionStatus.UNKNOWN, f"unknown (change source error: {source_error})")
    missing = [name for name in spec.labels if name not in labels]
    if missing:
        return Attribution(
            AttributionStatus.UNKNOWN, f"unknown (the target has no {', '.join(missing)} label to match rollouts on)"
        )
    candidates = [
        rollout
        for rollout in rollouts
        if all(rollout.labels.get(name) == value for name, value in selector.items())
        and onset - spec.window <= rollout.at <= onset
    ]
    if not candidates:
        later = [r for r in rollouts if all(r.labels.get(n) == v for n, v in selector.items()) and r.at > onset]
        note = f"; rollout {later[0].revision} came after the onset" if later else ""
        return Attribution(
            AttributionStatus.NONE, f"no rollout of {_format_selector(selector)} within {window} before onset{note}"
        )
    # Most recent first; a tie in time is broken by revision so the answer never depends on input order.
    chosen = max(candidates, key=lambda r: (r.at, r.revision))
    before = onset - chosen.at
    return Attribution(
        AttributionStatus.ATTRIBUTED,
        f"attributed to rollout {chosen.revision} ({chosen.describe_diff()}) {before:.0f} s before onset",
        chosen,
        before,
    )


def _guard_holds(
    branch: Branch,
    attribution: Attribution | None,
    observations: Mapping[str, SignalResult],
    target: TargetKey,
    now: float,
) -> tuple[bool, str]:
    guard = branch.if_
    if guard is None:
        return True, "otherwise"
    reasons: list[str] = []
    holds = True
    if guard.attributedToRollout is not None:
        attributed = attribution is not None and attribution.attributed
        if attribution is None:
            why = "no attribution"
        elif attribution.attributed:
            why = attribution.reason
        elif attribution.status is AttributionStatus.UNKNOWN:
            why = f"attribution {attribution.reason}"
        else:
            why = f"not attributed ({attribution.reason})"
        reasons.append(why)
        holds = holds and attributed == guard.attributedToRollout
    if guard.signal is not None:
        assert guard.op is not None and guard.value is not None
        kind, value, error = classify(observations.get(guard.signal), target, now)
        if value is None:
            what = f"error: {error}" if error else kind.value
            reasons.append(f"{guard.signal} is {what}, so {guard.op.value} {guard.value:g} does not hold")
            holds = False
        else:
            signal_holds = guard.op.holds(value, guard.value)
            relation = guard.op.value if signal_holds else f"not {guard.op.value}"
            reasons.append(f"{guard.signal} {value:.4g} {relation} {guard.value:g}")
            holds = holds and signal_holds
    return holds, "; ".join(reasons)


def choose_branch(
    condition: Condition,
    attribution: Attribution | None,
    observations: Mapping[str, SignalResult],
    target: TargetKey,
    now: float,
) -> tuple[Branch, BranchChoice] | None:
    """The first branch whose `if` holds (None: no branch holds, so nothing runs); the reason names why."""
    rejected: list[str] = []
    for branch in condition.choose or []:
        holds, why = _guard_holds(branch, attribution, observations, target, now)
        if holds:
            prefix = f"{'; '.join(rejected)}; " if rejected else ""
            return branch, BranchChoice(branch.name, f"{prefix}{why} -> {branch.name}")
        rejected.append(f"not {branch.name} ({why})")
    return None


def no_branch_choice(
    condition: Condition,
    attribution: Attribution | None,
    observations: Mapping[str, SignalResult],
    target: TargetKey,
    now: float,
) -> BranchChoice:
    """The record of "no branch held" (every branch had an `if`): nothing runs, and the reason says why."""
    reasons = [
        f"not {branch.name} ({_guard_holds(branch, attribution, observations, target, now)[1]})"
        for branch in condition.choose or []
    ]
    return BranchChoice("", "; ".join(reasons) + " -> no branch holds, no action")


@dataclass(frozen=True)
class AttributedDecision(Decision):
    """A decision of a condition with `attribution` or `choose`: it also says which rollout and which branch.

    A subclass so that every reader of Decision keeps working; to_json only adds keys.
    """

    attribution: Attribution | None = None
    branch: BranchChoice | None = None

    def to_json(self) -> dict[str, Any]:
        body = super().to_json()
        body["attribution"] = self.attribution.to_json() if self.attribution is not None else None
        body["branch"] = self.branch.to_json() if self.branch is not None else None
        return body


def text_variables(attribution: Attribution | None, branch: BranchChoice | None) -> dict[str, str]:
    """The action-text variables attribution adds: rollout_revision, rollout_diff, branch."""
    rollout = attribution.rollout if attribution is not None else None
    return {
        "rollout_revision": rollout.revision if rollout is not None else "none",
        "rollout_diff": rollout.describe_diff() if rollout is not None else "none",
        "branch": branch.reason if branch is not None else "",
    }


def attribution_of(decision: Mapping[str, Any]) -> Rollout | None:
    """The rollout a journaled decision (its JSON) was attributed to, if any."""
    entry = decision.get("attribution")
    if not isinstance(entry, Mapping) or entry.get("status") != AttributionStatus.ATTRIBUTED.value:
        return None
    rollout = entry.get("rollout")
    if not isinstance(rollout, Mapping):
        return None
    try:
        return Rollout.from_json(rollout)
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class ChangeFeed:
    """What the change sources answered for one evaluation: the rollouts, and the sources that failed."""

    rollouts: tuple[Rollout, ...]
    errors: tuple[str, ...] = ()

    @property
    def error(self) -> str | None:
        """One line for the engine's `rollouts_error` (None when every source answered)."""
        return "; ".join(self.errors) if self.errors else None


def lookback(policy: Policy, floor: float = 0.0) -> float | None:
    """How far back `policy` needs rollouts: its largest attribution window (None: it attributes nothing)."""
    windows = [c.attribution.window for c in policy.conditions if c.attribution is not None]
    return max([*windows, floor]) if windows else None
