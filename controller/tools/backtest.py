"""Backtest: replay the live engine over Prometheus history, executing nothing.

For each policy: one range query per signal over [start, end] (chunked past
Prometheus' 11,000-points limit), then the live evaluation at every step (below), exactly
as the controller would have evaluated. FIRE / SUPPRESSED / RESOLVE decisions of
one incident share an id and are merged into one entry; an incident still firing
at `end` has `resolved_at: null`. Every rendered action is listed with
`"executed": false`. This is what an SRE runs before enabling a policy.

Prediction signals (`predict: {model, dimension}`) are answered over history too, with the
models given as `--predictors NAME=DIR`: one range query per feature (grouped by the policy's
target labels, so all targets in one request), then the model once over every (timestamp,
target) row in blocks (vectorised), then the same engine. Models are loaded and checked by the
controller's own tailguard.predictors.serving.PredictionProvider (skops allow-list plus `--trusted-type`,
feature hash, sklearn version); staleness (maxAge) is judged at the backtest's end, the time the
controller would have evaluated last. A missing or incompatible model makes its signals no-data
for the whole backtest and the report says why (with the exit code of a signal error). This module
never imports predictors: the app (controller/app/ml_commands.py) passes `backtest_main` a factory
for the SLA model over history (tailguard.predictors.history.HistoricalPredictions, a HistoricalPredictionPort).

The replay is the live loop's (issue 12 item 6, "backtest = live"): all policies together, evaluation by
evaluation in time order, each through controller/loop/evaluation.py `evaluate` (transition, journal commit, the
policy's deferred actions retried, dispatch) into the real Dispatcher over a temporary journal, on a simulated clock,
with ports that only say they would run (controller/tools/backtest_world.py). So the global limits (cooldown,
budget, precedence per service across policies: `--config`'s `limits`) defer an action, retry it with its key while
its condition still fires and end it suppressed when it resolves, as live; each action's outcome (would_run,
deferred, suppressed, skipped, failed, dry_run, with why and the journaled events) is the report's `dispatch`.
Rollouts reach attribution through the change tracker port: a recorded list (`--rollouts FILE`, JSON
{labels, revision, previous_revision, at, source, diff}) and, with `--config`, what the configured change sources
list for the window (the app builds the tracker); at each evaluation only those up to its time count. Recorded
alerts (`--alerts FILE`: {at, labels} or Alertmanager payloads) trigger evaluations at their times touching only
the targets they name (controller/core/alerts.py), the signals queried at that time. What it cannot model
(actuator failures, the world reacting, replica counts): rules/README.md "Backtesting a policy".

    tailguard backtest --prometheus URL --rules PATH --start T --end T [--step 15s] [--output json|markdown]
                       [--predictors NAME=DIR ...] [--trusted-type NAME=TYPE ...] [--allow-untrusted NAME ...]
                       [--rollouts FILE] [--alerts FILE]
    tailguard backtest --config CONTROLLER_YAML --start T --end T [...]   (its prometheus, policies, limits, rollouts)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tailguard.controller.adapters.metrics.grid import RangeGrid
from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource, SourceConfigError
from tailguard.controller.adapters.stores.incidents import SqliteIncidentStore
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.actions import ActionRequest
from tailguard.controller.core.alerts import alert_scopes
from tailguard.controller.core.attribution import Rollout, lookback
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.model import (
    Decision,
    DecisionKind,
    SignalResult,
    TargetKey,
    format_target,
    target_labels,
)
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.core.ports import ChangeTrackerPort, HistoricalPredictionPort, MetricsSource, RangeResult
from tailguard.controller.core.signals import query_signals
from tailguard.controller.kit.cli_args import UsageError, parse_time
from tailguard.controller.kit.clock import ManualClock, SystemClock
from tailguard.controller.kit.durations import parse_duration
from tailguard.controller.loop.dispatcher import Actuators, GlobalLimits
from tailguard.controller.loop.embedding import EmbeddedLoop, embed_loop
from tailguard.controller.loop.incidents import EscalationDecision, IncidentKeeper
from tailguard.controller.loop.ports import TRIGGER_ALERT, TRIGGER_SCHEDULE
from tailguard.controller.tools.backtest_coverage import TargetsSeen
from tailguard.controller.tools.backtest_feed import QUERIES_AT_ONCE, PolicyFeed, QuietRun, chunk_times
from tailguard.controller.tools.backtest_world import (
    RecordedAlert,
    RecordedRollouts,
    WouldRun,
    dispatch_outcome,
    load_alerts,
)

EXIT_OK = 0
EXIT_SIGNAL_ERRORS = 1  # the report is printed, but some signal could not be queried
EXIT_USAGE = 2  # bad arguments, bad rules, unreachable Prometheus
EXIT_BLIND = 3  # --strict: a policy (or condition) matched no series in the window (backtest_coverage.py)

# Skip the evaluations in which nothing can happen (backtest_feed.QuietRun); tests turn it off to compare.
SKIP_QUIET = True


@dataclass
class BacktestEntry:
    """One incident: what the controller would have decided for (policy, condition, target)."""

    id: str
    policy: str
    condition: str
    target: TargetKey
    onset: float
    fired_at: float | None = None
    resolved_at: float | None = None
    suppressed_at: float | None = None
    errored_at: float | None = None
    kinds: list[str] = field(default_factory=list)
    actions: list[tuple[DecisionKind, ActionRequest]] = field(default_factory=list)
    peak: float | None = None
    reason: str = ""
    # idempotency key -> how the dispatcher handled the action (backtest_world.dispatch_outcome)
    dispatch: dict[str, dict[str, Any]] = field(default_factory=dict)
    # None: a decision of the policy; else the incident whose escalation step this is (controller/loop/incidents.py)
    incident: str | None = None

    @property
    def policy_fired(self) -> bool:
        """A decision of the policy itself, not an escalation step of its incident."""
        return self.incident is None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "policy": self.policy,
            "condition": self.condition,
            "target": target_labels(self.target),
            "onset": self.onset,
            "fired_at": self.fired_at,
            "resolved_at": self.resolved_at,
            "suppressed_at": self.suppressed_at,
            "errored_at": self.errored_at,
            "kinds": list(self.kinds),
            "peak": self.peak,
            "reason": self.reason,
            **({"incident": self.incident} if self.incident is not None else {}),
            "actions": [
                {
                    **action.to_json(),
                    "on": kind.value,
                    "executed": False,
                    "dispatch": self.dispatch.get(action.idempotency_key),
                }
                for kind, action in self.actions
            ],
        }


@dataclass(frozen=True)
class BacktestReport:
    decisions: list[BacktestEntry]
    evaluations: int
    start: float
    end: float
    signal_errors: list[str] = field(default_factory=list)
    alert_evaluations: int = 0  # of `evaluations`, those recorded alerts triggered
    # of `evaluations`, those in which nothing could happen, applied at once (backtest_feed.QuietRun); not reported
    skipped_evaluations: int = 0
    # {policy: {"*": targets any of its signals answered for, condition: targets its signal answered for}}
    targets_seen: dict[str, dict[str, int]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # policies and conditions that saw nothing

    def to_json(self) -> dict[str, Any]:
        return {
            "decisions": [entry.to_json() for entry in self.decisions],
            "evaluations": self.evaluations,
            "alert_evaluations": self.alert_evaluations,
            "start": self.start,
            "end": self.end,
            "signal_errors": list(self.signal_errors),
            "targets_seen": {policy: dict(counts) for policy, counts in self.targets_seen.items()},
            "warnings": list(self.warnings),
        }

    def to_markdown(self) -> str:
        lines = [
            (
                f"Backtest {_iso(self.start)} .. {_iso(self.end)}: {self.evaluations} evaluations, "
                f"{len(self.decisions)} incident(s)"
            ),
            "",
            "| policy | condition | target | onset | fired | resolved | actions |",
            "|---|---|---|---|---|---|---|",
        ]
        for entry in self.decisions:
            fired = (
                _iso(entry.fired_at)
                if entry.fired_at is not None
                else ("suppressed" if entry.suppressed_at is not None else "errored" if entry.errored_at else "-")
            )
            resolved = (
                _iso(entry.resolved_at)
                if entry.resolved_at is not None
                else ("still firing" if entry.fired_at is not None else "-")
            )
            actions = (
                ", ".join(
                    f"{action.type.value} ({kind.value}{_outcome(entry.dispatch.get(action.idempotency_key))})"
                    for kind, action in entry.actions
                )
                or "-"
            )
            lines.append(
                f"| {entry.policy} | {entry.condition} | {_cell(format_target(entry.target))} | "
                f"{_iso(entry.onset)} | {fired} | {resolved} | {actions} |"
            )
        if self.targets_seen:
            lines += ["", "| policy | condition | targets seen |", "|---|---|---|"]
            for policy, counts in self.targets_seen.items():
                for condition, count in counts.items():
                    lines.append(f"| {policy} | {'(any signal)' if condition == '*' else condition} | {count} |")
        for warning in self.warnings:
            lines.append(f"\nWARNING: {warning}")
        for error in self.signal_errors:
            lines.append(f"\nsignal error: {error}")
        return "\n".join(lines) + "\n"


def _iso(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _outcome(dispatch: Mapping[str, Any] | None) -> str:
    """How the dispatcher handled the action, for the markdown table (", would_run", ", deferred", ...)."""
    return f", {dispatch['outcome']}" if dispatch else ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _merge(entries: dict[str, BacktestEntry], decision: Decision) -> None:
    entry = entries.get(decision.id)
    if entry is None:
        entry = BacktestEntry(decision.id, decision.policy, decision.condition, decision.target, decision.onset)
        entry.incident = decision.incident if isinstance(decision, EscalationDecision) else None
        entries[decision.id] = entry
    entry.kinds.append(decision.kind.value)
    if decision.kind is DecisionKind.FIRE:
        entry.fired_at = decision.at
        entry.reason = decision.reason
    elif decision.kind is DecisionKind.RESOLVE:
        entry.resolved_at = decision.at
    elif decision.kind is DecisionKind.SUPPRESSED:
        entry.suppressed_at = decision.at
        entry.reason = entry.reason or decision.reason
    else:
        entry.errored_at = decision.at
        entry.reason = decision.reason
    values = [v for _, v in decision.evidence] + ([decision.value] if decision.value is not None else [])
    if values and decision.kind is not DecisionKind.RESOLVE:
        entry.peak = max([*values, *([entry.peak] if entry.peak is not None else [])])
    entry.actions.extend((decision.kind, action) for action in decision.actions)


def evaluation_times(start: float, end: float, step: float) -> list[float]:
    """The evaluation grid, rounded to the millisecond like the sources' sample timestamps."""
    return [at for chunk in chunk_times(start, end, step) for at in chunk]


@dataclass(frozen=True)
class ModelOptions:
    """The command's model options, as given: `--predictors NAME=DIR`, `--trusted-type NAME=TYPE`,
    `--allow-untrusted NAME` (each repeatable)."""

    predictors: tuple[str, ...] = ()
    trusted_types: tuple[str, ...] = ()
    allow_untrusted: tuple[str, ...] = ()


# (the model options, the backtest's end) -> the SLA model over history; raises UsageError for options it cannot
# use. The app passes one (controller/app/ml_commands.py builds tailguard.predictors.history.HistoricalPredictions).
PredictionsFactory = Callable[[ModelOptions, float], HistoricalPredictionPort]


@dataclass(frozen=True)
class ConfiguredInputs:
    """What `--config CONTROLLER_YAML` gives the backtest; the app reads the file and builds the change tracker
    from its sources (controller/app/ml_commands.py `backtest_config`)."""

    prometheus: PrometheusSettings
    policies: tuple[str, ...]  # the configured policy paths (used when no --rules is given)
    limits: GlobalLimits
    change_tracker: ChangeTrackerPort | None = None
    change_window: float = 0.0
    dry_run: bool | None = None  # the configuration's dryRun: true/false overrides every policy's


# a controller configuration's path -> what the backtest takes from it; raises UsageError for one it cannot use.
ConfigReader = Callable[[str], ConfiguredInputs]


class NoModels:
    """No SLA model wired into the backtest: every prediction signal is no-data for the whole backtest."""

    def predict_range(
        self, source: MetricsSource, policy: Policy, times: Sequence[float], step: float
    ) -> tuple[dict[str, RangeResult], list[str]]:
        signals = [signal for signal in policy.signals if signal.predict is not None]
        if not signals or not times:
            return {}, []
        names = ", ".join(signal.name for signal in signals)
        return {signal.name: RangeResult() for signal in signals}, [
            f"{policy.name}/{names}: no SLA model is wired into this backtest; no-data for the whole backtest"
        ]


def no_models(options: ModelOptions, at: float) -> HistoricalPredictionPort:
    """The factory without models: refuses `--predictors` (this entry point cannot load a model)."""
    if options.predictors:
        raise UsageError("--predictors: this entry point has no SLA model support; use `tailguard backtest`")
    return NoModels()


def load_rollouts(path: str) -> tuple[Rollout, ...]:
    """A recorded rollout list (JSON: [{labels, revision, previous_revision, at, source, diff}, ...]), by time.

    `at` is epoch seconds or RFC3339. UsageError for a file that is not such a list.
    """
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as unreadable:
        raise UsageError(f"--rollouts {path}: cannot read a JSON rollout list: {unreadable}") from None
    if not isinstance(raw, list):
        raise UsageError(f"--rollouts {path}: expected a JSON list of rollouts")
    rollouts: list[Rollout] = []
    for index, item in enumerate(raw):
        try:
            at = item["at"]
            rollouts.append(
                Rollout(
                    labels={str(k): str(v) for k, v in dict(item["labels"]).items()},
                    revision=str(item["revision"]),
                    previous_revision=None if item.get("previous_revision") is None else str(item["previous_revision"]),
                    at=float(at) if isinstance(at, (int, float)) else parse_time(str(at), f"--rollouts [{index}].at"),
                    source=str(item.get("source", "recorded")),
                    diff=dict(item.get("diff") or {}),
                )
            )
        except (KeyError, TypeError, ValueError) as bad:
            raise UsageError(f"--rollouts {path}: rollout [{index}]: {bad}") from None
    return tuple(sorted(rollouts, key=lambda r: (r.at, r.source, r.revision)))


def rollouts_at(
    policy: Policy, rollouts: Sequence[Rollout], now: float, change_window: float = 0.0
) -> tuple[Rollout, ...]:
    """What the live loop's change tracker would answer at `now`: the rollouts within the policy's largest
    attribution window (never later than `now`); none for a policy that attributes nothing."""
    window = lookback(policy, change_window)
    if window is None:
        return ()
    return tuple(r for r in rollouts if now - window <= r.at <= now)


@dataclass(frozen=True)
class _Evaluation:
    """One evaluation of the replay: a scheduled one on the policy's grid, or one an alert triggered (touching
    only `targets`, the targets the alerts at that time name)."""

    at: float
    trigger: str
    policy: int  # index into the policies
    name: str  # the policy's
    targets: frozenset[TargetKey] | None = None

    def order(self) -> tuple[float, int, str, int]:
        # In time order; at one time the scheduled evaluations first, then the triggered ones; then by policy name.
        return (self.at, 0 if self.trigger == TRIGGER_SCHEDULE else 1, self.name, self.policy)


class _Answers:
    """The signals' answers for the evaluation under way (its policy, at the clock's time): the range queries'
    samples on the grid (the policy's feed, at its current index), the instant queries' answers at an alert's
    time. The query and prediction ports the live evaluation (controller/loop/evaluation.py) calls."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.feeds: dict[str, PolicyFeed] = {}
        self.instant: dict[tuple[str, float], dict[str, SignalResult]] = {}

    def _answer(self, policy: Policy, signals: Sequence[str]) -> dict[str, SignalResult]:
        now = self.clock.now()
        pinned = self.instant.get((policy.name, now), {})
        feed = self.feeds.get(policy.name)
        grids, index = feed.current() if feed is not None else ({}, -1)
        on_grid = 0 <= index < len(feed.times) and feed.times[index] == now if feed is not None else False
        out: dict[str, SignalResult] = {}
        for name in signals:
            if name in pinned:
                out[name] = pinned[name]
            elif name in grids:
                out[name] = grids[name].at(index) if on_grid else SignalResult({})
            else:
                out[name] = SignalResult({})
        return out

    def query(self, _source: MetricsSource, policy: Policy, _at: float | None) -> Mapping[str, SignalResult]:
        return self._answer(policy, [signal.name for signal in policy.signals if signal.predict is None])

    def predict(self, _source: MetricsSource, policy: Policy, _at: float | None = None) -> Mapping[str, SignalResult]:
        return self._answer(policy, [signal.name for signal in policy.signals if signal.predict is not None])

    def warnings(self) -> list[str]:
        return []


def _known_rollouts(
    policies: Sequence[Policy],
    start: float,
    rollouts: Sequence[Rollout],
    change_tracker: ChangeTrackerPort | None,
    change_window: float,
) -> tuple[list[Rollout], list[str]]:
    """The recorded rollouts and what the change tracker answers once for the whole window (from the largest
    attribution window before `start`), without duplicates; and the tracker's errors."""
    known = list(rollouts)
    errors: list[str] = []
    windows = [window for policy in policies if (window := lookback(policy, change_window)) is not None]
    if change_tracker is not None and windows:
        try:
            feed = change_tracker.rollouts(start - max(windows))
            known.extend(feed.rollouts)
            errors.extend(feed.errors)
        except Exception as failure:  # noqa: BLE001 - a tracker answers errors as data; anything raised is one too
            errors.append(f"change tracker raised {type(failure).__name__}: {failure}")
    unique: dict[tuple[Any, ...], Rollout] = {}
    for rollout in known:
        identity = (rollout.at, rollout.source, rollout.revision, tuple(sorted(rollout.labels.items())))
        unique.setdefault(identity, rollout)
    return sorted(unique.values(), key=lambda r: (r.at, r.source, r.revision)), errors


def run_backtest(
    source: MetricsSource,
    policies: Sequence[Policy],
    start: float,
    end: float,
    step: float | None,
    predictions: HistoricalPredictionPort | None = None,
    rollouts: Sequence[Rollout] = (),
    change_window: float = 0.0,
    *,
    limits: GlobalLimits | None = None,
    alerts: Sequence[RecordedAlert] = (),
    change_tracker: ChangeTrackerPort | None = None,
) -> BacktestReport:
    """Replay every policy over [start, end] as the live loop runs them; `step` defaults to each policy's interval.

    All policies together, in time order: each evaluation is the live one (controller/loop/evaluation.py
    `evaluate`: transition, journal commit, the policy's deferred actions retried, dispatch) over a temporary
    journal, the real Dispatcher with the global `limits` (cooldown, budget, precedence; default: none) and
    ports that only say they would run (backtest_world.WouldRun), on a simulated clock. `alerts` trigger extra
    evaluations at their times, touching only the targets they name (controller/core/alerts.py), with the
    signals queried at that time. Rollouts: the recorded ones and what `change_tracker` answers for the window.
    `predictions` answers the prediction signals (the app builds tailguard.predictors.history.HistoricalPredictions);
    without it they are no-data for the whole backtest.
    """
    clock = ManualClock(start)
    answers = _Answers(clock)
    historical = predictions or NoModels()
    errors: list[str] = []
    schedule: list[_Evaluation] = []
    fetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailguard-backtest-fetch")
    querier = ThreadPoolExecutor(max_workers=QUERIES_AT_ONCE, thread_name_prefix="tailguard-backtest-query")
    feeds: list[PolicyFeed] = []
    entries: dict[str, BacktestEntry] = {}
    seen = TargetsSeen()
    try:
        for index, policy in enumerate(policies):
            policy_step = policy.interval if step is None else step
            times = evaluation_times(start, end, policy_step)
            predicted, notes = historical.predict_range(source, policy, times, policy_step)
            feed = PolicyFeed(source, policy, start, end, policy_step, predicted, fetcher, querier)
            _chunk_errors(policy, feed.first(), errors)
            seen.record(policy, feed.grids)
            errors.extend(notes)
            feeds.append(feed)
            answers.feeds[policy.name] = feed
            schedule.extend(_Evaluation(at, TRIGGER_SCHEDULE, index, policy.name) for at in times)
        schedule.extend(_alert_evaluations(source, policies, start, end, step, alerts, answers, historical, errors))
        schedule.sort(key=_Evaluation.order)

        known, tracker_errors = _known_rollouts(policies, start, rollouts, change_tracker, change_window)
        errors.extend(f"change tracking: {error}" for error in tracker_errors)
        with tempfile.TemporaryDirectory(prefix="tailguard-backtest-", dir=_scratch()) as scratch:
            journal = Journal(Path(scratch) / "journal.db")
            incident_store = SqliteIncidentStore(journal.path)
            try:
                world = WouldRun(clock)
                # Incidents as live (controller/loop/incidents.py): one per service scope in the scratch journal,
                # one rollback per incident, the escalation ladder, undone rollouts no longer a cause.
                by_name = {policy.name: policy for policy in policies}
                keeper = IncidentKeeper(incident_store, clock, lambda: by_name)
                loop = embed_loop(
                    journal,
                    Actuators(rollback=world, scale=world, router=world, annotator=world, notifier=world),
                    clock,
                    source,
                    answers,
                    limits=limits,
                    incidents=keeper,
                    change_tracker=RecordedRollouts(known, clock, tracker_errors),
                    change_window=change_window,
                    on_escalation=lambda decision: _merge(entries, decision),
                    query_signals=answers.query,
                )
                skipped = _replay(policies, feeds, schedule, loop, journal, clock, entries, errors, seen)
                for entry in entries.values():
                    for _kind, action in entry.actions:
                        record = journal.get_action(action.idempotency_key)
                        if record is not None:
                            events = journal.action_events(action.idempotency_key)
                            entry.dispatch[action.idempotency_key] = dispatch_outcome(record, events)
            finally:
                journal.close()
                incident_store.close()
    finally:  # the prefetch thread ends with the replay, however it ends
        for feed in feeds:
            feed.close()
        fetcher.shutdown(wait=True, cancel_futures=True)
        querier.shutdown(wait=True, cancel_futures=True)
    ordered = sorted(entries.values(), key=lambda e: (e.onset, e.policy, e.condition, e.target))
    triggered = sum(1 for evaluation in schedule if evaluation.trigger != TRIGGER_SCHEDULE)
    return BacktestReport(
        ordered,
        len(schedule),
        start,
        end,
        errors,
        triggered,
        skipped,
        seen.per_condition(policies),
        seen.blind_warnings(policies),
    )


def _replay(
    policies: Sequence[Policy],
    feeds: Sequence[PolicyFeed],
    schedule: Sequence[_Evaluation],
    loop: EmbeddedLoop,
    journal: Journal,
    clock: ManualClock,
    entries: dict[str, BacktestEntry],
    errors: list[str],
    seen: TargetsSeen,
) -> int:
    """The evaluations in time order, the live one each, except those QuietRun skips (applied before the policy's
    next real evaluation, at a chunk's end and at the end); the decisions merged into `entries`. Returns how
    many were skipped."""
    states = [PolicyState() for _ in policies]
    quiet = [QuietRun(policy) for policy in policies]

    def commit(policy: Policy) -> Callable[[PolicyState, float], None]:
        return lambda state, at: journal.commit_evaluation(policy.name, state, [], at)

    def arm(p: int) -> None:
        if SKIP_QUIET:
            quiet[p].arm(states[p], feeds[p].grids, deferred=bool(journal.deferred_actions(policies[p].name)))

    for p in range(len(policies)):
        arm(p)
    skipped = 0
    for evaluation in schedule:
        if evaluation.at > clock.now():
            clock.advance(evaluation.at - clock.now())
        p = evaluation.policy
        policy = policies[p]
        if evaluation.trigger == TRIGGER_SCHEDULE:
            feed = feeds[p]
            if feed.locate(evaluation.at):  # a new chunk: what was skipped is applied, its errors reported
                states[p] = quiet[p].apply(states[p], commit(policy))
                _chunk_errors(policy, feed.grids, errors)
                seen.record(policy, feed.grids)
                arm(p)
            if quiet[p].skip(feed.index):
                skipped += 1
                continue
        states[p] = quiet[p].apply(states[p], commit(policy))
        outcome = loop.evaluate(
            policy, states[p], evaluation.at, trigger=evaluation.trigger, targets=evaluation.targets
        )
        states[p] = outcome.state
        for decision in outcome.decisions:
            _merge(entries, decision)
        arm(p)
    for p, policy in enumerate(policies):
        states[p] = quiet[p].apply(states[p], commit(policy))
    return skipped


def _chunk_errors(policy: Policy, grids: Mapping[str, RangeGrid], errors: list[str]) -> None:
    """The signals a chunk could not be answered for, each message once."""
    for name, grid in grids.items():
        if grid.error is not None:
            message = f"{policy.name}/{name}: {grid.error}"
            if message not in errors:
                errors.append(message)


def _alert_evaluations(
    source: MetricsSource,
    policies: Sequence[Policy],
    start: float,
    end: float,
    step: float | None,
    alerts: Sequence[RecordedAlert],
    answers: _Answers,
    historical: HistoricalPredictionPort,
    errors: list[str],
) -> list[_Evaluation]:
    """The evaluations the alerts within [start, end] trigger: per alert time (the alerts of one time are one
    post), each policy they wake, touching the targets they name; the signals are queried at that time."""
    by_name = {policy.name: index for index, policy in enumerate(policies)}
    at_times: dict[float, list[Mapping[str, str]]] = {}
    for alert in alerts:
        if start <= alert.at <= end:
            at_times.setdefault(alert.at, []).append(alert.labels)
    out: list[_Evaluation] = []
    for at, labels in sorted(at_times.items()):
        scopes = alert_scopes({policy.name: policy for policy in policies}, labels)
        for name, targets in sorted(scopes.items()):
            policy = policies[by_name[name]]
            observed = query_signals(source, policy, at)
            predicted, notes = historical.predict_range(source, policy, [at], policy.interval if step is None else step)
            observed.update({signal: result.at(at) for signal, result in predicted.items()})
            for signal, result in observed.items():
                if result.error is not None:
                    errors.append(f"{name}/{signal} at {_iso(at)}: {result.error}")
            errors.extend(note for note in notes if note not in errors)
            answers.instant[(name, at)] = observed
            out.append(_Evaluation(at, TRIGGER_ALERT, by_name[name], name, frozenset(targets)))
    return out


def _scratch() -> str | None:
    """Where the temporary journal goes: memory-backed /dev/shm when there is one (every commit is fsynced)."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


# -- CLI -------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tailguard backtest",
        description="Replay policies over Prometheus history and print what would have been decided "
        "(no action is executed).",
    )
    parser.add_argument(
        "--prometheus", default=None, metavar="URL", help="Prometheus base URL (default: the --config's prometheus)"
    )
    parser.add_argument(
        "--rules",
        action="append",
        default=None,
        metavar="PATH",
        help="policy file or directory (repeatable; default: the --config's policies)",
    )
    parser.add_argument("--start", required=True, metavar="T", help="epoch seconds or RFC3339")
    parser.add_argument("--end", required=True, metavar="T", help="epoch seconds or RFC3339")
    parser.add_argument(
        "--step",
        default=None,
        metavar="DURATION",
        help="evaluation step such as 15s (default: each policy's interval)",
    )
    parser.add_argument("--output", choices=("json", "markdown"), default="json")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 3 when a policy or condition matched no series in the window (a blind backtest; always warned)",
    )
    parser.add_argument(
        "--rollouts",
        default=None,
        metavar="FILE",
        help="recorded rollouts (JSON list) fed to attribution as the live change tracker would",
    )
    parser.add_argument(
        "--config",
        default=None,
        metavar="CONTROLLER_YAML",
        help="the controller configuration: rollouts from its change sources over the window, its global limits "
        "(cooldown, budget, precedence) and dryRun; its prometheus and policies unless given",
    )
    parser.add_argument(
        "--alerts",
        default=None,
        metavar="FILE",
        help="recorded alerts (JSON list of {at, labels} or Alertmanager payloads) that trigger evaluations",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per Prometheus request")
    parser.add_argument("--bearer-token-file", default=None, metavar="PATH")
    parser.add_argument("--ca-file", default=None, metavar="PATH")
    parser.add_argument("--insecure-skip-verify", action="store_true")
    parser.add_argument(
        "--predictors",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a trained SLA model the policies' predict signals name (repeatable)",
    )
    parser.add_argument(
        "--trusted-type",
        action="append",
        default=[],
        metavar="NAME=TYPE",
        help="a fully qualified type trusted for model NAME on top of the artifact's allow-list (repeatable)",
    )
    parser.add_argument(
        "--allow-untrusted",
        action="append",
        default=[],
        metavar="NAME",
        help="load model NAME even with types outside every allow-list (runs their code: own artifacts only)",
    )
    return parser


def backtest_main(  # noqa: PLR0915 - the command line: arguments, policies, source, report
    argv: Sequence[str], predictions: PredictionsFactory | None = None, read_config: ConfigReader | None = None
) -> int:
    """`tailguard backtest`; `predictions` builds the SLA model over history from the model options, `read_config`
    reads `--config` (both the app's)."""
    parser = _parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exited:  # argparse already printed the usage error
        return int(exited.code) if isinstance(exited.code, int) else EXIT_USAGE
    try:
        start = parse_time(args.start, "--start")
        end = parse_time(args.end, "--end")
        if end <= start:
            raise UsageError(f"--end ({args.end}) must be after --start ({args.start})")
        step: float | None = None
        if args.step is not None:
            try:
                step = parse_duration(args.step)
            except ValueError as bad:
                raise UsageError(f"--step: {bad}") from None
            if step <= 0:
                raise UsageError("--step must be positive")
        configured: ConfiguredInputs | None = None
        if args.config is not None:
            if read_config is None:
                raise UsageError("--config: this entry point cannot read a controller configuration; "
                                 "use `tailguard backtest`")  # fmt: skip
            configured = read_config(args.config)
        if args.prometheus is None and configured is None:
            raise UsageError("--prometheus URL is required (or --config CONTROLLER_YAML)")
        rules = list(args.rules or (configured.policies if configured is not None else ()))
        if not rules:
            raise UsageError("--rules PATH is required (or --config CONTROLLER_YAML with policies)")
        options = ModelOptions(tuple(args.predictors), tuple(args.trusted_type), tuple(args.allow_untrusted))
        historical = (predictions or no_models)(options, end)
        rollouts = load_rollouts(args.rollouts) if args.rollouts is not None else ()
        alerts = load_alerts(args.alerts) if args.alerts is not None else ()
    except UsageError as bad:
        print(f"tailguard backtest: error: {bad}", file=sys.stderr)
        return EXIT_USAGE

    loaded, policy_errors = load_policies(rules)
    for policy_error in policy_errors:
        print(f"tailguard backtest: {policy_error}", file=sys.stderr)
    if policy_errors:
        return EXIT_USAGE
    if not loaded:
        print(f"tailguard backtest: error: no policy found under {', '.join(map(str, rules))}", file=sys.stderr)
        return EXIT_USAGE
    policies = [entry.policy for entry in loaded]
    if configured is not None and configured.dry_run is not None:
        # As the live controller applies the configuration's dryRun (controller/loop/runtime.py).
        policies = [policy.model_copy(update={"dryRun": configured.dry_run}) for policy in policies]

    try:
        if args.prometheus is not None:
            settings = PrometheusSettings.model_validate(
                {
                    "url": args.prometheus,
                    "timeout": args.timeout,
                    "retries": 2,
                    **({"bearer": {"token_file": args.bearer_token_file}} if args.bearer_token_file else {}),
                    "tls": {"ca_file": args.ca_file, "insecure_skip_verify": args.insecure_skip_verify},
                }
            )
        else:
            assert configured is not None
            settings = configured.prometheus
        source = PrometheusSource(settings, SystemClock())
    except ValidationError as invalid:
        first = invalid.errors()[0]
        field_name = ".".join(str(part) for part in first["loc"]) or "prometheus"
        print(f"tailguard backtest: error: {field_name}: {first['msg']}", file=sys.stderr)
        return EXIT_USAGE
    except SourceConfigError as bad:
        print(f"tailguard backtest: error: {bad}", file=sys.stderr)
        return EXIT_USAGE
    with source, _quiet_loop():
        unreachable = source.probe()
        if unreachable is not None:
            print(f"tailguard backtest: error: Prometheus is not usable: {unreachable}", file=sys.stderr)
            return EXIT_USAGE
        report = run_backtest(
            source,
            policies,
            start,
            end,
            step,
            historical,
            rollouts,
            configured.change_window if configured is not None else 0.0,
            limits=configured.limits if configured is not None else None,
            alerts=alerts,
            change_tracker=configured.change_tracker if configured is not None else None,
        )
    if args.output == "json":
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.to_markdown(), end="")
    for error in report.signal_errors:
        print(f"tailguard backtest: signal error: {error}", file=sys.stderr)
    for warning in report.warnings:
        print(f"tailguard backtest: warning: {warning}", file=sys.stderr)
    if report.signal_errors:
        return EXIT_SIGNAL_ERRORS
    return EXIT_BLIND if report.warnings and args.strict else EXIT_OK


@contextmanager
def _quiet_loop() -> Iterator[None]:
    """The replayed loop's own log lines (each evaluation, each deferral) stay out of the command's output: the
    report carries all of it. Errors still show."""
    # Every module's logger is under "tailguard" (the installed package and the loop's own names alike).
    logger = logging.getLogger("tailguard")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


if __name__ == "__main__":
    sys.exit(backtest_main(sys.argv[1:]))
