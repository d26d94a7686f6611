"""Traffic shifts on Kubernetes: Gateway API HTTPRoute backendRef weights and Istio VirtualService route weights.

Both implement `TrafficRouter.set_weight(TrafficRequest(service, version, weight, key))` the same way
(CustomObjectsApi):

1. read the route object; a key already recorded in its `tailguard.io/action-keys` annotation is a replay
   (no-op);
2. compute the new weights (pure, `split_weights`): `version` gets `weight` percent, the other backends
   share the rest in proportion to their current weights (evenly when they are all 0), summing to 100;
3. PUT it with its resourceVersion and the key; a 409 Conflict re-reads and recomputes (bounded); any
   other failure is reported at once (`transient` for 5xx/timeouts: the dispatcher alone retries actions,
   and its retry starts at step 1, where a write that landed is a replay);
4. read it back and verify every backend's weight; a mismatch (a mutating webhook, another controller
   such as Flagger or Argo Rollouts fighting over the route) is a FAILED outcome that says what was found.

Stepping. A `Ramp` makes increases gradual: with `Ramp(steps=(50,), hold_seconds=60)` a request to go from
10 to 100 sets 50, holds 60 s (through the injected clock), checks nobody changed the weight meanwhile, then
sets 100. Decreases are never stepped: moving traffic away from a failing version is done at once. The ramp
is configured per router (the controller configuration), not per policy: the dispatcher passes only the
final weight, and a ramp belongs to the route anyway. Each step is a write with its own derived key
(`{key}#step{n}`) and the final write carries the action's key, so a resumed ramp continues where it was.

Abort. An operator's abort (`tailguard abort DECISION`, the dispatcher's AbortSignal) is asked before each step
and cuts a hold short: the ramp stops BEFORE its next write, never inside one. Each step is one PUT of the whole
object (every backend's weight at once) read back and verified, so the route holds the last whole step; the
ABORTED outcome names it (`weights`, read again at the stop), the steps written and those not.

Which backend is `version`: HTTPRoute backendRefs map to versions through `version_of(service, backend)`
(default: Services named `{service}-{version}`); Istio routes by `destination.subset == version` (default).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from kubernetes import client as k8s

from tailguard.controller.adapters.kube.action_keys import recorded_keys, with_key
from tailguard.controller.adapters.kube.calls import KubeError, KubernetesActuatorError, kube_call
from tailguard.controller.adapters.kube.events import EventRecorder, ObjectRef
from tailguard.controller.core.controls import AbortRequest
from tailguard.controller.core.ports import AbortSignal, ActionOutcome, Clock, OutcomeStatus, TrafficRequest
from tailguard.controller.kit.errors import ActuatorError
from tailguard.controller.kit.http import RetryPolicy

log = logging.getLogger(__name__)


class WeightError(ActuatorError, ValueError):
    """The requested weights cannot be applied to this route (the message says why)."""


class ChangedError(WeightError):
    """A restore found the route's weights changed by someone else: it must not overwrite them."""


def split_weights(current: Mapping[str, int], version: str, weight: int) -> dict[str, int]:
    """`version` at `weight` percent; the others share 100 - weight in proportion to their current weights."""
    if not 0 <= weight <= 100:
        raise WeightError(f"weight must be between 0 and 100, got {weight}")
    if version not in current:
        raise WeightError(f"no backend for version {version!r}; the route has {', '.join(sorted(current)) or 'none'}")
    others = [name for name in current if name != version]
    if not others:
        if weight != 100:
            raise WeightError(f"version {version!r} is the route's only backend: its share cannot be {weight}%")
        return {version: 100}
    rest = 100 - weight
    total = sum(max(0, current[name]) for name in others)
    shares = {name: (max(0, current[name]) / total if total > 0 else 1 / len(others)) * rest for name in others}
    result = {name: int(share) for name, share in shares.items()}
    # Largest remainder: the integer weights sum to exactly `rest`; ties go to the earlier backend.
    missing = rest - sum(result.values())
    for name in sorted(others, key=lambda n: (-(shares[n] - result[n]), others.index(n)))[:missing]:
        result[name] += 1
    return {version: weight, **result}


def _split_to(current: dict[str, int], *, version: str, weight: int) -> dict[str, int]:
    return split_weights(current, version, weight)


@dataclass(frozen=True)
class Ramp:
    steps: Sequence[int] = (50,)  # intermediate weights on the way up
    hold_seconds: float = 60.0

    def path(self, current: int, target: int) -> list[int]:
        """The weights to set, in order, to go from `current` to `target` (decreases in one step)."""
        if target <= current:
            return [target]
        return [step for step in sorted(set(self.steps)) if current < step < target] + [target]


@dataclass(frozen=True)
class RouteRef:
    namespace: str
    name: str


class _WeightedRouteRouter:
    group = ""
    version = ""
    plural = ""
    kind = ""

    def __init__(
        self,
        api: k8s.CustomObjectsApi,
        *,
        clock: Clock,
        routes: Mapping[str, RouteRef] | None = None,
        namespace: str = "default",
        ramp: Ramp | None = None,
        timeout: float = 5.0,
        retry: RetryPolicy | None = None,
        conflict_retries: int = 3,
        events: EventRecorder | None = None,
    ) -> None:
        self.api = api
        self.clock = clock
        self.routes = dict(routes or {})
        self.namespace = namespace
        self.ramp = ramp
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.conflict_retries = max(0, conflict_retries)
        self.events = events

    # -- what differs between HTTPRoute and VirtualService ----------------------------------------------

    def _entries(self, obj: Mapping[str, Any], service: str) -> list[tuple[str, dict[str, Any]]]:
        """(version, the dict holding its `weight`) for every weighted backend of the route."""
        raise NotImplementedError

    def _default_weight(self, entries: int) -> int:
        raise NotImplementedError

    # -- the protocol -----------------------------------------------------------------------------------

    def route(self, service: str) -> RouteRef:
        return self.routes.get(service) or RouteRef(self.namespace, service)

    def read_weights(self, service: str) -> dict[str, int] | KubeError:
        found = self._read(self.route(service))
        if isinstance(found, KubeError):
            return found
        return self._weights_of(found, service)

    def weights(self, service: str) -> dict[str, int]:
        """Every version's weight (TrafficRouter); raises KubernetesActuatorError when the route is unreadable."""
        found = self.read_weights(service)
        if isinstance(found, KubeError):
            raise KubernetesActuatorError(found)
        return found

    def set_weight(self, request: TrafficRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        service, version, weight = request.service, request.version, request.weight
        idempotency_key = request.idempotency_key
        ref = self.route(service)
        where = f"{self.kind} {ref.namespace}/{ref.name}"
        found = self._read(ref)
        if isinstance(found, KubeError):
            return found.outcome({"route": where})
        if idempotency_key in recorded_keys(found.get("metadata", {}).get("annotations")):
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {"route": where, "weight": weight, "replayed": True})
        try:
            start = self._weights_of(found, service)
            split_weights(start, version, weight)  # refuse an impossible request before any write
        except WeightError as exc:
            return ActionOutcome(OutcomeStatus.FAILED, {"route": where}, f"{where}: {exc}", False)
        path = self.ramp.path(start[version], weight) if self.ramp is not None else [weight]
        detail: dict[str, Any] = {"route": where, "version": version, "from": start, "steps": path}
        previous: dict[str, int] | None = None
        conflicts = 0
        for index, step in enumerate(path):
            last = index == len(path) - 1
            if previous is not None and self.ramp is not None:
                stopped = self._hold(self.ramp.hold_seconds, abort)
                if stopped is not None:
                    return self._aborted(service, where, detail, stopped, index, start, previous, f"{weight}%")
                try:
                    now = self.read_weights(service)
                except WeightError as exc:
                    return ActionOutcome(OutcomeStatus.FAILED, {**detail, "reached": previous}, f"{where}: {exc}")
                if isinstance(now, KubeError):
                    return now.outcome({**detail, "reached": previous})
                if now != previous:
                    return ActionOutcome(
                        OutcomeStatus.FAILED,
                        {**detail, "reached": previous, "observed": now},
                        f"{where}: the ramp to {weight}% was interrupted: weights changed to {now} during the hold",
                        False,
                    )
            stopped = abort.requested() if abort is not None else None
            if stopped is not None:  # before this step's write (the first one too: then nothing was written)
                return self._aborted(service, where, detail, stopped, index, start, previous, f"{weight}%")
            # A step's key names its rank among the ramp's steps (not its index in this path): a resume that goes
            # on from a step already written writes the next step under its own key instead of finding the
            # previous step's key and skipping it.
            key = idempotency_key if last else f"{idempotency_key}#step{_rank(self.ramp, step)}"
            try:
                outcome = self._apply(ref, where, service, key, partial(_split_to, version=version, weight=step))
            except WeightError as exc:  # the route was edited into a shape we cannot weigh
                outcome = ActionOutcome(OutcomeStatus.FAILED, {}, f"{where}: {exc}", False)
            if outcome.status is not OutcomeStatus.SUCCEEDED:
                return ActionOutcome(outcome.status, {**detail, **outcome.detail}, outcome.error, outcome.transient)
            previous = dict(outcome.detail["weights"])
            conflicts += int(outcome.detail.get("conflicts", 0))
        assert previous is not None
        if self.events is not None:
            self.events.record(
                ObjectRef(f"{self.group}/{self.version}", self.kind, ref.namespace, ref.name),
                "TailguardTrafficShift",
                f"tailguard: {service} {version} -> {weight}% via {path}; weights {previous} ({idempotency_key})",
                key=idempotency_key,
            )
        return ActionOutcome(
            OutcomeStatus.SUCCEEDED,
            {
                **detail,
                "weight": weight,
                "weights": previous,
                "verified": True,
                "conflicts": conflicts,
                "replayed": False,
            },
        )

    def set_weights(
        self,
        service: str,
        weights: Mapping[str, int],
        *,
        expected: Mapping[str, int] | None,
        idempotency_key: str,
        abort: AbortSignal | None = None,
    ) -> ActionOutcome:
        """Every version's weight at once (a restore): SKIPPED without a write when the route does not show
        `expected` (someone else changed it) or already shows `weights`. Ramped like `set_weight`: the version
        whose weight rises most climbs through the ramp's steps (the others share the rest in proportion),
        holding between steps; the last write sets `weights` exactly."""
        ref = self.route(service)
        where = f"{self.kind} {ref.namespace}/{ref.name}"
        target = {str(name): int(weight) for name, weight in weights.items()}
        found = self._read(ref)
        if isinstance(found, KubeError):
            return found.outcome({"route": where})
        recorded = recorded_keys(found.get("metadata", {}).get("annotations"))
        if idempotency_key in recorded:
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {"route": where, "weights": target, "replayed": True})
        try:
            start = self._weights_of(found, service)
        except WeightError as exc:
            return ActionOutcome(OutcomeStatus.FAILED, {"route": where}, f"{where}: {exc}", False)
        detail: dict[str, Any] = {"route": where, "from": start, "to": target}
        if start == target:
            return ActionOutcome(OutcomeStatus.SKIPPED, {**detail, "reason": "already so"})
        # The ramp starts from what tailguard set (`expected`); the path is a function of that and `target`
        # alone, so a resumed restore recomputes the same steps and goes on after the last one the route records.
        origin = dict(expected) if expected is not None else start
        if set(origin) != set(target) or sum(target.values()) != 100 or min(target.values()) < 0:
            return ActionOutcome(
                OutcomeStatus.FAILED, detail, f"{where}: cannot set {target}: the route has versions {start}", False
            )
        path: list[dict[str, int]] = [target]
        if self.ramp is not None:
            rising = max(target, key=lambda name: (target[name] - origin[name], name))
            steps = self.ramp.path(origin[rising], target[rising])[:-1]
            path = [split_weights(origin, rising, step) for step in steps] + [target]
        detail["steps"] = path
        done = max((n for n in range(1, len(path)) if f"{idempotency_key}#step{n}" in recorded), default=0)
        shows = path[done - 1] if done else origin
        if start != shows:
            reason = f"changed by someone else since tailguard set {shows}: found {start}; not overwritten"
            return ActionOutcome(OutcomeStatus.SKIPPED, {**detail, "reason": reason})
        if done:
            detail["resumed_after_step"] = done
        previous = start
        conflicts = 0
        for index, step_weights in enumerate(path):
            if index < done:
                continue  # written before a restart: the route records this step's key
            stopped = None
            if index > 0 and self.ramp is not None:
                stopped = self._hold(self.ramp.hold_seconds, abort)
            stopped = stopped or (abort.requested() if abort is not None else None)
            if stopped is not None:
                written = previous if index > 0 else None  # steps before `done` were written by an earlier process
                return self._aborted(service, where, detail, stopped, index, start, written, f"{target}")
            key = idempotency_key if index == len(path) - 1 else f"{idempotency_key}#step{index + 1}"

            def compute(
                current: dict[str, int], was: dict[str, int] = previous, to: dict[str, int] = step_weights
            ) -> dict[str, int]:
                if current != was:  # a fresh read (first write, a hold, a 409) shows someone else's change
                    raise ChangedError(f"changed by someone else: expected {was}, found {current}; not overwritten")
                return dict(to)

            outcome = self._apply(ref, where, service, key, compute)
            if outcome.status is not OutcomeStatus.SUCCEEDED:
                if index == done:
                    return ActionOutcome(outcome.status, {**detail, **outcome.detail}, outcome.error, outcome.transient)
                # Changed by someone else during the ramp: part of it was written, so it is not a clean skip.
                error = outcome.error or f"{where}: the restore was interrupted: {outcome.detail.get('reason')}"
                return ActionOutcome(
                    OutcomeStatus.FAILED, {**detail, "reached": previous, **outcome.detail}, error, outcome.transient
                )
            previous = dict(outcome.detail["weights"])
            conflicts += int(outcome.detail.get("conflicts", 0))
        if self.events is not None:
            self.events.record(
                ObjectRef(f"{self.group}/{self.version}", self.kind, ref.namespace, ref.name),
                "TailguardTrafficRestore",
                f"tailguard: {service} weights {start} -> {previous} via {path} ({idempotency_key})",
                key=idempotency_key,
            )
        return ActionOutcome(
            OutcomeStatus.SUCCEEDED,
            {**detail, "weights": previous, "verified": True, "conflicts": conflicts, "replayed": False},
        )

    # -- abort ------------------------------------------------------------------------------------------

    def _hold(self, seconds: float, abort: AbortSignal | None) -> AbortRequest | None:
        """A ramp's hold: the clock's sleep, cut short by an abort (which it returns)."""
        if abort is None:
            self.clock.sleep(seconds)
            return None
        return abort.hold(seconds)

    def _aborted(
        self,
        service: str,
        where: str,
        detail: Mapping[str, Any],
        request: AbortRequest,
        index: int,
        start: Mapping[str, int],
        written: Mapping[str, int] | None,
        goal: str,
    ) -> ActionOutcome:
        """ABORTED before step `index` of the ramp in `detail["steps"]`: the weights in place (read again now), which
        whole step they are, and the steps written and not written."""
        steps = list(detail.get("steps") or [])
        last_written = dict(written) if written is not None else dict(start)
        try:
            observed = self.read_weights(service)
        except WeightError as exc:  # edited into a shape we cannot weigh
            observed = KubeError(str(exc), None, False)
        in_place = last_written if isinstance(observed, KubeError) else observed
        if written is None:
            state = f"before its first step: nothing written, weights stay {in_place}"
        else:
            state = f"before step {index + 1} of {len(steps)}: weights left at {in_place}, step {index}'s, whole"
        if not isinstance(observed, KubeError) and observed != last_written:
            state += f" (tailguard last wrote {last_written}: changed by someone else since)"
        elif isinstance(observed, KubeError):
            state += f" (as last written and verified; reading the route again failed: {observed.message})"
        outcome_detail = {
            **detail,
            "aborted": request.to_json(),
            "weights": in_place,
            "reached": dict(written) if written is not None else None,
            "steps_written": steps[:index],
            "steps_not_written": steps[index:],
            # Each step is one write of every backend's weight, verified by reading it back: never half-written.
            "consistent_step": True,
        }
        log.warning("%s: ramp to %s %s (%s)", where, goal, state, request.phrase())
        return ActionOutcome(
            OutcomeStatus.ABORTED, outcome_detail, f"{where}: ramp to {goal} {request.phrase()}; stopped {state}"
        )

    # -- one write: read, compute, PUT (409 -> again), read back and verify ---------------------------

    def _apply(
        self,
        ref: RouteRef,
        where: str,
        service: str,
        key: str,
        compute: Callable[[dict[str, int]], dict[str, int]],
    ) -> ActionOutcome:
        """One write of the weights `compute` derives from the route's current ones (fresh after a 409)."""
        conflicts = 0
        while True:
            found = self._read(ref)
            if isinstance(found, KubeError):
                return found.outcome()
            metadata = found.setdefault("metadata", {})
            if key in recorded_keys(metadata.get("annotations")):
                return ActionOutcome(OutcomeStatus.SUCCEEDED, {"weights": self._weights_of(found, service)})
            try:
                wanted = compute(self._weights_of(found, service))  # fresh: after a 409
            except ChangedError as exc:
                return ActionOutcome(OutcomeStatus.SKIPPED, {"reason": str(exc), "conflicts": conflicts})
            except WeightError as exc:
                return ActionOutcome(OutcomeStatus.FAILED, {}, f"{where}: {exc}", False)
            for name, entry in self._entries(found, service):
                entry["weight"] = wanted[name]
            metadata["annotations"] = with_key(metadata.get("annotations"), key)
            written = kube_call(
                lambda body=found: self.api.replace_namespaced_custom_object(  # type: ignore[misc]
                    self.group, self.version, ref.namespace, self.plural, ref.name, body, _request_timeout=self.timeout
                ),
                what=f"writing {where}",
                clock=self.clock,
                retry=RetryPolicy(attempts=1),
            )
            if isinstance(written, KubeError):
                if written.status == 409 and conflicts < self.conflict_retries:
                    conflicts += 1
                    log.info("%s changed while tailguard wrote it (conflict %d); reading it again", where, conflicts)
                    continue
                # One attempt: a transient failure may have landed; the dispatcher's retry reads first and then
                # finds the key (a replay, no second write).
                return written.outcome({"conflicts": conflicts})
            # Read back: what the API server stores after admission is what the data plane gets.
            check = self._read(ref)
            if isinstance(check, KubeError):
                return check.outcome({"conflicts": conflicts, "verified": False})
            observed = self._weights_of(check, service)
            if observed != wanted:
                return ActionOutcome(
                    OutcomeStatus.FAILED,
                    {"expected": wanted, "observed": observed, "verified": False},
                    f"{where}: weights read back {observed} differ from those written {wanted}",
                    False,
                )
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {"weights": observed, "conflicts": conflicts})

    def _read(self, ref: RouteRef) -> dict[str, Any] | KubeError:
        found = kube_call(
            lambda: self.api.get_namespaced_custom_object(
                self.group, self.version, ref.namespace, self.plural, ref.name, _request_timeout=self.timeout
            ),
            what=f"reading {self.kind} {ref.namespace}/{ref.name}",
            clock=self.clock,
            retry=self.retry,
        )
        if isinstance(found, KubeError):
            return found
        if not isinstance(found, dict):
            return KubeError(f"reading {self.kind} {ref.namespace}/{ref.name}: not an object", None, False)
        return found

    def _weights_of(self, obj: Mapping[str, Any], service: str) -> dict[str, int]:
        entries = self._entries(obj, service)
        weights: dict[str, int] = {}
        for name, entry in entries:
            value = int(entry.get("weight", self._default_weight(len(entries))))
            if name in weights and weights[name] != value:
                raise WeightError(f"version {name!r} has different weights in different rules")
            weights[name] = value
        return weights


def default_version_of(service: str, backend: str) -> str | None:
    """Backends are Services named `{service}-{version}` (e.g. chat-r2 -> r2)."""
    prefix = f"{service}-"
    return backend[len(prefix) :] if backend.startswith(prefix) and len(backend) > len(prefix) else None


class HttpRouteRouter(_WeightedRouteRouter):
    """Gateway API HTTPRoute (gateway.networking.k8s.io/v1): `spec.rules[].backendRefs[].weight`."""

    group = "gateway.networking.k8s.io"
    version = "v1"
    plural = "httproutes"
    kind = "HTTPRoute"

    def __init__(
        self,
        api: k8s.CustomObjectsApi,
        *,
        version_of: Callable[[str, str], str | None] = default_version_of,
        **options: Any,
    ) -> None:
        super().__init__(api, **options)
        self.version_of = version_of

    def _entries(self, obj: Mapping[str, Any], service: str) -> list[tuple[str, dict[str, Any]]]:
        found: list[tuple[str, dict[str, Any]]] = []
        for rule in obj.get("spec", {}).get("rules") or []:
            for backend in rule.get("backendRefs") or []:
                version = self.version_of(service, str(backend.get("name", "")))
                if version:  # None: a backend tailguard does not manage (it keeps its weight)
                    found.append((version, backend))
        return found

    def _default_weight(self, entries: int) -> int:
        return 1  # Gateway API: weight defaults to 1 (relative)


class VirtualServiceRouter(_WeightedRouteRouter):
    """Istio VirtualService (networking.istio.io/v1): `spec.http[].route[].weight` by `destination.subset`."""

    group = "networking.istio.io"
    version = "v1"
    plural = "virtualservices"
    kind = "VirtualService"

    def _entries(self, obj: Mapping[str, Any], service: str) -> list[tuple[str, dict[str, Any]]]:
        found: list[tuple[str, dict[str, Any]]] = []
        for http in obj.get("spec", {}).get("http") or []:
            for route in http.get("route") or []:
                subset = (route.get("destination") or {}).get("subset")
                if subset:
                    found.append((str(subset), route))
        return found

    def _default_weight(self, entries: int) -> int:
        return 100 if entries == 1 else 0  # Istio: a lone destination takes all traffic


def _rank(ramp: Ramp | None, step: int) -> int:
    """1 for the ramp's lowest step, 2 for the next, ... (the `#stepN` of an intermediate write's key)."""
    steps = sorted(set(ramp.steps)) if ramp is not None else []
    return steps.index(step) + 1 if step in steps else len(steps) + 1
