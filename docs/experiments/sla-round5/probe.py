"""Round-5 probes (not project code): how much could any further input move the CPU dimension?

Uses round 4's datasets and cached rows ($SLA_DATA, default /tmp/sla8; docs/experiments/sla-round4/gen.sh) and
its decided training set (7 + 11 + 13 + 31), scored on the pooled validation seeds 9 + 21 + 23 + 41 only: no
held-out set (B, C, D) is read here.

  probe.py oracle      replace one feature column (seq_limit_min, which made no difference) by a value taken
                       from the scenario itself: the CPU stall share of the contention ramp, the arrival rate
                       per replica over the last minute, or the arrival rate per replica over the NEXT minute
                       (unobservable: a perfect load forecast, the upper bound of any traffic signal)
  probe.py regression  a GBM regressor on log(highest CPU SLI in the next horizon), cut at the threshold
  probe.py features    six PromQL-only candidate features on the same TSDBs (one at a time and all together)
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "sla-round4"))
sys.path.insert(0, str(HERE.parents[2]))
import run  # round 4's harness: cached rows, scoring  # noqa: E402
from predictors.data import Rows  # noqa: E402
from serving.dataset import make_scenario, segment_at  # noqa: E402
from predictors.features import feature_names  # noqa: E402
from predictors.train import fit_artifact  # noqa: E402

TRAIN = ["ds7x3", "ds11", "ds13", "ds31"]
VALIDATION = ["ds9", "ds21", "ds23", "ds41"]
SEEDS = {"ds7x3": 7, "ds11": 11, "ds13": 13, "ds31": 31, "ds9": 9, "ds21": 21, "ds23": 23, "ds41": 41}
PROFILE_CHANGE = {"ds31": 1.0, "ds41": 1.0}  # gen.sh's --profile-change; the others use the default 0.3
COLUMN = feature_names().index("seq_limit_min")


def with_column(r: Rows, values: np.ndarray | None) -> Rows:
    X = r.X.copy()
    X[:, COLUMN] = 0.0 if values is None else values
    return Rows(r.times, r.target_index, r.targets, X, r.sli, r.labels, r.persistence, r.step, r.horizon_s, r.thresholds)


def scenario_column(name: str, r: Rows, what: str) -> np.ndarray:
    """Mean over 13 points 5 s apart in the last (or, for 'load_next', the next) minute of a scenario value."""
    start, hours = run.SETS[name]
    duration = hours * 3600
    plans: dict[int, list] = {}
    out = np.empty(len(r))
    for k in range(len(r)):
        target = r.targets[r.target_index[k]]
        service = target["service"] if isinstance(target, dict) else dict(target)["service"]
        index = 0 if service == "chat" else int(service.split("-")[1])
        if index not in plans:  # serving.dataset.generate: service i runs seed + 7919 * i
            plans[index] = make_scenario(SEEDS[name] + 7919 * index, duration, profile_change=PROFILE_CHANGE.get(name, 0.3))
        t = r.times[k] - start
        values = []
        for dt in range(0, 61, 5):
            at = t + dt if what == "load_next" else t - dt
            at = max(0.0, min(duration - 1e-6, at))
            s = segment_at(plans[index], at)
            if what == "stall":
                c = s.at(at, s.contention_from, s.contention_to)
                values.append((c - 1.0) / c)  # the share of a step spent waiting for a CPU
            else:
                values.append(s.at(at, s.rate_from, s.rate_to) / s.replicas)
        out[k] = float(np.mean(values))
    return out


def pooled_fit(make) -> dict:
    art, _ = fit_artifact(run.concat([make(p) for p in TRAIN]), match=run.MATCH, group_by=run.BY, seed=0, holdout=0.0)
    per = {v: run.score(art, make(v)) for v in VALIDATION}
    pooled = run.pooled(list(per.values()))
    return {d: {"correct": pooled[d]["correct"], "n": pooled[d]["n"], "f1": round(pooled[d]["f1"], 4)} for d in pooled} | {
        "cuts": art.decision_thresholds
    }


def oracle() -> None:
    print("base", json.dumps(pooled_fit(lambda p: with_column(run.rows(p), None))), flush=True)
    for what in ("stall", "load_last", "load_next"):
        print(what, json.dumps(pooled_fit(lambda p: with_column(run.rows(p), scenario_column(p, run.rows(p), what)))), flush=True)


def future_max_log(r: Rows, dimension: str = "cpu") -> np.ndarray:
    out = np.full(len(r), np.nan)
    sli = r.sli[dimension]
    for target in np.unique(r.target_index):
        idx = np.flatnonzero(r.target_index == target)
        idx = idx[np.argsort(r.times[idx])]
        times = r.times[idx]
        for k, i in enumerate(idx):
            window = sli[idx[(times > times[k]) & (times <= times[k] + r.horizon_s)]]
            window = window[np.isfinite(window)]
            if window.size:
                out[i] = np.log(max(float(window.max()), 1e-3))
    return out


def regression() -> None:
    from sklearn.ensemble import HistGradientBoostingRegressor

    train = run.concat([run.rows(p) for p in TRAIN])
    y = future_max_log(train)
    known = np.isfinite(y) & np.isfinite(train.labels["cpu"])
    for loss in ("squared_error", "absolute_error"):
        model = HistGradientBoostingRegressor(
            loss=loss, max_depth=3, min_samples_leaf=max(20, int(0.02 * known.sum())), random_state=0
        ).fit(train.X[known], y[known])
        for offset in (-0.2, -0.1, 0.0, 0.1):
            correct = total = 0
            for v in VALIDATION:
                r = run.rows(v)
                labelled = np.isfinite(r.labels["cpu"])
                alarm = model.predict(r.X[labelled]) > np.log(r.thresholds["cpu"]) + offset
                correct += int(np.sum(alarm == (r.labels["cpu"][labelled] == 1)))
                total += int(labelled.sum())
            print(loss, f"cut log(threshold){offset:+.1f}", correct, total, round(correct / total, 4), flush=True)


def features() -> None:
    import predictors.features as F
    from predictors.features import CPU_SLI, FeatureSpec, _agg, _over, _quantile, _rate

    candidates = (
        FeatureSpec("queue_time_p99_30s", _quantile(0.99, "vllm:request_queue_time_seconds", "30s"), "faster SLI"),
        FeatureSpec("queue_time_p90", _quantile(0.90, "vllm:request_queue_time_seconds"), "below the P99"),
        FeatureSpec("queue_time_p50", _quantile(0.50, "vllm:request_queue_time_seconds"), "the median wait"),
        FeatureSpec("queue_time_p99_max_5m", _over("max_over_time", CPU_SLI, "5m"), "breach memory"),
        FeatureSpec("queue_time_count_1m", _agg("sum", _rate("vllm:request_queue_time_seconds_count", "1m")), "SLI sample size"),
        FeatureSpec(
            "queue_waiting_max_5m", _over("max_over_time", _agg("sum", "vllm:num_requests_waiting{ {{ selector }} }"), "5m"), "queue memory"
        ),
    )
    base = len(F.FEATURES)
    F.FEATURES = F.FEATURES + candidates
    run.ROOT = Path(os.environ.get("PROBE_DIR", "/tmp/sla-round5"))  # its own rows cache; datasets linked there
    run.ROOT.mkdir(parents=True, exist_ok=True)
    data = Path(os.environ.get("SLA_DATA", "/tmp/sla8"))
    for name in TRAIN + VALIDATION:
        link = run.ROOT / name
        if not link.exists():
            link.symlink_to(data / name)

    def keeping(kept: set[int]):
        def make(p: str) -> Rows:
            r = run.rows(p)
            X = r.X.copy()
            for i in range(len(candidates)):
                if i not in kept:
                    X[:, base + i] = 0.0
            return Rows(r.times, r.target_index, r.targets, X, r.sli, r.labels, r.persistence, r.step, r.horizon_s, r.thresholds)
        return make

    print("base", json.dumps(pooled_fit(keeping(set()))), flush=True)
    print("all six", json.dumps(pooled_fit(keeping(set(range(len(candidates)))))), flush=True)
    for i, spec in enumerate(candidates):
        print(spec.name, json.dumps(pooled_fit(keeping({i}))), flush=True)



def margin() -> None:
    """Where the wrong validation rows sit: the highest CPU SLI of their next horizon over the threshold."""
    art, _ = fit_artifact(run.concat([with_column(run.rows(p), None) for p in TRAIN]), match=run.MATCH, group_by=run.BY, seed=0, holdout=0.0)
    from predictors.evaluate import evaluate_rows

    bands = [(0, 0.5), (0.5, 0.8), (0.8, 1.0), (1.0, 1.25), (1.25, 2.0), (2.0, np.inf)]
    wrong_by, all_by = np.zeros(len(bands), int), np.zeros(len(bands), int)
    for v in VALIDATION:
        r = with_column(run.rows(v), None)
        report = evaluate_rows(art, r, latency_repeats=1)
        p = report["_probabilities"]["cpu"]
        labelled = np.isfinite(r.labels["cpu"])
        wrong = (p >= art.decision_thresholds["cpu"]) != (r.labels["cpu"] == 1)
        ratio = np.exp(future_max_log(r)) / r.thresholds["cpu"]
        for b, (low, high) in enumerate(bands):
            inside = labelled & (ratio >= low) & (ratio < high)
            wrong_by[b] += int(np.sum(inside & wrong))
            all_by[b] += int(np.sum(inside))
    for (low, high), w, a in zip(bands, wrong_by, all_by):
        print(f"next-horizon max / threshold in [{low}, {high}): {a} rows, {w} wrong ({w / max(a, 1):.1%})", flush=True)
    print("total wrong", int(wrong_by.sum()), "of", int(all_by.sum()))


if __name__ == "__main__":
    {"oracle": oracle, "regression": regression, "features": features, "margin": margin}[sys.argv[1]]()
