"""Replica-level failover for the local router: a pure state machine fed one health-check result at a time.

Rules (from the seed design):
- a replica in rotation that fails 3 consecutive health checks is taken out of rotation (weight 0);
- when it answers again it returns at half weight (50), and after `recover_after` consecutive good checks at
  half weight it is back at full weight (100);
- failures while at half weight count towards the same 3-in-a-row rule.
A single failed check never moves traffic: health checks on a busy 2-core box do time out now and then.
Traffic-level failover between clusters is controller/failover.py's job, not this module's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

FULL_WEIGHT = 100
HALF_WEIGHT = 50

# On Kubernetes (tailguard.serving.tier.rotation) the same rotation is two pod readiness gates set by the rotation
# controller, plus the weight and rotation as pod metadata. Here, not there: the manifests use the names without the
# client.
WARMED_UP = "tailguard.io/warmed-up"
IN_ROTATION = "tailguard.io/in-rotation"
READINESS_GATES = (WARMED_UP, IN_ROTATION)
WEIGHT_ANNOTATION = "tailguard.io/weight"
ROTATION_LABEL = "tailguard.io/rotation"


class Rotation(str, Enum):
    IN = "in"  # full weight
    OUT = "out"  # no traffic
    RECOVERING = "recovering"  # half weight


@dataclass(frozen=True)
class Transition:
    before: Rotation
    after: Rotation


@dataclass
class FailoverState:
    failures_to_remove: int = 3
    recover_after: int = 3
    rotation: Rotation = Rotation.IN
    consecutive_failures: int = 0
    consecutive_successes: int = 0

    @property
    def weight(self) -> int:
        return {Rotation.IN: FULL_WEIGHT, Rotation.RECOVERING: HALF_WEIGHT, Rotation.OUT: 0}[self.rotation]

    def observe(self, healthy: bool) -> Transition | None:
        """Record one health-check result; returns the rotation change it caused, if any."""
        before = self.rotation
        if healthy:
            self.consecutive_failures = 0
            self.consecutive_successes += 1
            if self.rotation is Rotation.OUT:
                self.rotation = Rotation.RECOVERING
                self.consecutive_successes = 1
            elif self.rotation is Rotation.RECOVERING and self.consecutive_successes > self.recover_after:
                self.rotation = Rotation.IN
        else:
            self.consecutive_successes = 0
            self.consecutive_failures += 1
            if self.rotation is not Rotation.OUT and self.consecutive_failures >= self.failures_to_remove:
                self.rotation = Rotation.OUT
        return Transition(before, self.rotation) if self.rotation is not before else None
