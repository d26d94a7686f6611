"""The store ports: the journal (engine states, decisions, actions) and the incidents (SQLite; custom resources)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tailguard.controller.core.actions import ActionRecord, ActionStatus
from tailguard.controller.core.controls import AbortRequest
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.incidents import Incident, Ledger
from tailguard.controller.core.model import Decision


class RecentDecisions(Protocol):
    def recent_decisions(self, limit: int = 100, before: int | None = None) -> list[dict[str, Any]]:
        """Newest first, at most `limit`; `before`: only decisions older than that `seq` (the next page)."""
        ...


class JournalPort(RecentDecisions, Protocol):
    """What the controller needs of the journal (controller/adapters/stores/journal.py)."""

    def load_state(self, policy: str) -> PolicyState | None: ...

    def commit_evaluation(self, policy: str, state: PolicyState, decisions: Sequence[Decision], now: float) -> None: ...

    def close(self) -> None: ...


class ActionJournalPort(Protocol):
    """What the dispatcher needs of the journal: the actions' rows, their decisions, their transitions."""

    def record_decision(self, decision: Decision, now: float) -> None: ...

    def get_action(self, idempotency_key: str) -> ActionRecord | None: ...

    def pending_actions(self) -> list[ActionRecord]: ...

    def actions_for(self, decision_id: str) -> list[ActionRecord]: ...

    def actions_since(self, resource: str, since: float) -> list[ActionRecord]: ...

    def deferred_actions(self, policy: str | None = None) -> list[ActionRecord]: ...

    def defer(self, idempotency_key: str, now: float, reason: str) -> ActionRecord: ...

    def mark_started(self, idempotency_key: str, now: float, plan: Mapping[str, Any] | None = None) -> ActionRecord: ...

    def set_plan(self, idempotency_key: str, plan: Mapping[str, Any], now: float) -> ActionRecord:
        """The plan of a planned or deferred action, made from the world its decision saw (its precondition and
        deadline in it), journaled before it is queued."""
        ...

    def record_event(self, idempotency_key: str, now: float, event: str, detail: str | None) -> None:
        """One `action_events` row (e.g. each failed attempt of a retried action)."""
        ...

    def load_state(self, policy: str) -> PolicyState | None:
        """The engine state the latest evaluation of `policy` committed (whether an action's condition holds)."""
        ...

    def finish(
        self,
        idempotency_key: str,
        status: ActionStatus,
        now: float,
        *,
        result: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> ActionRecord: ...

    def decision(self, decision_id: str, kind: str) -> dict[str, Any] | None: ...

    def abort_actions(self, request: AbortRequest, now: float) -> list[ActionRecord]:
        """One transaction: the decision's planned and deferred actions end `aborted` (they never run), its started
        ones get an `abort_requested` event (the next step, or the next process, ends them); every action of the
        decision is returned as it is after."""
        ...

    def abort_requested(self, idempotency_key: str) -> AbortRequest | None:
        """The abort journaled for a started action (its `abort_requested` event), or None."""
        ...


class IncidentStorePort(Protocol):
    """Where incidents live (controller/core/incidents.py): the journal's SQLite locally, `TailguardIncident`
    resources in a cluster. Every write is a compare-and-set on the version read."""

    def current(self, scope_key: str) -> tuple[Incident, Ledger] | None:
        """The open incident of the scope (at most one) and the ledger stored with it, or None."""
        ...

    def ledger(self, service: str) -> Ledger:
        """The service's revision ledger as its latest incident left it (an empty one when it has none)."""
        ...

    def latest(self, service: str, *, open_only: bool) -> Incident | None:
        """The service's newest incident (with `open_only`: its newest open one), or None."""
        ...

    def save(self, incident: Incident, ledger: Ledger) -> Incident:
        """Write the incident and the service's ledger with it, only if the stored incident still has
        `incident.version` ("" = create it). Returns it with its new version; IncidentConflict otherwise."""
        ...

    def incidents(self, *, open_only: bool = True, limit: int = 50) -> list[Incident]:
        """Newest first."""
        ...
