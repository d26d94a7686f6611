"""The `kubernetes.rollback` section (Deployment revisions, deployment.py; registered in
controller/app/registrations.py). Apart from deployment.py because it imports no client library."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tailguard.controller.adapters.kube.settings import ObjectRefSettings


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RollbackSettings(_Strict):
    """`kubernetes.rollback`: roll a Deployment back to its previous ReplicaSet revision (`kubectl rollout undo`)."""

    deployments: dict[str, ObjectRefSettings] = Field(
        default_factory=dict, description="service -> its Deployment; default: the Deployment named like the service"
    )
    helm: bool = Field(
        default=False,
        description="a Deployment Helm owns goes back to a previous Helm revision's template (read only, through "
        "the release Secrets; needs the Secrets list permission of deploy/components/helm-rollback)",
    )
