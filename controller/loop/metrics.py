"""The controller's own Prometheus metrics, on an injectable registry.

Every metric lives on the registry handed in (a fresh one per test), never on
prometheus_client's global REGISTRY, so tests read values back without
interference and two controllers in one process do not collide.
"""

from __future__ import annotations

import importlib.metadata
import math
import platform
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from operator import attrgetter, itemgetter

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from tailguard.controller.core.engine import Phase, PolicyState
from tailguard.controller.core.model import Decision, TargetKey
from tailguard.controller.core.source_health import SourceHealth, SourceStatus

EXPOSITION_CONTENT_TYPE = CONTENT_TYPE_LATEST

# Prometheus answers in milliseconds on loopback and in seconds when overloaded; timeouts are ~10 s.
QUERY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# One evaluation: its queries, the engine, the journal commit and the dispatch (ms at 100 targets, s at 5,000).
EVALUATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def target_label(target: TargetKey) -> str:
    """One `target` label for any groupBy: 'namespace=llm,service=chat' (label names sorted)."""
    return ",".join(f"{name}={value}" for name, value in target)


_CONDITION = itemgetter(0)
_PHASE = attrgetter("phase")


class ControllerMetrics:
    """tailguard_* metrics: evaluations, decisions, actions, query latency, source errors, state."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.evaluations = Counter(
            "tailguard_evaluations_total",
            "Policy evaluations, by what triggered them (schedule, alert).",
            ["policy", "trigger"],
            registry=self.registry,
        )
        self.decisions = Counter(
            "tailguard_decisions_total",
            "Decisions taken by the breach engine.",
            ["policy", "condition", "kind"],
            registry=self.registry,
        )
        self.actions = Counter(
            "tailguard_actions_total",
            "Actions run by the dispatcher, by final status.",
            ["type", "status"],
            registry=self.registry,
        )
        self.query_duration = Histogram(
            "tailguard_query_duration_seconds",
            "Time to query one signal of a policy.",
            ["policy", "signal"],
            buckets=QUERY_BUCKETS,
            registry=self.registry,
        )
        self.source_errors = Counter(
            "tailguard_source_errors_total",
            "Signal queries that returned an error (never counted as breaches).",
            ["policy", "signal"],
            registry=self.registry,
        )
        self.condition_state = Gauge(
            "tailguard_condition_state",
            "Targets per condition in each phase after the last evaluation.",
            ["policy", "condition", "phase"],
            registry=self.registry,
        )
        self.policies_loaded = Gauge(
            "tailguard_policies_loaded",
            "Policies in the active (last good) set.",
            registry=self.registry,
        )
        self.last_evaluation = Gauge(
            "tailguard_last_evaluation_timestamp_seconds",
            "When each policy was last evaluated (unix time).",
            ["policy"],
            registry=self.registry,
        )
        self.reload_errors = Counter(
            "tailguard_reload_errors_total",
            "Policy reloads rejected because a file had errors.",
            registry=self.registry,
        )
        self.policy_errors = Gauge(
            "tailguard_policy_errors",
            "Signals of a policy whose query Prometheus refused as bad data at the policy's last evaluation "
            "(a PromQL error: the policy must be fixed; never a breach, never retried as an outage).",
            ["policy"],
            registry=self.registry,
        )
        self.breach_probability = Gauge(
            "tailguard_sla_breach_probability",
            "Predicted probability that the SLA of a dimension breaches within the model's horizon, per target.",
            ["policy", "model", "dimension", "target"],
            registry=self.registry,
        )
        self.evaluation_duration = Histogram(
            "tailguard_evaluation_duration_seconds",
            "Time of one policy evaluation: queries, engine, journal commit and dispatch.",
            ["policy"],
            buckets=EVALUATION_BUCKETS,
            registry=self.registry,
        )
        self.evaluation_targets = Gauge(
            "tailguard_evaluation_targets",
            "Targets of each policy (distinct target label sets with state) after its last evaluation.",
            ["policy"],
            registry=self.registry,
        )
        # The probability series each policy wrote last, so targets that disappear are dropped (bounded).
        self._probability_series: dict[str, set[tuple[str, str, str]]] = {}
        self._watch_the_watcher()

    def _watch_the_watcher(self) -> None:
        """What the controller's own alerts read (issue 24: deploy/base/prometheusrule.yaml, docs/runbooks.md)."""
        self.source_up = Gauge(
            "tailguard_source_up",
            "1 when the source answered every query of every policy's last evaluation, 0 when degraded or blind.",
            ["source"],
            registry=self.registry,
        )
        self.source_status = Gauge(
            "tailguard_source_status",
            "1 for the source's current status (up, degraded: some queries fail, blind: every query fails).",
            ["source", "status"],
            registry=self.registry,
        )
        self.source_status_since = Gauge(
            "tailguard_source_status_since_timestamp_seconds",
            "When the source entered its current status (unix time).",
            ["source"],
            registry=self.registry,
        )
        self.last_successful_evaluation = Gauge(
            "tailguard_last_successful_evaluation_timestamp_seconds",
            "When each policy was last evaluated with every signal answered by its source (unix time).",
            ["policy"],
            registry=self.registry,
        )
        self.policy_interval = Gauge(
            "tailguard_policy_interval_seconds",
            "Each loaded policy's evaluation interval (the alerts' 'blind for more than 2 intervals').",
            ["policy"],
            registry=self.registry,
        )
        self.journal_errors = Counter(
            "tailguard_journal_errors_total",
            "Journal writes that failed (a full disk, an unusable file): the evaluation decided nothing, acted on "
            "nothing.",
            ["operation"],
            registry=self.registry,
        )
        self.requests_rejected = Counter(
            "tailguard_requests_rejected_total",
            "Requests to the API refused: no or a wrong bearer token (401/403), a malformed webhook body (400).",
            ["endpoint", "code"],
            registry=self.registry,
        )
        build_info = Gauge(
            "tailguard_build_info",
            "The running tailguard: its version and Python's (always 1).",
            ["version", "python"],
            registry=self.registry,
        )
        build_info.labels(version=_version(), python=platform.python_version()).set(1)
        ProcessCollector(registry=self.registry)  # process_* (CPU, memory, open fds, start time)
        self._leadership = _LeadershipCollector()
        self.registry.register(self._leadership)

    def watch_leadership(
        self, leads: Callable[[], bool], shards: Callable[[], Mapping[int, bool]] | None = None
    ) -> None:
        """tailguard_leader (and tailguard_shard_leader{shard}) read at each scrape from the elector."""
        self._leadership.leads, self._leadership.shards = leads, shards

    def record_source_health(self, health: SourceHealth) -> None:
        self.source_up.labels(source=health.source).set(1 if health.status is SourceStatus.UP else 0)
        for status in SourceStatus:
            self.source_status.labels(source=health.source, status=status.value).set(status is health.status)
        if health.since is not None:
            self.source_status_since.labels(source=health.source).set(health.since)

    def record_successful_evaluation(self, policy: str, at: float) -> None:
        self.last_successful_evaluation.labels(policy=policy).set(at)

    def record_journal_error(self, operation: str) -> None:
        self.journal_errors.labels(operation=operation).inc()

    def record_rejected(self, endpoint: str, code: int) -> None:
        self.requests_rejected.labels(endpoint=endpoint, code=str(code)).inc()

    def record_evaluation(self, policy: str, trigger: str, at: float) -> None:
        self.evaluations.labels(policy=policy, trigger=trigger).inc()
        self.last_evaluation.labels(policy=policy).set(at)

    def record_cycle(self, policy: str, seconds: float, targets: int) -> None:
        """One evaluation's wall time and the number of target states it left."""
        self.evaluation_duration.labels(policy=policy).observe(max(0.0, seconds))
        self.evaluation_targets.labels(policy=policy).set(targets)

    def record_decision(self, decision: Decision) -> None:
        self.decisions.labels(policy=decision.policy, condition=decision.condition, kind=decision.kind.value).inc()

    def record_action(self, action_type: str, status: str) -> None:
        self.actions.labels(type=action_type, status=status).inc()

    def record_query(self, policy: str, signal: str, seconds: float, ok: bool) -> None:
        self.query_duration.labels(policy=policy, signal=signal).observe(max(0.0, seconds))
        if not ok:
            self.source_errors.labels(policy=policy, signal=signal).inc()

    def set_policy_errors(self, policy: str, count: int) -> None:
        self.policy_errors.labels(policy=policy).set(count)

    def set_breach_probabilities(
        self, policy: str, probabilities: Mapping[tuple[str, str], Mapping[TargetKey, float]]
    ) -> None:
        """Replace the policy's probability series: {(model, dimension): {target: p}}; NaN or absent = no series."""
        current: set[tuple[str, str, str]] = set()
        for (model, dimension), values in probabilities.items():
            for target, probability in values.items():
                if math.isnan(probability):
                    continue
                labels = (model, dimension, target_label(target))
                self.breach_probability.labels(policy, *labels).set(probability)
                current.add(labels)
        self._drop_probabilities(policy, self._probability_series.get(policy, set()) - current)
        self._probability_series[policy] = current

    def _drop_probabilities(self, policy: str, series: Iterable[tuple[str, str, str]]) -> None:
        for labels in series:
            try:
                self.breach_probability.remove(policy, *labels)
            except KeyError:
                pass

    def record_condition_states(self, policy: str, conditions: Iterable[str], state: PolicyState) -> None:
        """Set the per-phase target counts; every phase is written so a phase left empty reads 0, not stale."""
        # zip/map: the counting runs in C, once per (condition, target) of every evaluation
        conditions_held = state.conditions
        counts = Tally(zip(map(_CONDITION, conditions_held), map(_PHASE, conditions_held.values())))
        for condition in conditions:
            for phase in Phase:
                self.condition_state.labels(policy=policy, condition=condition, phase=phase.value).set(
                    counts.get((condition, phase), 0)
                )

    def set_intervals(self, intervals: Mapping[str, float]) -> None:
        for policy, interval in intervals.items():
            self.policy_interval.labels(policy=policy).set(interval)

    def set_policies(self, policies: Mapping[str, Iterable[str]], removed: Mapping[str, Iterable[str]]) -> None:
        """After a (re)load: the loaded count, and no series left behind for removed policies or conditions."""
        self.policies_loaded.set(len(policies))
        for policy, conditions in removed.items():
            for condition in conditions:
                for phase in Phase:
                    try:
                        self.condition_state.remove(policy, condition, phase.value)
                    except KeyError:
                        pass  # never evaluated: no series to remove
            if policy not in policies:
                for gauge in (
                    self.last_evaluation,
                    self.policy_errors,
                    self.evaluation_targets,
                    self.last_successful_evaluation,
                    self.policy_interval,
                ):
                    try:
                        gauge.remove(policy)
                    except KeyError:
                        pass
                self._drop_probabilities(policy, self._probability_series.pop(policy, set()))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _version() -> str:
    try:
        return importlib.metadata.version("tailguard")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _always_leads() -> bool:
    return True  # without leader election the one replica leads


class _LeadershipCollector(Collector):
    """tailguard_leader (1: this replica holds the Lease, or leads some shard) and, sharded, tailguard_shard_leader
    per shard (1: this replica holds it), read at each scrape."""

    def __init__(self) -> None:
        self.leads: Callable[[], bool] = _always_leads
        self.shards: Callable[[], Mapping[int, bool]] | None = None

    def collect(self) -> Iterator[Metric]:
        leader = GaugeMetricFamily("tailguard_leader", "1 when this replica holds the leader Lease (or a shard's).")
        leader.add_metric([], 1.0 if self.leads() else 0.0)
        yield leader
        if self.shards is not None:
            shards = GaugeMetricFamily(
                "tailguard_shard_leader", "1 for each shard whose Lease this replica holds.", labels=["shard"]
            )
            for index, held in sorted(self.shards().items()):
                shards.add_metric([str(index)], 1.0 if held else 0.0)
            yield shards
