"""In-memory actuators for tests: they record every call, deduplicate by idempotency key like the real
ones, and fail on demand (`script(...)` queues outcomes: a transient or permanent failure, or a raise)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.core.model import ActionRequest, ActionType, Decision, DecisionKind, decision_id, target_key
from controller.core.ports import ActionOutcome, Annotation, OutcomeStatus


def transient_failure(message: str = "503 Service Unavailable") -> ActionOutcome:
    return ActionOutcome(OutcomeStatus.FAILED, {}, message, transient=True)


def permanent_failure(message: str = "400 Bad Request") -> ActionOutcome:
    return ActionOutcome(OutcomeStatus.FAILED, {}, message, transient=False)


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


class FakeDeployer(_Recorder):
    def __init__(self, replicas: Mapping[str, int] | None = None, revisions: Mapping[str, int] | None = None) -> None:
        super().__init__()
        self.replica_counts: dict[str, int] = dict(replicas or {})
        self.active_revision: dict[str, int] = dict(revisions or {})
        self.replicas_error: BaseException | None = None

    def rollback(self, service: str, *, idempotency_key: str) -> ActionOutcome:
        def act() -> ActionOutcome:
            current = self.active_revision.get(service, 2)
            if current <= 1:
                return ActionOutcome(OutcomeStatus.FAILED, {}, "no earlier good revision", False)
            self.active_revision[service] = current - 1
            return ActionOutcome(
                OutcomeStatus.SUCCEEDED,
                {"from_revision": current, "to_revision": current - 1, "replayed": False},
            )

        return self._handle("rollback", {"service": service}, idempotency_key, act)

    def replicas(self, service: str) -> int:
        if self.replicas_error is not None:
            raise self.replicas_error
        return self.replica_counts.get(service, 1)

    def set_replicas(self, service: str, replicas: int, *, idempotency_key: str) -> ActionOutcome:
        def act() -> ActionOutcome:
            before = self.replica_counts.get(service, 1)
            self.replica_counts[service] = replicas
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {"from": before, "to": replicas, "replayed": False})

        return self._handle("set_replicas", {"service": service, "replicas": replicas}, idempotency_key, act)


class FakeRouter(_Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.weights: dict[tuple[str, str], int] = {}

    def set_weight(self, service: str, version: str, weight: int, *, idempotency_key: str) -> ActionOutcome:
        def act() -> ActionOutcome:
            self.weights[(service, version)] = weight
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {"weight": weight, "verified": True, "replayed": False})

        return self._handle(
            "set_weight", {"service": service, "version": version, "weight": weight}, idempotency_key, act
        )


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

    def notify(self, receiver: str, payload: Mapping[str, Any], *, idempotency_key: str) -> ActionOutcome:
        def act() -> ActionOutcome:
            self.sent.append((receiver, payload))
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {"receiver": receiver, "replayed": False})

        return self._handle("notify", {"receiver": receiver}, idempotency_key, act)


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
        ActionRequest(ActionType(action_type), dict(params), f"{incident}:{decision_kind.value}:{index}")
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
