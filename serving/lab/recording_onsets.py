"""Per-onset transfer table on a real-vLLM recording: train on disjoint history, evaluate every onset (issue 27).

    python -m tailguard.serving.lab.recording_onsets --out docs/experiments/real-vllm-onsets [--work
    var/real-vllm-onsets]

The evaluated recordings (default serving/lab/recordings/vllm-cpu-2026-12-06-onsets, 10 surge onsets and 1
bad-config rollout, and vllm-cpu-2026-12-06-rollouts, 3 bad-config rollouts and 4 surge onsets with 4 minutes of
calm after each) list their surge onsets (the scenario's phases with an `onset` shape) and their bad-config
rollouts (a pre-warmed canary promoted to all the traffic under steady calm load, rolled back 90 s later) in
recording.json. Each experiment trains the SLA model
(predictors.transfer.fit: the gradient-boosted model and the decision cut it picks on its own training data) on
training segments, evaluates it on evaluated segments, and scores per onset, beside the reactive rules and
persistence on the same rows (tailguard.predictors.onset_leads):
- the lead from the first alarm to the first SLO violation (queue-time P99 over 1m > 1 s) and to the onset;
- false alarms per hour on the calm stretches (steady load under capacity, no bad config serving);
- each bad-config rollout detected (an alarm while it served) or not.

The protocol cannot flatter: a training segment that overlaps an evaluated one, or ends less than a horizon
before it (its labels look a horizon ahead, into the evaluated rows), is refused before anything is read
(`check_disjoint`, as tailguard.serving.lab.surge_protocol refuses shared trace segments). All the history lives in one
Prometheus (the recordings and the simulator's history backfilled on one wall clock), so time windows are
the segments. Each evaluated recording is also evaluated by a model trained on the other one (and the
2026-12-01 recordings): a whole recording of history the model never saw. The report ends with the onsets and
rollouts of both recordings pooled per training set (`pool`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from tailguard.controller import PrometheusSettings, PrometheusSource, SystemClock
from tailguard.predictors.artifact import predict_proba
from tailguard.predictors.data import DataError, Rows, score_dimension
from tailguard.predictors.features import DEFAULT_SLI_THRESHOLDS, feature_names
from tailguard.predictors.onset_leads import (
    Array,
    Episode,
    Mask,
    Stretch,
    fmt_seconds,
    pool_method_summaries,
    score_alarms,
)
from tailguard.predictors.train import TrainingError
from tailguard.serving.lab import transfer
from tailguard.serving.lab.dataset import NAMESPACE
from tailguard.serving.lab.promstack import PrometheusServer, PromStackError, write_prometheus_config
from tailguard.serving.lab.recording import (
    Recording,
    RecordingError,
    action_time,
    backfill_recording,
    bad_config_rollouts,
    simulated_windows,
)
from tailguard.serving.lab.surge_protocol import ProtocolError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = PROJECT_ROOT / "serving" / "lab" / "recordings"
EVALUATED = (RECORDINGS / "vllm-cpu-2026-12-06-onsets", RECORDINGS / "vllm-cpu-2026-12-06-rollouts")
EARLIER = (RECORDINGS / "vllm-cpu-2026-12-01", RECORDINGS / "vllm-cpu-2026-12-01-rollout")
STEP_S, HORIZON_S = 5.0, 60.0
# After a rollback the bad version's queue is dropped (scale_down_delay_s 0) and the 1-minute P99 window clears.
ROLLBACK_SETTLE_S = 60.0
# The reactive rules an operator would deploy instead, as alarms on the same rows
# (tailguard.serving.lab.surge_protocol's baselines as rules: an HPA scales out once the per-replica value passes its
# target by the 10% tolerance).
HPA_TOLERANCE = 1.1
METHODS = (
    "model",
    "reactive (SLI over)",
    "queue>20 (shipped rule)",
    "HPA waiting/replica>5",
    "HPA in-engine/replica>48",
    "persistence",
)


@dataclass(frozen=True)
class Segment:
    """A window of history [start, end) (unix s) a role uses; `source` names the recording or simulator seed."""

    source: str
    role: str  # "train" or "eval"
    start: float
    end: float

    def describe(self) -> str:
        return (
            f"{self.source} {datetime.fromtimestamp(self.start, UTC):%Y-%m-%d %H:%M:%S}"
            f"-{datetime.fromtimestamp(self.end, UTC):%H:%M:%S} UTC ({(self.end - self.start) / 60:.1f} min)"
        )


def check_disjoint(train: Sequence[Segment], evaluated: Sequence[Segment], horizon_s: float) -> None:
    """Refuse training history that overlaps evaluated history or ends within a horizon before it."""
    for a in train:
        for b in evaluated:
            if a.start < b.end and b.start < a.end + horizon_s:
                raise ProtocolError(
                    f"training segment {a.describe()} and evaluated segment {b.describe()} overlap (or the "
                    f"training one ends less than the {horizon_s:g} s horizon before the evaluated one starts): "
                    "training and evaluation must not share history"
                )


def full_rollouts(actions: Sequence[Mapping[str, Any]], versions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rollouts without a canary: the version took the traffic when it first had weight 100 and a serving replica
    (the tier's state every 5 s, `versions` in recording.json); rolled back at the next rollback."""
    rollouts = []
    for index, action in enumerate(actions):
        if action.get("action") != "rollout" or action.get("status") != 200:
            continue
        version = action["answer"]["version"]
        took = next(
            (
                float(state["at"])
                for state in versions
                if float(state["at"]) >= float(action["sent_at"])
                and any(v["version"] == version and v["weight"] == 100 and v["serving"] for v in state["versions"])
            ),
            None,
        )
        rollback = next((a for a in actions[index + 1 :] if a.get("action") == "rollback"), None)
        if took is not None:
            back = rollback["sent_at"] if rollback is not None else None
            rollouts.append({"took_traffic_at": took, "rolled_back_at": back, "note": action.get("note", "")})
    return rollouts


def episodes_and_calm(meta: Mapping[str, Any]) -> tuple[list[Episode], list[Stretch], list[dict[str, Any]]]:
    """A recording's onsets (surges and bad configs taking the traffic), its calm stretches and its rollouts.

    Surge onsets are the phases with an `onset` shape; a bad config's onset is the answer to its `promote`
    (or, in a recording without promotes, when a rolled-out version first served all the traffic).
    Calm stretches are the phases at the base rate (the first phase's) with no onset, minus the time from a
    promote to ROLLBACK_SETTLE_S after its rollback. Each episode is looked at until the next one starts.
    """
    started, ended = float(meta["started_at"]), float(meta["ended_at"])
    base = float(meta["phases"][0]["rate_from"])
    marks: list[tuple[float, str, str, str]] = []
    surges = 0
    for phase in meta["phases"]:
        if phase.get("onset"):
            surges += 1
            marks.append((float(phase["start_at"]), f"surge {surges}", "surge", str(phase["onset"])))
    rollouts: list[dict[str, Any]] = []
    actions = sorted([*meta.get("actions", []), *meta.get("manual_actions", [])], key=action_time)
    for rollout in bad_config_rollouts(actions) or full_rollouts(actions, meta.get("versions", [])):
        took = float(rollout["took_traffic_at"])
        back = float(rollout["rolled_back_at"]) if rollout["rolled_back_at"] is not None else ended
        name = f"bad config {len(rollouts) + 1}"
        marks.append((took, name, "bad-config", "bad-config"))
        rollouts.append({"name": name, "promoted_at": took, "rolled_back_at": back, "note": rollout["note"]})
    marks.sort()
    episodes = [
        Episode(name, kind, shape, at, marks[i + 1][0] if i + 1 < len(marks) else ended)
        for i, (at, name, kind, shape) in enumerate(marks)
    ]
    bad = [(r["promoted_at"], r["rolled_back_at"] + ROLLBACK_SETTLE_S) for r in rollouts]
    calm: list[Stretch] = []
    for phase in meta["phases"]:
        if phase.get("onset") or not float(phase["rate_from"]) == float(phase["rate_to"]) == base:
            continue
        pieces = [(max(float(phase["start_at"]), started), min(float(phase["end_at"]), ended))]
        for low, high in bad:
            pieces = [p for a, b in pieces for p in ((a, min(b, low)), (max(a, high), b)) if p[1] > p[0]]
        calm += [Stretch(a, b) for a, b in pieces]
    return episodes, calm, rollouts


def method_alarms(rows: Rows, probability: Array | None, cut: float | None) -> dict[str, Mask]:
    """Every method's alarm on these rows (queue-time dimension)."""
    names = feature_names()

    def feature(name: str) -> Array:
        return rows.X[:, names.index(name)]

    def over(values: Array, limit: float) -> Mask:
        return np.isfinite(values) & (values > limit)

    sli = rows.sli["cpu"]
    alarms: dict[str, Mask] = {}
    if probability is not None and cut is not None:
        alarms["model"] = probability >= cut
    alarms["reactive (SLI over)"] = over(sli, rows.thresholds["cpu"])
    alarms["queue>20 (shipped rule)"] = over(feature("queue_waiting"), transfer.QUEUE_RULE_WAITING)
    alarms["HPA waiting/replica>5"] = over(feature("waiting_per_replica"), 5.0 * HPA_TOLERANCE)
    in_engine = feature("running_per_replica") + feature("waiting_per_replica")
    alarms["HPA in-engine/replica>48"] = over(in_engine, 48.0 * HPA_TOLERANCE)
    alarms["persistence"] = rows.persistence["cpu"] == 1.0
    return alarms


def row_scores(rows: Rows, alarms: Mapping[str, Mask]) -> dict[str, Any]:
    """Precision, recall and F1 over the labelled rows (the row view the earlier tables gave), per method."""
    scores = {}
    for method, alarm in alarms.items():
        scored = score_dimension(rows, "cpu", alarm, None)
        scores[method] = {k: scored[k] for k in ("precision", "recall", "f1")}
    return scores


@dataclass(frozen=True)
class Experiment:
    name: str
    train: tuple[Segment, ...]
    evaluated: Segment
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)  # the evaluated recording's
    # The training set's kind ("simulator", "the other real recordings", ...): the pooled tables group by it.
    family: str = ""


def without_absent_features(rows_of: Mapping[Segment, Rows], train: Sequence[Segment], evaluated: Rows) -> Rows:
    """The training rows with the features the evaluated host never exports (the DCGM series of a CPU host) left
    out (NaN everywhere, which training treats as an empty column): the model cannot read them there, and in
    mixed simulator + real training a cross-validation fold of real rows only would hold them as all-NaN."""
    rows = transfer.concat_rows([rows_of[s] for s in train])
    absent = ~np.isfinite(evaluated.X).any(axis=0) if len(evaluated) else np.zeros(rows.X.shape[1], dtype=bool)
    if not absent.any():
        return rows
    X = rows.X.copy()
    X[:, absent] = np.nan
    return dataclasses.replace(rows, X=X)


def run_experiment(
    experiment: Experiment,
    rows_of: Mapping[Segment, Rows],
    settings: transfer.Settings,
) -> dict[str, Any]:
    check_disjoint(experiment.train, [experiment.evaluated], settings.horizon_s)
    episodes, calm, rollouts = episodes_and_calm(experiment.meta)
    rows = rows_of[experiment.evaluated]
    artifact, skipped = transfer.fit(without_absent_features(rows_of, experiment.train, rows), settings)
    if len(rows.targets) != 1:
        raise DataError(f"{experiment.evaluated.describe()}: expected one service, found {len(rows.targets)}")
    probability = predict_proba(artifact, rows.X).get("cpu") if len(rows) else None
    cut = artifact.decision_thresholds.get("cpu")
    alarms = method_alarms(rows, probability, cut)
    window = experiment.evaluated
    mine = [e for e in episodes if window.start <= e.onset < window.end]
    stretches = [Stretch(max(c.start, window.start), min(c.end, window.end)) for c in calm]
    stretches = [c for c in stretches if c.end > c.start]
    scored = score_alarms(rows.times, rows.sli["cpu"], rows.thresholds["cpu"], alarms, mine, stretches, HORIZON_S)
    bad = []
    for rollout in rollouts:
        if not window.start <= rollout["promoted_at"] < window.end:
            continue
        served = rollout["rolled_back_at"] - rollout["promoted_at"]
        per_method = {}
        for method, entry in scored.items():
            onset = next(o for o in entry["onsets"] if o["episode"] == rollout["name"])
            alarm_s = onset["alarm_s"]
            per_method[method] = {
                "detected": alarm_s is not None and alarm_s <= served,
                "alarm_s": alarm_s,
                "lead_to_violation_s": onset["lead_to_violation_s"],
                "lead_to_promote_s": onset["lead_to_onset_s"],
            }
        first = next(o for o in scored[next(iter(scored))]["onsets"] if o["episode"] == rollout["name"])
        bad.append(
            {
                **rollout,
                "served_s": served,
                "violation_s": first["violation_s"],
                "clean": first["outcome"] != "breaching at onset",
                "methods": per_method,
            }
        )
    return {
        "experiment": experiment.name,
        "family": experiment.family,
        "recording": experiment.evaluated.source,
        "train": [s.describe() for s in experiment.train],
        "evaluated": window.describe(),
        "rows": len(rows),
        "decision_cut": cut,
        "skipped": dict(skipped),
        "row_scores": row_scores(rows, alarms),
        "methods": scored,
        "rollouts": bad,
    }


def _lead(onset: Mapping[str, Any]) -> str:
    outcome = onset["outcome"]
    if outcome in ("warned", "late"):
        mark = "*" if onset["alarm_already_on"] else ""
        return f"{fmt_seconds(onset['lead_to_violation_s'])} / {fmt_seconds(onset['lead_to_onset_s'])}{mark}"
    if outcome == "alarm, no violation":
        return f"alarm at {fmt_seconds(onset['alarm_s'])}, no violation"
    return str(outcome)


def render_markdown(header: str, experiments: Sequence[Mapping[str, Any]]) -> str:
    lines = [header, ""]
    for experiment in experiments:
        methods = [m for m in METHODS if m in experiment["methods"]]
        lines += [f"### {experiment['experiment']}", ""]
        lines.append(f"Trained on: {'; '.join(experiment['train'])}. Evaluated on: {experiment['evaluated']}.")
        lines.append(
            f"{experiment['rows']} evaluated rows; the model's own cut (chosen on its training data): "
            f"p >= {_cut(experiment['decision_cut'])}"
            + (f"; not trained: {experiment['skipped']}" if experiment["skipped"] else "")
            + "."
        )
        lines += [
            "",
            (
                "| method | warned | late | missed | breaching at onset | quiet / alarm, no violation "
                "| lead to violation p10 / p50 / p90 (s) | lead to onset p50 (s) "
                "| calm false alarms/h (calm time alarming) "
                "| rows: precision / recall / F1 |"
            ),
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for method in methods:
            summary = experiment["methods"][method]["summary"]
            outcomes = summary["outcomes"]
            lead = summary["lead_to_violation_s"]
            row = experiment["row_scores"].get(method, {})
            lines.append(
                f"| {method} | {outcomes.get('warned', 0)} | {outcomes.get('late', 0)} | {outcomes.get('missed', 0)} "
                f"| {outcomes.get('breaching at onset', 0)} "
                f"| {outcomes.get('quiet', 0)} / {outcomes.get('alarm, no violation', 0)} "
                f"| {fmt_seconds(lead['p10'])} / {fmt_seconds(lead['p50'])} / {fmt_seconds(lead['p90'])} "
                f"| {fmt_seconds(summary['lead_to_onset_s']['p50'])} "
                f"| {summary['calm_false_alarms']} in {summary['calm_hours']:.2f} h = "
                f"{summary['calm_false_alarms_per_hour'] or 0:.1f} ({summary['calm_alarm_share']:.0%}) "
                f"| {_scores(row)} |"
            )
        lines += [
            "",
            (
                "Per onset: lead to the first violation / lead to the onset, seconds (negative: after; `*`: the alarm "
                "was already on a horizon before the onset). First violation: seconds after the onset."
            ),
            "",
            "| onset | shape | first violation | " + " | ".join(methods) + " |",
            "|---|---|---|" + "---|" * len(methods),
        ]
        first = experiment["methods"][methods[0]]["onsets"]
        for index, onset in enumerate(first):
            cells = [_lead(experiment["methods"][m]["onsets"][index]) for m in methods]
            when = datetime.fromtimestamp(onset["onset"], UTC)
            violation = "-" if onset["violation_s"] is None else f"+{onset['violation_s']:.0f}"
            lines.append(
                f"| {onset['episode']} ({when:%H:%M:%S}) | {onset['shape']} | {violation} | " + " | ".join(cells) + " |"
            )
        if experiment["rollouts"]:
            lines += [
                "",
                (
                    "Bad-config rollouts (detected: an alarm from a horizon before the promote until the rollback; "
                    "in brackets the lead to the first violation / to the promote, seconds, negative: after it; "
                    "clean: the SLI was under its threshold for the horizon before the promote):"
                ),
                "",
                "| rollout | promoted (UTC) | served (s) | clean | first violation | " + " | ".join(methods) + " |",
                "|---|---|---|---|---|" + "---|" * len(methods),
            ]
            for rollout in experiment["rollouts"]:
                cells = [_detected(rollout["methods"][m]) for m in methods]
                violation = "-" if rollout["violation_s"] is None else f"+{rollout['violation_s']:.0f}"
                lines.append(
                    f"| {rollout['name']} | {datetime.fromtimestamp(rollout['promoted_at'], UTC):%H:%M:%S} "
                    f"| {rollout['served_s']:.0f} | {'yes' if rollout['clean'] else 'no'} | {violation} | "
                    + " | ".join(cells)
                    + " |"
                )
        lines.append("")
    return "\n".join(lines)


def _cut(cut: float | None) -> str:
    return "-" if cut is None else f"{cut:.3f}"


def _detected(entry: Mapping[str, Any]) -> str:
    if entry["alarm_s"] is None:
        return "not detected (no alarm)"
    leads = f"{fmt_seconds(entry['lead_to_violation_s'])} / {fmt_seconds(entry['lead_to_promote_s'])}"
    return ("detected" if entry["detected"] else "not detected") + f" ({leads})"


def _scores(row: Mapping[str, Any]) -> str:
    if not row:
        return "-"
    return f"{row['precision']:.3f} / {row['recall']:.3f} / {row['f1']:.3f}"


def plan_experiments(
    evaluated: Sequence[Recording],
    earlier: Sequence[Recording],
    sims: Sequence[tuple[int, tuple[float, float]]],
    split_share: float = 0.5,
) -> list[Experiment]:
    """Every experiment: for each evaluated recording, models trained on the simulator, on the 2026-12-01
    recordings, on both, on the 2026-12-01 recordings and the other evaluated recordings (whole), and on its own
    first part (evaluated on its second part); and the 2026-12-01 rollout recording held out. `sims`: (seed,
    window) of the simulator's history."""
    sim_train = tuple(Segment(f"simulator seed {seed}", "train", a, b) for seed, (a, b) in sims)
    real_train = tuple(Segment(r.directory.name, "train", r.start, r.end) for r in earlier)
    wholes = {r.directory.name: Segment(r.directory.name, "eval", r.start, r.end) for r in evaluated}
    experiments: list[Experiment] = []
    for recording in evaluated:
        name = recording.directory.name
        whole, meta = wholes[name], recording.meta
        episodes, _, _ = episodes_and_calm(meta)
        split = _split_point(recording, episodes, split_share)
        first = Segment(name, "train", recording.start, split - HORIZON_S)
        second = Segment(name, "eval", split, recording.end)
        # The other evaluated recordings, whole, as training history: recorded the same day on the same tier,
        # never this one's history (check_disjoint says so before anything is read).
        others = tuple(Segment(o, "train", w.start, w.end) for o, w in wholes.items() if o != name)
        experiments += [
            Experiment(f"simulator -> {name}", sim_train, whole, meta, "simulator"),
            Experiment(f"real 2026-12-01 recordings -> {name}", real_train, whole, meta, "real 2026-12-01"),
            Experiment(
                f"simulator + real 2026-12-01 -> {name}", sim_train + real_train, whole, meta, "simulator + 2026-12-01"
            ),
        ]
        if others:
            experiments.append(
                Experiment(
                    f"real 2026-12-01 + the other 2026-12-06 recording -> {name}",
                    (*real_train, *others),
                    whole,
                    meta,
                    "real 2026-12-01 + the other 2026-12-06 recording",
                )
            )
        experiments.append(
            Experiment(
                f"real 2026-12-01 + {name}'s first part -> its second part",
                (*real_train, first),
                second,
                meta,
                "real 2026-12-01 + the recording's first part (second part only)",
            )
        )
    # The earlier rollout recording's bad config (a full rollout after an 8.8-minute cold start), held out: trained
    # on the simulator, the earlier surge recording and the evaluated ones (none of them its history).
    for held in earlier:
        if held.directory.name.endswith("-rollout"):
            others = tuple(s for s in real_train if s.source != held.directory.name)
            experiments.append(
                Experiment(
                    f"simulator + the other real recordings -> {held.directory.name} (held out)",
                    (*sim_train, *others, *(Segment(w.source, "train", w.start, w.end) for w in wholes.values())),
                    Segment(held.directory.name, "eval", held.start, held.end),
                    held.meta,
                    "held out 2026-12-01 rollout",
                )
            )
    return experiments


def evaluate(
    evaluated: Sequence[Recording],
    earlier: Sequence[Recording],
    work: Path,
    *,
    sim_seeds: Sequence[int] = (101,),
    sim_hours: float = 1.0,
    split_share: float = 0.5,
) -> tuple[str, list[dict[str, Any]]]:
    """Every experiment on each of `evaluated`; the TSDB and the simulator's history go to `work`."""
    work.mkdir(parents=True, exist_ok=True)
    data_dir = work / "data"
    for recording in (*evaluated, *earlier):
        backfill_recording(recording.history, data_dir)
    sims = simulated_windows(sim_seeds, sim_hours, work, data_dir)
    experiments = plan_experiments(evaluated, earlier, list(zip(sim_seeds, sims, strict=True)), split_share)
    for experiment in experiments:  # refused before any row is read
        check_disjoint(experiment.train, [experiment.evaluated], HORIZON_S)
    settings = transfer.Settings(
        match={"namespace": NAMESPACE},
        group_by=["service"],
        step_s=STEP_S,
        horizon_s=HORIZON_S,
        thresholds=dict(DEFAULT_SLI_THRESHOLDS),
        e2e_threshold_s=10.0,
    )
    config = write_prometheus_config(work / "prometheus.yml")
    results = []
    with (
        PrometheusServer(config, data_dir, workdir=work / "prometheus").start() as prometheus,
        PrometheusSource(PrometheusSettings(url=prometheus.url, timeout=60.0), SystemClock()) as source,
    ):
        segments = {s for e in experiments for s in (*e.train, e.evaluated)}
        rows_of = {s: transfer.read_rows(transfer.Window(source, s.start, s.end), settings)[0] for s in segments}
        for experiment in experiments:
            results.append(run_experiment(experiment, rows_of, settings))
    lines = []
    for recording in evaluated:
        episodes, calm, rollouts = episodes_and_calm(recording.meta)
        load = [s["load1"] for s in recording.meta.get("load_average", [])]
        lines.append(
            f"- {recording.directory.name}: {_utc(recording.start)} UTC + "
            f"{(recording.end - recording.start) / 60:.1f} min, {sum(e.kind == 'surge' for e in episodes)} surge "
            f"onsets, {len(rollouts)} bad-config rollouts, {sum(c.end - c.start for c in calm) / 60:.1f} min of calm "
            f"stretches; host load average (1 min) {min(load, default=0):.1f}-{max(load, default=0):.1f} on 2 cores."
        )
    header = "\n".join(
        [
            "Evaluated recordings:",
            "",
            *lines,
            "",
            (
                f"Step {STEP_S:g} s, horizon {HORIZON_S:g} s, SLI queue-time P99 (1m) > "
                f"{DEFAULT_SLI_THRESHOLDS['cpu']:g} s; simulator seeds {', '.join(map(str, sim_seeds))} "
                f"({sim_hours:g} h each). Regenerate: "
                "`python -m tailguard.serving.lab.recording_onsets --out docs/experiments/real-vllm-onsets`."
            ),
        ]
    )
    return header, results


def pool(experiments: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The onsets and rollouts of every evaluated recording pooled per training-set family, per method: outcome
    counts, the lead distribution over the clean onsets, calm false alarms per calm hour, rollouts detected."""
    families: dict[str, list[Mapping[str, Any]]] = {}
    for experiment in experiments:
        families.setdefault(experiment["family"], []).append(experiment)
    pooled = []
    for family, members in families.items():
        methods = [m for m in METHODS if all(m in e["methods"] for e in members)]
        summaries = {m: pool_method_summaries([e["methods"][m] for e in members]) for m in methods}
        for method in methods:
            rollouts = [r for e in members for r in e["rollouts"]]
            summaries[method]["rollouts"] = len(rollouts)
            summaries[method]["rollouts_detected"] = sum(bool(r["methods"][method]["detected"]) for r in rollouts)
            clean = [r for r in rollouts if r["clean"]]
            summaries[method]["clean_rollouts"] = len(clean)
            summaries[method]["clean_rollouts_detected"] = sum(bool(r["methods"][method]["detected"]) for r in clean)
        pooled.append(
            {
                "family": family,
                "evaluated": [e["evaluated"] for e in members],
                "cuts": [e["decision_cut"] for e in members],
                "methods": summaries,
            }
        )
    return pooled


def render_pooled(pooled: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "## Pooled over the evaluated recordings, per training set",
        "",
        (
            "Each training set's experiments on every evaluated recording (or part) together: onset outcomes, the "
            "clean onsets whose alarm was already on a horizon before them (carried through the calm: no warning, "
            "left out of the leads), the lead to the first violation over the other clean onsets (p10 / p50 / p90, "
            "seconds), calm false alarms per "
            "calm hour, bad-config rollouts detected (in brackets: of the clean ones, the SLI under its threshold "
            "for the horizon before the promote). Each model at its own cut (listed), chosen on its training data."
        ),
        "",
    ]
    for entry in pooled:
        lines += [
            f"### {entry['family']}",
            "",
            f"Evaluated: {'; '.join(entry['evaluated'])}. Model cuts: {', '.join(_cut(c) for c in entry['cuts'])}.",
            "",
            (
                "| method | onsets | warned | late | missed | breaching at onset | quiet / alarm, no violation "
                "| alarm already on | clean leads | lead to violation p10 / p50 / p90 (s) | calm false alarms/h "
                "| rollouts detected |"
            ),
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for method, summary in entry["methods"].items():
            outcomes, lead = summary["outcomes"], summary["lead_to_violation_s"]
            per_hour = summary["calm_false_alarms_per_hour"]
            lines.append(
                f"| {method} | {summary['episodes']} | {outcomes.get('warned', 0)} | {outcomes.get('late', 0)} "
                f"| {outcomes.get('missed', 0)} | {outcomes.get('breaching at onset', 0)} "
                f"| {outcomes.get('quiet', 0)} / {outcomes.get('alarm, no violation', 0)} "
                f"| {summary['alarm_already_on']} | {lead['count']} "
                f"| {fmt_seconds(lead['p10'])} / {fmt_seconds(lead['p50'])} / {fmt_seconds(lead['p90'])} "
                f"| {summary['calm_false_alarms']} in {summary['calm_hours']:.2f} h = {per_hour or 0:.1f} "
                f"| {summary['rollouts_detected']} of {summary['rollouts']} "
                f"({summary['clean_rollouts_detected']} of {summary['clean_rollouts']} clean) |"
            )
        lines.append("")
    return "\n".join(lines)


def _utc(at: float) -> str:
    return f"{datetime.fromtimestamp(at, UTC):%Y-%m-%d %H:%M:%S}"


def _split_point(recording: Recording, episodes: Sequence[Episode], share: float) -> float:
    """The onset nearest `share` of the recording: its first part trains, the rest (from that onset) is evaluated."""
    target = recording.start + share * (recording.end - recording.start)
    if not episodes:
        return target
    return min((e.onset for e in episodes), key=lambda at: abs(at - target))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tailguard.serving.lab.recording_onsets", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--recording", type=Path, nargs="+", default=list(EVALUATED), help="evaluated recordings")
    parser.add_argument("--earlier", type=Path, nargs="*", default=list(EARLIER), help="recordings trained on")
    parser.add_argument("--out", type=Path, required=True, help="report.md and report.json go here")
    parser.add_argument("--work", type=Path, default=PROJECT_ROOT / "var" / "real-vllm-onsets")
    parser.add_argument("--sim-seeds", type=int, nargs="+", default=[101])
    parser.add_argument("--sim-hours", type=float, default=1.0)
    args = parser.parse_args(argv)
    try:
        header, experiments = evaluate(
            [Recording.load(path) for path in args.recording],
            [Recording.load(path) for path in args.earlier],
            args.work,
            sim_seeds=args.sim_seeds,
            sim_hours=args.sim_hours,
        )
    except (RecordingError, ProtocolError, DataError, TrainingError, PromStackError, OSError) as failed:
        print(f"error: {failed}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    pooled = pool(experiments)
    markdown = render_markdown(
        f"{header}\n\n{render_pooled(pooled)}\n## Per experiment: every onset and rollout\n", experiments
    )
    (args.out / "report.md").write_text(markdown, encoding="utf-8")
    (args.out / "report.json").write_text(
        json.dumps({"header": header, "experiments": experiments, "pooled": pooled}, indent=1, default=float) + "\n",
        encoding="utf-8",
    )
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
