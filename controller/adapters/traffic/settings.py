"""The `kubernetes.traffic` section (route weights, routes.py; registered in controller/app/registrations.py). Apart
from routes.py because it imports no client library: the configuration loads without the cluster extra."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tailguard.controller.adapters.kube.settings import ObjectRefSettings
from tailguard.controller.core.policy import Duration


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RampSettings(_Strict):
    steps: list[int] = Field(default_factory=lambda: [50], description="intermediate weights on the way up")
    hold: Duration = Field(default=60.0, description="time at each step before the next")

    @model_validator(mode="after")
    def _in_range(self) -> RampSettings:
        outside = [step for step in self.steps if not 0 < step < 100]
        if outside:
            raise ValueError(f"ramp steps are intermediate weights: expected 1..99, got {outside}")
        return self


class TrafficSettings(_Strict):
    kind: Literal["httproute", "virtualservice"] = Field(
        default="httproute", description="Gateway API HTTPRoute backendRefs or Istio VirtualService routes"
    )
    routes: dict[str, ObjectRefSettings] = Field(
        default_factory=dict, description="service -> its route; default: the route named like the service"
    )
    ramp: RampSettings | None = Field(default=None, description="step increases of a weight; absent: one step")
