"""One Kubernetes object of a service, as the actuators' settings name it (`kubernetes.hpa.targets`,
`kubernetes.traffic.routes`, `kubernetes.rollback.deployments`). Imports no client library."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ObjectRefSettings(_Strict):
    """One Kubernetes object of a service: its namespace (default: `kubernetes.namespace`) and name."""

    namespace: str | None = Field(default=None, min_length=1, description="default: kubernetes.namespace")
    name: str = Field(min_length=1)
