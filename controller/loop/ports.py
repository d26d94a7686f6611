"""The loop's own seams: Protocols and data only the loop uses (the external ports are in controller/core/ports/).

The loop layer may import the core, never the other way; these move with the loop.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tailguard.controller.core.attribution import Rollout
from tailguard.controller.core.controls import AbortRequest, AbortResult, Controls
from tailguard.controller.core.ports.outcomes import ActionOutcome
from tailguard.controller.core.ports.stores import ActionJournalPort, JournalPort
from tailguard.controller.kit.clock import Clock

TRIGGER_SCHEDULE = "schedule"
TRIGGER_ALERT = "alert"


@runtime_checkable
class WakeableClock(Clock, Protocol):
    """A clock whose wait another thread can end early (the kit's SystemClock and ManualClock are): an operator's
    abort cuts a ramp's hold or a sync poll short instead of waiting it out."""

    def sleep_unless(self, seconds: float, wake: threading.Event) -> bool:
        """Wait `seconds`, or less once `wake` is set: True when woken (at once when already set). Raises
        ShutdownInterrupt like sleep()."""
        ...


class ControlsStorePort(Protocol):
    """Where the operator controls persist (the journal: the set in its meta table, each control as a row)."""

    def load_controls(self) -> Controls: ...

    def record_control(
        self, controls: Controls | None, action: str, subject: str, by: str, reason: str, now: float
    ) -> None: ...

    def recent_controls(self, limit: int = 50) -> list[dict[str, Any]]: ...


@runtime_checkable
class DecisionAborterPort(Protocol):
    """Optional next to DispatcherPort: the abort of one decision's actions (controller/loop/dispatcher.py)."""

    def abort(self, request: AbortRequest) -> AbortResult:
        """Stop the decision's actions: the queued and deferred never run; the one running stops at its next step."""
        ...


class ActionWorkersPort(Protocol):
    """The dispatcher's background workers (controller/loop/workers.py), as the controller waits for and stops them."""

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no action is queued or running; False on timeout."""
        ...

    def close(self, timeout: float = 30.0) -> bool:
        """Take no more actions; queued ones stay in the journal (resumed later); wait for the running ones."""
        ...


class DecisionSink(Protocol):
    """Gets every decision as it leaves the process (the Grafana region of an incident)."""

    def annotate_decision(self, decision: Mapping[str, Any]) -> ActionOutcome: ...


class RolloutAnnotatorPort(Protocol):
    def annotate_rollout(self, rollout: Rollout) -> Any: ...


class LoopJournalPort(JournalPort, ActionJournalPort, Protocol):
    """The journal an embedded loop writes (controller/loop/embedding.py): the evaluation's side (states, decisions)
    and the dispatcher's (actions, their events); the adapters' SQLite `Journal` is both."""


class AdoptingJournalPort(ActionJournalPort, Protocol):
    """What adoption (controller/loop/adoption.py) needs of the journal besides the dispatcher's needs."""

    def adopt(self, action: Mapping[str, Any], decision: Mapping[str, Any], now: float) -> bool:
        """The previous leader's unfinished action and its decision, journaled `planned` (False: already here)."""
        ...

    @property
    def closed(self) -> bool: ...


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reasons: tuple[str, ...]
    reload_errors: tuple[str, ...]
    policies: Mapping[str, float | None] = field(default_factory=dict)
    # Listed on /readyz without making the controller unready (e.g. an unusable prediction model).
    warnings: tuple[str, ...] = ()
    # Policy errors found at run time (a signal query Prometheus refuses as bad data): "policy P: signal S: ...".
    # Listed without making the controller unready, like a rejected reload: every other policy still works.
    policy_errors: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "reasons": list(self.reasons),
            "reload_errors": list(self.reload_errors),
            "policy_errors": list(self.policy_errors),
            "warnings": list(self.warnings),
            "policies": {name: {"last_evaluation": at} for name, at in sorted(self.policies.items())},
        }
