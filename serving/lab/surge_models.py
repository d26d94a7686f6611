"""The SLA model's classes compared under the surge protocol (issue 27, item 3): a model that leads, or a verdict.

    python -m tailguard.serving.lab.surge_models run --out DIR [--classes gbm,logistic,mlp] [--controllers
    hpa-concurrency-48,...]
        [--seed-list 1-5] [--calm-seeds 1001-1055] [--models DIR] [--only bad-config,calm]
    python -m tailguard.serving.lab.surge_models calm --out DIR --models DIR/models --calm-seeds 1001-1060
    python -m tailguard.serving.lab.surge_models report --out DIR [--baseline surge.json] PART_DIR...

`run` trains one artifact per model class on the protocol's training seeds (one recording, one set of rows: every
class sees the same features, each gets its own calibration and its own cut from its out-of-fold probabilities on
the training window only), then runs each class's policy (`predictive-<class>`: predicted-queue-breach-scale.yaml
at that class's cut) and the named reactive controllers in the closed loop of tailguard.serving.lab.surge on the
evaluated seeds' onsets and calm traces (`--seed-list`) and on calm traces only (`--calm-seeds`: more calm hours for the
false-alarm rate; their slices lie in the evaluation region too, checked against the training slices). Every run's
summary and onset lead is appended to DIR/runs.jsonl as it finishes, so a run cut short still reports.

`report` reads the parts' runs.jsonl (and calm.jsonl) and writes DIR/models-comparison.md and .json: per
controller violation minutes and replica-minutes over the protocol's onsets and calm traces (the evaluated
seeds), false scale-outs per calm hour over every calm trace a controller ran (closed loop, and open loop from
`calm`), the lead before the first violation per onset, and the issue's targets for every model class against the
best reactive controller on the same runs.

`calm` replays calm traces once without a controller and counts every controller's alarms on the recorded
features (`run_calm_open_loop`): cheap calm hours for the false-alarm rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tailguard.controller import ManualClock, PrometheusSettings, PrometheusSource
from tailguard.predictors.artifact import load_artifact
from tailguard.predictors.data import build_rows, policy_thresholds
from tailguard.serving.errors import LabError
from tailguard.serving.lab.load import BUILTIN_TRACES, read_trace
from tailguard.serving.lab.surge import (
    CONCURRENCY_POLICY,
    PREDICTIVE_POLICY,
    REACTIVE_POLICY,
    START,
    WINDOW_S,
    ScenarioConfig,
    SurgeError,
    TrainedModel,
    load_policy,
    prediction_provider,
    record_training_rows,
    remote_write_prometheus,
    run_closed_loop,
    trace_slice,
)
from tailguard.serving.lab.surge_protocol import (
    OnsetLead,
    ProtocolError,
    baselines,
    check_disjoint,
    controller_table,
    draw_segment,
)

RUNS_FILE = "runs.jsonl"
REPORT = "models-comparison"  # the report's DIR/models-comparison.md and .json
RULES = {"reactive": REACTIVE_POLICY, "concurrency-rule": CONCURRENCY_POLICY}
# Issue 27's targets against the best reactive controller.
TARGET_REDUCTION = 0.30
TARGET_EXTRA_REPLICAS = 0.10
TARGET_FALSE_PER_CALM_HOUR = 0.1
TARGET_MEDIAN_LEAD_S = 30.0


def train_classes(
    prometheus_url: str,
    config: ScenarioConfig,
    classes: Sequence[str],
    out: Path,
    journal_dir: Path,
    log: Callable[[str], None],
) -> tuple[dict[str, TrainedModel], float]:
    """One recording of the training seeds, one artifact per model class (its cut from its own out-of-fold
    probabilities on the training window); returns the models and the end of the training window."""
    from tailguard.predictors.artifact import save_artifact
    from tailguard.predictors.train import fit_artifact

    policy = load_policy(PREDICTIVE_POLICY)
    trace = read_trace(BUILTIN_TRACES["conv"])
    rows, end = record_training_rows(prometheus_url, config, START, journal_dir, trace)
    labels = rows.labels["cpu"]
    breaches = int((labels[np.isfinite(labels)] > 0).sum())
    models: dict[str, TrainedModel] = {}
    for model_class in classes:
        artifact, _skipped = fit_artifact(
            rows,
            match=policy.targets.match,
            group_by=policy.targets.groupBy,
            seed=0,
            now=end,
            holdout=0.0,
            folds=max(2, len(config.train_seeds) // 2),
            model_class=model_class,
        )
        if "cpu" not in artifact.decision_thresholds:
            raise SurgeError(f"{model_class}: the training window gave no queue-time (cpu) model")
        directory = save_artifact(artifact, out / model_class)
        cut = float(artifact.decision_thresholds["cpu"])
        models[model_class] = TrainedModel(directory, cut, config.train_seeds, len(rows), breaches, None)
        log(f"surge-models: {model_class} trained on {len(rows)} rows ({breaches} breach rows); cpu cut {cut:.3f}")
    return models, end


def reuse_classes(directory: Path, classes: Sequence[str], config: ScenarioConfig) -> dict[str, TrainedModel]:
    from tailguard.serving.lab.surge import reuse_model

    return {name: reuse_model(directory / name, config) for name in classes}


def _seed_range(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return tuple(out)


def run_comparison(
    config: ScenarioConfig,
    classes: Sequence[str],
    reactive: Sequence[str],
    calm_seeds: Sequence[int],
    out: Path,
    *,
    model_dir: Path | None,
    only: Sequence[str] = (),
    log: Callable[[str], None] = print,
) -> None:
    """Train (or reuse) the classes, then every controller on the evaluated seeds' onsets + calm and on the calm
    seeds' calm traces; each run appended to out/runs.jsonl as it finishes."""
    evaluated = list(config.eval_seeds) + [s for s in calm_seeds if s not in config.eval_seeds]
    try:
        config.check()
        check_disjoint(
            [config.trace_segment(seed) for seed in config.train_seeds],
            [draw_segment(seed, "eval", config.eval_region, config.duration_s) for seed in evaluated],
        )
    except ProtocolError as refused:
        raise SurgeError(str(refused)) from refused
    hpas = {b.name: b for b in baselines(config.tuned_rps)}
    unknown = [name for name in reactive if name not in hpas and name not in RULES]
    if unknown:
        raise SurgeError(f"unknown reactive controllers {unknown}; expected some of {[*hpas, *RULES]}")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tailguard-surge-models-"))
    trace = read_trace(BUILTIN_TRACES["conv"])
    began = time.monotonic()
    try:
        server = remote_write_prometheus(work)
        with server.start():
            if model_dir is not None:
                models, at = reuse_classes(model_dir, classes, config), START
            else:
                models, at = train_classes(server.url, config, classes, out / "models", work, log)
            trained = {name: {"cut": m.cut, "rows": m.rows, "breach_rows": m.breaches} for name, m in models.items()}
            (out / "models.json").write_text(json.dumps(trained) + "\n", encoding="utf-8")
            controllers: list[tuple[str, Any]] = [(f"predictive-{name}", model) for name, model in models.items()]
            controllers += [(name, None) for name in reactive]
            at += WINDOW_S
            with (out / RUNS_FILE).open("a", encoding="utf-8") as sink:
                for seed in evaluated:
                    seed_trace = trace_slice(trace, config.trace_segment(seed))
                    kinds = [*config.seed_shapes(seed), "calm"] if seed in config.eval_seeds else ["calm"]
                    kinds = [kind for kind in kinds if not only or kind in only]
                    for kind in kinds:
                        for name, model in controllers:
                            policy = None
                            hpa = None
                            provider = None
                            if model is not None:
                                policy = load_policy(
                                    PREDICTIVE_POLICY, cut=model.cut, recovery_hold_s=config.recovery_hold_s
                                )
                                provider = prediction_provider(model.directory)
                            elif name in RULES:
                                policy = load_policy(RULES[name], recovery_hold_s=config.recovery_hold_s)
                            else:
                                hpa = hpas[name].hpa(config.floor)
                            result = run_closed_loop(
                                server.url,
                                config,
                                seed,
                                at,
                                policy,
                                name,
                                shape=config.shape(seed, kind),
                                calm=kind == "calm",
                                predictions=provider,
                                journal_dir=work,
                                trace=seed_trace,
                                hpa=hpa,
                            )
                            at += config.duration_s + WINDOW_S
                            summary = result.summary(config.queue_slo_s, config.e2e_slo_s)
                            lead = result.onset_lead(config.queue_slo_s, config.e2e_slo_s)
                            record = {
                                "summary": summary,
                                "lead": dataclasses.asdict(lead) if kind != "calm" else None,
                                "protocol": seed in config.eval_seeds,
                            }
                            sink.write(json.dumps(record) + "\n")
                            sink.flush()
                            log(
                                f"surge-models: seed {seed} {kind:10s} {name:20s} violation "
                                f"{summary['slo_violation_minutes']:5.2f} min, scale-outs {summary['scale_outs']}, "
                                f"replica-minutes {summary['replica_minutes']:.1f} ({time.monotonic() - began:.0f} s)"
                            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- calm hours, open loop -------------------------------------------------------------------------------------

CALM_FILE = "calm.jsonl"
# The policies' firing rules on one replica: the SLA model's condition holds 2 evaluations (`for: 2`), the
# concurrency rule's 1; both then wait out a 2-minute cooldown. The HPA on in-engine requests (target 48,
# tolerance 10%) scales a single replica out once the engines hold more than 52.8.
MODEL_FOR = 2
COOLDOWN_S = 120.0
IN_ENGINE_PER_REPLICA = (
    '(sum by (service) (vllm:num_requests_running{namespace="llm"}) + sum by (service) '
    '(vllm:num_requests_waiting{namespace="llm"})) / count by (service) (vllm:num_requests_waiting{namespace="llm"})'
)


def alarm_times(times: Sequence[float], firing: Sequence[bool], hold: int, cooldown_s: float) -> list[float]:
    """When a rule that needs `hold` consecutive firing evaluations acts, at most once per `cooldown_s`."""
    acted: list[float] = []
    streak = 0
    for at, fires in zip(times, firing, strict=True):
        streak = streak + 1 if fires else 0
        if streak >= hold and (not acted or at - acted[-1] >= cooldown_s):
            acted.append(at)
            streak = 0
    return acted


def score_calm_trace(
    features: Any,
    times: Sequence[float],
    engine_per_replica: Sequence[float],
    cuts: Mapping[str, tuple[Any, float]],
    peaks: dict[str, float],
) -> dict[str, list[float]]:
    """Alarm times of every controller on one controller-free calm trace (one target): each model at its cut with
        the policy's `for` and cooldown (a target missing more than half its features gets no prediction, as live),
        the concurrency rule (> 48 per replica) and the HPA on in-engine requests (> 52.8 on one replica). `peaks` gets
    each model's highest probability and the highest in-engine count per replica (how far calm stays from a cut)."""
    from tailguard.predictors.artifact import predict_proba
    from tailguard.predictors.serving import DEFAULT_MAX_MISSING_FRACTION, usable_rows

    usable = usable_rows(features, DEFAULT_MAX_MISSING_FRACTION)
    out: dict[str, list[float]] = {}
    for name, (artifact, cut) in cuts.items():
        probabilities = np.zeros(len(times))
        if usable.any():
            probabilities[usable] = predict_proba(artifact, features[usable])["cpu"]
        out[f"predictive-{name}"] = alarm_times(times, list(usable & (probabilities > cut)), MODEL_FOR, COOLDOWN_S)
        peaks[f"predictive-{name}"] = float(probabilities.max()) if len(times) else math.nan
    engine = np.asarray(engine_per_replica, dtype=float)
    out["concurrency-rule"] = alarm_times(times, list(np.nan_to_num(engine) > 48.0), 1, COOLDOWN_S)
    out["hpa-concurrency-48"] = alarm_times(times, list(np.nan_to_num(engine) > 48.0 * 1.1), 1, 15.0)
    peaks["in_engine_per_replica"] = float(np.nanmax(engine)) if np.isfinite(engine).any() else math.nan
    return out


def run_calm_open_loop(
    config: ScenarioConfig, model_dir: Path, classes: Sequence[str], calm_seeds: Sequence[int], out: Path
) -> None:
    """Every calm seed's trace once without a controller (what the closed loop replays until its first scale-out),
    then every controller's alarms on it from the same recorded features (range queries at the evaluation times,
    the values the live loop's instant queries read). Appends one record per seed to out/calm.jsonl."""
    try:
        check_disjoint(
            [config.trace_segment(seed) for seed in config.train_seeds],
            [draw_segment(seed, "eval", config.eval_region, config.duration_s) for seed in calm_seeds],
        )
    except ProtocolError as refused:
        raise SurgeError(str(refused)) from refused
    policy = load_policy(PREDICTIVE_POLICY)
    cuts = {}
    for name in classes:
        artifact = load_artifact(model_dir / name)
        cuts[name] = (artifact, float(artifact.decision_thresholds["cpu"]))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tailguard-surge-calm-"))
    trace = read_trace(BUILTIN_TRACES["conv"])
    began = time.monotonic()
    try:
        server = remote_write_prometheus(work)
        with server.start(), (out / CALM_FILE).open("a", encoding="utf-8") as sink:
            at = START
            for seed in calm_seeds:
                result = run_closed_loop(
                    server.url,
                    config,
                    seed,
                    at,
                    None,
                    "none",
                    shape=config.shape(seed, "calm"),
                    calm=True,
                    journal_dir=work,
                    trace=trace_slice(trace, config.trace_segment(seed)),
                )
                end = at + config.duration_s
                source = PrometheusSource(PrometheusSettings(url=server.url, timeout=60.0), ManualClock(end))
                rows = build_rows(
                    source, policy.targets.match, policy.targets.groupBy, at, end, 15.0, config.horizon_s,
                    policy_thresholds(policy),
                )  # fmt: skip
                engine = source.range(IN_ENGINE_PER_REPLICA, ["service"], at, end, 15.0)
                per_step = {round(t, 3): v for t, v in next(iter(engine.series.values()), {}).items()}
                chat = rows.target_index == rows.targets.index(
                    next(t for t in rows.targets if dict(t)["service"] == "chat")
                )
                times = [float(t) for t in rows.times[chat]]
                engine_values = [per_step.get(round(t, 3), math.nan) for t in times]
                peaks: dict[str, float] = {}
                alarms = score_calm_trace(rows.X[chat], times, engine_values, cuts, peaks)
                summary = result.summary(config.queue_slo_s, config.e2e_slo_s)
                record = {
                    "seed": seed,
                    "minutes": summary["minutes"],
                    "slo_violation_minutes": summary["slo_violation_minutes"],
                    "alarms_s": {name: [round(t - at, 1) for t in ts] for name, ts in alarms.items()},
                    "peaks": {name: round(value, 4) for name, value in peaks.items()},
                }
                sink.write(json.dumps(record) + "\n")
                sink.flush()
                fired = {name: len(ts) for name, ts in alarms.items() if ts}
                print(f"surge-models: calm seed {seed}: alarms {fired or 'none'} ({time.monotonic() - began:.0f} s)")
                at += config.duration_s + WINDOW_S
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- the report -----------------------------------------------------------------------------------------------


def read_runs(parts: Sequence[Path]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for part in parts:
        path = part / RUNS_FILE
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as bad:
                raise ValueError(f"{path}:{number}: not a JSON run record: {bad}") from None
    return records


def baseline_records(report: Mapping[str, Any], *, leave_out: Sequence[str] = ("predictive",)) -> list[dict[str, Any]]:
    """A `tailguard demo --scenario surge` report (surge.json) as run records: the controllers it ran on the same
    protocol (the same seeds, shapes and trace slices; the simulator is deterministic, so a controller rerun gives
    the same figures), less `leave_out`."""
    leads = {
        (name, lead["seed"], lead["shape"]): lead for name, rows in report["leads"].items() for lead in rows
    }  # fmt: skip
    out = []
    for run in report["runs"]:
        if run["controller"] in leave_out:
            continue
        lead = leads.get((run["controller"], run["seed"], run["shape"])) if run["trace"] != "calm" else None
        fields = ("seed", "shape", "first_action_s", "first_violation_s")
        out.append({"summary": run, "lead": {k: lead[k] for k in fields} if lead else None, "protocol": True})
    return out


def unique_runs(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The first record of every (controller, seed, trace, shape): a run repeated in a later part is dropped."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for record in records:
        run = record["summary"]
        key = (run["controller"], run["seed"], run["trace"], run["shape"])
        if key not in seen:
            seen.add(key)
            out.append(record)
    return out


def open_loop_calm(calm: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per controller, its alarms on the controller-free calm traces (`run_calm_open_loop`)."""
    names = list(dict.fromkeys(name for record in calm for name in record["alarms_s"]))
    hours = sum(record["minutes"] for record in calm) / 60.0
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        alarms = sum(len(record["alarms_s"].get(name, [])) for record in calm)
        peaks = [record["peaks"][name] for record in calm if name in record.get("peaks", {})]
        out[name] = {
            "traces": len(calm),
            "hours": round(hours, 2),
            "alarms": alarms,
            "traces_with_an_alarm": sum(1 for record in calm if record["alarms_s"].get(name)),
            "highest_probability": round(max(peaks), 4) if peaks else None,
        }
    return out


def comparison(
    records: Sequence[Mapping[str, Any]],
    cuts: Mapping[str, float],
    calm_open_loop: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Per controller: the protocol's table (violation and replica minutes over the evaluated seeds' onsets and
    calm traces, onset leads) and the false scale-outs over every calm trace it ran (closed loop, plus the
    open-loop calm traces where given); the targets per model."""
    records = unique_runs(records)
    names = list(dict.fromkeys(r["summary"]["controller"] for r in records))
    protocol_seeds = sorted({r["summary"]["seed"] for r in records if r["protocol"]})
    table: dict[str, Any] = {}
    for name in names:
        mine = [r for r in records if r["summary"]["controller"] == name]
        protocol = [r["summary"] for r in mine if r["protocol"]]
        leads = [OnsetLead(**r["lead"]) for r in mine if r["protocol"] and r["lead"] is not None]
        row = controller_table(protocol, leads)
        calm = [r["summary"] for r in mine if r["summary"]["trace"] == "calm"]
        hours = sum(r["minutes"] for r in calm) / 60.0
        false = sum(r["scale_outs"] for r in calm)
        extra = (calm_open_loop or {}).get(name)
        if extra is not None:
            hours += extra["hours"]
            false += extra["alarms"]
        row["all_calm"] = {
            "closed_loop_traces": len(calm),
            "open_loop_traces": extra["traces"] if extra else 0,
            "hours": round(hours, 2),
            "false_scale_outs": false,
            "per_calm_hour": round(false / hours, 3) if hours else None,
            "open_loop": extra,
        }
        row["runs"] = len(protocol)
        table[name] = row
    reactive = [n for n in names if not n.startswith("predictive")]
    best = min(reactive, key=lambda n: table[n]["violation_minutes"]) if reactive else None
    targets: dict[str, Any] = {}
    for name in (n for n in names if n.startswith("predictive")):
        ours = table[name]
        entry: dict[str, Any] = {"cut": cuts.get(name.removeprefix("predictive-"))}
        if best is not None:
            # The best reactive controller on the same runs as this model (all of them once its part is complete).
            runs = [r["summary"] for r in records if r["protocol"] and r["summary"]["controller"] == name]
            keys = {(r["seed"], r["trace"], r["shape"]) for r in runs}
            paired = [
                r["summary"]
                for r in records
                if r["protocol"]
                and r["summary"]["controller"] == best
                and (r["summary"]["seed"], r["summary"]["trace"], r["summary"]["shape"]) in keys
            ]
            theirs = {
                "violation_minutes": sum(r["slo_violation_minutes"] for r in paired),
                "replica_minutes": sum(r["replica_minutes"] for r in paired),
            }
            entry["paired_runs"] = len(paired)
            entry["by_shape"] = {
                shape: {
                    "model": round(sum(r["slo_violation_minutes"] for r in runs if r["shape"] == shape), 2),
                    best: round(sum(r["slo_violation_minutes"] for r in paired if r["shape"] == shape), 2),
                }
                for shape in dict.fromkeys(r["shape"] for r in runs)
            }
            entry["best_reactive_on_these_runs"] = {k: round(v, 2) for k, v in theirs.items()}
            reduction = (
                1.0 - ours["violation_minutes"] / theirs["violation_minutes"] if theirs["violation_minutes"] else None
            )
            extra = ours["replica_minutes"] / theirs["replica_minutes"] - 1.0 if theirs["replica_minutes"] else None
            lead = ours["lead_to_violation_s"]["median"]
            rate = ours["all_calm"]["per_calm_hour"]
            entry |= {
                "violation_reduction": None if reduction is None else round(reduction, 3),
                "extra_replica_minutes": None if extra is None else round(extra, 3),
                "false_scale_outs_per_calm_hour": rate,
                "median_lead_to_violation_s": lead,
                "met": {
                    "violations": reduction is not None and reduction >= TARGET_REDUCTION,
                    "replica_minutes": extra is not None and extra <= TARGET_EXTRA_REPLICAS,
                    "false_alarms": rate is not None and rate <= TARGET_FALSE_PER_CALM_HOUR,
                    "lead": lead is not None and lead >= TARGET_MEDIAN_LEAD_S,
                },
            }
            entry["meets_all"] = all(entry["met"].values())
        targets[name] = entry
    return {"protocol_seeds": protocol_seeds, "best_reactive": best, "table": table, "targets": targets}


def _cell(value: Any, unit: str = "") -> str:
    return "-" if value is None else f"{value:g}{unit}" if isinstance(value, float) else f"{value}{unit}"


def _row(name: str, row: Mapping[str, Any], cut: float | None) -> str:
    outcomes, lead, calm = row["outcomes"], row["lead_to_violation_s"], row["all_calm"]
    violations = (
        f"{row['violation_minutes']:g} ({row['violation_minutes_surge']:g} + {row['violation_minutes_calm']:g})"
    )
    onsets = (
        f"{outcomes.get('acted before', 0)} / {outcomes.get('acted after', 0)}, {outcomes.get('missed', 0)}, "
        f"{outcomes.get('prevented', 0)} of {row['onsets']}"
    )
    leads = f"{_cell(lead['p25'], ' s')} / {_cell(lead['median'], ' s')} / {_cell(lead['p75'], ' s')} ({lead['n']})"
    traces = calm["closed_loop_traces"] + calm["open_loop_traces"]
    hours = f"{calm['false_scale_outs']} in {calm['hours']:g} h, {traces} traces"
    false = f"{_cell(calm['per_calm_hour'])} ({hours})"
    cells = [name, _cell(None if cut is None else round(cut, 4)), violations, f"{row['replica_minutes']:g}", onsets]
    return "| " + " | ".join([*cells, leads, false]) + " |"


def render(figures: Mapping[str, Any]) -> str:
    intro = (
        f"Evaluated seeds (onsets + calm): {figures['protocol_seeds']}; calm-only seeds: "
        f"{_spans(figures['calm_only_seeds'])}. Best reactive controller (fewest violation minutes on the "
        f"evaluated seeds): {figures['best_reactive']}."
    )
    header = (
        "| controller | cut | violation min (surge + calm) | replica-min | onsets: acted before / after, missed, "
        "prevented | lead to violation p25 / median / p75 (n) | false scale-outs / calm h (all calm traces) |"
    )
    lines = [
        "# The SLA model's classes against the best reactive controller (issue 27, item 3)",
        "",
        intro,
        "",
        header,
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in figures["table"].items():
        lines.append(_row(name, row, figures["targets"].get(name, {}).get("cut")))
    targets = (
        f"Targets against {figures['best_reactive']} (>= 30% fewer violation minutes, <= +10% replica-minutes, "
        "<= 0.1 false scale-outs per calm hour, median lead >= 30 s):"
    )
    lines += ["", targets, ""]
    for name, entry in figures["targets"].items():
        if "met" not in entry:
            continue
        extra = entry["extra_replica_minutes"]
        missed = [k for k, v in entry["met"].items() if not v]
        paired = entry.get("best_reactive_on_these_runs", {})
        lines.append(
            f"- {name} ({entry['paired_runs']} runs; {figures['best_reactive']} on them: "
            f"{paired.get('violation_minutes', 0):g} violation min, {paired.get('replica_minutes', 0):g} "
            f"replica-min): violation minutes {_pct(entry['violation_reduction'], 'fewer', 'more')}, replica-minutes "
            f"{'-' if extra is None else f'{extra * 100:+.0f}%'}, false scale-outs per calm hour "
            f"{_cell(entry['false_scale_outs_per_calm_hour'])}, median lead "
            f"{_cell(entry['median_lead_to_violation_s'], ' s')}: "
            + ("meets the target" if not missed else "misses " + ", ".join(missed))
        )
    lines += [
        "",
        f"SLO-violation minutes per shape, each model against {figures['best_reactive']} on the same runs:",
        "",
    ]
    lines += ["| model | " + " | ".join(_SHAPE_ORDER) + " |", "|---" * (len(_SHAPE_ORDER) + 1) + "|"]
    for name, entry in figures["targets"].items():
        shapes = entry.get("by_shape", {})
        cells = [
            "-" if shape not in shapes else f"{shapes[shape]['model']:g} vs {shapes[shape][figures['best_reactive']]:g}"
            for shape in _SHAPE_ORDER
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


_SHAPE_ORDER = ("sudden", "slow-ramp", "two-steps", "diurnal", "bad-config", "calm")


def _spans(seeds: Sequence[int]) -> str:
    """1001, 1002, 1003, 1007 -> "1001-1003, 1007"."""
    spans: list[list[int]] = []
    for seed in sorted(seeds):
        if spans and seed == spans[-1][1] + 1:
            spans[-1][1] = seed
        else:
            spans.append([seed, seed])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans) or "none"


def _pct(share: float | None, good: str, bad: str) -> str:
    if share is None:
        return "-"
    return f"{share * 100:.0f}% {good}" if share >= 0 else f"{-share * 100:.0f}% {bad}"


def write_report(out: Path, parts: Sequence[Path], baseline: Path | None = None) -> dict[str, Any]:
    """models-comparison.md/.json from the parts' runs.jsonl and calm.jsonl and, first, the controllers of an
    earlier surge.json on the same protocol (`baseline`)."""
    records: list[dict[str, Any]] = []
    if baseline is not None:
        records += baseline_records(json.loads(baseline.read_text(encoding="utf-8")))
    records += read_runs([part for part in parts if (part / RUNS_FILE).is_file()])
    calm: list[dict[str, Any]] = []
    cuts: dict[str, float] = {}
    for part in parts:
        path = part / "models.json"
        if path.is_file():
            cuts |= {name: float(m["cut"]) for name, m in json.loads(path.read_text(encoding="utf-8")).items()}
        if (part / CALM_FILE).is_file():
            calm += [json.loads(line) for line in (part / CALM_FILE).read_text(encoding="utf-8").splitlines() if line]
    figures = comparison(records, cuts, open_loop_calm(calm) if calm else None)
    figures["calm_only_seeds"] = sorted({record["seed"] for record in calm})
    figures["baseline_report"] = str(baseline) if baseline is not None else None
    kept = unique_runs(records)
    figures["runs"] = [r["summary"] for r in kept]
    figures["leads"] = [r["lead"] | {"controller": r["summary"]["controller"]} for r in kept if r["lead"]]
    figures["calm_open_loop"] = calm
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{REPORT}.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    (out / f"{REPORT}.md").write_text(render(figures), encoding="utf-8")
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tailguard.serving.lab.surge_models", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train the classes and run the controllers (appends DIR/runs.jsonl)")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--classes", default="gbm,logistic,mlp", help="model classes (tailguard.predictors.modeling)")
    run.add_argument("--controllers", default="", help="reactive controllers beside them (surge's names)")
    run.add_argument("--seed-list", default="1-5", help="evaluated seeds: onsets and calm (e.g. 1-5)")
    run.add_argument("--calm-seeds", default="", help="seeds run calm only (e.g. 1001-1055)")
    run.add_argument("--models", type=Path, default=None, help="reuse the artifacts a run wrote (DIR/models)")
    run.add_argument("--only", default="", help="only these of each seed's shapes (and calm), e.g. bad-config,calm")
    calm = commands.add_parser(
        "calm", help="open-loop calm hours: controller-free calm traces, every controller's alarms"
    )
    calm.add_argument("--out", type=Path, required=True)
    calm.add_argument("--models", type=Path, required=True, help="the artifacts a run wrote (DIR/models)")
    calm.add_argument("--classes", default="gbm,logistic,mlp")
    calm.add_argument("--calm-seeds", required=True, help="calm seeds (e.g. 1001-1060)")
    report = commands.add_parser("report", help="models-comparison.md/.json from the parts' runs.jsonl, calm.jsonl")
    report.add_argument("--out", type=Path, required=True)
    report.add_argument("--baseline", type=Path, default=None, help="an earlier surge.json on the same protocol")
    report.add_argument("parts", type=Path, nargs="+")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.command == "report":
        try:
            figures = write_report(args.out, args.parts, args.baseline)
        except (OSError, ValueError, KeyError) as failed:
            print(f"surge-models: error: {failed}", file=sys.stderr)
            return 1
        print(render(figures))
        return 0

    def terminate(signum: int, _frame: object) -> None:
        # SIGTERM's default action would skip the cleanup and leave Prometheus behind.
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    classes = [c.strip() for c in args.classes.split(",") if c.strip()]
    if args.command == "calm":
        try:
            run_calm_open_loop(ScenarioConfig(), args.models, classes, _seed_range(args.calm_seeds), args.out)
        except (SurgeError, LabError, OSError, ValueError) as failed:
            print(f"surge-models: error: {failed}", file=sys.stderr)
            return 1
        return 0
    try:
        seeds = _seed_range(args.seed_list)
        calm_seeds = _seed_range(args.calm_seeds)
    except ValueError:
        print("surge-models: error: --seed-list/--calm-seeds: expected numbers and ranges like 1-5,9", file=sys.stderr)
        return 2
    config = dataclasses.replace(ScenarioConfig(), eval_seeds=seeds)
    reactive = [c.strip() for c in args.controllers.split(",") if c.strip()]
    try:
        only = [kind.strip() for kind in args.only.split(",") if kind.strip()]
        run_comparison(config, classes, reactive, calm_seeds, args.out, model_dir=args.models, only=only)
    except (SurgeError, LabError, OSError, ValueError) as failed:
        print(f"surge-models: error: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
