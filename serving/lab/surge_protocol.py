"""The surge scenario's evaluation protocol: what a run replays, what counts, and the reactive baselines.

A protocol that cannot flatter (issue 27):
- **Disjoint trace segments.** Every run replays a slice of the Azure conv trace, never wrapped: training seeds
  draw theirs from the training region, evaluated seeds from the evaluation region, and `check_disjoint` refuses
  a plan in which any training slice overlaps any evaluated one (the harness calls it before anything runs).
- **Calm control for every evaluated seed**: the same slice without the surge; every scale-out there is false.
- **Several shapes** of onset: a sudden step, a slow ramp, two steps, a diurnal rise, and a bad config rolled out
  under steady load (`SHAPES`).
- **Per-onset lead**: the time from the controller's first scale-out to the first SLO violation, and to the
  onset, per onset (`onset_lead`); violation minutes and replica-minutes summed over surge and calm runs together.
- **The reactive baselines** an operator would deploy instead: an HPA on queue length with KEDA/HPA defaults
  (target per replica, no `for`), an HPA on requests/s per replica, a static floor (`HpaLike`, `BASELINES`).
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tailguard.serving.errors import LabError

NAMESPACE = "llm"
# The onset shapes of the evaluation; "calm" is each seed's control trace (no onset).
SHAPES = ("sudden", "slow-ramp", "two-steps", "diurnal", "bad-config")
BAD_CONFIG_PROFILE = "bad-max-num-seqs"


class ProtocolError(LabError, ValueError):
    """The evaluation plan breaks the protocol (overlapping segments, a region too short): one sentence."""


# -- trace segments ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceSegment:
    """The slice [start_s, end_s) of the trace a run replays (seconds into the trace)."""

    seed: int
    role: str  # "train" or "eval"
    start_s: float
    end_s: float

    def overlaps(self, other: TraceSegment) -> bool:
        return self.start_s < other.end_s and other.start_s < self.end_s


def draw_segment(seed: int, role: str, region: tuple[float, float], duration_s: float) -> TraceSegment:
    """A seed's slice, drawn inside its role's region (seconds of the trace), never wrapping around."""
    low, high = region
    if high - low < duration_s:
        raise ProtocolError(
            f"the {role} region {low:.0f}-{high:.0f} s of the trace is shorter than one run ({duration_s:.0f} s)"
        )
    start = random.Random(seed * 104729 + 7).uniform(low, high - duration_s)
    return TraceSegment(seed, role, start, start + duration_s)


def check_disjoint(train: Sequence[TraceSegment], evaluated: Sequence[TraceSegment]) -> None:
    """Refuse a plan in which a training run replays any second an evaluated run replays."""
    for a in train:
        for b in evaluated:
            if a.overlaps(b):
                raise ProtocolError(
                    f"training seed {a.seed} replays {a.start_s:.0f}-{a.end_s:.0f} s of the trace and evaluated "
                    f"seed {b.seed} {b.start_s:.0f}-{b.end_s:.0f} s: training and evaluation must not share "
                    "trace segments"
                )
    shared = {s.seed for s in train} & {s.seed for s in evaluated}
    if shared:
        raise ProtocolError(f"seeds {sorted(shared)} are both trained on and evaluated")


# -- load shapes ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadShape:
    """Load in multiples of the trace's own rate as piecewise-linear (time s, multiple) points from 0, held after
    the last; `onset_s` is when the surge (or the bad rollout) starts; `rollout_profile` is the profile rolled out
    at the onset (a bad config under steady load). kind "calm": no onset."""

    kind: str
    points: tuple[tuple[float, float], ...]
    onset_s: float
    rollout_profile: str | None = None

    @property
    def surge(self) -> bool:
        return self.kind != "calm"

    def rate_at(self, t: float) -> float:
        points = self.points
        if t <= points[0][0]:
            return points[0][1]
        for (t0, r0), (t1, r1) in itertools.pairwise(points):
            if t0 <= t <= t1:
                return r0 if t1 <= t0 else r0 + (r1 - r0) * (t - t0) / (t1 - t0)
        return points[-1][1]


def make_shape(kind: str, baseline: float, peak: float, onset_s: float, duration_s: float) -> LoadShape:
    b, p, s = baseline, peak, onset_s
    if kind == "calm":
        return LoadShape(kind, ((0.0, b), (duration_s, b)), s)
    if kind == "sudden":  # a step within 5 s, held 3 minutes
        return LoadShape(kind, ((0.0, b), (s, b), (s + 5, p), (s + 185, p), (s + 245, b)), s)
    if kind == "slow-ramp":  # 5 minutes up
        return LoadShape(kind, ((0.0, b), (s, b), (s + 300, p), (s + 360, p), (s + 420, b)), s)
    if kind == "ramp":  # the training seeds' surge: 60-90 s up, 2 minutes held (issue 13's shape)
        ramp = 60.0 + 30.0 * ((s * 7.0) % 1.0)
        return LoadShape(kind, ((0.0, b), (s, b), (s + ramp, p), (s + ramp + 120, p), (s + 2 * ramp + 120, b)), s)
    if kind == "two-steps":  # half way, two minutes, then the rest
        m = (b + p) / 2
        return LoadShape(
            kind, ((0.0, b), (s, b), (s + 10, m), (s + 130, m), (s + 140, p), (s + 260, p), (s + 320, b)), s
        )
    if kind == "diurnal":  # a half cosine over 6 minutes, then held (the morning rise)
        rise = [(s + 60.0 * k, b + (p - b) * (1 - math.cos(math.pi * k / 6)) / 2) for k in range(7)]
        return LoadShape(kind, ((0.0, b), *rise), s)
    if kind == "bad-config":  # steady load; a version with max_num_seqs 2 rolled out at the onset
        return LoadShape(kind, ((0.0, b), (duration_s, b)), s, rollout_profile=BAD_CONFIG_PROFILE)
    raise ProtocolError(f"unknown surge shape {kind!r}; expected one of {[*SHAPES, 'ramp', 'calm']}")


# -- the reactive baselines ------------------------------------------------------------------------------


@dataclass
class HpaLike:
    """The Kubernetes HPA's algorithm on one Prometheus total (KEDA's prometheus scaler, metricType AverageValue):
    desired = ceil(total / target) unless within the 10% tolerance of the current count; scale-up at most
    max(2x, +4) per 15 s sync and no stabilisation; scale-down to the highest recommendation of the last 5 minutes
    (the default stabilizationWindowSeconds 300). No `for`: it acts on the sync that sees the value. A missing
    metric changes nothing (the HPA skips the sync)."""

    name: str
    query: str
    target: float
    min_replicas: int
    max_replicas: int = 8
    tolerance: float = 0.1
    scale_down_window_s: float = 300.0
    _recommendations: list[tuple[float, int]] = field(default_factory=list)

    def decide(self, at: float, current: int, total: float | None) -> int:
        if total is None or math.isnan(total) or current <= 0:
            return current
        desired = current
        if abs(total / (self.target * current) - 1.0) > self.tolerance:
            desired = math.ceil(total / self.target)
        desired = min(desired, max(2 * current, current + 4))
        desired = max(self.min_replicas, min(self.max_replicas, desired))
        self._recommendations = [(t, r) for t, r in self._recommendations if t > at - self.scale_down_window_s]
        self._recommendations.append((at, desired))
        if desired < current:
            desired = min(current, max(r for _, r in self._recommendations))
        return desired


QUEUE_TOTAL = f'sum(vllm:num_requests_waiting{{namespace="{NAMESPACE}"}})'
FINISHED_RATE_TOTAL = f'sum(rate(vllm:request_success_total{{namespace="{NAMESPACE}"}}[1m]))'
# Requests in the engines (running + waiting): by Little's law arrival rate x time in the engine, so it grows with
# the arrival rate while the batch still has room, before any request waits (Knative's concurrency target).
_SELECTOR = f'{{namespace="{NAMESPACE}"}}'
CONCURRENCY_TOTAL = f"sum(vllm:num_requests_running{_SELECTOR}) + sum(vllm:num_requests_waiting{_SELECTOR})"


@dataclass(frozen=True)
class Baseline:
    """A reactive baseline: an HPA on a query with a per-replica target, or a static replica floor."""

    name: str
    description: str
    query: str | None = None
    target: float | None = None
    static_replicas: int | None = None

    def hpa(self, floor: int) -> HpaLike | None:
        if self.query is None or self.target is None:
            return None
        return HpaLike(self.name, self.query, self.target, floor)


def baselines(tuned_rps: float) -> tuple[Baseline, ...]:
    return (
        Baseline("static-2", "a static floor of 2 replicas (no controller)", static_replicas=2),
        Baseline("hpa-queue-5", "HPA (KEDA defaults) on waiting requests, target 5 per replica", QUEUE_TOTAL, 5.0),
        Baseline(
            "hpa-rps-50", "HPA on finished requests/s, the seed's target 50 per replica", FINISHED_RATE_TOTAL, 50.0
        ),
        Baseline(
            "hpa-concurrency-48",
            "HPA on requests in the engine (running + waiting), target 48 per replica (75% of max_num_seqs 64)",
            CONCURRENCY_TOTAL,
            48.0,
        ),
        Baseline(
            "hpa-rps-tuned",
            f"HPA on finished requests/s, target {tuned_rps:g} per replica (70% of a replica's measured capacity)",
            FINISHED_RATE_TOTAL,
            tuned_rps,
        ),
    )


# -- what counts ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OnsetLead:
    """One onset: the controller's first scale-out and the first SLO violation, relative to the onset (s)."""

    seed: int
    shape: str
    first_action_s: float | None
    first_violation_s: float | None

    @property
    def lead_to_violation_s(self) -> float | None:
        """Seconds the first action came before the first violation (negative: after it)."""
        if self.first_action_s is None or self.first_violation_s is None:
            return None
        return self.first_violation_s - self.first_action_s

    @property
    def outcome(self) -> str:
        if self.first_violation_s is None:
            return "no violation" if self.first_action_s is None else "prevented"
        if self.first_action_s is None:
            return "missed"
        return "acted before" if self.first_action_s < self.first_violation_s else "acted after"


def onset_lead(
    seed: int, shape: str, onset: float, scale_outs: Sequence[float], violations: Sequence[float]
) -> OnsetLead:
    action = (scale_outs[0] - onset) if scale_outs else None
    violation = (violations[0] - onset) if violations else None
    return OnsetLead(seed, shape, action, violation)


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return round(ordered[index], 1)


def controller_table(runs: Sequence[Mapping[str, Any]], leads: Sequence[OnsetLead]) -> dict[str, Any]:
    """One controller's row: its runs' summaries (surge and calm) and its onsets' leads."""
    calm = [r for r in runs if r["trace"] == "calm"]
    surge = [r for r in runs if r["trace"] != "calm"]
    calm_hours = sum(r["minutes"] for r in calm) / 60.0
    false_calm = sum(r["scale_outs"] for r in calm)
    before_onset = sum(r["scale_outs_before_onset"] for r in surge)
    to_violation = [lead.lead_to_violation_s for lead in leads if lead.lead_to_violation_s is not None]
    to_onset = [lead.first_action_s for lead in leads if lead.first_action_s is not None]
    outcomes = [lead.outcome for lead in leads]
    return {
        "violation_minutes": round(sum(r["slo_violation_minutes"] for r in runs), 2),
        "violation_minutes_surge": round(sum(r["slo_violation_minutes"] for r in surge), 2),
        "violation_minutes_calm": round(sum(r["slo_violation_minutes"] for r in calm), 2),
        "replica_minutes": round(sum(r["replica_minutes"] for r in runs), 1),
        "calm_hours": round(calm_hours, 2),
        "false_scale_outs_calm": false_calm,
        "false_scale_outs_per_calm_hour": round(false_calm / calm_hours, 2) if calm_hours else None,
        "scale_outs_before_onset": before_onset,
        "onsets": len(leads),
        "outcomes": {name: outcomes.count(name) for name in sorted(set(outcomes))},
        "lead_to_violation_s": {
            "n": len(to_violation),
            "p25": _quantile(to_violation, 0.25),
            "median": round(statistics.median(to_violation), 1) if to_violation else None,
            "p75": _quantile(to_violation, 0.75),
        },
        "action_after_onset_s": {
            "n": len(to_onset),
            "median": round(statistics.median(to_onset), 1) if to_onset else None,
        },
    }
