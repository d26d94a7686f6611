"""Public fakes of the ports (controller/core/ports/), for tests: like `kopf.testing`, shipped with the package.

Action ports (FakeRollback, FakeScaler, FakeDeployer for both, FakeRouter, FakeAnnotator, FakeNotifier) record
every call, deduplicate by idempotency key like the real ones, and fail on demand (`script(...)` queues outcomes:
a transient or permanent failure, or a raise). FakeSource is a scripted MetricsSource. `make_decision` builds a
decision as the engine would.

The loop's collaborators: FakeDispatcher (DispatcherPort: records decisions and resumes), FakeJournal (JournalPort
in memory: engine states and decisions; the dispatcher's ActionJournalPort is the real Journal on a temporary
path), FakeLeader (LeaderPort: leading as told), FakeHandover (HandoverPort), FakeChangeTracker
(ChangeTrackerPort: a fixed ChangeFeed) and FakePredictions (PredictionPort: fixed signals and warnings).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tailguard.controller.core.actions import ActionRequest, ActionType
from tailguard.controller.core.attribution import ChangeFeed, Rollout
from tailguard.controller.core.engine import ConditionState, Phase, PolicyState
from tailguard.controller.core.handover import ActionTimes
from tailguard.controller.core.model import Decision, DecisionKind, SignalResult, decision_id, target_key
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.ports import (
    AbortSignal,
    ActionOutcome,
    Annotation,
    HandoverPort,
    MetricsSource,
    NotifyRequest,
    OutcomeStatus,
    RangeResult,
    RollbackPlan,
    RollbackRequest,
    ScaleRequest,
    ScaleState,
    TrafficRequest,
)


def transient_failure(message: str = "503 Service Unavailable") -> ActionOutcome:
    return ActionOutcome(OutcomeStatus.FAILED, {}, message, transient=True)


def permanent_failure(message: str = "400 Bad Request") -> ActionOutcome:
    return ActionOutcome(OutcomeStatus.FAILED, {}, message, transient=False)


def _aborted(abort: AbortSignal | None, left: Mapping[str, Any] | None = None) -> ActionOutcome | None:
    """The fakes act in one step: an abort already requested when they are called stops them before acting."""
    stopped = abort.requested() if abort is not None else None
    if stopped is None:
        return None
    detail = {**(left or {}), "aborted": stopped.to_json()}
    return ActionOutcome(OutcomeStatus.ABORTED, detail, f"{stopped.phrase()}; nothing written")


@dataclass
class Call:
    method: str
    args: Mapping[str, Any]
    idempotency_key: str | None
    replayed: bool = False


@dataclass
class _Recorder:
    calls: list[Call] = field(default_factory=list)
    # Outcomes (or exceptions to raise) returned by the next calls, in order, before normal behaviour.
    _script: deque[ActionOutcome | BaseException] = field(default_factory=deque)
    _answers: dict[str, ActionOutcome] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def script(self, *outcomes: ActionOutcome | BaseException) -> None:
        self._script.extend(outcomes)

    def performed(self, method: str | None = None) -> list[Call]:
        """Calls that had an effect: not scripted failures, not replays of a key already answered."""
        return [
            c
            for c in self.calls
            if not c.replayed and (method is None or c.method == method) and c.args.get("_effective", True)
        ]

    def _handle(self, method: str, args: dict[str, Any], key: str | None, act: Any) -> ActionOutcome:
        with self._lock:
            if self._script:
                scripted = self._script.popleft()
                self.calls.append(Call(method, {**args, "_effective": False}, key))
                if isinstance(scripted, BaseException):
                    raise scripted
                if scripted.status is not OutcomeStatus.FAILED and key is not None:
                    self._answers[key] = scripted
                return scripted
            if key is not None and key in self._answers:
                self.calls.append(Call(method, args, key, replayed=True))
                first = self._answers[key]
                return ActionOutcome(first.status, {**first.detail, "replayed": True}, first.error, first.transient)
            outcome: ActionOutcome = act()
            self.calls.append(Call(method, args, key))
            if key is not None and outcome.status is not OutcomeStatus.FAILED:
                self._answers[key] = outcome
            return outcome


class FakeRollback(_Recorder):
    """RollbackPort: each service steps back one revision (an attributed `rollout_revision` is recorded)."""

    def __init__(self, revisions: Mapping[str, int] | None = None) -> None:
        super().__init__()
        self.active_revision: dict[str, int] = dict(revisions or {})

    def plan_rollback(self, service: str, *, rollout_revision: str | None = None) -> RollbackPlan | ActionOutcome:
        current = self.active_revision.get(service, 2)
        if current <= 1:
            return ActionOutcome(OutcomeStatus.FAILED, {}, "no earlier good revision", False)
        return RollbackPlan(service=service, from_revision=current, to_revision=current - 1)

    def rollback(self, request: RollbackRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        service, rollout_revision = request.service, request.rollout_revision

        def act() -> ActionOutcome:
            stopped = _aborted(abort)
            if stopped is not None:
                return stopped
            current = self.active_revision.get(service, 2)
            planned = request.plan or self.plan_rollback(service, rollout_revision=rollout_revision)
            if isinstance(planned, ActionOutcome):
                return planned
            source, target = int(planned.from_revision or 0), int(planned.to_revision or 0)
            detail: dict[str, Any] = {"from_revision": source, "to_revision": target, "replayed": False}
            if current == target:
                return ActionOutcome(OutcomeStatus.SUCCEEDED, {**detail, "already_done": True})
            if current != source:
                reason = f"changed by someone else since the plan: revision {current}"
                return ActionOutcome(OutcomeStatus.WORLD_CHANGED, {**detail, "reason": reason}, reason)
            self.active_revision[service] = target
            return ActionOutcome(OutcomeStatus.SUCCEEDED, detail)

        args: dict[str, Any] = {"service": service}
        if rollout_revision is not None:
            args["rollout_revision"] = rollout_revision
        return self._handle("rollback", args, request.idempotency_key, act)


class FakeScaler(_Recorder):
    """ScalePort: replica counts in a dict (`replicas_error` makes the read raise)."""

    def __init__(self, replicas: Mapping[str, int] | None = None) -> None:
        super().__init__()
        self.replica_counts: dict[str, int] = dict(replicas or {})
        self.replicas_error: BaseException | None = None

    def replicas(self, service: str) -> int:
        if self.replicas_error is not None:
            raise self.replicas_error
        return self.replica_counts.get(service, 1)

    def scale_target(self, replicas: int) -> dict[str, int]:
        """A scale sets the fake's replica count."""
        return {"replicas": replicas}

    def set_replicas(self, request: ScaleRequest) -> ActionOutcome:
        service, replicas, idempotency_key = request.service, request.replicas, request.idempotency_key
        def act() -> ActionOutcome:
            before = self.replica_counts.get(service, 1)
            self.replica_counts[service] = replicas
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {"from": before, "to": replicas, "replayed": False})

        return self._handle("set_replicas", {"service": service, "replicas": replicas}, idempotency_key, act)

    def scale_state(self, service: str) -> ScaleState:
        return ScaleState(replicas=self.replicas(service))

    def restore_scale(
        self,
        service: str,
        state: ScaleState,
        *,
        expected: ScaleState | None,
        idempotency_key: str,
    ) -> ActionOutcome:
        def act() -> ActionOutcome:
            current, wanted = self.replica_counts.get(service, 1), int(state.replicas or 0)
            detail: dict[str, Any] = {"from": {"replicas": current}, "to": {"replicas": wanted}, "replayed": False}
            if current == wanted:
                return ActionOutcome(OutcomeStatus.SKIPPED, {**detail, "reason": "already so"})
            if expected is not None and int(expected.replicas or 0) != current:
                return ActionOutcome(OutcomeStatus.SKIPPED, {**detail, "reason": "changed by someone else"})
            self.replica_counts[service] = wanted
            return ActionOutcome(OutcomeStatus.SUCCEEDED, detail)

        args = {"service": service, "state": state.to_json(), "expected": expected.to_json() if expected else None}
        return self._handle("restore_scale", args, idempotency_key, act)


class FakeDeployer(FakeRollback, FakeScaler):
    """Both RollbackPort and ScalePort, with one call record (the local tier's shape)."""

    def __init__(self, replicas: Mapping[str, int] | None = None, revisions: Mapping[str, int] | None = None) -> None:
        FakeScaler.__init__(self, replicas)
        self.active_revision = dict(revisions or {})


class FakeRouter(_Recorder):
    """TrafficRouter: each service's route as version -> weight (`routes`). `set_weight` gives the other versions
    the rest in proportion to their weights (evenly when all 0); a version the route lacks is added."""

    def __init__(self, routes: Mapping[str, Mapping[str, int]] | None = None) -> None:
        super().__init__()
        self.routes: dict[str, dict[str, int]] = {name: dict(route) for name, route in (routes or {}).items()}

    def weights(self, service: str) -> Mapping[str, int]:
        return dict(self.routes.get(service, {}))

    def set_weight(self, request: TrafficRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        service, version, weight = request.service, request.version, request.weight
        idempotency_key = request.idempotency_key
        def act() -> ActionOutcome:
            stopped = _aborted(abort, {"weights": dict(self.routes.get(service, {}))})
            if stopped is not None:
                return stopped
            route = self.routes.setdefault(service, {})
            others = [name for name in route if name != version]
            total = sum(route[name] for name in others)
            shares = {
                name: (route[name] * (100 - weight) // total if total else (100 - weight) // len(others))
                for name in others
            }
            if others:  # integer shares: the first other version takes what rounding left over
                shares[others[0]] += 100 - weight - sum(shares.values())
            route.update({version: weight, **shares})
            detail = {"weight": weight, "weights": dict(route), "verified": True, "replayed": False}
            return ActionOutcome(OutcomeStatus.SUCCEEDED, detail)

        return self._handle(
            "set_weight", {"service": service, "version": version, "weight": weight}, idempotency_key, act
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
        def act() -> ActionOutcome:
            stopped = _aborted(abort, {"weights": dict(self.routes.get(service, {}))})
            if stopped is not None:
                return stopped
            current, wanted = dict(self.routes.get(service, {})), dict(weights)
            detail: dict[str, Any] = {"from": current, "to": wanted, "replayed": False}
            if current == wanted:
                return ActionOutcome(OutcomeStatus.SKIPPED, {**detail, "reason": "already so"})
            if expected is not None and current != dict(expected):
                return ActionOutcome(OutcomeStatus.SKIPPED, {**detail, "reason": "changed by someone else"})
            self.routes[service] = wanted
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {**detail, "weights": wanted, "verified": True})

        args = {"service": service, "weights": dict(weights), "expected": dict(expected) if expected else None}
        return self._handle("set_weights", args, idempotency_key, act)


class FakeAnnotator(_Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.annotations: list[Annotation] = []

    def annotate(self, annotation: Annotation, *, idempotency_key: str) -> ActionOutcome:
        def act() -> ActionOutcome:
            self.annotations.append(annotation)
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {"replayed": False})

        return self._handle("annotate", {"text": annotation.text}, idempotency_key, act)


class FakeNotifier(_Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, Mapping[str, Any]]] = []

    def notify(self, request: NotifyRequest) -> ActionOutcome:
        receiver, idempotency_key = request.receiver, request.idempotency_key

        def act() -> ActionOutcome:
            self.sent.append((receiver, request.payload.to_json()))
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {"receiver": receiver, "replayed": False})

        return self._handle("notify", {"receiver": receiver}, idempotency_key, act)


def condition_state(decision: Decision, phase: str = "firing") -> PolicyState:
    """The engine state an evaluation commits while `decision`'s condition is `phase` for its target ("firing":
    with the decision's id, as right after it fired or while it keeps firing; "ok": recovered)."""
    state = ConditionState(
        phase=Phase(phase),
        onset=decision.onset if phase == "firing" else None,
        decision_id=decision.id if phase == "firing" else None,
        fired_at=decision.fired_at if phase == "firing" else None,
    )
    return PolicyState(conditions={(decision.condition, decision.target): state})


def make_decision(
    actions: list[tuple[str, Mapping[str, Any]]],
    *,
    policy: str = "p99-rollback",
    condition: str = "p99-above-800ms",
    service: str = "chat",
    onset: float = 1_700_000_000.0,
    at: float | None = None,
    kind: str = "fire",
    value: float | None = 1.2,
    dry_run: bool = False,
) -> Decision:
    """A decision as the engine would produce it (deterministic id, keys `"{id}:{kind}:{index}"`)."""
    target = target_key({"service": service})
    incident = decision_id(policy, condition, target, onset)
    decision_kind = DecisionKind(kind)
    requests = tuple(
        ActionRequest.of(ActionType(action_type), dict(params), f"{incident}:{decision_kind.value}:{index}")
        for index, (action_type, params) in enumerate(actions)
    )
    when = at if at is not None else onset + 30.0
    return Decision(
        id=incident,
        kind=decision_kind,
        policy=policy,
        condition=condition,
        target=target,
        onset=onset,
        at=when,
        fired_at=when if decision_kind is DecisionKind.FIRE else onset + 30.0,
        resolved_at=when if decision_kind is DecisionKind.RESOLVE else None,
        value=value,
        threshold=0.8,
        evidence=((onset, 1.0), (onset + 15.0, 1.1), (when, value or 0.0)),
        actions=requests,
        dry_run=dry_run,
        reason="> 0.8 for 3 consecutive evaluations",
    )


# ----- MetricsSource ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SentQuery:
    kind: str  # "instant" or "range"
    query: str
    group_by: tuple[str, ...]
    at: float | None = None
    start: float | None = None
    end: float | None = None
    step: float | None = None


InstantAnswer = SignalResult | Callable[[str, float | None], SignalResult]
RangeAnswer = RangeResult | Callable[[str, float, float, float], RangeResult]


@dataclass
class FakeSource:
    """Answers from scripts keyed by exact query text; an unknown query is an error result (as Prometheus'd be).

    `instant_answers[query]` is a SignalResult, or a function (query, at) -> SignalResult; a list of
    answers is consumed one per call (the last one repeats). `range_answers` likewise for range().
    `default` answers any query not scripted (None: an error naming the query).
    """

    instant_answers: dict[str, InstantAnswer | list[InstantAnswer]] = field(default_factory=dict)
    range_answers: dict[str, RangeAnswer | list[RangeAnswer]] = field(default_factory=dict)
    default: SignalResult | None = None
    sent: list[SentQuery] = field(default_factory=list)

    def instant(self, query: str, group_by: Sequence[str], at: float | None = None) -> SignalResult:
        self.sent.append(SentQuery("instant", query, tuple(group_by), at=at))
        answer: InstantAnswer | None = _next(self.instant_answers, query)
        if answer is None:
            return self.default if self.default is not None else SignalResult.failed(f"unscripted query: {query}")
        return answer if isinstance(answer, SignalResult) else answer(query, at)

    def range(self, query: str, group_by: Sequence[str], start: float, end: float, step: float) -> RangeResult:
        self.sent.append(SentQuery("range", query, tuple(group_by), start=start, end=end, step=step))
        answer: RangeAnswer | None = _next(self.range_answers, query)
        if answer is None:
            return RangeResult(error=f"unscripted range query: {query}")
        return answer if isinstance(answer, RangeResult) else answer(query, start, end, step)

    def queries(self, kind: str | None = None) -> list[str]:
        return [sent.query for sent in self.sent if kind is None or sent.kind == kind]


def _next(script: Mapping[str, Any], query: str) -> Any:
    answer = script.get(query)
    if isinstance(answer, list):
        if not answer:
            return None
        return answer.pop(0) if len(answer) > 1 else answer[0]
    return answer


# ----- the loop's collaborators -----------------------------------------------------------------------------


class FakeDispatcher:
    """DispatcherPort: records every decision it is given (`dispatched`), counts `resume()` calls and records each
    `retry_deferred(policy, state)` (`retried`); runs nothing. `deferred` is what `deferred_policies()` answers."""

    def __init__(self) -> None:
        self.dispatched: list[Decision] = []
        self.resumed = 0
        self.retried: list[tuple[str, PolicyState | None]] = []
        self.deferred: set[str] = set()

    def dispatch(self, decision: Decision) -> Sequence[Any]:
        self.dispatched.append(decision)
        return []

    def resume(self) -> Sequence[Any]:
        self.resumed += 1
        return []

    def retry_deferred(self, policy: str, state: PolicyState | None) -> Sequence[Any]:
        self.retried.append((policy, state))
        return []

    def deferred_policies(self) -> set[str]:
        return set(self.deferred)


class FakeJournal:
    """JournalPort in memory: the last engine state per policy and the decisions committed, newest first in
    `recent_decisions` (each decision's JSON plus `recorded_at`, without action records)."""

    def __init__(self) -> None:
        self.states: dict[str, PolicyState] = {}
        self.decisions: list[tuple[Decision, float]] = []
        self.closed = False

    def load_state(self, policy: str) -> PolicyState | None:
        return self.states.get(policy)

    def commit_evaluation(self, policy: str, state: PolicyState, decisions: Sequence[Decision], now: float) -> None:
        self.states[policy] = state
        known = {(d.id, d.kind) for d, _ in self.decisions}
        self.decisions.extend((d, now) for d in decisions if (d.id, d.kind) not in known)

    def recent_decisions(self, limit: int = 100, before: int | None = None) -> list[dict[str, Any]]:
        numbered = [(seq, d, at) for seq, (d, at) in enumerate(self.decisions, start=1)]
        newest = [entry for entry in reversed(numbered) if before is None or entry[0] < before][: max(0, limit)]
        return [{**decision.to_json(), "recorded_at": at, "seq": seq} for seq, decision, at in newest]

    def close(self) -> None:
        self.closed = True


class FakeLeader:
    """LeaderPort: leading or not as the test sets `leading`; remembers the attached handover and counts
    `publish()` calls (which succeed only while leading)."""

    def __init__(self, leading: bool = True) -> None:
        self.leading = leading
        self.handover: HandoverPort | None = None
        self.published = 0

    def is_leader(self) -> bool:
        return self.leading

    def attach_handover(self, handover: HandoverPort) -> None:
        self.handover = handover

    def publish(self) -> bool:
        self.published += 1
        return self.leading


class FakeHandover:
    """HandoverPort: hands out `times` as its snapshot and records what it is told to inherit."""

    def __init__(self, times: ActionTimes | None = None) -> None:
        self.times: ActionTimes = dict(times or {})
        self.inherited: list[ActionTimes] = []

    def handover_snapshot(self) -> ActionTimes:
        return self.times

    def inherit_handover(self, times: ActionTimes) -> None:
        self.inherited.append(times)


class FakeChangeTracker:
    """ChangeTrackerPort: the rollouts (and source errors) it is given, those at or after `since`; records each
    `since` asked for."""

    def __init__(self, rollouts: Sequence[Rollout] = (), errors: Sequence[str] = ()) -> None:
        self.rollouts_known = list(rollouts)
        self.errors = tuple(errors)
        self.asked: list[float] = []

    def rollouts(self, since: float) -> ChangeFeed:
        self.asked.append(since)
        return ChangeFeed(tuple(r for r in self.rollouts_known if r.at >= since), self.errors)


class FakePredictions:
    """PredictionPort: the same signals (name -> SignalResult) for every policy, and fixed warnings."""

    def __init__(self, signals: Mapping[str, SignalResult] | None = None, warnings: Sequence[str] = ()) -> None:
        self.signals = dict(signals or {})
        self._warnings = list(warnings)
        self.asked: list[tuple[str, float | None]] = []

    def predict(self, source: MetricsSource, policy: Policy, at: float | None = None) -> Mapping[str, SignalResult]:
        self.asked.append((policy.name, at))
        return dict(self.signals)

    def warnings(self) -> list[str]:
        return list(self._warnings)
