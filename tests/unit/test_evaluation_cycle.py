"""One evaluation's queries run at once (bounded) with the sequential path's results, its cycle time and target
count in /metrics, and its log line formatting only the targets it prints."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tailguard.controller.core import engine
from tailguard.controller.core.engine import PolicyState, prepare_condition, transition
from tailguard.controller.core.model import SignalResult, TargetKey, target_key
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.signals import render_signal_queries
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop import evaluation
from tailguard.controller.loop.evaluation import LOG_TARGETS, EvaluationPorts, UnconfiguredPredictions, evaluate
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.testing import FakeDispatcher, FakeJournal

SIGNALS = ("p99", "queue", "errors", "hbm")


def _policy(signals: Sequence[str] = SIGNALS) -> Policy:
    return Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": "cycle",
            "targets": {"groupBy": ["service"], "match": {"namespace": "llm"}},
            "signals": [{"name": name, "query": f"{name}{{ {{{{ selector }}}} }}"} for name in signals],
            "conditions": [
                {
                    "name": f"{name}-high",
                    "signal": name,
                    "when": {"op": ">", "value": 0.8},
                    "for": 1,
                    "noData": "hold",
                    "actions": [{"type": "annotate", "text": "{{ value }}"}],
                }
                for name in signals
            ],
        }
    )


def _targets(count: int) -> list[TargetKey]:
    return [target_key({"service": f"svc-{i:05d}"}) for i in range(count)]


class OverlapSource:
    """Answers every signal's query after a short wait and records how many queries were in flight at once."""

    def __init__(self, answers: dict[str, SignalResult], hold: float = 0.05) -> None:
        self.answers = answers
        self.hold = hold
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        self.sent: list[str] = []

    def instant(self, query: str, group_by: Sequence[str], at: float | None = None) -> SignalResult:
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.sent.append(query)
        try:
            time.sleep(self.hold)
            return self.answers.get(query) or SignalResult.failed(f"unscripted query: {query}")
        finally:
            with self.lock:
                self.in_flight -= 1

    def range(self, *args: Any) -> Any:
        raise AssertionError("no range queries in an evaluation")


def _answers(policy: Policy, targets: list[TargetKey]) -> dict[str, SignalResult]:
    queries = render_signal_queries(policy)
    answers: dict[str, SignalResult] = {}
    for index, name in enumerate(SIGNALS):
        if name not in queries:
            continue
        if name == "errors":
            answers[queries[name]] = SignalResult.failed("connection refused")
            continue
        answers[queries[name]] = SignalResult(
            {target: (0.9 if (i + index) % 3 == 0 else 0.2) for i, target in enumerate(targets)}
        )
    return answers


def _ports(source: Any, clock: ManualClock, metrics: ControllerMetrics) -> EvaluationPorts:
    return EvaluationPorts(
        source=source,
        journal=FakeJournal(),
        dispatcher=FakeDispatcher(),
        clock=clock,
        metrics=metrics,
        predictions=UnconfiguredPredictions(),
    )


class _Sequential:
    """Stands in for the query pool: submit() runs each query at once, one after another (the sequential path)."""

    def submit(self, function: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(function(*args))
        return future


def test_queries_run_at_once_with_the_sequential_results(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = _policy()
    targets = _targets(30)

    def run() -> tuple[Any, OverlapSource, ControllerMetrics]:
        source = OverlapSource(_answers(policy, targets))
        metrics = ControllerMetrics(CollectorRegistry())
        clock = ManualClock()
        state = PolicyState()
        outcomes = []
        for step in range(3):
            outcome = evaluate(policy, state, clock.now() + 15.0 * step, _ports(source, clock, metrics))
            state = outcome.state
            outcomes.append(outcome)
        return outcomes, source, metrics

    concurrent, concurrent_source, concurrent_metrics = run()
    assert concurrent_source.most_in_flight >= 2  # two queries in flight at once
    assert concurrent_source.most_in_flight <= evaluation.QUERY_WORKERS
    with monkeypatch.context() as patch:
        patch.setattr(evaluation, "_pool", _Sequential)
        sequential, sequential_source, sequential_metrics = run()
    assert sequential_source.most_in_flight == 1
    assert [o.state.to_json() for o in concurrent] == [o.state.to_json() for o in sequential]
    assert [[d.to_json() for d in o.decisions] for o in concurrent] == [
        [d.to_json() for d in o.decisions] for o in sequential
    ]
    assert [o.source_errors for o in concurrent] == [o.source_errors for o in sequential]
    assert concurrent[0].source_errors == ("errors: connection refused",)
    assert sorted(concurrent_source.sent) == sorted(sequential_source.sent)
    for name in SIGNALS:
        labels = {"policy": "cycle", "signal": name}
        count = "tailguard_query_duration_seconds_count"
        assert concurrent_metrics.registry.get_sample_value(count, labels) == 3.0
        assert sequential_metrics.registry.get_sample_value(count, labels) == 3.0
    errors = "tailguard_source_errors_total"
    assert concurrent_metrics.registry.get_sample_value(errors, {"policy": "cycle", "signal": "errors"}) == 3.0


class SlowSignalSource(OverlapSource):
    """The p99 query answers only once the engine's fast path of every other condition was computed (or after
    `limit` seconds): what the evaluation does while its slowest query is in flight."""

    def __init__(self, answers: dict[str, SignalResult], slow_query: str, limit: float = 10.0) -> None:
        super().__init__(answers, hold=0.0)
        self.slow_query = slow_query
        self.limit = limit
        self.others_prepared = threading.Event()
        self.waited_out = False

    def instant(self, query: str, group_by: Sequence[str], at: float | None = None) -> SignalResult:
        if query == self.slow_query:
            self.waited_out = not self.others_prepared.wait(self.limit)
        return super().instant(query, group_by, at)


def test_the_fast_path_of_answered_signals_is_computed_while_the_slowest_query_is_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = _policy()
    targets = _targets(40)
    answers = _answers(policy, targets)
    source = SlowSignalSource(answers, render_signal_queries(policy)["p99"])
    prepared: list[str] = []
    real_prepare = prepare_condition

    def recording_prepare(condition: Any, *args: Any) -> Any:
        prepared.append(condition.name)
        if {"queue-high", "errors-high", "hbm-high"} <= set(prepared):
            source.others_prepared.set()
        return real_prepare(condition, *args)

    monkeypatch.setattr(evaluation, "prepare_condition", recording_prepare)
    monkeypatch.setattr(engine, "prepare_condition", recording_prepare)  # what transition() would recompute
    clock = ManualClock()
    state = PolicyState()
    outcomes = []
    for step in range(3):
        source.others_prepared.clear()
        prepared.clear()
        outcome = evaluate(
            policy, state, clock.now() + 15.0 * step, _ports(source, clock, ControllerMetrics(CollectorRegistry()))
        )
        assert not source.waited_out  # the other three were prepared before the p99 answer was given
        assert prepared[-1] == "p99-high"  # prepared as it arrived, last
        assert sorted(prepared) == sorted(f"{name}-high" for name in SIGNALS)  # each once: transition reused them
        state = outcome.state
        outcomes.append(outcome)
    # the same states and decisions as the engine computing every condition itself (no `prepared`)
    monkeypatch.setattr(engine, "prepare_condition", real_prepare)
    queries = render_signal_queries(policy)
    observations = {name: answers[queries[name]] for name in SIGNALS}
    plain_state = PolicyState()
    for step, outcome in enumerate(outcomes):
        plain, decisions = transition(policy, observations, plain_state, clock.now() + 15.0 * step)
        assert plain.to_json() == outcome.state.to_json()
        assert [d.to_json() for d in decisions] == [d.to_json() for d in outcome.decisions]
        plain_state = plain
    assert any(outcome.decisions for outcome in outcomes)  # breaching targets fired (for: 1): not only fast paths


def test_a_query_that_raises_is_an_errored_signal_and_the_others_still_answer() -> None:
    policy = _policy()
    targets = _targets(3)
    answers = _answers(policy, targets)
    broken = render_signal_queries(policy)["hbm"]

    class Raising(OverlapSource):
        def instant(self, query: str, group_by: Sequence[str], at: float | None = None) -> SignalResult:
            if query == broken:
                raise RuntimeError("boom")
            return super().instant(query, group_by, at)

    clock = ManualClock()
    outcome = evaluate(
        policy, PolicyState(), clock.now(), _ports(Raising(answers, 0.0), clock, ControllerMetrics(CollectorRegistry()))
    )
    assert any(error.startswith("hbm: ") and "boom" in error for error in outcome.source_errors)
    assert outcome.state.conditions[("p99-high", targets[0])].last_value == 0.9


def test_cycle_time_and_targets_are_in_the_metrics() -> None:
    policy = _policy(["p99"])
    targets = _targets(7)
    clock = ManualClock()
    answers = _answers(policy, targets)

    class Slow(OverlapSource):
        def instant(self, query: str, group_by: Sequence[str], at: float | None = None) -> SignalResult:
            clock.advance(0.25)
            return super().instant(query, group_by, at)

    metrics = ControllerMetrics(CollectorRegistry())
    evaluate(policy, PolicyState(), clock.now(), _ports(Slow(answers, 0.0), clock, metrics))
    registry = metrics.registry
    labels = {"policy": "cycle"}
    assert registry.get_sample_value("tailguard_evaluation_duration_seconds_count", labels) == 1.0
    assert registry.get_sample_value("tailguard_evaluation_duration_seconds_sum", labels) == pytest.approx(0.25)
    bucket = {"policy": "cycle", "le": "0.25"}
    assert registry.get_sample_value("tailguard_evaluation_duration_seconds_bucket", bucket) == 1.0
    assert registry.get_sample_value("tailguard_evaluation_targets", labels) == 7.0
    # a removed policy leaves no stale targets gauge
    metrics.set_policies({}, {"cycle": ["p99-high"]})
    assert registry.get_sample_value("tailguard_evaluation_targets", labels) is None


def test_the_log_line_formats_only_the_targets_it_prints(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    policy = _policy(["p99"])
    targets = _targets(500)
    formatted: list[Any] = []
    original = evaluation._describe_state

    def counting(key: Any, state: Any) -> str:
        formatted.append(key)
        return original(key, state)

    monkeypatch.setattr(evaluation, "_describe_state", counting)
    clock = ManualClock()
    source = OverlapSource(_answers(policy, list(reversed(targets))), 0.0)
    with caplog.at_level(logging.INFO, logger="tailguard.controller"):
        evaluate(policy, PolicyState(), clock.now(), _ports(source, clock, ControllerMetrics(CollectorRegistry())))
    assert len(formatted) == LOG_TARGETS
    line = next(r for r in caplog.records if r.getMessage().startswith("evaluated cycle"))
    message = line.getMessage()
    # the first targets in order, the rest counted
    assert 'p99-high {service="svc-00000"}=' in message
    assert message.index("svc-00000") < message.index("svc-00009")
    assert "svc-00010" not in message
    assert f"... and {500 - LOG_TARGETS} more" in message
    assert vars(line)["fields"]["targets"] == 500
