"""The traffic port: the weights of a service's versions (HTTPRoute, VirtualService, the local tier)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from tailguard.controller.core.ports.outcomes import AbortSignal, ActionOutcome


@dataclass(frozen=True)
class TrafficRequest:
    """One traffic shift, as every TrafficRouter takes it: `version`'s share (percent) of `service`'s traffic and
    the action's idempotency key (a ramped router derives its steps' keys from it)."""

    service: str
    version: str
    weight: int
    idempotency_key: str


class TrafficRouter(Protocol):
    def set_weight(self, request: TrafficRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        """Set `version`'s share (percent) of `service`'s traffic, then read it back to verify. A ramped router
        stops before its next step on `abort` (ABORTED, with the weights of the last whole step in place)."""
        ...

    def weights(self, service: str) -> Mapping[str, int]:
        """Every version's weight (percent); raises (with `transient`) when the route cannot be read."""
        ...

    def set_weights(
        self,
        service: str,
        weights: Mapping[str, int],
        *,
        expected: Mapping[str, int] | None,
        idempotency_key: str,
        abort: AbortSignal | None = None,
    ) -> ActionOutcome:
        """Set every version's weight at once (ramped where the router ramps, stopping on `abort` like set_weight),
        then verify. SKIPPED, writing
        nothing, when the current weights are not `expected` (changed by someone else) or already `weights`."""
        ...
