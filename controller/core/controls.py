"""Operator controls: pause/resume of one policy, the global kill switch (`tailguard pause --all`), and the abort
of one decision's actions (`tailguard abort DECISION`: `AbortRequest`, run by controller/loop/dispatcher.py).

A paused policy runs as if its document said `suspend: true` (`effective_policy`): it keeps evaluating and
journaling, and the engine turns every would-be mutating fire into a `suppressed` decision with reason
"suspended" (controller/core/engine.py). The kill switch pauses every policy.

Who paused what and why travels with each control. The set is persisted in the journal's `meta` table (it
survives a restart) and in the Lease annotation `tailguard.io/controls` (it survives a leader change: the new
leader takes the union with its own journal's, the later change of each policy winning).

Pure: encoding and decoding (a malformed value is a ControlsError, never a crash) and merging.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tailguard.controller.core.policy import Policy
from tailguard.controller.kit.errors import InputError

CONTROLS_ANNOTATION = "tailguard.io/controls"
CONTROLS_META_KEY = "controls"
ALL = "*"  # the kill switch's key in `Controls.paused`


class ControlsError(InputError, ValueError):
    """A controls value that cannot be read; the message says why."""


@dataclass(frozen=True)
class Control:
    """One pause (or, with `paused=False`, the resume that ended it): who, why, when."""

    paused: bool
    by: str
    reason: str
    at: float

    def to_json(self) -> dict[str, Any]:
        return {"paused": self.paused, "by": self.by, "reason": self.reason, "at": self.at}

    @staticmethod
    def from_json(raw: Any) -> Control:
        if not isinstance(raw, Mapping):
            raise ControlsError("a control must be an object")
        try:
            return Control(bool(raw["paused"]), str(raw["by"]), str(raw.get("reason", "")), float(raw["at"]))
        except (KeyError, TypeError, ValueError) as bad:
            raise ControlsError(f"a control needs paused, by and at: {bad}") from None


@dataclass(frozen=True)
class Controls:
    """The last control per policy name (`ALL`: the kill switch). Resumes are kept, so a later resume wins a
    merge over an older pause from another replica."""

    latest: Mapping[str, Control] = field(default_factory=dict)

    def pause_of(self, policy: str) -> Control | None:
        """What keeps `policy` paused (the kill switch first), or None."""
        for key in (ALL, policy):
            control = self.latest.get(key)
            if control is not None and control.paused:
                return control
        return None

    @property
    def killed(self) -> Control | None:
        control = self.latest.get(ALL)
        return control if control is not None and control.paused else None

    def with_control(self, policy: str, control: Control) -> Controls:
        return Controls({**self.latest, policy: control})

    def merged(self, other: Controls) -> Controls:
        """The union, the later control of each key winning (ties: a pause wins, the safe side)."""
        result = dict(self.latest)
        for key, control in other.latest.items():
            mine = result.get(key)
            if mine is None or (control.at, control.paused) > (mine.at, mine.paused):
                result[key] = control
        return Controls(result)

    def to_json(self) -> dict[str, Any]:
        return {key: control.to_json() for key, control in sorted(self.latest.items())}

    def encode(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def decode(text: str) -> Controls:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as bad:
            raise ControlsError(f"not JSON: {bad}") from None
        if not isinstance(raw, Mapping):
            raise ControlsError("expected an object of policy name -> control")
        return Controls({str(key): Control.from_json(value) for key, value in raw.items()})


def effective_policy(policy: Policy, controls: Controls) -> Policy:
    """`policy` as the engine should run it: suspended while it (or everything) is paused."""
    if policy.suspend or controls.pause_of(policy.name) is None:
        return policy
    return policy.model_copy(update={"suspend": True})


# ----- abort: stop the actions of one decision (`tailguard abort DECISION`) -----------------------------------

ABORT = "abort"  # the control's name in the journal's controls table (its subject: the decision id)
MAX_ABORT_REASON = 1000  # characters: the reason is required and journaled as given, never cut


@dataclass(frozen=True)
class AbortRequest:
    """An operator's abort of a decision's actions: who, why, when."""

    decision_id: str
    by: str
    reason: str
    at: float

    def to_json(self) -> dict[str, Any]:
        return {"decision_id": self.decision_id, "by": self.by, "reason": self.reason, "at": self.at}

    def phrase(self) -> str:
        return f"aborted by {self.by}: {self.reason}"


class AbortState(StrEnum):
    IN_FLIGHT = "in_flight"  # an action is running: it stops at its next step (its outcome says where)
    CANCELLED = "cancelled"  # none was running: the queued and deferred ones end `aborted` without running
    FINISHED = "finished"  # every action had already ended: nothing to abort
    UNKNOWN = "unknown"  # no action of that decision in the journal


@dataclass(frozen=True)
class AbortResult:
    """What an abort found and did: its state, and each action of the decision as the journal has it after."""

    decision_id: str
    state: AbortState
    message: str
    actions: tuple[Mapping[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "decision_id": self.decision_id,
            "state": self.state.value,
            "message": self.message,
            "actions": [dict(action) for action in self.actions],
        }
