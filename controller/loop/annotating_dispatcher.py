"""A dispatcher decorator: every decision gets its annotation region (Grafana's, through the DecisionSink port).

It wraps any `DispatcherPort` and knows no annotation backend; the app wires it around the dispatcher when an
annotator is configured (controller/app/build.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tailguard.controller.core.controls import AbortRequest, AbortResult, AbortState
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.model import Decision
from tailguard.controller.core.ports import DispatcherPort, OutcomeStatus, RecentDecisions
from tailguard.controller.loop.ports import DecisionAborterPort, DecisionSink

log = logging.getLogger(__name__)


class DecisionAnnotatingDispatcher:
    """Wraps the dispatcher so every decision (with or without an annotate action) gets its Grafana region.

    The region is enqueued in the outbox before the decision's actions run. `resume()` re-enqueues the
    journal's recent decisions: a crash between the journal commit and the enqueue loses no region, and
    what was enqueued before is deduplicated by its key.
    """

    def __init__(
        self,
        inner: DispatcherPort,
        annotator: DecisionSink,
        journal: RecentDecisions | None = None,
        resume_window: int = 200,
    ) -> None:
        self.inner = inner
        self.annotator = annotator
        self.journal = journal
        self.resume_window = resume_window

    def _annotate(self, decision: Mapping[str, Any]) -> None:
        outcome = self.annotator.annotate_decision(decision)
        if outcome.status is OutcomeStatus.FAILED:
            log.warning("decision %s: Grafana region not queued: %s", decision.get("id"), outcome.error)

    def dispatch(self, decision: Decision) -> Sequence[Any]:
        self._annotate(decision.to_json())
        return self.inner.dispatch(decision)

    def resume(self) -> Sequence[Any]:
        if self.journal is not None:
            # Oldest first, so an incident's opening is queued before its resolution.
            for entry in reversed(self.journal.recent_decisions(self.resume_window)):
                self._annotate(entry)
        return self.inner.resume()

    def retry_deferred(self, policy: str, state: PolicyState | None) -> Sequence[Any]:
        return self.inner.retry_deferred(policy, state)  # no new decision: its region is already queued

    def deferred_policies(self) -> set[str]:
        return self.inner.deferred_policies()

    def abort(self, request: AbortRequest) -> AbortResult:
        """The inner dispatcher's abort (no new decision: nothing to annotate)."""
        if not isinstance(self.inner, DecisionAborterPort):
            return AbortResult(request.decision_id, AbortState.UNKNOWN, "this dispatcher cannot abort actions")
        return self.inner.abort(request)
