"""The incident report: what happened between a rollout and the recovery, as a PNG, JSON and Markdown.

Pure rendering of data the caller collected (the P99 series from Prometheus and
the journal's decisions and actions); no queries here.
"""

from __future__ import annotations

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


def _seconds(value: Any) -> str:
    return "—" if value is None else f"{value:.1f} s"


def render_markdown(timeline: IncidentTimeline) -> str:
    summary = timeline.summary()
    lines = [
        f"# Incident report: {timeline.service}",
        "",
        f"Policy `{timeline.policy}`, condition `{timeline.condition}`, decision `{timeline.decision_id}`.",
        f"Threshold: P99 end-to-end latency > {timeline.threshold_seconds:g} s.",
        "",
        "| event | time (UTC) | since rollout |",
        "|---|---|---|",
        f"| rollout of {timeline.rollout_revision or '?'} | {_clock(timeline.rollout_at)} | 0 s |",
        f"| breach onset | {_clock(timeline.onset_at)} | {_seconds(summary['seconds_rollout_to_onset'])} |",
        (
            f"| condition fired (detection) | {_clock(timeline.fired_at)} | "
            f"{_seconds(summary['seconds_rollout_to_detection'])} |"
        ),
        (
            f"| rollback to {timeline.rollback_to or '?'} done | {_clock(timeline.rollback_at)} | "
            f"{_seconds(summary['seconds_rollout_to_rollback'])} |"
        ),
        (
            f"| P99 back under threshold | {_clock(summary['recovered_at'])} | "
            f"{_seconds(summary['seconds_rollout_to_recovery'])} |"
        ),
        (
            f"| decision resolved | {_clock(timeline.resolved_at)} | "
            f"{_seconds(summary['seconds_rollout_to_resolution'])} |"
        ),
        "",
    ]
    peak = summary["peak_p99_seconds"]
    if peak is not None:
        lines.append(f"Peak P99: {peak:.3f} s.")
    lines.extend(f"- {note}" for note in timeline.notes)
    lines.append("")
    return "\n".join(lines)


def render_plot(timeline: IncidentTimeline, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = timeline.series[0][0] if timeline.series else (timeline.rollout_at or 0.0)
    figure, axes = plt.subplots(figsize=(10, 4.5), dpi=110)
    if timeline.series:
        axes.plot(
            [t - start for t, _ in timeline.series],
            [v for _, v in timeline.series],
            color="#1f77b4",
            linewidth=1.8,
            label="P99 e2e latency",
        )
    axes.axhline(
        timeline.threshold_seconds,
        color="#d62728",
        linestyle="--",
        linewidth=1.2,
        label=f"threshold {timeline.threshold_seconds:g} s",
    )
    markers = [
        (timeline.rollout_at, f"rollout {timeline.rollout_revision or ''}".strip(), "#ff7f0e"),
        (timeline.fired_at, "fired", "#d62728"),
        (timeline.rollback_at, f"rollback → {timeline.rollback_to or ''}".strip(), "#2ca02c"),
        (timeline.resolved_at, "resolved", "#9467bd"),
    ]
    for moment, label, colour in markers:
        if moment is not None:
            axes.axvline(moment - start, color=colour, linewidth=1.2, label=label)
    axes.set_xlabel("seconds since start")
    axes.set_ylabel("seconds")
    axes.set_title(f"{timeline.service}: P99 end-to-end latency ({timeline.policy})")
    axes.grid(True, alpha=0.3)
    axes.legend(loc="upper left", fontsize=8)
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
