"""`argocd:` in the controller configuration: the Argo CD server, its applications, the token's source.

Shared by the rollback adapter (controller/adapters/rollback/argocd.py) and change tracking
(controller/adapters/changes/tracker.py). The token is never a value here: a file or an env variable.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

AutoSyncMode = Literal["disableAutoSync", "notifyOnly"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArgoCDApp(_Strict):
    name: str = Field(min_length=1, description="the Argo CD application")
    appNamespace: str | None = Field(default=None, description="the application's namespace (apps in any namespace)")
    project: str | None = None
    autoSync: AutoSyncMode | None = Field(default=None, description="overrides the global autoSync for this app")


def _app(value: Any) -> Any:
    return {"name": value} if isinstance(value, str) else value


class ArgoCDSettings(_Strict):
    """`argocd:` in the controller configuration. The token is never a value here: a file or an env variable."""

    url: str = Field(pattern=r"^https?://", description="Argo CD API server, e.g. https://argocd.example")
    tokenFile: str | None = Field(default=None, description="file holding the bearer token")
    tokenEnv: str | None = Field(default=None, description="environment variable holding the bearer token")
    apps: dict[str, ArgoCDApp] = Field(
        min_length=1, description="service -> application (a name, or {name, appNamespace, project, autoSync})"
    )
    autoSync: AutoSyncMode = Field(
        default="notifyOnly",
        description="Argo CD refuses rollback while automated sync is on: disable it first, or only notify",
    )
    timeout: float = Field(default=10.0, gt=0, description="seconds per request")
    retries: int = Field(default=3, ge=1, le=10, description="attempts in all, transient errors only")
    waitTimeout: float = Field(default=300.0, gt=0, description="seconds to wait for the rollback to be Healthy")
    pollInterval: float = Field(default=5.0, gt=0, description="seconds between status polls while waiting")

    @model_validator(mode="before")
    @classmethod
    def _app_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("apps"), dict):
            data = {**data, "apps": {k: _app(v) for k, v in data["apps"].items()}}
        return data

    @model_validator(mode="after")
    def _one_token_source(self) -> ArgoCDSettings:
        if (self.tokenFile is None) == (self.tokenEnv is None):
            raise ValueError("argocd needs exactly one of tokenFile or tokenEnv (the bearer token is never inline)")
        return self
