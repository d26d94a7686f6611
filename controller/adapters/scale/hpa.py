"""Scaling an HPA-managed service through its autoscaling/v2 HorizontalPodAutoscaler (official client).

For a service whose pods an HPA owns, setting `Deployment.spec.replicas` is pointless (the HPA undoes it),
so `set_replicas(n)` moves the HPA's floor: `minReplicas = n` (and `maxReplicas` up to at least that), within
the bounds the operator configured (`HpaBounds.max_replicas`). `replicas()` is the HPA's current count.

The human floor. The first time tailguard writes an HPA it records the `minReplicas` a human had set in the
annotation `tailguard.io/human-min-replicas`, and what it wrote itself in `tailguard.io/tailguard-min-replicas`.
Scaling down never goes below the human floor unless `HpaBounds.allow_below_human_floor` is set. When a
human edits `minReplicas` later (it no longer equals what tailguard wrote), that value becomes the new floor.

Writes are read-modify-PUT with the object's resourceVersion: a 409 Conflict (someone wrote in between)
re-reads and writes again, boundedly (nothing was written). The idempotency key of every change is written in
the same PUT to the annotation `tailguard.io/action-keys` (the last few keys, JSON), so a replayed key is a
no-op. Reads retry transient errors (5xx, 429, timeouts, refused connections) with backoff through the injected
clock; a write makes one attempt and reports a transient failure as `transient` (the dispatcher alone retries
actions); 404 and other 4xx are reported at once. All of it comes back as an `ActionOutcome`, never an exception.

The helpers every Kubernetes actuator shares (`kube_call`, `recorded_keys`/`with_key`, `EventRecorder`, the
bounded ApiClient) live on the adapters' ground floor, controller/adapters/kube/.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s

from tailguard.controller.adapters.kube.action_keys import recorded_keys, with_key
from tailguard.controller.adapters.kube.calls import KubeError, KubernetesActuatorError, kube_call
from tailguard.controller.adapters.kube.events import EventRecorder, ObjectRef
from tailguard.controller.core.ports import ActionOutcome, Clock, OutcomeStatus, ScaleRequest, ScaleState
from tailguard.controller.kit.http import RetryPolicy

log = logging.getLogger(__name__)

ANNOTATION_HUMAN_FLOOR = "tailguard.io/human-min-replicas"
ANNOTATION_TAILGUARD_MIN = "tailguard.io/tailguard-min-replicas"


# ----- the HPA actuator ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HpaTarget:
    namespace: str
    name: str


@dataclass(frozen=True)
class HpaBounds:
    """What the operator allows tailguard to do to HPAs (the policy's scale min/max clamp the count first)."""

    max_replicas: int  # never set minReplicas or maxReplicas above this
    allow_below_human_floor: bool = False
    min_replicas: int = 1  # never below this in any case
    # metric name -> (lowest, highest) AverageValue target a scale may set; a metric not named is never changed.
    metric_targets: Mapping[str, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class HpaPlan:
    """A pure plan of one change: the new spec values, the floor, and why (for the outcome detail)."""

    min_replicas: int
    max_replicas: int
    human_floor: int
    clamped: str | None


def human_floor(hpa: Mapping[str, Any]) -> int:
    """The floor a human set: recorded at tailguard's first touch; a later human edit of minReplicas replaces it."""
    annotations = hpa.get("annotations") or {}
    current_min = int(hpa["min_replicas"])
    recorded = annotations.get(ANNOTATION_HUMAN_FLOOR)
    ours = annotations.get(ANNOTATION_TAILGUARD_MIN)
    if recorded is None or not str(recorded).isdigit():
        return current_min
    if ours is not None and str(ours).isdigit() and int(ours) != current_min:
        return current_min  # minReplicas is not what tailguard wrote: a human changed it since
    return int(recorded)


def plan_replicas(hpa: Mapping[str, Any], wanted: int, bounds: HpaBounds) -> HpaPlan:
    """minReplicas/maxReplicas for `wanted` replicas, clamped to the bounds and the human floor."""
    floor = human_floor(hpa)
    clamped: str | None = None
    new_min = wanted
    lowest = bounds.min_replicas if bounds.allow_below_human_floor else max(bounds.min_replicas, floor)
    if new_min < lowest:
        clamped = (
            f"{wanted} is below the human floor {floor}; kept at {lowest}"
            if lowest == floor and not bounds.allow_below_human_floor
            else f"{wanted} is below the minimum {lowest}; kept at {lowest}"
        )
        new_min = lowest
    if new_min > bounds.max_replicas:
        clamped = f"{wanted} is above the configured maximum {bounds.max_replicas}; kept at {bounds.max_replicas}"
        new_min = bounds.max_replicas
    current_max = int(hpa["max_replicas"])
    new_max = max(current_max, new_min)
    return HpaPlan(new_min, new_max, floor, clamped)


class HpaScaler:
    """`ScalePort` for HPA-managed services: replicas are the HPA's floor (rollbacks are Argo CD's)."""

    def __init__(
        self,
        api: k8s.AutoscalingV2Api,
        *,
        clock: Clock,
        bounds: HpaBounds,
        targets: Mapping[str, HpaTarget] | None = None,
        namespace: str = "default",
        timeout: float = 5.0,
        retry: RetryPolicy | None = None,
        conflict_retries: int = 3,
        events: EventRecorder | None = None,
    ) -> None:
        self.api = api
        self.clock = clock
        self.bounds = bounds
        self.targets = dict(targets or {})
        self.namespace = namespace
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.conflict_retries = max(0, conflict_retries)
        self.events = events

    def target(self, service: str) -> HpaTarget:
        return self.targets.get(service) or HpaTarget(self.namespace, service)

    def _read(self, target: HpaTarget) -> k8s.V2HorizontalPodAutoscaler | KubeError:
        return kube_call(
            lambda: self.api.read_namespaced_horizontal_pod_autoscaler(
                target.name, target.namespace, _request_timeout=self.timeout
            ),
            what=f"reading HorizontalPodAutoscaler {target.namespace}/{target.name}",
            clock=self.clock,
            retry=self.retry,
        )

    # -- ScalePort ----------------------------------------------------------------------------------------

    def replicas(self, service: str) -> int:
        found = self._read(self.target(service))
        if isinstance(found, KubeError):
            raise KubernetesActuatorError(found)
        status = found.status
        if status is not None and status.current_replicas is not None:
            return int(status.current_replicas)
        return int(found.spec.min_replicas or 1)

    def scale_target(self, replicas: int) -> dict[str, int]:
        """A scale moves the HPA's floor (ScalePort)."""
        return {"minReplicas": replicas}

    def set_replicas(self, request: ScaleRequest) -> ActionOutcome:
        service, replicas, idempotency_key = request.service, request.replicas, request.idempotency_key
        bounds = self.bounds

        def change(hpa: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, Any]] | None:
            plan = plan_replicas(hpa, replicas, bounds)
            detail: dict[str, Any] = {
                "from": {"minReplicas": hpa["min_replicas"], "maxReplicas": hpa["max_replicas"]},
                "to": {"minReplicas": plan.min_replicas, "maxReplicas": plan.max_replicas},
                "requested": replicas,
                "human_floor": plan.human_floor,
            }
            if plan.clamped is not None:
                detail["clamped"] = plan.clamped
            if (plan.min_replicas, plan.max_replicas) == (hpa["min_replicas"], hpa["max_replicas"]):
                return None if plan.clamped is None else ({}, detail)
            return {"min_replicas": plan.min_replicas, "max_replicas": plan.max_replicas}, detail

        return self._update(service, idempotency_key, change, reason="TailguardScale")

    def scale_state(self, service: str) -> ScaleState:
        """minReplicas, maxReplicas, the AverageValue target of every Pods/External metric, and the current
        replica count (for the record: the HPA moves it, a restore never sets it)."""
        found = self._read(self.target(service))
        if isinstance(found, KubeError):
            raise KubernetesActuatorError(found)
        status = found.status
        current = status.current_replicas if status is not None else None
        return ScaleState(
            minReplicas=int(found.spec.min_replicas or 1),
            maxReplicas=int(found.spec.max_replicas),
            metrics=_metric_targets(found.spec.metrics or []),
            replicas=int(current) if current is not None else None,
        )

    def restore_scale(
        self,
        service: str,
        state: ScaleState,
        *,
        expected: ScaleState | None,
        idempotency_key: str,
    ) -> ActionOutcome:
        """Set minReplicas, maxReplicas and the metric targets of `state` exactly (a restore), never below the
        human floor; SKIPPED without a write when the HPA does not show `expected` (changed by someone else)."""
        bounds = self.bounds

        def change(hpa: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
            current = _settable(hpa["min_replicas"], hpa["max_replicas"], _metric_targets(hpa["metrics"]))
            wanted = _settable(state.minReplicas, state.maxReplicas, state.metrics or {})
            detail: dict[str, Any] = {"from": current, "to": wanted}
            if wanted == current:
                return None
            if expected is not None:
                seen = _settable(expected.minReplicas, expected.maxReplicas, expected.metrics or {})
                if seen != current:
                    reason = f"changed by someone else since tailguard set {seen}: found {current}; not overwritten"
                    return {}, {**detail, "reason": reason}
            floor = human_floor(hpa)
            if wanted["minReplicas"] < floor and not bounds.allow_below_human_floor:
                detail["clamped"] = f"{wanted['minReplicas']} is below the human floor {floor}; kept at {floor}"
                wanted = {**wanted, "minReplicas": floor, "maxReplicas": max(wanted["maxReplicas"], floor)}
                detail["to"] = wanted
            if wanted == current:
                return None
            metrics = list(hpa["metrics"])
            for spec in metrics:
                source = spec.pods or spec.external
                if source is not None and source.metric.name in wanted["metrics"]:
                    source.target.type = "AverageValue"
                    source.target.average_value = wanted["metrics"][source.metric.name]
            fields = {"min_replicas": wanted["minReplicas"], "max_replicas": wanted["maxReplicas"], "metrics": metrics}
            return fields, detail

        return self._update(service, idempotency_key, change, reason="TailguardScaleRestore")

    def set_metric_target(
        self, service: str, metric: str, average_value: str, *, idempotency_key: str
    ) -> ActionOutcome:
        """Set the AverageValue target of the HPA's Pods/External metric named `metric` (e.g. queue depth)."""

        def change(hpa: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
            for spec in hpa["metrics"]:
                source = spec.pods or spec.external
                if source is not None and source.metric.name == metric:
                    before = source.target.average_value
                    if str(before) == str(average_value):
                        return None
                    source.target.type = "AverageValue"
                    source.target.average_value = average_value
                    return {"metrics": hpa["metrics"]}, {"metric": metric, "from": before, "to": average_value}
            raise LookupError(f"the HPA has no Pods or External metric named {metric!r}")

        return self._update(service, idempotency_key, change, reason="TailguardMetricTarget")

    def set_limits(
        self,
        service: str,
        *,
        max_replicas: int | None,
        metric_targets: Mapping[str, float],
        idempotency_key: str,
    ) -> ActionOutcome:
        """A scale's `ceiling` and `metricTargets` (ScaleLimitsPort): maxReplicas clamped to [minReplicas, the
        configured maximum], each metric's AverageValue target clamped to its configured bounds (a metric without
        bounds is refused, nothing written). The restore puts back what `scale_state` read before."""
        bounds = self.bounds

        def change(hpa: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
            before = _settable(hpa["min_replicas"], hpa["max_replicas"], _metric_targets(hpa["metrics"]))
            detail: dict[str, Any] = {"from": before, "requested": {"maxReplicas": max_replicas, **metric_targets}}
            clamped: list[str] = []
            new_max = int(hpa["max_replicas"])
            if max_replicas is not None:
                low, high = int(hpa["min_replicas"]), bounds.max_replicas
                new_max = max(low, min(high, int(max_replicas)))
                if new_max != max_replicas:
                    clamped.append(f"ceiling {max_replicas} kept at {new_max} (minReplicas {low}, maximum {high})")
            metrics = list(hpa["metrics"])
            for name, value in sorted(metric_targets.items()):
                if name not in bounds.metric_targets:
                    raise LookupError(
                        f"no bounds for the metric target {name!r}: add it to kubernetes.hpa.metricTargets"
                    )
                low_value, high_value = bounds.metric_targets[name]
                wanted = max(low_value, min(high_value, float(value)))
                if wanted != float(value):
                    clamped.append(f"{name} target {value:g} kept at {wanted:g} (bounds {low_value:g}..{high_value:g})")
                source = next(
                    (s for spec in metrics if (s := spec.pods or spec.external) is not None and s.metric.name == name),
                    None,
                )
                if source is None:
                    raise LookupError(f"the HPA has no Pods or External metric named {name!r}")
                source.target.type = "AverageValue"
                source.target.average_value = _quantity(wanted)
            after = _settable(hpa["min_replicas"], new_max, _metric_targets(metrics))
            detail["to"] = after
            if clamped:
                detail["clamped"] = "; ".join(clamped)
            if after == before:
                return None
            return {"max_replicas": new_max, "metrics": metrics}, detail

        return self._update(service, idempotency_key, change, reason="TailguardLimits")

    # -- read, change, PUT with resourceVersion; 409 -> read again ---------------------------------------

    def _update(
        self,
        service: str,
        key: str,
        change: Callable[[Mapping[str, Any]], tuple[dict[str, Any], dict[str, Any]] | None],
        *,
        reason: str,
    ) -> ActionOutcome:
        target = self.target(service)
        where = f"HorizontalPodAutoscaler {target.namespace}/{target.name}"
        conflicts = 0
        while True:
            found = self._read(target)
            if isinstance(found, KubeError):
                return found.outcome({"hpa": where})
            if found.metadata is None:
                found.metadata = k8s.V1ObjectMeta()
            metadata = found.metadata
            annotations = dict(metadata.annotations or {})
            if key in recorded_keys(annotations):
                return ActionOutcome(OutcomeStatus.SUCCEEDED, {"hpa": where, "replayed": True})
            view = {
                "min_replicas": int(found.spec.min_replicas or 1),
                "max_replicas": int(found.spec.max_replicas),
                "metrics": list(found.spec.metrics or []),
                "annotations": annotations,
            }
            try:
                planned = change(view)
            except LookupError as exc:
                return ActionOutcome(OutcomeStatus.FAILED, {"hpa": where}, f"{where}: {exc}", False)
            if planned is None:
                return ActionOutcome(OutcomeStatus.SKIPPED, {"hpa": where, "reason": "already so"})
            fields, detail = planned
            if not fields:
                return ActionOutcome(OutcomeStatus.SKIPPED, {"hpa": where, **detail})
            if ANNOTATION_HUMAN_FLOOR not in annotations or "min_replicas" in fields:
                annotations[ANNOTATION_HUMAN_FLOOR] = str(human_floor(view))
            if "min_replicas" in fields:
                found.spec.min_replicas = fields["min_replicas"]
                found.spec.max_replicas = fields["max_replicas"]
                annotations[ANNOTATION_TAILGUARD_MIN] = str(fields["min_replicas"])
            elif "max_replicas" in fields:
                found.spec.max_replicas = fields["max_replicas"]
            if "metrics" in fields:
                found.spec.metrics = fields["metrics"]
            metadata.annotations = with_key(annotations, key)
            written = self._put(target, found)
            if isinstance(written, KubeError) and written.status == 409 and conflicts < self.conflict_retries:
                conflicts += 1
                log.info("%s changed while tailguard wrote it (conflict %d); reading it again", where, conflicts)
                continue
            if isinstance(written, KubeError):
                # One attempt: a transient failure (the write may have landed) is the dispatcher's to retry, and
                # its next attempt reads first: a recorded key then makes it a replay.
                return written.outcome({"hpa": where, "conflicts": conflicts})
            if self.events is not None:
                self.events.record(
                    ObjectRef("autoscaling/v2", "HorizontalPodAutoscaler", target.namespace, target.name),
                    reason,
                    f"tailguard: {json.dumps(detail, sort_keys=True, default=str)} ({key})",
                    key=key,
                )
            return ActionOutcome(
                OutcomeStatus.SUCCEEDED, {"hpa": where, **detail, "conflicts": conflicts, "replayed": False}
            )

    def _put(self, target: HpaTarget, hpa: k8s.V2HorizontalPodAutoscaler) -> Any:
        # One try per read: a 409 needs a fresh read, not a resend; a transient failure is reported (the
        # dispatcher's retry reads first: the write may have landed, and the recorded key then makes it a replay).
        return kube_call(
            lambda: self.api.replace_namespaced_horizontal_pod_autoscaler(
                target.name, target.namespace, hpa, _request_timeout=self.timeout
            ),
            what=f"writing HorizontalPodAutoscaler {target.namespace}/{target.name}",
            clock=self.clock,
            retry=RetryPolicy(attempts=1),
        )


def _metric_targets(metrics: Sequence[Any]) -> dict[str, str]:
    """The AverageValue target of every Pods/External metric, by metric name (as the API writes quantities)."""
    targets: dict[str, str] = {}
    for spec in metrics:
        source = spec.pods or spec.external
        if source is not None and source.target is not None and source.target.average_value is not None:
            targets[str(source.metric.name)] = str(source.target.average_value)
    return targets


def _quantity(value: float) -> str:
    """A target as a Kubernetes quantity: `10`, or milli-units (`12500m`) as the API server writes fractions."""
    return str(int(value)) if float(value).is_integer() else f"{round(value * 1000)}m"


def _settable(min_replicas: Any, max_replicas: Any, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """What a restore sets and compares: the floor, the ceiling and the metric targets."""
    return {
        "minReplicas": int(min_replicas),
        "maxReplicas": int(max_replicas),
        "metrics": {str(name): str(value) for name, value in metrics.items()},
    }


def hpa_names(services: Sequence[str], namespace: str) -> dict[str, HpaTarget]:
    """The common layout: one HPA per service, named like it, in one namespace."""
    return {service: HpaTarget(namespace, service) for service in services}
