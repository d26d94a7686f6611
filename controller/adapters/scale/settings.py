"""The `kubernetes.hpa` section (the HPA scaler, hpa.py; registered in controller/app/registrations.py). Apart from
hpa.py because it imports no client library: the configuration loads without the cluster extra."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tailguard.controller.adapters.kube.settings import ObjectRefSettings


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MetricTargetBounds(_Strict):
    min: float = Field(gt=0, description="the lowest AverageValue target tailguard may set")
    max: float = Field(gt=0, description="the highest AverageValue target tailguard may set")

    @model_validator(mode="after")
    def _ordered(self) -> MetricTargetBounds:
        if self.min > self.max:
            raise ValueError(f"expected min <= max, got {self.min} > {self.max}")
        return self


class HpaSettings(_Strict):
    maxReplicas: int = Field(ge=1, description="tailguard never sets minReplicas or maxReplicas above this")
    minReplicas: int = Field(default=1, ge=1, description="tailguard never sets minReplicas below this")
    allowBelowHumanFloor: bool = Field(
        default=False, description="may scaling down go below the minReplicas a human set (recorded at first touch)"
    )
    targets: dict[str, ObjectRefSettings] = Field(
        default_factory=dict, description="service -> its HPA; default: the HPA named like the service"
    )
    metricTargets: dict[str, MetricTargetBounds] = Field(
        default_factory=dict,
        description="HPA metric -> the bounds of the AverageValue target a scale's metricTargets may set; a metric "
        "not named here is never changed",
    )

    @model_validator(mode="after")
    def _ordered(self) -> HpaSettings:
        if self.minReplicas > self.maxReplicas:
            raise ValueError(f"expected minReplicas <= maxReplicas, got {self.minReplicas} > {self.maxReplicas}")
        return self
