"""The incident report: what happened between a rollout and the recovery, as a PNG, JSON and Markdown.

Pure rendering of data the caller collected (the P99 series from Prometheus and
the journal's decisions and actions); no queries here.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class IncidentTimeline:
    policy: str
    condition: str
    service: str
    threshold_seconds: float
    series: Sequence[tuple[float, float]]  # (epoch seconds, P99 seconds)
    rollout_at: float | None = None
    rollout_revision: str | None = None
    onset_at: float | None = None
    fired_at: float | None = None
    rollback_at: float | None = None
    rollback_to: str | None = None
    resolved_at: float | None = None
    decision_id: str | None = None
    notes: Sequence[str] = field(default_factory=tuple)
    # Where the rollout's time comes from (e.g. the tier's revision record): said in the report, because a breach
    # onset before it reads as a contradiction unless the reader knows what the timestamp stamps.
    rollout_source: str | None = None
    evidence: Sequence[tuple[float, float]] = field(default_factory=tuple)  # (epoch s, value) the decision carried
    signal: str = "P99 end-to-end latency"

    def recovered_at(self) -> float | None:
        """First sample at or under the threshold after the rollback (what users felt)."""
        if self.rollback_at is None:
            return None
        for at, value in self.series:
            if at > self.rollback_at and value <= self.threshold_seconds:
                return at
        return None

    def summary(self) -> dict[str, Any]:
        def since_rollout(moment: float | None) -> float | None:
            if moment is None or self.rollout_at is None:
                return None
            return round(moment - self.rollout_at, 1)

        recovered = self.recovered_at()
        peak = max((value for _, value in self.series), default=None)
        return {
            "policy": self.policy,
            "condition": self.condition,
            "service": self.service,
            "decision_id": self.decision_id,
            "threshold_seconds": self.threshold_seconds,
            "rollout_revision": self.rollout_revision,
            "rollback_to": self.rollback_to,
            "rollout_at": self.rollout_at,
            "onset_at": self.onset_at,
            "fired_at": self.fired_at,
            "rollback_at": self.rollback_at,
            "recovered_at": recovered,
            "resolved_at": self.resolved_at,
            "seconds_rollout_to_onset": since_rollout(self.onset_at),
            "seconds_rollout_to_detection": since_rollout(self.fired_at),
            "seconds_rollout_to_rollback": since_rollout(self.rollback_at),
            "seconds_rollout_to_recovery": since_rollout(recovered),
            "seconds_rollout_to_resolution": since_rollout(self.resolved_at),
            "peak_p99_seconds": peak,
            "notes": list(self.notes),
        }


def _clock(at: float | None) -> str:
    if at is None:
        return "—"
    return datetime.fromtimestamp(at, tz=UTC).strftime("%H:%M:%S")


def _stamp(at: float | None) -> str:
    if at is None:
        return "—"
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _seconds(value: Any) -> str:
    return "—" if value is None else f"{value:+.1f} s" if value < 0 else f"{value:.1f} s"


def _latency(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _above_threshold_seconds(timeline: IncidentTimeline) -> float | None:
    """How long the series stayed above the threshold (sum of the sample intervals that started above it)."""
    points = list(timeline.series)
    if len(points) < 2:
        return None
    return sum(b[0] - a[0] for a, b in itertools.pairwise(points) if a[1] > timeline.threshold_seconds)


def render_markdown(timeline: IncidentTimeline) -> str:
    """A postmortem's facts, pasteable as they are: summary, impact, a UTC timeline, the evidence, what was done,
    and the sections a person fills in."""
    summary = timeline.summary()
    peak = summary["peak_p99_seconds"]
    above = _above_threshold_seconds(timeline)
    rollout = timeline.rollout_revision or "?"
    rollback_to = timeline.rollback_to or "?"
    threshold = _latency(timeline.threshold_seconds)
    peak_text = f" (peak {_latency(peak)})" if peak is not None else ""
    story = (
        f"After the rollout of {rollout} of `{timeline.service}` at {_stamp(timeline.rollout_at)}, its "
        f"{timeline.signal} rose above {threshold}{peak_text}. tailguard's policy `{timeline.policy}` (condition "
        f"`{timeline.condition}`, fires when > {threshold}) fired {_seconds(summary['seconds_rollout_to_detection'])} "
        f"after the rollout and rolled back to {timeline.rollback_to or '?'}"
        + (
            f"; the value was back under the threshold {_seconds(summary['seconds_rollout_to_recovery'])} after the "
            "rollout"
            if summary["seconds_rollout_to_recovery"] is not None
            else ""
        )
        + f". Decision `{timeline.decision_id}`."
    )
    impact = f"- {timeline.signal} above {threshold} for {'—' if above is None else f'{above:.0f} s'}{peak_text}."
    events = [
        (timeline.rollout_at, 0.0, f"rollout of {rollout}"),
        (timeline.onset_at, summary["seconds_rollout_to_onset"], "breach onset (first breaching evaluation)"),
        (timeline.fired_at, summary["seconds_rollout_to_detection"], "condition fired (detection)"),
        (timeline.rollback_at, summary["seconds_rollout_to_rollback"], f"rollback to {rollback_to} done"),
        (summary["recovered_at"], summary["seconds_rollout_to_recovery"], f"{timeline.signal} under the threshold"),
        (timeline.resolved_at, summary["seconds_rollout_to_resolution"], "decision resolved (recovery held)"),
    ]
    lines = [
        f"# Incident: {timeline.service} {timeline.signal} above {threshold}",
        "",
        "## Summary",
        "",
        story,
        "",
        "## Impact",
        "",
        impact,
        "- Requests affected: (fill in from the serving tier's dashboards)",
        "",
        "## Timeline (UTC)",
        "",
        "| time (UTC) | since rollout | event |",
        "|---|---|---|",
        *(f"| {_stamp(at)} | {'0 s' if since == 0.0 else _seconds(since)} | {what} |" for at, since, what in events),
        "",
    ]
    if timeline.rollout_source:
        lines.append(f"The rollout's time is {timeline.rollout_source}.")
    onset_lead = summary["seconds_rollout_to_onset"]
    if onset_lead is not None and onset_lead < 0:
        lines.append(
            f"The breach onset is {-onset_lead:.1f} s before that time: the signal's rate window reaches back over "
            "requests served before it, and the rollout's timestamp marks when it was recorded, not the first "
            "request the new revision answered."
        )
    if timeline.evidence:
        lines += ["", "## Evidence (what the decision carried)", "", "| time (UTC) | value |", "|---|---|"]
        lines += [f"| {_stamp(at)} | {_latency(value)} |" for at, value in timeline.evidence]
    lines += ["", "## Notes", ""] if timeline.notes else []
    lines.extend(f"- {note}" for note in timeline.notes)
    lines += [
        "",
        "## Root cause",
        "",
        "(fill in)",
        "",
        "## Follow-ups",
        "",
        "- (fill in)",
        "",
    ]
    return "\n".join(lines)


def render_plot(timeline: IncidentTimeline, path: Path) -> None:
    """The series on wall-clock time (UTC), the threshold with its unit, and the events as lines of their own
    style, each labelled on its own row so that events seconds apart never hide one another."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    def when(at: float) -> float:
        """matplotlib's date number (days since its epoch) of an epoch time: the axis is wall-clock time."""
        return float(mdates.date2num(datetime.fromtimestamp(at, tz=UTC)))  # type: ignore[no-untyped-call]

    figure, axes = plt.subplots(figsize=(11, 5), dpi=110)
    if timeline.series:
        axes.plot(
            [when(t) for t, _ in timeline.series],
            [v for _, v in timeline.series],
            color="#1f77b4",
            linewidth=1.8,
            label=timeline.signal,
        )
    axes.axhline(
        timeline.threshold_seconds,
        color="#d62728",
        linestyle="--",
        linewidth=1.2,
        label=f"threshold: fires when > {_latency(timeline.threshold_seconds)}",
    )
    markers = [
        (timeline.rollout_at, f"rollout {timeline.rollout_revision or ''}".strip(), "#ff7f0e", "-"),
        (timeline.onset_at, "breach onset", "#8c564b", ":"),
        (timeline.fired_at, "fired", "#d62728", "--"),
        (timeline.rollback_at, f"rollback -> {timeline.rollback_to or ''}".strip(), "#2ca02c", "-."),
        (timeline.resolved_at, "resolved", "#9467bd", (0, (1, 1))),
    ]
    shown = [(at, label, colour, style) for at, label, colour, style in markers if at is not None]
    for row, (at, label, colour, style) in enumerate(sorted(shown, key=lambda m: m[0])):
        axes.axvline(when(at), color=colour, linewidth=1.6, linestyle=style, label=f"{label} {_clock(at)}")
        axes.annotate(
            f"{label} {_clock(at)}",
            xy=(when(at), 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -12 - 12 * row),
            textcoords="offset points",
            fontsize=8,
            color=colour,
        )
    if timeline.evidence:
        axes.scatter([when(t) for t, _ in timeline.evidence], [v for _, v in timeline.evidence], s=18,
                     color="#d62728", zorder=5, label="evidence (the decision's samples)")  # fmt: skip
    axes.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=UTC))  # type: ignore[no-untyped-call]
    first = timeline.rollout_at or (timeline.series[0][0] if timeline.series else None)
    axes.set_xlabel(f"time (UTC), {_stamp(first)[:10]}")
    axes.set_ylabel(f"{timeline.signal} (s)")
    axes.set_title(f"{timeline.service}: {timeline.signal} ({timeline.policy} / {timeline.condition})")
    axes.grid(True, alpha=0.3)
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4, fontsize=7, frameon=False)
    figure.autofmt_xdate()
    if timeline.rollout_source:
        figure.text(0.01, 0.01, f"rollout time: {timeline.rollout_source}", fontsize=7, color="#555555")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def write_report(timeline: IncidentTimeline, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "png": out_dir / "incident.png",
        "json": out_dir / "incident.json",
        "markdown": out_dir / "incident.md",
    }
    render_plot(timeline, paths["png"])
    document = {
        "summary": timeline.summary(),
        "series": [list(point) for point in timeline.series],
        "timeline": {k: v for k, v in asdict(timeline).items() if k != "series"},
    }
    paths["json"].write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    paths["markdown"].write_text(render_markdown(timeline), encoding="utf-8")
    return paths
