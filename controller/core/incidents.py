"""Incidents: one per service scope, opened by the first policy that fires, joined by every other one.

Pure data and transitions (no I/O, no clock): the loop (controller/loop/incidents.py) reads an incident and its
service's ledger from a store (the journal's SQLite locally, a `TailguardIncident` resource in a cluster), applies
one of these functions, and writes the result back with a compare-and-set on `version`.

An incident holds what fired (policies, conditions, evidence), the cause it is attributed to (rollout, revision),
the actions taken with their plans and outcomes, the escalation stage and its end. The service's `Ledger` (the
revisions known bad, the rollouts undone, the last revision known good) outlives each incident: every replica and
a restart read it from the store, so a successor never takes a rolled-back revision for a good one.

The rules the rollback path asks (`rollback_refusal`):
* at most one rollback per incident, whichever policy asks: a rollback that did not end the breach is followed by
  the escalation ladder (a notification by default), never by a second rollback;
* a rollback never targets a revision this incident or an earlier one marked bad;
* a rollback never goes past the last revision known good (seen healthy for a recovery window) without a human.

Lifecycle (docs/architecture.md, "Incidents", draws it):
  open --action--> acting --outcome--> verifying --breach held past verifyAfter--> escalated (stage n)
  any --every joined policy recovered--> resolved (the running revision becomes the last known good)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from tailguard.controller.core.model import TargetKey, target_labels
from tailguard.controller.kit.errors import StoreError

# The labels that make a scope: what every shipped policy groups by at least (a version-level target of one
# service is the same incident as the service-level one).
SCOPE_LABELS: tuple[str, ...] = ("namespace", "service")


class IncidentPhase(StrEnum):
    OPEN = "open"  # fired; no action of the incident has run yet
    ACTING = "acting"  # an action is running or its outcome is not yet verified
    VERIFYING = "verifying"  # the last action ended; the breach has `verifyAfter` to end
    ESCALATED = "escalated"  # a step of the ladder ran (stage n)
    RESOLVED = "resolved"  # every joined policy recovered


OPEN_PHASES = frozenset({IncidentPhase.OPEN, IncidentPhase.ACTING, IncidentPhase.VERIFYING, IncidentPhase.ESCALATED})


# The actions whose effect is verified (a notification or an annotation changes nothing that could end a breach).
VERIFIED_ACTIONS = frozenset({"rollback", "scale", "shift_traffic", "escalation"})


class IncidentConflict(StoreError):
    """The stored incident changed since it was read (compare-and-set failed): read it again and re-decide."""


def scope_of(target: TargetKey | Mapping[str, str]) -> dict[str, str]:
    """The incident scope of a target: its namespace and service labels (all its labels when it has no service)."""
    labels = target_labels(target) if not isinstance(target, Mapping) else dict(target)
    scoped = {name: labels[name] for name in SCOPE_LABELS if name in labels}
    return scoped if "service" in scoped else labels


def scope_key(scope: Mapping[str, str]) -> str:
    """One string per scope: `namespace=llm,service=chat`."""
    return ",".join(f"{name}={value}" for name, value in sorted(scope.items()))


def service_of(scope: Mapping[str, str]) -> str:
    return scope.get("service") or scope_key(scope)


def incident_id(scope: Mapping[str, str], opened_at: float) -> str:
    """A DNS-1123 name (it names a Kubernetes object too): `chat-1700000030`, `llm-chat-1700000030` with a
    namespace (two namespaces' `chat` are two scopes)."""
    name = service_of(scope) if "namespace" not in scope else f"{scope['namespace']}-{service_of(scope)}"
    base = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:50] or "scope"
    return f"{base}-{int(opened_at)}"


@dataclass(frozen=True)
class Firing:
    """One policy's condition that fired in the incident (the first fire of each policy and condition)."""

    policy: str
    condition: str
    decision_id: str
    at: float
    value: float | None
    threshold: float
    evidence: tuple[tuple[float, float], ...] = ()
    cause: str | None = None  # the rollout revision the decision attributed the breach to

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "condition": self.condition,
            "decision_id": self.decision_id,
            "at": self.at,
            "value": self.value,
            "threshold": self.threshold,
            "evidence": [[t, v] for t, v in self.evidence],
            "cause": self.cause,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Firing:
        return Firing(
            policy=str(data["policy"]),
            condition=str(data["condition"]),
            decision_id=str(data["decision_id"]),
            at=float(data["at"]),
            value=None if data.get("value") is None else float(data["value"]),
            threshold=float(data.get("threshold", 0.0)),
            evidence=tuple((float(t), float(v)) for t, v in data.get("evidence") or ()),
            cause=None if data.get("cause") is None else str(data["cause"]),
        )


@dataclass(frozen=True)
class TakenAction:
    """An action of the incident: its plan and outcome (`status`: succeeded, skipped, refused, failed, ...)."""

    key: str
    type: str
    policy: str
    at: float
    status: str
    plan: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "type": self.type,
            "policy": self.policy,
            "at": self.at,
            "status": self.status,
            "plan": dict(self.plan),
            "reason": self.reason,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> TakenAction:
        return TakenAction(
            key=str(data["key"]),
            type=str(data["type"]),
            policy=str(data.get("policy", "")),
            at=float(data["at"]),
            status=str(data["status"]),
            plan=dict(data.get("plan") or {}),
            reason=str(data.get("reason") or ""),
        )

    def describe(self) -> str:
        if self.type == "rollback" and self.plan.get("from_revision") is not None:
            what = f"rollback {self.plan['from_revision']} -> {self.plan.get('to_revision')}"
        else:
            what = self.type
        return f"{what} {self.status}" + (f" ({self.reason})" if self.reason else "")


@dataclass(frozen=True)
class Ledger:
    """What a service's incidents learned about its revisions; read by every replica and after a restart."""

    service: str
    known_bad: tuple[str, ...] = ()
    rolled_back: tuple[str, ...] = ()  # rollouts an incident undid: never again the cause of a later breach
    last_good: str | None = None
    version: str = ""  # the store's compare-and-set token

    def to_json(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "known_bad": list(self.known_bad),
            "rolled_back": list(self.rolled_back),
            "last_good": self.last_good,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any], version: str = "") -> Ledger:
        last = data.get("last_good")
        return Ledger(
            service=str(data["service"]),
            known_bad=tuple(str(r) for r in data.get("known_bad") or ()),
            rolled_back=tuple(str(r) for r in data.get("rolled_back") or ()),
            last_good=None if last is None else str(last),
            version=version,
        )


@dataclass(frozen=True)
class Incident:
    id: str
    scope: Mapping[str, str]
    opened_at: float
    phase: IncidentPhase = IncidentPhase.OPEN
    fired: tuple[Firing, ...] = ()
    recovered: tuple[str, ...] = ()  # policies whose recovery held (they stay in `fired`)
    cause: Mapping[str, Any] | None = None  # {"rollout": revision, "policy": ..., "undone": bool}
    actions: tuple[TakenAction, ...] = ()
    stage: int = 0  # escalation steps taken
    next_step: str = ""
    notes: tuple[str, ...] = ()  # what the incident found (a restore skipped because a human changed the object)
    ended_at: float | None = None
    version: str = ""  # the store's compare-and-set token (resourceVersion, or the journal row's counter)

    @property
    def open(self) -> bool:
        return self.phase in OPEN_PHASES

    @property
    def service(self) -> str:
        return service_of(self.scope)

    @property
    def policies(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.policy for f in self.fired))

    @property
    def active_policies(self) -> tuple[str, ...]:
        return tuple(p for p in self.policies if p not in self.recovered)

    def rollbacks(self) -> tuple[TakenAction, ...]:
        """The rollbacks the incident made (or may have: one that started counts until it says otherwise)."""
        return tuple(a for a in self.actions if a.type == "rollback" and a.status in ("succeeded", "started"))

    def last_action(self) -> TakenAction | None:
        done = [
            a for a in self.actions if a.type in VERIFIED_ACTIONS and a.status in ("succeeded", "started", "escalated")
        ]
        return done[-1] if done else None

    def summary(self) -> dict[str, str]:
        """The printer columns: service, phase, cause, action, next step."""
        cause = ""
        if self.cause is not None:
            cause = f"rollout {self.cause.get('rollout')}" + (" (undone)" if self.cause.get("undone") else "")
        last = self.actions[-1].describe() if self.actions else ""
        return {
            "service": self.service,
            "phase": self.phase.value,
            "cause": cause,
            "action": last,
            "stage": str(self.stage),
            "next": self.next_step,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "scope": dict(self.scope),
            "opened_at": self.opened_at,
            "phase": self.phase.value,
            "fired": [f.to_json() for f in self.fired],
            "recovered": list(self.recovered),
            "cause": dict(self.cause) if self.cause is not None else None,
            "actions": [a.to_json() for a in self.actions],
            "stage": self.stage,
            "next_step": self.next_step,
            "notes": list(self.notes),
            "ended_at": self.ended_at,
            "summary": self.summary(),
        }

    @staticmethod
    def from_json(data: Mapping[str, Any], version: str = "") -> Incident:
        ended = data.get("ended_at")
        return Incident(
            id=str(data["id"]),
            scope={str(k): str(v) for k, v in dict(data["scope"]).items()},
            opened_at=float(data["opened_at"]),
            phase=IncidentPhase(str(data.get("phase", "open"))),
            fired=tuple(Firing.from_json(f) for f in data.get("fired") or ()),
            recovered=tuple(str(p) for p in data.get("recovered") or ()),
            cause=dict(data["cause"]) if data.get("cause") else None,
            actions=tuple(TakenAction.from_json(a) for a in data.get("actions") or ()),
            stage=int(data.get("stage", 0)),
            next_step=str(data.get("next_step") or ""),
            notes=tuple(str(n) for n in data.get("notes") or ()),
            ended_at=None if ended is None else float(ended),
            version=version,
        )


# ----- transitions ---------------------------------------------------------------------------------------------


def open_or_join(current: Incident | None, scope: Mapping[str, str], firing: Firing) -> Incident:
    """The incident `firing` belongs to: `current` joined (when open), or a new one opened by it."""
    if current is None or not current.open:
        incident = Incident(
            id=incident_id(scope, firing.at),
            scope=dict(scope),
            opened_at=firing.at,
            next_step="first action of the policy that fired",
        )
    else:
        incident = current
    if any(f.decision_id == firing.decision_id for f in incident.fired):
        return incident  # the same decision seen again (a resume): joined once
    cause = incident.cause
    if cause is None and firing.cause is not None:
        cause = {"rollout": firing.cause, "policy": firing.policy, "undone": False}
    return replace(
        incident,
        fired=(*incident.fired, firing),
        recovered=tuple(p for p in incident.recovered if p != firing.policy),
        cause=cause,
    )


def recover(
    incident: Incident, policy: str, now: float, ledger: Ledger, running: str | None
) -> tuple[Incident, Ledger]:
    """`policy` recovered on the scope; when every joined policy has, the incident ends and the revision running
    (when the incident knows it: its last rollback's target) is the last known good."""
    if not incident.open or policy not in incident.policies:
        return incident, ledger
    recovered = tuple(dict.fromkeys((*incident.recovered, policy)))
    incident = replace(incident, recovered=recovered)
    if incident.active_policies:
        return incident, ledger
    known_bad = running is not None and any(same_revision(running, bad) for bad in ledger.known_bad)
    good = running if running is not None and not known_bad else ledger.last_good
    return (
        replace(incident, phase=IncidentPhase.RESOLVED, ended_at=now, next_step=""),
        replace(ledger, last_good=good),
    )


def rollback_refusal(incident: Incident | None, ledger: Ledger, plan: Mapping[str, Any]) -> str | None:
    """Why the rollback `plan` (from_revision, to_revision) may not run in `incident`, or None (it may)."""
    source = _revision(plan.get("from_revision"))
    target = _revision(plan.get("to_revision"))
    if incident is not None:
        earlier = incident.rollbacks()
        if earlier:
            first = earlier[0]
            source_of = first.plan.get("from_revision")
            what = f"{source_of} -> {first.plan.get('to_revision')}" if source_of is not None else "its rollout"
            return (
                f"incident {incident.id} already rolled back {what} (policy {first.policy!r}); a rollback that did "
                "not end the breach is followed by the escalation ladder, never by a second rollback"
            )
    if target is not None and any(same_revision(target, bad) for bad in ledger.known_bad):
        return f"revision {target} is known bad on {ledger.service} (an incident rolled it back): never a target"
    if source is not None and ledger.last_good is not None and same_revision(source, ledger.last_good):
        return (
            f"{ledger.service} runs {source}, the last revision known good: rolling back past it needs a human"
        )
    return None


def rollback_started(incident: Incident, action: TakenAction) -> Incident:
    """A rollback's plan is journaled and it is about to run: the incident counts it from now (a crash after this
    still holds a second one back)."""
    return _with_action(replace(incident, phase=IncidentPhase.ACTING, next_step="verify the rollback"), action)


def action_ended(
    incident: Incident, ledger: Ledger, action: TakenAction, verify_after: float
) -> tuple[Incident, Ledger]:
    """An action of the incident ended with `action.status`. A succeeded rollback marks the revision it left bad
    and its rollout undone (no longer the cause of later breaches)."""
    incident = _with_action(incident, action)
    if action.status != "succeeded" or action.type in ("annotate", "notify"):
        return incident, ledger
    if action.type == "rollback":
        left = _revision(action.plan.get("from_revision"))
        if left is not None:
            ledger = replace(
                ledger,
                known_bad=tuple(dict.fromkeys((*ledger.known_bad, left))),
                rolled_back=tuple(dict.fromkeys((*ledger.rolled_back, left))),
            )
        cause = incident.cause
        if cause is not None and left is not None and _revision(cause.get("rollout")) == left:
            cause = {**cause, "undone": True}
        elif cause is None and left is not None:
            cause = {"rollout": left, "policy": action.policy, "undone": True}
        incident = replace(incident, cause=cause)
    if incident.phase is not IncidentPhase.ESCALATED:
        incident = replace(
            incident,
            phase=IncidentPhase.VERIFYING,
            next_step=f"verify by {action.at + verify_after:.0f}: the breach must end within {verify_after:.0f}s",
        )
    return incident, ledger


def note(incident: Incident, text: str) -> Incident:
    """Something the incident found and says in its status (e.g. a restore skipped because a human changed it)."""
    return incident if text in incident.notes else replace(incident, notes=(*incident.notes, text))


def escalation_due(incident: Incident, breach_holds: bool, now: float, verify_after: float) -> TakenAction | None:
    """The action whose verification window ended with the breach still held (the ladder's next step is due), or
    None. An escalation step is verified like any other action."""
    if not incident.open or not breach_holds:
        return None
    last = incident.last_action()
    if last is None:
        # Nothing was done: a rollback the incident refused (e.g. past the last known good) is the ladder's at once.
        refused = [a for a in incident.actions if a.status == "refused"]
        return refused[-1] if refused and incident.stage == 0 else None
    if now - last.at < verify_after:
        return None
    return last


def escalated(incident: Incident, step_name: str, now: float, key: str, next_step: str) -> Incident:
    """The ladder's step `step_name` was dispatched at `now`."""
    action = TakenAction(key=key, type="escalation", policy="", at=now, status="escalated", reason=step_name)
    return replace(
        _with_action(incident, action), phase=IncidentPhase.ESCALATED, stage=incident.stage + 1, next_step=next_step
    )


def replace_next_step(incident: Incident, next_step: str) -> Incident:
    return replace(incident, next_step=next_step)


def undone_rollouts(ledger: Ledger | None) -> frozenset[str]:
    return frozenset(ledger.rolled_back) if ledger is not None else frozenset()


_NUMBERED = re.compile(r"r?(\d+)")


def same_revision(a: str, b: str) -> bool:
    """One revision as two sources name it: the local tier's plan says 3 where its rollouts say r3."""
    if a == b:
        return True
    left, right = _NUMBERED.fullmatch(a), _NUMBERED.fullmatch(b)
    return left is not None and right is not None and int(left.group(1)) == int(right.group(1))


def open_incidents(incidents: Iterable[Incident]) -> list[Incident]:
    return sorted((i for i in incidents if i.open), key=lambda i: (i.opened_at, i.id))


def _with_action(incident: Incident, action: TakenAction) -> Incident:
    kept: Sequence[TakenAction] = [a for a in incident.actions if a.key != action.key]
    if len(kept) == len(incident.actions):
        return replace(incident, actions=(*incident.actions, action))
    # The same action again (its outcome after its start): in place, so the order stays the order of starts.
    return replace(incident, actions=tuple(action if a.key == action.key else a for a in incident.actions))


def _revision(value: Any) -> str | None:
    return None if value is None else str(value)
