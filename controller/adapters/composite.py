"""One `Deployer` from two: rollbacks to one actuator, replica counts to another.

In a cluster the two halves of the Deployer protocol belong to different systems: a rollback is Argo CD's
(GitOps: the revision is Git's), replicas are the HPA's (its floor; setting a Deployment's replicas would be
undone by the HPA). Locally both may be the serving tier. A half with no actuator answers a FAILED outcome
that says which section of the configuration is missing, instead of calling an actuator that refuses.

`replicas()` returns a plain int, so a missing scaling half can only raise: `NoActuatorError`, permanent
(transient=False); the dispatcher records it as a FAILED scale action with this message.
"""

from __future__ import annotations

from controller.core.errors import ActuatorError
from controller.core.ports import ActionOutcome, Deployer, OutcomeStatus

ROLLBACK_MISSING = "no actuator configured for rollback: add argocd (or tier)"
SCALE_MISSING = "no actuator configured for scale: add kubernetes.hpa (or tier)"


class NoActuatorError(ActuatorError):
    """Raised by `replicas()` when nothing is configured to scale; never worth a retry."""

    transient = False


class CompositeDeployer:
    """`Deployer`: rollback -> `rollbacks`, replicas/set_replicas -> `scaling`; either may be None."""

    def __init__(self, rollbacks: Deployer | None, scaling: Deployer | None) -> None:
        self.rollbacks = rollbacks
        self.scaling = scaling

    def rollback(self, service: str, *, idempotency_key: str) -> ActionOutcome:
        if self.rollbacks is None:
            return ActionOutcome(OutcomeStatus.FAILED, {"service": service}, ROLLBACK_MISSING, False)
        return self.rollbacks.rollback(service, idempotency_key=idempotency_key)

    def replicas(self, service: str) -> int:
        if self.scaling is None:
            raise NoActuatorError(SCALE_MISSING)
        return self.scaling.replicas(service)

    def set_replicas(self, service: str, replicas: int, *, idempotency_key: str) -> ActionOutcome:
        if self.scaling is None:
            return ActionOutcome(OutcomeStatus.FAILED, {"service": service, "replicas": replicas}, SCALE_MISSING, False)
        return self.scaling.set_replicas(service, replicas, idempotency_key=idempotency_key)
