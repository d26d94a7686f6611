"""The action times a leader hands to its successor, so cooldowns and action budgets survive a failover.

Each replica keeps its engine state in its own journal; a standby that takes the Lease over starts from its
own. What must not start over is when the last mutating actions ran (cooldown) and how many ran in the last
hour (budget): otherwise a new leader whose condition is still breaching would roll back or scale a second
time after its `for`. The leader therefore writes those times (policy -> target -> times) into an annotation
of the Lease itself on every renewal and before it dispatches a mutating action; whoever acquires the Lease
reads them first (controller/adapters/lease/leader.py). Writing them to the Lease, not to another object, ties
each write to holding the Lease: a replica that lost it gets a 409 and writes nothing.

Pure functions: encoding (bounded in size), decoding (a malformed annotation is a HandoverError with the
reason, never a crash) and merging.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tailguard.controller.core.engine import union_times
from tailguard.controller.core.model import TargetKey
from tailguard.controller.kit.errors import InputError

HANDOVER_ANNOTATION = "tailguard.io/action-times"
# All annotations of one object share 256 KiB; the action times get half of it at most.
HANDOVER_MAX_BYTES = 128 * 1024
HANDOVER_VERSION = 1

# policy name -> target -> times (epoch seconds) of the mutating actions decided for it
ActionTimes = Mapping[str, Mapping[TargetKey, tuple[float, ...]]]


class HandoverError(InputError, ValueError):
    """The annotation cannot be read as action times; the message says why."""


class _TargetTimes(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    target: list[tuple[str, str]]
    times: list[float] = Field(min_length=1)


class _Handover(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: int
    policies: dict[str, list[_TargetTimes]]


def encode_action_times(times: ActionTimes, max_bytes: int = HANDOVER_MAX_BYTES) -> tuple[str, int]:
    """Compact JSON of `times`; returns (text, targets left out). When it would exceed `max_bytes`, the targets
    whose last action is oldest are left out first: a recent action is what a cooldown needs."""
    entries = sorted(
        ((policy, target, tuple(sorted(stamps))) for policy, by_target in times.items()
         for target, stamps in by_target.items() if stamps),
        key=lambda entry: (-entry[2][-1], entry[0], entry[1]),
    )  # fmt: skip
    kept: dict[str, list[dict[str, object]]] = {}
    size = len(_dumps({"v": HANDOVER_VERSION, "policies": {}}))
    dropped = 0
    for policy, target, stamps in entries:
        entry = {"target": [list(pair) for pair in target], "times": [round(t, 3) for t in stamps]}
        # An entry costs its JSON and a comma; a policy's first entry also the policy's key, colon and brackets.
        # That over-counts by at most a byte per policy, so the text never exceeds max_bytes.
        cost = len(_dumps(entry)) + 1 + (0 if policy in kept else len(_dumps(policy)) + 3)
        if size + cost > max_bytes:
            dropped += 1
            continue
        size += cost
        kept.setdefault(policy, []).append(entry)
    text = _dumps({"v": HANDOVER_VERSION, "policies": {p: kept[p] for p in sorted(kept)}})
    return text, dropped


def decode_action_times(text: str) -> dict[str, dict[TargetKey, tuple[float, ...]]]:
    """The action times in an annotation written by encode_action_times; HandoverError if it is not one."""
    handover = _parsed(text, _Handover, HANDOVER_VERSION)
    out: dict[str, dict[TargetKey, tuple[float, ...]]] = {}
    for policy, entries in handover.policies.items():
        by_target = out.setdefault(policy, {})
        for entry in entries:
            key: TargetKey = tuple(sorted((str(k), str(v)) for k, v in entry.target))
            by_target[key] = union_times(by_target.get(key, ()), entry.times)
    return out


def merge_action_times(*parts: ActionTimes) -> dict[str, dict[TargetKey, tuple[float, ...]]]:
    """The union of several sets of action times (a time present in two of them counts once)."""
    out: dict[str, dict[TargetKey, tuple[float, ...]]] = {}
    for part in parts:
        for policy, by_target in part.items():
            merged = out.setdefault(policy, {})
            for target, stamps in by_target.items():
                merged[target] = union_times(merged.get(target, ()), stamps)
    return out


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


# ----- unfinished actions: adopted by the next leader (issue 23, item 5) ------------------------------------

PENDING_ANNOTATION = "tailguard.io/pending-actions"
# The other half of the budget the action times leave (all annotations of one object share 256 KiB).
PENDING_MAX_BYTES = 64 * 1024
PENDING_VERSION = 1


class _PendingEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    action: dict[str, object]
    decision: dict[str, object]


class _Pending(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: int
    actions: list[_PendingEntry]


def encode_pending(entries: Sequence[Mapping[str, Any]], max_bytes: int = PENDING_MAX_BYTES) -> tuple[str, int]:
    """Compact JSON of the leader's unfinished mutating actions (each `{"action": ActionRecord JSON, "decision":
    its decision's JSON}`), newest kept first when over `max_bytes`; returns (text, entries left out)."""
    kept: list[Mapping[str, Any]] = []
    size = len(_dumps({"v": PENDING_VERSION, "actions": []}))
    dropped = 0
    for entry in entries:  # newest first
        cost = len(_dumps(entry)) + 1
        if size + cost > max_bytes:
            dropped += 1
            continue
        size += cost
        kept.append(entry)
    return _dumps({"v": PENDING_VERSION, "actions": kept}), dropped


def decode_pending(text: str) -> list[dict[str, dict[str, object]]]:
    """The entries written by encode_pending; HandoverError if the text is not one."""
    pending = _parsed(text, _Pending, PENDING_VERSION)
    return [{"action": dict(entry.action), "decision": dict(entry.decision)} for entry in pending.actions]


_Versioned = TypeVar("_Versioned", "_Handover", "_Pending")


def _parsed(text: str, model: type[_Versioned], version: int) -> _Versioned:
    """An annotation's JSON as `model` of `version`; HandoverError (one line: where and what) if it is not one."""
    try:
        raw = json.loads(text)
    except ValueError as bad:
        raise HandoverError(f"not JSON ({bad})") from None
    try:
        parsed = model.model_validate(raw)
    except ValidationError as invalid:
        first = invalid.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise HandoverError(f"{where}: {first['msg']}") from None
    if parsed.v != version:
        raise HandoverError(f"version {parsed.v}, this controller reads version {version}")
    return parsed
