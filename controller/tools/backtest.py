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
for the whole backtest and the report says why (with the exit code of a signal error).

    tailguard backtest --prometheus URL --rules PATH --start T --end T [--step 15s] [--output json|markdown]
                       [--predictors NAME=DIR ...] [--trusted-type NAME=TYPE ...] [--allow-untrusted NAME ...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from controller.core.engine import PolicyState, transition
from controller.core.errors import ConfigError
from controller.core.model import ActionRequest, Decision, DecisionKind, TargetKey, format_target, target_labels
from controller.core.policy import Policy
from controller.core.policy_files import load_policies
from controller.core.ports import MetricsSource, RangeResult
from controller.core.signals import query_signals_range, range_chunks
from controller.kit.clock import ManualClock, SystemClock
from controller.kit.durations import parse_duration
from predictors.serving import (
    ArtifactLoader,
    ModelSpec,
    PredictionProvider,
    ProbabilityFunction,
    single_threaded,
    usable_rows,
)

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


# Rows (timestamp x target) per model call: bounds the feature tensor's memory on long, wide backtests.
PREDICTION_BLOCK_CELLS = 2_000_000


def query_range_chunked(
    source: MetricsSource, query: str, group_by: Sequence[str], start: float, end: float, step: float
) -> RangeResult:
    """One range query (more past Prometheus' points limit); a source that raises is an error result."""
    merged: dict[TargetKey, dict[float, float]] = {}
    for chunk_start, chunk_end in range_chunks(start, end, step):
        try:
            part = source.range(query, group_by, chunk_start, chunk_end, step)
        except Exception as unexpected:  # noqa: BLE001 - sources should not raise; one that does is an error
            return RangeResult(error=f"source raised {type(unexpected).__name__}: {unexpected}")
        if part.error is not None:
            return RangeResult(error=part.error)
        for target, samples in part.series.items():
            merged.setdefault(target, {}).update(samples)
    return RangeResult(series=merged)


class HistoricalPredictions:
    """Answers prediction signals over history with the controller's loading and trust rules.

    The models are loaded once for the whole backtest by a PredictionProvider (the same checks as the
    live controller: missing, untrusted types, feature hash, sklearn version, maxAge judged at `at`).
    """

    def __init__(
        self,
        specs: Mapping[str, ModelSpec],
        at: float,
        *,
        loader: ArtifactLoader | None = None,
        probabilities: ProbabilityFunction | None = None,
    ) -> None:
        self._specs = dict(specs)
        self._loader = loader
        self._probabilities = probabilities
        self._artifacts: dict[Path, Any] = {}
        # The provider decides whether a model may be used; the artifact it accepted is kept by `_load`.
        self._provider = PredictionProvider(self._specs, ManualClock(at), loader=self._load)

    def _load(self, directory: Path, **trust: Any) -> Any:
        if self._loader is not None:
            loader = self._loader
        else:
            from predictors.artifact import load_artifact

            loader = load_artifact
        artifact = loader(directory, **trust)
        self._artifacts[Path(directory)] = artifact
        return artifact

    def predict_range(
        self, source: MetricsSource, policy: Policy, times: Sequence[float], step: float
    ) -> tuple[dict[str, RangeResult], list[str]]:
        """Every prediction signal of `policy` at every time of `times` (an evaluation grid), and why any is no-data."""
        signals = [signal for signal in policy.signals if signal.predict is not None]
        if not signals or not times:
            return {}, []
        results: dict[str, RangeResult] = {signal.name: RangeResult() for signal in signals}
        notes: list[str] = []
        states = self._provider.refresh([signal.predict.model for signal in signals if signal.predict is not None])
        usable: dict[str, Any] = {}
        for model, state in states.items():
            if state.usable:
                usable[model] = self._artifacts[self._specs[model].directory]
                continue
            names = ", ".join(s.name for s in signals if s.predict is not None and s.predict.model == model)
            notes.append(f"{policy.name}/{names}: {state.describe()} for the whole backtest")
        if not usable:
            return results, notes  # nothing to predict with: no feature queries either
        from predictors.features import FEATURES, feature_queries

        group_by = list(policy.targets.groupBy)
        queries = feature_queries(policy.targets.match, group_by)
        ranges = {
            name: query_range_chunked(source, query, group_by, times[0], times[-1], step)
            for name, query in queries.items()
        }
        failures = [f"{name}: {result.error}" for name, result in ranges.items() if result.error is not None]
        targets = sorted({target for result in ranges.values() for target in result.series})
        time_index = {timestamp: row for row, timestamp in enumerate(times)}
        target_index = {target: column for column, target in enumerate(targets)}
        # Sparse columns (time row, target, value) per feature, so a block of the tensor is filled by masks.
        cells: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]] = []
        for feature in FEATURES:
            found = ranges.get(feature.name)
            rows_at: list[int] = []
            columns_at: list[int] = []
            values: list[float] = []
            for target, samples in found.series.items() if found is not None else ():
                for timestamp, value in samples.items():
                    row = time_index.get(timestamp)
                    if row is not None and math.isfinite(value):
                        rows_at.append(row)
                        columns_at.append(target_index[target])
                        values.append(value)
            cells.append(
                (np.asarray(rows_at, dtype=np.int64), np.asarray(columns_at, dtype=np.int64), np.asarray(values))
            )
        width = len(FEATURES)
        for model, artifact in usable.items():
            spec = self._specs[model]
            model_signals = [s for s in signals if s.predict is not None and s.predict.model == model]
            if width and len(failures) / width > spec.max_missing_fraction:
                failed = RangeResult(error=f"feature queries failed: {'; '.join(failures[:3])}")
                results.update({signal.name: failed for signal in model_signals})
                continue
            series, note = self._predict_model(model, artifact, spec, cells, times, targets, model_signals)
            if note:
                notes.append(f"{policy.name}: {note}")
            for signal in model_signals:
                if signal.name in series:
                    results[signal.name] = RangeResult(series=series[signal.name])
        return results, notes

    def _predict_model(
        self,
        model: str,
        artifact: Any,
        spec: ModelSpec,
        cells: Sequence[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]],
        times: Sequence[float],
        targets: Sequence[TargetKey],
        model_signals: Sequence[Any],
    ) -> tuple[dict[str, dict[TargetKey, dict[float, float]]], str]:
        if self._probabilities is not None:
            predict_proba = self._probabilities
        else:
            from predictors.artifact import predict_proba
        series: dict[str, dict[TargetKey, dict[float, float]]] = {signal.name: {} for signal in model_signals}
        if not targets:
            return series, ""
        width = len(cells)
        block = max(1, PREDICTION_BLOCK_CELLS // max(1, len(targets) * width))
        gaps: set[str] = set()
        for first in range(0, len(times), block):
            last = min(len(times), first + block)
            tensor = np.full((last - first, len(targets), width), np.nan, dtype=np.float64)
            for column, (rows_at, columns_at, values) in enumerate(cells):
                inside = (rows_at >= first) & (rows_at < last)
                tensor[rows_at[inside] - first, columns_at[inside], column] = values[inside]
            # A target exists at a time when it has any feature then (as a live evaluation sees it).
            present = ~np.isnan(tensor).all(axis=2)
            flat = tensor.reshape(-1, width)
            keep = present.reshape(-1) & usable_rows(flat, spec.max_missing_fraction)
            if not keep.any():
                continue
            try:
                probabilities = single_threaded(predict_proba, artifact, flat[keep])
            except Exception as failure:  # noqa: BLE001 - a model that cannot predict gives no-data, not a crash
                return {}, f"model {model}: prediction failed: {type(failure).__name__}: {failure}; no-data"
            row_of, target_of = np.divmod(np.flatnonzero(keep), len(targets))
            for signal in model_signals:
                dimension = signal.predict.dimension.value
                column_values = probabilities.get(dimension)
                if column_values is None:
                    gaps.add(dimension)
                    continue
                into = series[signal.name]
                for row, target, value in zip(row_of, target_of, np.asarray(column_values, dtype=float), strict=True):
                    into.setdefault(targets[target], {})[times[first + row]] = float(value)
        note = "; ".join(f"model {model} has no {d} model: those signals are no-data" for d in sorted(gaps))
        return series, note


def backtest_policy(
    source: MetricsSource,
    policy: Policy,
    start: float,
    end: float,
    step: float | None = None,
    predictions: HistoricalPredictions | None = None,
) -> tuple[list[Decision], int, list[str]]:
    """All decisions the engine takes for `policy` over history, the number of evaluations and signal errors."""
    step = policy.interval if step is None else step
    times = evaluation_times(start, end, step)
    ranges = query_signals_range(source, policy, start, end, step)
    predictions = predictions or HistoricalPredictions({}, end)
    predicted, notes = predictions.predict_range(source, policy, times, step)
    ranges.update(predicted)
    errors = [f"{policy.name}/{name}: {result.error}" for name, result in ranges.items() if result.error]
    errors.extend(notes)
    state = PolicyState()
    decisions: list[Decision] = []
    for now in times:
        observations = {name: result.at(now) for name, result in ranges.items()}
        state, taken = transition(policy, observations, state, now)
        decisions.extend(taken)
    return decisions, len(times), errors


def run_backtest(
    source: MetricsSource,
    policies: Sequence[Policy],
    start: float,
    end: float,
    step: float | None,
    predictors: Mapping[str, ModelSpec] | None = None,
) -> BacktestReport:
    """Replay every policy over [start, end]; `step` defaults to each policy's own interval."""
    entries: dict[str, BacktestEntry] = {}
    evaluations = 0
    errors: list[str] = []
    predictions = HistoricalPredictions(predictors or {}, end)
    for policy in policies:
        decisions, count, policy_errors = backtest_policy(source, policy, start, end, step, predictions)
        evaluations += count
        errors.extend(policy_errors)
        for decision in decisions:
            _merge(entries, decision)
    ordered = sorted(entries.values(), key=lambda e: (e.onset, e.policy, e.condition, e.target))
    return BacktestReport(ordered, evaluations, start, end, errors)


# -- CLI -------------------------------------------------------------------------------------------


class UsageError(ConfigError, ValueError):
    pass


def parse_time(text: str, what: str) -> float:
    """Epoch seconds ("1700000000", "1700000000.5") or RFC3339 ("2024-05-01T12:00:00Z")."""
    raw = text.strip()
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        raise UsageError(
            f"{what}: expected epoch seconds or an RFC3339 time such as 2024-05-01T12:00:00Z, got {text!r}"
        ) from None
    if parsed.tzinfo is None:
        raise UsageError(f"{what}: RFC3339 time {text!r} needs a timezone (Z or +HH:MM)")
    return parsed.timestamp()


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


def predictor_specs(
    predictors: Sequence[str], trusted: Sequence[str], untrusted: Sequence[str]
) -> dict[str, ModelSpec]:
    """`--predictors NAME=DIR`, `--trusted-type NAME=TYPE`, `--allow-untrusted NAME` as the controller's specs."""
    directories: dict[str, Path] = {}
    for raw in predictors:
        name, separator, directory = raw.partition("=")
        if not separator or not name.strip() or not directory.strip():
            raise UsageError(f"--predictors: expected NAME=DIR such as sla=models/sla, got {raw!r}")
        if name.strip() in directories:
            raise UsageError(f"--predictors: model {name.strip()!r} is given twice")
        directories[name.strip()] = Path(directory.strip()).expanduser().absolute()
    types: dict[str, list[str]] = {}
    for raw in trusted:
        name, separator, type_name = raw.partition("=")
        if not separator or name.strip() not in directories or not type_name.strip():
            raise UsageError(f"--trusted-type: expected NAME=TYPE for a model given with --predictors, got {raw!r}")
        types.setdefault(name.strip(), []).append(type_name.strip())
    for name in untrusted:
        if name not in directories:
            raise UsageError(f"--allow-untrusted: {name!r} is not a model given with --predictors")
    return {
        name: ModelSpec(
            name=name,
            directory=directory,
            trusted_types=tuple(types.get(name, ())),
            allow_untrusted=name in untrusted,
        )
        for name, directory in directories.items()
    }


def backtest_main(argv: Sequence[str]) -> int:
    # Imported here: the pure backtest above does not need requests or the client library.
    from pydantic import ValidationError

    from controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource, SourceConfigError

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
        predictors = predictor_specs(args.predictors, args.trusted_type, args.allow_untrusted)
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
        report = run_backtest(source, [entry.policy for entry in loaded], start, end, step, predictors)
    if args.output == "json":
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.to_markdown(), end="")
    for error in report.signal_errors:
        print(f"tailguard backtest: signal error: {error}", file=sys.stderr)
    return EXIT_SIGNAL_ERRORS if report.signal_errors else EXIT_OK


if __name__ == "__main__":
    sys.exit(backtest_main(sys.argv[1:]))
