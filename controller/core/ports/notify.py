"""The notification port: a decision sent to a receiver (signed webhooks).

Every Notifier takes one `NotifyRequest`: the receiver named in the configuration, the typed `NotifyPayload` (the
webhook body's fields: the message, the journaled decision, its evidence, the decision's actions, the links) and
the action's idempotency key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tailguard.controller.core.ports.outcomes import ActionOutcome


@dataclass(frozen=True)
class NotifyPayload:
    """What a notification says (the webhook body adds the receiver and the idempotency key). `decision` and each
    of `actions` are the journal's JSON of the decision and of its actions, as `/api/v1/decisions` shows them."""

    message: str | None = None
    decision: Mapping[str, object] = field(default_factory=dict)
    evidence: Sequence[object] = ()
    actions: Sequence[Mapping[str, object]] = ()
    links: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "message": self.message,
            "decision": dict(self.decision),
            "evidence": list(self.evidence),
            "actions": [dict(action) for action in self.actions],
            "links": dict(self.links),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> NotifyPayload:
        """A payload from its JSON (a missing field is its default)."""
        message, decision, evidence = data.get("message"), data.get("decision"), data.get("evidence")
        actions, links = data.get("actions"), data.get("links")
        return cls(
            message=str(message) if message is not None else None,
            decision=dict(decision) if isinstance(decision, Mapping) else {},
            evidence=list(evidence) if isinstance(evidence, (list, tuple)) else [],
            actions=[dict(a) for a in actions if isinstance(a, Mapping)] if isinstance(actions, (list, tuple)) else [],
            links={str(k): str(v) for k, v in links.items()} if isinstance(links, Mapping) else {},
        )


@dataclass(frozen=True)
class NoticePayload:
    """A notice that is no decision's (Argo CD's auto-sync disabled for a rollback): `{"kind": "notice", "message":
    ..., **detail}` in the body."""

    message: str
    detail: Mapping[str, object] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"kind": "notice", "message": self.message, **self.detail}


@dataclass(frozen=True)
class NotifyRequest:
    """One notification, as every Notifier takes it."""

    receiver: str
    payload: NotifyPayload | NoticePayload
    idempotency_key: str


class Notifier(Protocol):
    def notify(self, request: NotifyRequest) -> ActionOutcome: ...
