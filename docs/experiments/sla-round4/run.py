"""Round-4 experiment harness (not project code): rows per dataset, fits with/without the new features."""
from __future__ import annotations
import json, pickle, sys
from pathlib import Path
import numpy as np
import os
REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
from controller.kit.clock import SystemClock
from controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from predictors.data import Rows, build_rows
from predictors.evaluate import evaluate_rows
from predictors.features import feature_names
from predictors.train import fit_artifact
from serving.promstack import PrometheusServer

ROOT = Path(os.environ.get("SLA_DATA", "/tmp/sla8"))  # where gen.sh wrote the datasets
MATCH, BY = {"namespace": "llm"}, ["service"]
THRESH = {"cpu": 1.0, "gpu": 2.5, "network": 0.5}
NEW = ["seq_limit_min", "load_over_seq_limit"]
SETS = {  # name: (start, hours)
    "ds7x3": (1767225600, 1.5), "ds11": (1767268800, 1.5), "ds13": (1767283200, 1.0), "ds9": (1767254400, 1.0),
    "ds21": (1767312000, 1.0), "ds23": (1767326400, 1.0), "ds41": (1767355200, 1.0), "ds31": (1767340800, 1.5),
    "ds8x3": (1767240000, 1.5), "ds17": (1767297600, 1.0), "ds51": (1767369600, 1.5),
}

def rows(name: str) -> Rows:
    cache = ROOT / "rows" / f"{name}.pkl"
    if cache.exists():
        return pickle.loads(cache.read_bytes())
    start, hours = SETS[name]
    with PrometheusServer(data_dir=ROOT / name / "data", workdir=ROOT / "prom" / name).start() as prom:
        with PrometheusSource(PrometheusSettings(url=prom.url, timeout=60), SystemClock()) as source:
            r = build_rows(source, MATCH, BY, start, start + hours * 3600, 15.0, 60.0, THRESH)
    cache.parent.mkdir(exist_ok=True)
    cache.write_bytes(pickle.dumps(r))
    return r

def masked(r: Rows, names: list[str]) -> Rows:
    X = r.X.copy()
    for n in names:
        X[:, feature_names().index(n)] = 0.0  # constant: no split uses it (an all-NaN column breaks HGB binning)
    return Rows(r.times, r.target_index, r.targets, X, r.sli, r.labels, r.persistence, r.step, r.horizon_s, r.thresholds)

def concat(parts: list[Rows]) -> Rows:
    targets = sorted({t for p in parts for t in p.targets})
    idx = [np.array([targets.index(p.targets[i]) for i in p.target_index], dtype=np.int64) for p in parts]
    cat = lambda key: {d: np.concatenate([getattr(p, key)[d] for p in parts]) for d in parts[0].labels}
    return Rows(np.concatenate([p.times for p in parts]), np.concatenate(idx), targets,
                np.vstack([p.X for p in parts]), cat("sli"), cat("labels"), cat("persistence"),
                parts[0].step, parts[0].horizon_s, parts[0].thresholds)

def onset_mask(r: Rows, dim: str = "cpu") -> np.ndarray:
    """label 1 and the SLI not over the threshold in any of the previous 4 rows of the same target."""
    out = np.zeros(len(r), dtype=bool)
    sli, lab, thr = r.sli[dim], r.labels[dim], r.thresholds[dim]
    for t in np.unique(r.target_index):
        rows_t = np.flatnonzero(r.target_index == t)
        rows_t = rows_t[np.argsort(r.times[rows_t])]
        for k, i in enumerate(rows_t):
            prev = rows_t[max(0, k - 4):k]
            if lab[i] == 1 and k >= 4 and not np.any(sli[prev] > thr):
                out[i] = True
    return out

def score(art, r: Rows) -> dict:
    rep = evaluate_rows(art, r, latency_repeats=1)
    out = {}
    for dim, entry in rep["dimensions"].items():
        m = entry["methods"]["model"]
        known = np.isfinite(r.labels[dim]); y = r.labels[dim][known] == 1
        p = rep["_probabilities"][dim]; alarm = (p >= entry["decision_threshold"])[known]
        out[dim] = {"n": int(known.sum()), "correct": int(np.sum(alarm == y)), "tp": int(np.sum(alarm & y)),
                    "fp": int(np.sum(alarm & ~y)), "fn": int(np.sum(~alarm & y)), "acc": m["accuracy"], "f1": m["f1"],
                    "lead_p50": m["lead_time_s"].get("p50") if isinstance(m["lead_time_s"], dict) else None}
        reactive = entry["methods"]["reactive"]
        out[dim]["reactive_acc"] = reactive["accuracy"]
    ons = onset_mask(r)
    out["cpu_onset_rows"] = int(ons.sum())
    out["cpu_onset_mean_p"] = float(np.mean(rep["_probabilities"]["cpu"][ons])) if ons.any() else None
    return out

def pooled(scores: list[dict]) -> dict:
    res = {}
    for dim in ("cpu", "gpu", "network"):
        n = sum(s[dim]["n"] for s in scores); c = sum(s[dim]["correct"] for s in scores)
        tp = sum(s[dim]["tp"] for s in scores); fp = sum(s[dim]["fp"] for s in scores); fn = sum(s[dim]["fn"] for s in scores)
        res[dim] = {"n": n, "correct": c, "acc": c / n, "f1": 2 * tp / (2 * tp + fp + fn)}
    return res

def fit(parts: list[str], mask: bool):
    r = concat([rows(p) for p in parts])
    if mask:
        r = masked(r, NEW)
    art, skipped = fit_artifact(r, match=MATCH, group_by=BY, seed=0, holdout=0.0)
    return art

if __name__ == "__main__":
    what = sys.argv[1]
    if what == "rows":
        for name in sys.argv[2:]:
            r = rows(name); print(name, len(r), flush=True)
    elif what == "decide":
        train = sys.argv[2].split("+"); val = ["ds9", "ds21", "ds23", "ds41"]
        result = {}
        for label, mask in (("E", False), ("N", True)):
            art = fit(train, mask)
            per = {v: score(art, masked(rows(v), NEW) if mask else rows(v)) for v in val}
            result[label] = {"per": per, "pooled": pooled(list(per.values())), "cuts": art.decision_thresholds}
            print(label, json.dumps(result[label]["pooled"]), art.decision_thresholds, flush=True)
            for v in val:
                print("  ", v, {d: (per[v][d]["correct"], per[v][d]["n"], round(per[v][d]["f1"], 3)) for d in ("cpu", "gpu", "network")},
                      "onset rows", per[v]["cpu_onset_rows"], "mean p", per[v]["cpu_onset_mean_p"], flush=True)
        (ROOT / f"decide-{sys.argv[2]}.json").write_text(json.dumps(result, indent=1, default=str))

    elif what == "final-masked":  # information only, after the final model: the same fit with the new features masked
        train = sys.argv[2].split("+")
        art = fit(train, True)
        for v in ("ds8x3", "ds17", "ds51"):
            sc = score(art, masked(rows(v), NEW))
            print(v, {d: (sc[d]["correct"], sc[d]["n"], round(sc[d]["acc"], 3), round(sc[d]["f1"], 3), sc[d]["lead_p50"]) for d in ("cpu", "gpu", "network")}, flush=True)
    elif what == "decide2":  # training data: N on 7+11+13 vs 7+11+13+31 (the rule); E+31 printed for information only
        val = ["ds9", "ds21", "ds23", "ds41"]
        for label, train, mask in (("N+31", ["ds7x3", "ds11", "ds13", "ds31"], True), ("E+31 (info)", ["ds7x3", "ds11", "ds13", "ds31"], False)):
            art = fit(train, mask)
            per = {v: score(art, masked(rows(v), NEW) if mask else rows(v)) for v in val}
            print(label, json.dumps(pooled(list(per.values()))), art.decision_thresholds, flush=True)
            for v in val:
                print("  ", v, {d: (per[v][d]["correct"], per[v][d]["n"], round(per[v][d]["f1"], 3)) for d in ("cpu", "gpu", "network")},
                      "onset rows", per[v]["cpu_onset_rows"], "mean p", per[v]["cpu_onset_mean_p"], flush=True)
