"""Per-onset leads and calm false alarms of an alarm series on recorded history (the protocol of issue 27, item 1).

A recording says when each surge started and when each bad config took the traffic (its metadata: `Episode`s),
and which stretches were calm. For one alarm series (the model at its own cut, a reactive rule, persistence)
and one SLI, each episode gets
- the first SLO violation: the first row at or after the onset whose SLI is over the threshold, before the
  episode's end (none: the episode never violated);
- the first alarm: the first alarming row from `onset - horizon` on (an earlier alarm cannot be said to be about
  this onset), before the episode's end;
- the leads: first violation minus first alarm (what prevention needs; negative = the alarm came after the
  violation) and onset minus first alarm (negative = after the onset);
- an outcome: "warned" (alarm at or before the violation), "late", "missed" (violation, no alarm),
  "quiet" (no violation, no alarm), "alarm, no violation", or "breaching at onset" (the SLI was over the
  threshold at some time in the horizon before the onset, e.g. a previous backlog still draining: no clean
  onset, left out of the leads);
  `alarm_already_on` marks an alarm that was on before `onset - horizon` too.
Calm false alarms: alarm episodes (runs of alarming rows) with a row in a calm stretch and no violation from
their first calm row to `horizon` after their end, per hour of calm stretch; and the share of calm rows alarming.

Pure: arrays in, plain data out (the I/O is tailguard.serving.lab.recording_onsets').
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Episode:
    """A surge onset or a bad config taking the traffic, at `onset` (unix s); its effects are looked for until `end`."""

    name: str
    kind: str  # "surge" or "bad-config"
    shape: str  # sudden, ramp, two-steps, bad-config
    onset: float
    end: float


@dataclass(frozen=True)
class Stretch:
    """A calm stretch [start, end) (unix s): steady load under capacity, no bad config serving."""

    start: float
    end: float


@dataclass(frozen=True)
class OnsetResult:
    episode: Episode
    violation_s: float | None  # first violation, seconds after the onset
    alarm_s: float | None  # first alarm, seconds after the onset (negative: before it)
    breaching_at_onset: bool
    alarm_already_on: bool

    @property
    def lead_to_violation_s(self) -> float | None:
        if self.violation_s is None or self.alarm_s is None:
            return None
        return self.violation_s - self.alarm_s

    @property
    def lead_to_onset_s(self) -> float | None:
        return None if self.alarm_s is None else -self.alarm_s

    @property
    def outcome(self) -> str:
        if self.breaching_at_onset:
            return "breaching at onset"
        if self.violation_s is None:
            return "quiet" if self.alarm_s is None else "alarm, no violation"
        if self.alarm_s is None:
            return "missed"
        return "warned" if self.alarm_s <= self.violation_s else "late"

    def to_json(self) -> dict[str, Any]:
        return {
            "episode": self.episode.name,
            "kind": self.episode.kind,
            "shape": self.episode.shape,
            "onset": self.episode.onset,
            "violation_s": self.violation_s,
            "alarm_s": self.alarm_s,
            "lead_to_violation_s": self.lead_to_violation_s,
            "lead_to_onset_s": self.lead_to_onset_s,
            "alarm_already_on": self.alarm_already_on,
            "outcome": self.outcome,
        }


def _ordered(times: Array, sli: Array, alarm: Mask) -> tuple[Array, Array, Mask]:
    order = np.argsort(times, kind="stable")
    return times[order], sli[order], np.asarray(alarm, dtype=bool)[order]


def onset_result(
    times: Array, sli: Array, threshold: float, alarm: Mask, episode: Episode, horizon_s: float
) -> OnsetResult:
    """The first violation and first alarm of one episode (one target's rows; any order)."""
    t, s, a = _ordered(times, sli, alarm)
    over = np.isfinite(s) & (s > threshold)
    alarming = a.astype(bool)
    # A clean onset has a horizon of SLI under the threshold before it; otherwise the previous episode's
    # breach (a backlog still draining) carries alarms over and a "lead" would be that earlier breach's.
    breaching_at_onset = bool(np.any(over & (t >= episode.onset - horizon_s) & (t <= episode.onset)))
    inside = (t >= episode.onset) & (t < episode.end)
    violations = np.flatnonzero(inside & over)
    violation = float(t[violations[0]] - episode.onset) if violations.shape[0] else None
    looked = (t >= episode.onset - horizon_s) & (t < episode.end)
    alarms = np.flatnonzero(looked & alarming)
    alarm_s = float(t[alarms[0]] - episode.onset) if alarms.shape[0] else None
    before = np.flatnonzero(t < episode.onset - horizon_s)
    already_on = bool(alarms.shape[0] and before.shape[0] and alarming[before[-1]] and alarms[0] == before[-1] + 1)
    return OnsetResult(episode, violation, alarm_s, breaching_at_onset, already_on)


def calm_false_alarms(
    times: Array, sli: Array, threshold: float, alarm: Mask, calm: Sequence[Stretch], horizon_s: float
) -> tuple[int, float, float]:
    """(false alarm episodes in calm stretches, calm hours covered by rows, share of calm rows alarming).

    An alarm episode (a run of alarming rows) is false in calm when it has a row in a calm stretch and no
    violation follows from its first calm row to a horizon after its end; an alarm stuck on through a calm
    stretch is one false alarm, and the share of calm rows alarming says how long it was on.
    """
    t, s, a = _ordered(times, sli, alarm)
    over = np.isfinite(s) & (s > threshold)
    alarming = a.astype(bool)
    in_calm = np.zeros(t.shape[0], dtype=bool)
    hours = 0.0
    for stretch in calm:
        rows = (t >= stretch.start) & (t < stretch.end)
        in_calm |= rows
        if rows.any():
            hours += (stretch.end - stretch.start) / 3600.0
    false = 0
    i = 0
    while i < t.shape[0]:
        if not alarming[i]:
            i += 1
            continue
        j = i
        while j + 1 < t.shape[0] and alarming[j + 1]:
            j += 1
        calm_rows = np.flatnonzero(in_calm[i : j + 1])
        if calm_rows.shape[0]:
            first = t[i + int(calm_rows[0])]
            if not np.any(over & (t >= first) & (t <= t[j] + horizon_s)):
                false += 1
        i = j + 1
    share = float((alarming & in_calm).sum() / in_calm.sum()) if in_calm.any() else 0.0
    return false, hours, share


def _quantile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if values else None


def method_summary(
    results: Sequence[OnsetResult], false_alarms: int, calm_hours: float, calm_alarm_share: float = 0.0
) -> dict[str, Any]:
    """Counts of outcomes, lead distributions over the clean onsets, calm false alarms per hour."""
    outcomes: dict[str, int] = {}
    for result in results:
        outcomes[result.outcome] = outcomes.get(result.outcome, 0) + 1
    to_violation = [r.lead_to_violation_s for r in results if r.lead_to_violation_s is not None]
    to_onset = [r.lead_to_onset_s for r in results if r.lead_to_onset_s is not None and r.outcome in ("warned", "late")]
    clean = [r for r in results if r.outcome != "breaching at onset"]
    leads = [r.lead_to_violation_s for r in clean if r.lead_to_violation_s is not None]
    return {
        "episodes": len(results),
        "outcomes": outcomes,
        "lead_to_violation_s": {
            "count": len(leads),
            "p10": _quantile(leads, 10),
            "p50": _quantile(leads, 50),
            "p90": _quantile(leads, 90),
        },
        "lead_to_onset_s": {"count": len(to_onset), "p50": _quantile([x for x in to_onset if x is not None], 50)},
        "all_leads_to_violation_s": to_violation,
        "calm_false_alarms": false_alarms,
        "calm_hours": calm_hours,
        "calm_false_alarms_per_hour": false_alarms / calm_hours if calm_hours else None,
        "calm_alarm_share": calm_alarm_share,
    }


def pool_method_summaries(scored: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One method's scores on several evaluated windows (score_alarms' entries: per-onset JSON and a summary)
    pooled: outcome counts and lead distributions over all their clean onsets whose alarm was not already on a
    horizon before the onset, calm false alarms per pooled calm hour."""
    onsets = [onset for entry in scored for onset in entry["onsets"]]
    outcomes: dict[str, int] = {}
    for onset in onsets:
        outcomes[onset["outcome"]] = outcomes.get(onset["outcome"], 0) + 1
    # An alarm on since before the horizon (carried through the calm) is no warning about this onset: its "lead"
    # is left out of the pooled distribution and counted apart.
    carried = [o for o in onsets if o["outcome"] != "breaching at onset" and o.get("alarm_already_on")]
    leads = [
        float(o["lead_to_violation_s"])
        for o in onsets
        if o["outcome"] != "breaching at onset"
        and not o.get("alarm_already_on")
        and o["lead_to_violation_s"] is not None
    ]
    to_onset = [
        float(o["lead_to_onset_s"])
        for o in onsets
        if o["outcome"] in ("warned", "late") and o["lead_to_onset_s"] is not None
    ]
    false_alarms = sum(int(entry["summary"]["calm_false_alarms"]) for entry in scored)
    hours = sum(float(entry["summary"]["calm_hours"]) for entry in scored)
    share = (
        sum(float(e["summary"]["calm_alarm_share"]) * float(e["summary"]["calm_hours"]) for e in scored) / hours
        if hours
        else 0.0
    )
    return {
        "episodes": len(onsets),
        "outcomes": outcomes,
        "alarm_already_on": len(carried),
        "lead_to_violation_s": {
            "count": len(leads),
            "p10": _quantile(leads, 10),
            "p50": _quantile(leads, 50),
            "p90": _quantile(leads, 90),
        },
        "lead_to_onset_s": {"count": len(to_onset), "p50": _quantile(to_onset, 50)},
        "calm_false_alarms": false_alarms,
        "calm_hours": hours,
        "calm_false_alarms_per_hour": false_alarms / hours if hours else None,
        "calm_alarm_share": share,
    }


def score_alarms(
    times: Array,
    sli: Array,
    threshold: float,
    alarms: Mapping[str, Mask],
    episodes: Sequence[Episode],
    calm: Sequence[Stretch],
    horizon_s: float,
) -> dict[str, Any]:
    """Per method: each episode's result and the summary (one target's rows)."""
    scored: dict[str, Any] = {}
    for method, alarm in alarms.items():
        results = [onset_result(times, sli, threshold, alarm, e, horizon_s) for e in episodes]
        false, hours, share = calm_false_alarms(times, sli, threshold, alarm, calm, horizon_s)
        scored[method] = {
            "onsets": [r.to_json() for r in results],
            "summary": method_summary(results, false, hours, share),
        }
    return scored


def fmt_seconds(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.0f}" if value else "0"
