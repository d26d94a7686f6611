"""What every action port answers (an ActionOutcome, never an exception for an expected failure) and the abort
signal a port that works in steps asks between its steps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from tailguard.controller.core.controls import AbortRequest


class OutcomeStatus(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"  # nothing to do (e.g. already at that weight, no earlier good revision)
    # An operator's abort stopped it between steps (AbortSignal); the detail says exactly what it left behind.
    ABORTED = "aborted"
    # The precondition the plan carries (what the decision saw: the running revision, the ReplicaSet) no longer
    # holds right before the write: nothing was written; the decision is not retried.
    WORLD_CHANGED = "world-changed"


@dataclass(frozen=True)
class ActionOutcome:
    status: OutcomeStatus
    detail: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    # Only transient failures (timeouts, 5xx, connection refused) are retried.
    transient: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "detail": dict(self.detail),
            "error": self.error,
            "transient": self.transient,
        }


class AbortSignal(Protocol):
    """The operator's abort of the action in flight (`tailguard abort DECISION`), as a port that works in steps sees
    it: a traffic ramp asks before each weight step, an Argo CD sync wait at each poll. A port stops only BETWEEN
    steps (a step's write is never cut in half) and answers OutcomeStatus.ABORTED with the state it left."""

    def requested(self) -> AbortRequest | None:
        """The abort, once an operator asked for it; None until then."""
        ...

    def hold(self, seconds: float) -> AbortRequest | None:
        """Wait `seconds` through the clock (a ramp's hold, a poll interval), cut short by an abort: the abort, or
        None after the whole wait. Raises ShutdownInterrupt like the clock's sleep."""
        ...
