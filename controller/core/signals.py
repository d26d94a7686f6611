"""Signals are batched: one PromQL request per signal per evaluation, for every target at once.

A policy's signal query aggregates `by` the target labels, so Prometheus answers one
series per target and the controller never sends one request per target (what
Flagger and Argo Rollouts do). Template variables are substituted as escaped PromQL
string literals (tailguard.controller.kit.templating), so a quote or backslash in a label value
cannot change the query.
"""

from __future__ import annotations

import logging
import math

from tailguard.controller.core.model import SignalResult, TargetKey
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.ports import MetricsSource, RangeResult
from tailguard.controller.kit.templating import render_query

log = logging.getLogger(__name__)

# Prometheus refuses range queries with more than 11,000 points per series.
MAX_POINTS_PER_QUERY = 11_000


def render_signal_queries(policy: Policy) -> dict[str, str]:
    """The PromQL each query signal sends, by signal name (prediction signals are answered by predictors)."""
    return {
        signal.name: render_query(
            signal.query,
            match=policy.targets.match,
            group_by=list(policy.targets.groupBy),
            variables=policy.vars,
        )
        for signal in policy.signals
        if signal.query is not None
    }


def query_signals(source: MetricsSource, policy: Policy, at: float | None) -> dict[str, SignalResult]:
    """One instant query per signal; a source that raises is recorded as an error result, never a breach."""
    group_by = list(policy.targets.groupBy)
    results: dict[str, SignalResult] = {}
    for name, query in render_signal_queries(policy).items():
        try:
            results[name] = source.instant(query, group_by, at)
        except Exception as unexpected:  # noqa: BLE001 - sources should not raise; one that does must not stop the loop
            log.warning("signal %s of policy %s: source raised %s", name, policy.name, type(unexpected).__name__)
            results[name] = SignalResult.failed(f"source raised {type(unexpected).__name__}: {unexpected}")
    return results


def refused_queries(source: MetricsSource, policy: Policy, at: float | None = None) -> dict[str, str]:
    """The query signals whose query the source refuses as bad data (a policy error), by name, with why.

    One instant query per signal. Any other failure (Prometheus down, a timeout) proves nothing about the
    query and is not reported: only a refusal of the query itself is a policy error.
    """
    return {
        name: str(result.error)
        for name, result in query_signals(source, policy, at).items()
        if result.policy_error and result.error is not None
    }


def range_chunks(
    start: float, end: float, step: float, max_points: int = MAX_POINTS_PER_QUERY
) -> list[tuple[float, float]]:
    """Split [start, end] into windows of at most `max_points` evaluation timestamps each, on the same grid."""
    if step <= 0:
        raise ValueError(f"step must be positive, got {step}")
    if end < start:
        raise ValueError(f"end ({end}) is before start ({start})")
    points = math.floor((end - start) / step + 1e-9) + 1
    chunks: list[tuple[float, float]] = []
    first = 0
    while first < points:
        last = min(points, first + max_points) - 1
        chunks.append((start + first * step, start + last * step))
        first = last + 1
    return chunks


def query_signals_range(
    source: MetricsSource, policy: Policy, start: float, end: float, step: float
) -> dict[str, RangeResult]:
    """One range query per signal (more only when the range exceeds Prometheus' points limit)."""
    group_by = list(policy.targets.groupBy)
    chunks = range_chunks(start, end, step)
    results: dict[str, RangeResult] = {}
    for name, query in render_signal_queries(policy).items():
        merged: dict[TargetKey, dict[float, float]] = {}
        error: str | None = None
        for chunk_start, chunk_end in chunks:
            try:
                part = source.range(query, group_by, chunk_start, chunk_end, step)
            except Exception as unexpected:  # noqa: BLE001 - see query_signals
                part = RangeResult(error=f"source raised {type(unexpected).__name__}: {unexpected}")
            if part.error is not None:
                error = part.error
                break
            for target, samples in part.series.items():
                merged.setdefault(target, {}).update(samples)
        results[name] = RangeResult(error=error) if error is not None else RangeResult(series=merged)
    return results
