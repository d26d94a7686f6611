"""The `tier` section of the controller configuration: the local serving tier's control API, which rolls back,
scales and shifts traffic (controller/adapters/tier/local_tier.py) and lists revisions for change tracking."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TierSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(pattern=r"^https?://", description="the local serving tier's control API")
    timeout: float = Field(default=5.0, gt=0, description="seconds per request")
    retries: int = Field(default=3, ge=1, le=10, description="attempts in all, transient errors only")
