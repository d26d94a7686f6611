"""Batched signals: one request per signal for every target, escaped templates, chunked ranges."""

from __future__ import annotations

import pytest

from tailguard.controller.core.model import SignalResult, target_key
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.ports import RangeResult
from tailguard.controller.core.signals import (
    MAX_POINTS_PER_QUERY,
    query_signals,
    query_signals_range,
    range_chunks,
    render_signal_queries,
)
from tailguard.controller.testing import FakeSource


def _policy(match: dict[str, str] | None = None, signals: int = 1) -> Policy:
    return Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": "p",
            "targets": {"groupBy": ["service", "version"], "match": match or {"namespace": "llm"}},
            "vars": {"model": 'm"x\\y'},
            "signals": [
                {"name": f"s{i}", "query": f"sum by ({{{{ by }}}}) (m{i}{{ {{{{ selector }}}} }})"}
                for i in range(signals)
            ],
            "conditions": [
                {
                    "name": "c",
                    "signal": "s0",
                    "when": {"op": ">", "value": 1},
                    "for": 1,
                    "noData": "hold",
                    "actions": [{"type": "annotate", "text": "x"}],
                }
            ],
        }
    )


def test_rendered_queries_group_by_target_labels_and_escape_values() -> None:
    queries = render_signal_queries(_policy({"namespace": 'l"l\\m'}))
    assert queries == {"s0": 'sum by (service,version) (m0{ namespace="l\\"l\\\\m" })'}


@pytest.mark.parametrize("targets", [10, 100, 1000])
def test_one_instant_request_per_signal_whatever_the_number_of_targets(targets: int) -> None:
    policy = _policy(signals=2)
    answer = SignalResult({target_key({"service": f"s{i}", "version": "r1"}): float(i) for i in range(targets)})
    source = FakeSource(default=answer)
    results = query_signals(source, policy, at=1700000000.0)
    assert len(source.sent) == 2
    assert {sent.query for sent in source.sent} == set(render_signal_queries(policy).values())
    assert all(sent.group_by == ("service", "version") and sent.at == 1700000000.0 for sent in source.sent)
    assert len(results["s0"].values) == targets


def test_a_raising_source_becomes_an_error_result() -> None:
    class Broken(FakeSource):
        def instant(self, query: str, group_by: object, at: float | None = None) -> SignalResult:
            raise RuntimeError("boom")

    results = query_signals(Broken(), _policy(), at=None)
    assert results["s0"].error is not None and "boom" in results["s0"].error


def test_range_chunks_respect_the_points_limit() -> None:
    assert range_chunks(0, 150, 15) == [(0, 150)]
    chunks = range_chunks(0, 15 * 25_000, 15)
    assert [round((e - s) / 15) + 1 for s, e in chunks] == [MAX_POINTS_PER_QUERY, MAX_POINTS_PER_QUERY, 3001]
    assert chunks[1][0] == chunks[0][1] + 15  # contiguous, same grid
    with pytest.raises(ValueError, match="before start"):
        range_chunks(10, 0, 15)


def test_range_queries_are_chunked_and_merged() -> None:
    policy = _policy()
    key = target_key({"service": "a", "version": "r1"})

    def answer(query: str, start: float, end: float, step: float) -> RangeResult:
        return RangeResult({key: {start: start, end: end}})

    query = render_signal_queries(policy)["s0"]
    source = FakeSource(range_answers={query: answer})
    result = query_signals_range(source, policy, 0, 15 * 12_000, 15)["s0"]
    assert len(source.sent) == 2
    assert result.series[key] == {
        0: 0,
        15 * 10_999: 15 * 10_999,
        15 * 11_000: 15 * 11_000,
        15 * 12_000: 15 * 12_000,
    }


def test_an_error_in_any_chunk_fails_the_whole_range() -> None:
    policy = _policy()
    query = render_signal_queries(policy)["s0"]
    source = FakeSource(range_answers={query: [RangeResult(), RangeResult(error="HTTP 503")]})
    assert query_signals_range(source, policy, 0, 15 * 12_000, 15)["s0"].error == "HTTP 503"
