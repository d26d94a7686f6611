"""Round-4 diagnosis (experiment script): wrong CPU rows of the final model by class and cause."""
import collections, json, os, sys
from pathlib import Path
import numpy as np
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE)); sys.path.insert(0, str(HERE.parents[2]))
DATA = os.environ.get("SLA_DATA", "/tmp/sla8")
from run import rows, onset_mask
from predictors.artifact import load_artifact
from predictors.artifact import predict_proba
art = load_artifact(f"{DATA}/model")
for name in sys.argv[1:]:
    r = rows(name)
    p = predict_proba(art, r.X)["cpu"]
    alarm = p >= art.decision_thresholds["cpu"]
    scen = json.load(open(f"{DATA}/{name}/scenario.json"))
    per_service, cur = [], None
    for seg in scen["segments"]:
        if seg["start"] == 0.0:
            cur = []; per_service.append(cur)
        cur.append(seg)
    lab, sli, thr = r.labels["cpu"], r.sli["cpu"], 1.0
    ons = onset_mask(r)
    known = np.isfinite(lab)
    wrong = known & (alarm != (lab == 1))
    # classes: onset / breach end / in breach / calm
    cls = np.full(len(r), "calm", dtype=object)
    for t in np.unique(r.target_index):
        idx = np.flatnonzero(r.target_index == t); idx = idx[np.argsort(r.times[idx])]
        for k, i in enumerate(idx):
            before = np.any(sli[idx[max(0, k - 4):k]] > thr)
            if lab[i] == 1 and before: cls[i] = "in breach"
            elif lab[i] == 1: cls[i] = "onset"
            elif before: cls[i] = "breach end"
    print(f"== {name}: {known.sum()} rows, {wrong.sum()} wrong, accuracy {1 - wrong.sum() / known.sum():.4f}")
    for c in ("onset", "breach end", "in breach", "calm"):
        m = known & (cls == c)
        print(f"  {c}: {m.sum()} rows, {(m & wrong).sum()} wrong")
    causes = collections.Counter()
    for i in np.flatnonzero(wrong & (cls == "onset")):
        t = r.times[i] - scen["start"]
        segs = per_service[r.target_index[i]] if r.target_index[i] < len(per_service) else []
        recent = [s for s in segs if t - 150 <= s["start"] <= t + 60]
        prev = [s for s in segs if s["start"] < t]
        label = []
        for s in recent:
            before = [x for x in segs if x["end"] == s["start"]]
            if before and before[0]["profile"] != s["profile"]: label.append(f"rollout->{s['profile']}")
            if before and before[0]["replicas"] > s["replicas"]: label.append("scale-down")
        cur_seg = prev[-1] if prev else None
        if cur_seg is not None:
            per_rep = cur_seg["rate_to"] / cur_seg["replicas"]
            if per_rep >= 7: label.append(f"surge x{per_rep:.1f}/replica")
            if cur_seg["contention_to"] > 1: label.append(f"contention x{cur_seg['contention_to']:.1f}")
        causes[", ".join(sorted(set(label))) or "other"] += 1
    for k, v in causes.most_common(): print(f"    wrong onset: {v} x {k}")
