"""The `annotations` section of the controller configuration (controller/app/settings.py): the JSONL file, and
`annotations.grafana`.

Apart from the Grafana adapter (grafana.py) because it imports no client library: the configuration loads
without the cluster extra (grafana-client), which is needed only when the section is present.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tailguard.controller.kit.errors import ConfigError


class GrafanaTokenError(ConfigError):
    """The configured token cannot be read. The message names the source, never the value."""


class GrafanaSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="Grafana base URL, e.g. https://grafana.example.com")
    tokenEnv: str | None = Field(default=None, description="environment variable holding a service-account token")
    tokenFile: Path | None = Field(default=None, description="file holding the token (whitespace stripped)")
    timeout: float = Field(default=5.0, gt=0, description="seconds per request")
    retries: int = Field(default=3, ge=1, le=10, description="attempts per idempotent request (GET, PATCH)")
    outbox: str = Field(default="grafana-outbox.db", min_length=1, description="SQLite outbox path")
    dashboardUid: str | None = Field(default=None, description="bind annotations to this dashboard (else org-wide)")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("expected an http:// or https:// URL")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _one_token(self) -> GrafanaSettings:
        if self.tokenEnv is not None and self.tokenFile is not None:
            raise ValueError("set at most one of tokenEnv or tokenFile")
        return self

    def token(self) -> str | None:
        if self.tokenEnv is not None:
            value = os.environ.get(self.tokenEnv, "").strip()
            if not value:
                raise GrafanaTokenError(f"environment variable {self.tokenEnv} is not set or empty")
            return value
        if self.tokenFile is not None:
            return read_token_file(self.tokenFile)
        return None


def read_token_file(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise GrafanaTokenError(f"token file {path}: {exc.strerror or type(exc).__name__}") from None
    if not text:
        raise GrafanaTokenError(f"token file {path} is empty")
    return text


class AnnotationSettings(BaseModel):
    """`annotations:`: every annotation is appended to a JSONL file (jsonl.py), and also sent to Grafana when
    `grafana` is set (grafana.py, through a durable outbox)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1, description="JSONL file the annotations are appended to")
    grafana: GrafanaSettings | None = Field(default=None, description="also annotate in Grafana (durable outbox)")
