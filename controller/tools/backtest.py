"""Backtest: replay the live engine over Prometheus history, executing nothing.

For each policy: one range query per signal over [start, end] (chunked past
Prometheus' 11,000-points limit), then `engine.transition` at every step, exactly
as the controller would have evaluated. FIRE / SUPPRESSED / RESOLVE decisions of
one incident share an id and are merged into one entry; an incident still firing
at `end` has `resolved_at: null`. Every rendered action is listed with
`"executed": false`. This is what an SRE runs before enabling a policy.

Prediction signals (`predict: {model, dimension}`) are answered over history too, with the
models given as `--predictors NAME=DIR`: one range query per feature (grouped by the policy's
target labels, so all targets in one request), then the model once over every (timestamp,
target) row in blocks (vectorised), then the same engine. Models are loaded and checked by the
controller's own predictors.serving.PredictionProvider (skops allow-list plus `--trusted-type`,
feature hash, sklearn version); staleness (maxAge) is judged at the backtest's end, the time the
controller would have evaluated last. A missing or incompatible model makes its signals no-data
for the whole backtest and the report says why (with the exit code of a signal error). This module
never imports predictors: the app (controller/app/ml_commands.py) passes `backtest_main` a factory
for the SLA model over history (predictors.history.HistoricalPredictions, a HistoricalPredictionPort).

Rollouts are fed to the engine as the live loop feeds them (controller/loop/evaluation.py recent_rollouts): at
each evaluation, the rollouts within the policy's largest attribution window up to that time, from a recorded
rollout list (`--rollouts FILE`: a JSON list of rollouts as the journal and annotations write them,
{labels, revision, previous_revision, at, source, diff}), so an attributed rollback comes out as a rollback.

    tailguard backtest --prometheus URL --rules PATH --start T --end T [--step 15s] [--output json|markdown]
                       [--predictors NAME=DIR ...] [--trusted-type NAME=TYPE ...] [--allow-untrusted NAME ...]
                       [--rollouts FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource, SourceConfigError
from controller.core.actions import ActionRequest
from controller.core.attribution import Rollout, lookback
from controller.core.engine import PolicyState, transition
from controller.core.model import Decision, DecisionKind, TargetKey, format_target, target_labels
from controller.core.policy import Policy
from controller.core.policy_files import load_policies
from controller.core.ports import HistoricalPredictionPort, MetricsSource, RangeResult
from controller.core.signals import query_signals_range, range_chunks
from controller.kit.cli_args import UsageError, parse_time
from controller.kit.clock import SystemClock
from controller.kit.durations import parse_duration

EXIT_OK = 0
EXIT_SIGNAL_ERRORS = 1  # the report is printed, but some signal could not be queried
EXIT_USAGE = 2  # bad arguments, bad rules, unreachable Prometheus


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
            "actions": [{**action.to_json(), "on": kind.value, "executed": False} for kind, action in self.actions],
        }


@dataclass(frozen=True)
class BacktestReport:
    decisions: list[BacktestEntry]
    evaluations: int
    start: float
    end: float
    signal_errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "decisions": [entry.to_json() for entry in self.decisions],
            "evaluations": self.evaluations,
            "start": self.start,
            "end": self.end,
            "signal_errors": list(self.signal_errors),
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
            actions = ", ".join(f"{action.type.value} ({kind.value})" for kind, action in entry.actions) or "-"
            lines.append(
                f"| {entry.policy} | {entry.condition} | {_cell(format_target(entry.target))} | "
                f"{_iso(entry.onset)} | {fired} | {resolved} | {actions} |"
            )
        for error in self.signal_errors:
            lines.append(f"\nsignal error: {error}")
        return "\n".join(lines) + "\n"


def _iso(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _merge(entries: dict[str, BacktestEntry], decision: Decision) -> None:
    entry = entries.get(decision.id)
    if entry is None:
        entry = BacktestEntry(decision.id, decision.policy, decision.condition, decision.target, decision.onset)
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
    times: list[float] = []
    for chunk_start, chunk_end in range_chunks(start, end, step):
        count = round((chunk_end - chunk_start) / step) + 1
        times.extend(round(chunk_start + index * step, 3) for index in range(count))
    return times


@dataclass(frozen=True)
class ModelOptions:
    """The command's model options, as given: `--predictors NAME=DIR`, `--trusted-type NAME=TYPE`,
    `--allow-untrusted NAME` (each repeatable)."""

    predictors: tuple[str, ...] = ()
    trusted_types: tuple[str, ...] = ()
    allow_untrusted: tuple[str, ...] = ()


# (the model options, the backtest's end) -> the SLA model over history; raises UsageError for options it cannot
# use. The app passes one (controller/app/ml_commands.py builds predictors.history.HistoricalPredictions).
PredictionsFactory = Callable[[ModelOptions, float], HistoricalPredictionPort]


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


def backtest_policy(
    source: MetricsSource,
    policy: Policy,
    start: float,
    end: float,
    step: float | None = None,
    predictions: HistoricalPredictionPort | None = None,
    rollouts: Sequence[Rollout] = (),
    change_window: float = 0.0,
) -> tuple[list[Decision], int, list[str]]:
    """All decisions the engine takes for `policy` over history, the number of evaluations and signal errors."""
    step = policy.interval if step is None else step
    times = evaluation_times(start, end, step)
    ranges = query_signals_range(source, policy, start, end, step)
    predicted, notes = (predictions or NoModels()).predict_range(source, policy, times, step)
    ranges.update(predicted)
    errors = [f"{policy.name}/{name}: {result.error}" for name, result in ranges.items() if result.error]
    errors.extend(notes)
    state = PolicyState()
    decisions: list[Decision] = []
    for now in times:
        observations = {name: result.at(now) for name, result in ranges.items()}
        state, taken = transition(policy, observations, state, now, rollouts_at(policy, rollouts, now, change_window))
        decisions.extend(taken)
    return decisions, len(times), errors


def run_backtest(
    source: MetricsSource,
    policies: Sequence[Policy],
    start: float,
    end: float,
    step: float | None,
    predictions: HistoricalPredictionPort | None = None,
    rollouts: Sequence[Rollout] = (),
    change_window: float = 0.0,
) -> BacktestReport:
    """Replay every policy over [start, end]; `step` defaults to each policy's own interval.

    `predictions` answers the prediction signals (the app builds predictors.history.HistoricalPredictions);
    without it they are no-data for the whole backtest.
    """
    entries: dict[str, BacktestEntry] = {}
    evaluations = 0
    errors: list[str] = []
    for policy in policies:
        decisions, count, policy_errors = backtest_policy(
            source, policy, start, end, step, predictions, rollouts, change_window
        )
        evaluations += count
        errors.extend(policy_errors)
        for decision in decisions:
            _merge(entries, decision)
    ordered = sorted(entries.values(), key=lambda e: (e.onset, e.policy, e.condition, e.target))
    return BacktestReport(ordered, evaluations, start, end, errors)


# -- CLI -------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tailguard backtest",
        description="Replay policies over Prometheus history and print what would have been decided "
        "(no action is executed).",
    )
    parser.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus base URL")
    parser.add_argument(
        "--rules",
        required=True,
        action="append",
        metavar="PATH",
        help="policy file or directory (repeatable)",
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
        "--rollouts",
        default=None,
        metavar="FILE",
        help="recorded rollouts (JSON list) fed to attribution as the live change tracker would",
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


def backtest_main(argv: Sequence[str], predictions: PredictionsFactory | None = None) -> int:
    """`tailguard backtest`; `predictions` builds the SLA model over history from the model options (the app's)."""
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
        options = ModelOptions(tuple(args.predictors), tuple(args.trusted_type), tuple(args.allow_untrusted))
        historical = (predictions or no_models)(options, end)
        rollouts = load_rollouts(args.rollouts) if args.rollouts is not None else ()
    except UsageError as bad:
        print(f"tailguard backtest: error: {bad}", file=sys.stderr)
        return EXIT_USAGE

    loaded, policy_errors = load_policies(args.rules)
    for policy_error in policy_errors:
        print(f"tailguard backtest: {policy_error}", file=sys.stderr)
    if policy_errors:
        return EXIT_USAGE
    if not loaded:
        print(f"tailguard backtest: error: no policy found under {', '.join(args.rules)}", file=sys.stderr)
        return EXIT_USAGE

    try:
        settings = PrometheusSettings.model_validate(
            {
                "url": args.prometheus,
                "timeout": args.timeout,
                "retries": 2,
                **({"bearer": {"token_file": args.bearer_token_file}} if args.bearer_token_file else {}),
                "tls": {"ca_file": args.ca_file, "insecure_skip_verify": args.insecure_skip_verify},
            }
        )
        source = PrometheusSource(settings, SystemClock())
    except ValidationError as invalid:
        first = invalid.errors()[0]
        field_name = ".".join(str(part) for part in first["loc"]) or "prometheus"
        print(f"tailguard backtest: error: {field_name}: {first['msg']}", file=sys.stderr)
        return EXIT_USAGE
    except SourceConfigError as bad:
        print(f"tailguard backtest: error: {bad}", file=sys.stderr)
        return EXIT_USAGE
    with source:
        unreachable = source.probe()
        if unreachable is not None:
            print(f"tailguard backtest: error: Prometheus is not usable: {unreachable}", file=sys.stderr)
            return EXIT_USAGE
        report = run_backtest(source, [entry.policy for entry in loaded], start, end, step, historical, rollouts)
    if args.output == "json":
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.to_markdown(), end="")
    for error in report.signal_errors:
        print(f"tailguard backtest: signal error: {error}", file=sys.stderr)
    return EXIT_SIGNAL_ERRORS if report.signal_errors else EXIT_OK


if __name__ == "__main__":
    sys.exit(backtest_main(sys.argv[1:]))
