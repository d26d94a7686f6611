"""The annotation port: a decision or a rollout marked on the dashboards (JSONL, Grafana behind its outbox)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tailguard.controller.core.ports.outcomes import ActionOutcome


@dataclass(frozen=True)
class Annotation:
    time: float
    text: str
    tags: Sequence[str]
    time_end: float | None = None
    decision_id: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


class Annotator(Protocol):
    def annotate(self, annotation: Annotation, *, idempotency_key: str) -> ActionOutcome: ...
