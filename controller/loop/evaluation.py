"""One evaluation of one policy: `evaluate(policy, state, now, ports)`.

query the policy's signals (one request per signal) -> its prediction signals (one feature fetch) -> the
rollouts within its attribution window -> engine.transition -> journal commit (state + decisions + planned
actions, one transaction) -> the controller keeps the new state -> metrics and logs -> the policy's deferred
actions retried (or ended) against the new state -> dispatch.

Everything the evaluation reaches outside itself comes in `ports` (EvaluationPorts); the Controller
(controller/loop/runtime.py) calls this function under the policy's lock, with the rooms it wires keeping the
scheduling and the locks (scheduling.py), the policies, their state, the reload and the handover (policy_set.py),
the leadership (leadership.py) and the controls (operator.py). Expected failures are data here: a source or a
tracker that raises becomes an errored signal or an attribution error, never a crash of the evaluation.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from tailguard.controller.core.attribution import Rollout, lookback
from tailguard.controller.core.engine import (
    ConditionState,
    Phase,
    PolicyState,
    PreparedCondition,
    StateKey,
    held_targets,
    prepare_condition,
    transition,
)
from tailguard.controller.core.model import Decision, SignalResult, TargetKey, format_target
from tailguard.controller.core.policy import Policy, Signal
from tailguard.controller.core.ports import (
    ChangeTrackerPort,
    Clock,
    DispatcherPort,
    JournalPort,
    MetricsSource,
    PredictionPort,
)
from tailguard.controller.core.signals import query_signals as live_query_signals
from tailguard.controller.core.source_health import CHANGE_TRACKING, PROMETHEUS, SourceReading, signal_reading
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.ports import TRIGGER_SCHEDULE, RolloutAnnotatorPort

logger = logging.getLogger("tailguard.controller")

# Targets spelled out in the one-line evaluation log; the rest are counted.
LOG_TARGETS = 10

# The signal queries of one evaluation run at once, bounded: one small pool shared by every policy (a policy's
# queries are independent requests; none of them submits work to the pool, so it cannot deadlock).
QUERY_WORKERS = 8
_query_pool: ThreadPoolExecutor | None = None
_query_pool_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _query_pool
    with _query_pool_lock:
        if _query_pool is None:
            _query_pool = ThreadPoolExecutor(max_workers=QUERY_WORKERS, thread_name_prefix="tailguard-query")
        return _query_pool


QuerySignals = Callable[[MetricsSource, Policy, "float | None"], Mapping[str, SignalResult]]


@dataclass(frozen=True)
class EvaluationOutcome:
    policy: str
    trigger: str
    at: float
    decisions: tuple[Decision, ...]
    state: PolicyState
    source_errors: tuple[str, ...] = ()
    # "signal: why" for each signal whose query the source refused as bad data: a policy error (/readyz, metrics)
    policy_errors: tuple[str, ...] = ()
    # What this evaluation saw of each source it used (controller/core/source_health.py): the health model's input.
    readings: tuple[SourceReading, ...] = ()


def _always_act(_policy: str, _decisions: Sequence[Decision]) -> bool:
    return True


@dataclass(frozen=True)
class EvaluationPorts:
    """What an evaluation reaches: the metrics source, the journal, the dispatcher, the prediction port, the
    change tracker (and the annotator its rollouts go to), the clock that times the queries and the metrics.

    `before_acting(policy, decisions)` runs after the decisions are committed and logged and before they are
    dispatched; False leaves their actions planned in the journal (the leader's Lease gate).
    """

    source: MetricsSource
    journal: JournalPort
    dispatcher: DispatcherPort
    clock: Clock
    metrics: ControllerMetrics
    predictions: PredictionPort
    query_signals: QuerySignals = live_query_signals
    change_tracker: ChangeTrackerPort | None = None
    change_window: float = 0.0
    rollout_annotator: RolloutAnnotatorPort | None = None
    before_acting: Callable[[str, Sequence[Decision]], bool] = _always_act


def _keep_nothing(_state: PolicyState) -> None:
    return None


def evaluate(
    policy: Policy,
    state: PolicyState,
    now: float,
    ports: EvaluationPorts,
    *,
    trigger: str = TRIGGER_SCHEDULE,
    committed: Callable[[PolicyState], None] = _keep_nothing,
    targets: Collection[TargetKey] | None = None,
) -> EvaluationOutcome:
    """Evaluate `policy` from `state` at `now`: decide, commit, act. `committed(new_state)` is called right after
    the journal commit, before anything is logged or acted on (the controller keeps its copy of the state there).
    `targets`: the only targets the evaluation may touch (an alert's; engine.transition), None: all of them."""
    started = ports.clock.now()
    ahead = _FastPathAhead(policy, state, now, None if targets is None else frozenset(targets))
    observations, source_errors = query(policy, ports, answered=ahead.answered)
    policy_errors = tuple(
        f"{name}: {result.error}" for name, result in observations.items() if result.policy_error and result.error
    )
    ports.metrics.set_policy_errors(policy.name, len(policy_errors))
    rollouts, rollouts_error = recent_rollouts(policy, now, ports)
    if rollouts_error is not None:
        source_errors.append(f"change tracking: {rollouts_error}")
    new_state, decisions = transition(
        policy,
        observations,
        state,
        now,
        rollouts,
        rollouts_error=rollouts_error,
        targets=targets,
        prepared=ahead.prepared,
    )
    readings = source_readings(policy, now, observations, ports, rollouts_error)
    ports.journal.commit_evaluation(policy.name, new_state, decisions, now)
    committed(new_state)
    ports.metrics.record_evaluation(policy.name, trigger, now)
    if not any(reading.failed for reading in readings):
        ports.metrics.record_successful_evaluation(policy.name, now)
    ports.metrics.record_condition_states(policy.name, [c.name for c in policy.conditions], new_state)
    _log_evaluation(policy, trigger, new_state, source_errors)
    act = ports.before_acting(policy.name, decisions)
    if act:
        # Actions the global limits deferred earlier: run again (same key) while their condition still holds in
        # the state just committed, ended suppressed once it does not; before the new decisions (older first).
        for record in ports.dispatcher.retry_deferred(policy.name, new_state):
            ports.metrics.record_action(*action_labels(record))
    for decision in decisions:
        ports.metrics.record_decision(decision)
        _log_decision(decision)
        if not act:
            continue
        for record in ports.dispatcher.dispatch(decision):
            ports.metrics.record_action(*action_labels(record))
    targets_seen = len(set(map(itemgetter(1), new_state.conditions)))
    ports.metrics.record_cycle(policy.name, ports.clock.now() - started, targets_seen)
    return EvaluationOutcome(
        policy.name, trigger, now, tuple(decisions), new_state, tuple(source_errors), policy_errors, readings
    )


def source_readings(
    policy: Policy,
    now: float,
    observations: Mapping[str, SignalResult],
    ports: EvaluationPorts,
    rollouts_error: str | None,
) -> tuple[SourceReading, ...]:
    """What the evaluation saw of Prometheus (its non-prediction signals) and of the change tracker (when the
    policy attributes and one is configured: no tracker configured is the configuration's choice, not an outage)."""
    queried = [signal.name for signal in policy.signals if signal.predict is None]
    readings = [signal_reading(PROMETHEUS, policy.name, now, observations, queried)]
    if ports.change_tracker is not None and lookback(policy, ports.change_window) is not None:
        failed = rollouts_error is not None
        readings.append(SourceReading(CHANGE_TRACKING, policy.name, now, 1, int(failed), rollouts_error))
    return tuple(readings)


def recent_rollouts(policy: Policy, now: float, ports: EvaluationPorts) -> tuple[tuple[Rollout, ...], str | None]:
    """Rollouts within the policy's largest attribution window; an unreadable tracker is an error, as data."""
    window = lookback(policy, ports.change_window)
    if window is None:
        return (), None
    if ports.change_tracker is None:
        return (), "no change tracking configured (changeTracking in the controller configuration)"
    try:
        feed = ports.change_tracker.rollouts(now - window)
    except Exception as failure:  # the tracker turns source errors into data; anything raised is one too
        logger.exception("change tracking for %s raised", policy.name)
        return (), f"change tracker raised {type(failure).__name__}: {failure}"
    if ports.rollout_annotator is not None:
        for rollout in feed.rollouts:
            ports.rollout_annotator.annotate_rollout(rollout)
    return feed.rollouts, feed.error


class _FastPathAhead:
    """The engine's fast path of each condition (engine.prepare_condition), computed as its signal's answer
    arrives: while the policy's slowest query is still in flight, the healthy targets of the signals already
    answered are done, and transition() is left the rest. Runs in the evaluating thread only."""

    def __init__(self, policy: Policy, state: PolicyState, now: float, allowed: frozenset[TargetKey] | None) -> None:
        self._policy = policy
        self._state = state
        self._now = now
        self._allowed = allowed
        self._held: dict[str, list[TargetKey]] | None = None
        self.prepared: dict[str, PreparedCondition] = {}

    def answered(self, signal: str, result: SignalResult) -> None:
        for condition in self._policy.conditions:
            if condition.signal != signal:
                continue
            if self._held is None:
                self._held = held_targets(self._state)
            self.prepared[condition.name] = prepare_condition(
                condition, result, self._state, self._held, self._now, self._allowed
            )


def _ignore_answer(_signal: str, _result: SignalResult) -> None:
    return None


def query(
    policy: Policy, ports: EvaluationPorts, *, answered: Callable[[str, SignalResult], None] = _ignore_answer
) -> tuple[dict[str, SignalResult], list[str]]:
    """One request per signal, issued at once (bounded by QUERY_WORKERS), each timed and counted on its own
    (policy, signal) series; then the predictions. `answered(signal, result)` is called in this thread as each
    query's answer arrives (first answered, first called). Results, metrics and errors come in the signals'
    order, exactly as if the queries had run one after another."""
    signals = [signal for signal in policy.signals if signal.predict is None]
    # the prediction signals are answered below, all of them from one feature fetch
    if len(signals) > 1:
        pending: dict[Future[tuple[SignalResult, float]], Signal] = {
            _pool().submit(_query_one, policy, signal, ports): signal for signal in signals
        }
        by_name: dict[str, tuple[SignalResult, float]] = {}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                signal = pending.pop(future)
                by_name[signal.name] = future.result()  # _query_one returns errors as data, never raises
                answered(signal.name, by_name[signal.name][0])
        answers = [by_name[signal.name] for signal in signals]
    else:
        answers = [_query_one(policy, signal, ports) for signal in signals]
        for signal, (result, _seconds) in zip(signals, answers, strict=True):
            answered(signal.name, result)
    results: dict[str, SignalResult] = {}
    errors: list[str] = []
    for signal, (result, seconds) in zip(signals, answers, strict=True):
        ports.metrics.record_query(policy.name, signal.name, seconds, result.ok)
        if result.error is not None:
            errors.append(f"{signal.name}: {result.error}")
        results[signal.name] = result
    for name, result in predict(policy, ports).items():
        if result.error is not None:
            errors.append(f"{name}: {result.error}")
        results[name] = result
    return results, errors


def _query_one(policy: Policy, signal: Signal, ports: EvaluationPorts) -> tuple[SignalResult, float]:
    """One signal's query and how long it took; anything raised is an errored result."""
    single = policy.model_copy(update={"signals": [signal]})
    started = ports.clock.now()
    try:
        answer = ports.query_signals(ports.source, single, None)
        result = answer.get(signal.name) or SignalResult.failed("the query returned no result")
    except Exception as failure:  # sources return errors as data; anything raised is still an error
        logger.exception("signal %s/%s: query raised", policy.name, signal.name)
        result = SignalResult.failed(f"query raised {type(failure).__name__}: {failure}")
    return result, ports.clock.now() - started


def predict(policy: Policy, ports: EvaluationPorts) -> dict[str, SignalResult]:
    """The policy's prediction signals; a missing or broken model is no-data (never a breach, never a crash)."""
    signals = [signal for signal in policy.signals if signal.predict is not None]
    if not signals:
        return {}
    started = ports.clock.now()
    try:
        answer: Mapping[str, SignalResult] = ports.predictions.predict(ports.source, policy, None)
    except Exception as failure:  # the provider returns data; anything raised is an error, not a breach
        logger.exception("prediction signals of %s: provider raised", policy.name)
        answer = {s.name: SignalResult.failed(f"prediction raised {type(failure).__name__}") for s in signals}
    # The feature fetch is shared, so each prediction signal is timed with the whole batch.
    elapsed = ports.clock.now() - started
    results: dict[str, SignalResult] = {}
    probabilities: dict[tuple[str, str], Mapping[TargetKey, float]] = {}
    for signal in signals:
        assert signal.predict is not None
        result = answer.get(signal.name) or SignalResult(values={})
        ports.metrics.record_query(policy.name, signal.name, elapsed, result.ok)
        probabilities[(signal.predict.model, signal.predict.dimension.value)] = result.values
        results[signal.name] = result
    ports.metrics.set_breach_probabilities(policy.name, probabilities)
    return results


def action_labels(record: Any) -> tuple[str, str]:
    """(type, status) of a dispatcher ActionRecord, for tailguard_actions_total."""
    action_type = getattr(record, "type", None)
    if action_type is None:
        request = getattr(record, "request", None) or getattr(record, "action", None)
        action_type = getattr(request, "type", "unknown")
    status = getattr(record, "status", "unknown")
    return str(getattr(action_type, "value", action_type)), str(getattr(status, "value", status))


class UnconfiguredPredictions:
    """The prediction port when none is wired: every model is unconfigured, its signals no-data (as
    tailguard.predictors.serving.PredictionProvider answers with no models configured); each model is warned about
    once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: set[str] = set()

    def predict(self, source: MetricsSource, policy: Policy, at: float | None = None) -> dict[str, SignalResult]:
        answer: dict[str, SignalResult] = {}
        for signal in policy.signals:
            if signal.predict is None:
                continue
            answer[signal.name] = SignalResult(values={})
            with self._lock:
                if signal.predict.model in self._models:
                    continue
                self._models.add(signal.predict.model)
            logger.warning("prediction %s", self._describe(signal.predict.model))
        return answer

    def warnings(self) -> list[str]:
        with self._lock:
            return [self._describe(model) for model in sorted(self._models)]

    @staticmethod
    def _describe(model: str) -> str:
        return (
            f"model {model}: unconfigured: not in the configuration's predictors (none); "
            "its prediction signals are no-data"
        )


def _describe_state(key: StateKey, condition_state: ConditionState) -> str:
    condition, target = key
    value = "no-data" if condition_state.last_value is None else f"{condition_state.last_value:.4g}"
    marks = (" stale" if condition_state.stale else "") + (" errored" if condition_state.errored else "")
    return f"{condition} {format_target(target)}={value} {condition_state.phase.value}{marks}"


def _log_evaluation(policy: Policy, trigger: str, state: PolicyState, source_errors: Sequence[str]) -> None:
    """One human-readable line per evaluation: the first LOG_TARGETS targets' value and phase, per condition,
    the rest counted (only what is printed is formatted; nothing when the line would not be logged)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    total = len(state.conditions)
    if total > LOG_TARGETS:
        first = heapq.nsmallest(LOG_TARGETS, state.conditions.items(), key=_by_key)
    else:
        first = sorted(state.conditions.items(), key=_by_key)
    shown = [_describe_state(key, condition_state) for key, condition_state in first]
    if total > LOG_TARGETS:
        shown.append(f"... and {total - LOG_TARGETS} more")
    firing = sum(1 for s in state.conditions.values() if s.phase is Phase.FIRING)
    logger.info(
        "evaluated %s (%s): %s%s",
        policy.name,
        trigger,
        "; ".join(shown) or "no targets",
        f" | source errors: {'; '.join(source_errors)}" if source_errors else "",
        extra={
            "fields": {
                "event": "evaluation",
                "policy": policy.name,
                "trigger": trigger,
                "targets": total,
                "firing": firing,
                "source_errors": list(source_errors),
            }
        },
    )


def _by_key(item: tuple[StateKey, ConditionState]) -> StateKey:
    return item[0]


def _log_decision(decision: Decision) -> None:
    value = "no-data" if decision.value is None else f"{decision.value:.4g}"
    logger.info(
        "decision %s %s/%s %s value=%s threshold=%s%s: %s [%s]",
        decision.kind.value,
        decision.policy,
        decision.condition,
        format_target(decision.target),
        value,
        f"{decision.threshold:.4g}",
        " (dry run)" if decision.dry_run else "",
        decision.reason,
        decision.id,
        extra={"fields": {"event": "decision", **decision.to_json()}},
    )
