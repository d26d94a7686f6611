"""A scripted MetricsSource for tests: answers by query text and records every query sent."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.core.model import SignalResult
from controller.core.ports import RangeResult


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
