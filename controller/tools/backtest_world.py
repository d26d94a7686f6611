"""What the backtest dispatches into and reads from instead of the world (controller/tools/backtest.py).

* `WouldRun`: every action port (rollback, scale, traffic, annotations, notifications) answering "would run"
  and changing nothing outside this process. Scale and traffic keep a simulated state so that a plan and a
  restore have something to read: the backtest does not know the cluster's replica counts or route weights, so
  a service starts at 1 replica and a route with no weights; a scale's count is planned from that (then from
  what the backtest set), never from the cluster. Every call is recorded (`calls`).
* `RecordedRollouts`: the change tracker port over a list of rollouts known for the whole window (a recorded
  list, and/or what the configured change sources answered once for the window); at each evaluation it answers
  what the live tracker would have: the rollouts since the window's start up to the evaluation's time.
* `RecordedAlert` / `load_alerts`: alert times (`--alerts FILE`) that trigger extra evaluations.
* `dispatch_outcome`: one journaled action as the report shows it (would run, deferred, suppressed, ... and why).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tailguard.controller.core.actions import ActionRecord, ActionStatus
from tailguard.controller.core.alerts import PayloadError, alertmanager_payload
from tailguard.controller.core.attribution import ChangeFeed, Rollout
from tailguard.controller.core.ports import (
    AbortSignal,
    ActionOutcome,
    Annotation,
    Clock,
    NotifyRequest,
    OutcomeStatus,
    RollbackPlan,
    RollbackRequest,
    ScaleRequest,
    ScaleState,
    TrafficRequest,
)
from tailguard.controller.kit.cli_args import UsageError, parse_time

WOULD_RUN = "would_run"


@dataclass(frozen=True)
class PortCall:
    method: str
    args: Mapping[str, Any]
    idempotency_key: str
    at: float


class WouldRun:
    """Every action port, doing nothing outside this process (module docstring)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.calls: list[PortCall] = []
        self.replica_counts: dict[str, int] = {}
        self.routes: dict[str, dict[str, int]] = {}

    def _would(self, method: str, key: str, detail: Mapping[str, Any] | None = None, **args: Any) -> ActionOutcome:
        with self._lock:
            self.calls.append(PortCall(method, args, key, self._clock.now()))
        return ActionOutcome(OutcomeStatus.SUCCEEDED, {"would_run": True, **(detail or {})})

    # RollbackPort (the revisions are not known to a backtest: the plan names the attributed one, if any)
    def plan_rollback(self, service: str, *, rollout_revision: str | None = None) -> RollbackPlan | ActionOutcome:
        return RollbackPlan(service=service, from_revision=rollout_revision, to_revision=None)

    def rollback(self, request: RollbackRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        return self._would(
            "rollback", request.idempotency_key, service=request.service, rollout_revision=request.rollout_revision
        )

    # ScalePort
    def replicas(self, service: str) -> int:
        return self.replica_counts.get(service, 1)

    def scale_target(self, replicas: int) -> dict[str, int]:
        """A scale would set the replica count."""
        return {"replicas": replicas}

    def set_replicas(self, request: ScaleRequest) -> ActionOutcome:
        service, replicas, idempotency_key = request.service, request.replicas, request.idempotency_key
        before = self.replicas(service)
        self.replica_counts[service] = replicas
        return self._would(
            "set_replicas", idempotency_key, {"from": before, "to": replicas}, service=service, replicas=replicas
        )

    def scale_state(self, service: str) -> ScaleState:
        return ScaleState(replicas=self.replicas(service))

    def restore_scale(
        self, service: str, state: ScaleState, *, expected: ScaleState | None, idempotency_key: str
    ) -> ActionOutcome:
        wanted = state.replicas if state.replicas is not None else self.replicas(service)
        if wanted == self.replicas(service):
            return ActionOutcome(OutcomeStatus.SKIPPED, {"reason": "already so"})
        self.replica_counts[service] = wanted
        return self._would("restore_scale", idempotency_key, service=service, state=state.to_json())

    # TrafficRouter
    def weights(self, service: str) -> Mapping[str, int]:
        return dict(self.routes.get(service, {}))

    def set_weight(self, request: TrafficRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        service, version, weight = request.service, request.version, request.weight
        idempotency_key = request.idempotency_key
        self.routes.setdefault(service, {})[version] = weight
        return self._would("set_weight", idempotency_key, service=service, version=version, weight=weight)

    def set_weights(
        self,
        service: str,
        weights: Mapping[str, int],
        *,
        expected: Mapping[str, int] | None,
        idempotency_key: str,
        abort: AbortSignal | None = None,
    ) -> ActionOutcome:
        if dict(weights) == self.weights(service):
            return ActionOutcome(OutcomeStatus.SKIPPED, {"reason": "already so"})
        self.routes[service] = dict(weights)
        return self._would("set_weights", idempotency_key, service=service, weights=dict(weights))

    # Annotator, Notifier
    def annotate(self, annotation: Annotation, *, idempotency_key: str) -> ActionOutcome:
        return self._would("annotate", idempotency_key, text=annotation.text)

    def notify(self, request: NotifyRequest) -> ActionOutcome:
        return self._would("notify", request.idempotency_key, receiver=request.receiver)


class RecordedRollouts:
    """ChangeTrackerPort over rollouts known for the whole window: at each evaluation, those up to the clock's
    time (a rollout after the evaluation's time was not known then); `errors` (the configured sources that could
    not be read for the window) are answered at every evaluation, as the live tracker would answer its failure."""

    def __init__(self, rollouts: Sequence[Rollout], clock: Clock, errors: Sequence[str] = ()) -> None:
        self._rollouts = tuple(sorted(rollouts, key=lambda r: (r.at, r.source, r.revision)))
        self._clock = clock
        self._errors = tuple(errors)

    def rollouts(self, since: float) -> ChangeFeed:
        now = self._clock.now()
        return ChangeFeed(tuple(r for r in self._rollouts if since <= r.at <= now), self._errors)


@dataclass(frozen=True)
class RecordedAlert:
    """An alert received at `at` (epoch seconds, to the millisecond) with these labels."""

    at: float
    labels: Mapping[str, str] = field(default_factory=dict)


def load_alerts(path: str) -> tuple[RecordedAlert, ...]:
    """`--alerts FILE`: a JSON list of `{at, labels}` and/or Alertmanager webhook payloads (version "4"), by time.

    A payload's alerts arrive at the payload's `at` when it has one (the time it was posted), else each at its
    `startsAt` (firing) or `endsAt` (resolved). Times are epoch seconds or RFC3339. UsageError for anything else.
    """
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as unreadable:
        raise UsageError(f"--alerts {path}: cannot read a JSON alert list: {unreadable}") from None
    if not isinstance(raw, list):
        raise UsageError(f"--alerts {path}: expected a JSON list of alerts or Alertmanager payloads")
    alerts: list[RecordedAlert] = []
    for index, item in enumerate(raw):
        where = f"--alerts {path}: [{index}]"
        if not isinstance(item, dict):
            raise UsageError(f"{where}: expected an object")
        if "version" in item:
            try:
                payload = alertmanager_payload(item)
            except PayloadError as bad:
                raise UsageError(f"{where}: {bad}") from None
            posted = item.get("at")
            for number, alert in enumerate(payload.alerts):
                when = posted if posted is not None else (alert.startsAt if alert.status == "firing" else alert.endsAt)
                if when in (None, ""):
                    raise UsageError(f"{where}.alerts[{number}]: no time (give the payload an `at`)")
                alerts.append(RecordedAlert(_time(when, f"{where}.alerts[{number}]"), dict(alert.labels)))
            continue
        labels = item.get("labels")
        if "at" not in item or not isinstance(labels, dict):
            raise UsageError(f"{where}: expected {{at, labels}} or an Alertmanager payload")
        alerts.append(RecordedAlert(_time(item["at"], f"{where}.at"), {str(k): str(v) for k, v in labels.items()}))
    return tuple(sorted(alerts, key=lambda a: (a.at, sorted(a.labels.items()))))


def _time(value: Any, where: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return round(float(value), 3)
    try:
        return round(parse_time(str(value), where), 3)
    except ValueError as bad:
        raise UsageError(str(bad)) from None


# The report's words for the journal's statuses (the action never ran: it "would" have).
_OUTCOMES = {
    ActionStatus.SUCCEEDED: WOULD_RUN,
    ActionStatus.SKIPPED: "skipped",
    ActionStatus.FAILED: "failed",
    ActionStatus.DEFERRED: "deferred",
    ActionStatus.SUPPRESSED: "suppressed",
    ActionStatus.DRY_RUN: "dry_run",
    ActionStatus.PLANNED: "planned",
    ActionStatus.STARTED: "started",
}


def dispatch_outcome(record: ActionRecord, events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One action's dispatch in the backtest: `outcome` (would_run, deferred: still deferred at the end,
    suppressed, skipped, failed, dry_run), `at` (when it would have run, or ended), `why` (the refusal, the
    suppression's reason, a skip's or failure's reason; null when it would run), and the journaled `events`
    (each global-limits refusal, the start, the outcome)."""
    result = dict(record.result or {})
    detail = dict(result.get("detail") or {})
    why = record.error
    if why is None and record.status is ActionStatus.SKIPPED:
        why = str(detail.get("reason") or "nothing to do")
    at = record.started_at if record.status is ActionStatus.SUCCEEDED else (record.finished_at or record.updated_at)
    return {
        "outcome": _OUTCOMES.get(record.status, record.status.value),
        "at": at,
        "why": why,
        "events": [dict(event) for event in events],
    }
