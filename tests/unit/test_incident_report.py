"""The incident report (controller/tools/incident_report.py): markdown that pastes into a postmortem (summary,
impact, a UTC timeline with dates, the evidence formatted in its unit, where the rollout's time comes from and why
an onset may precede it, sections to fill in) and a PNG on wall-clock time."""

from __future__ import annotations

from pathlib import Path

from tailguard.controller.tools.incident_report import IncidentTimeline, render_markdown, write_report

T0 = 1_764_600_000.0  # 2025-12-01T14:40:00Z


def timeline() -> IncidentTimeline:
    series = [(T0 - 30 + 5 * i, 0.3 if i < 6 else 1.4 if i < 14 else 0.35) for i in range(24)]
    return IncidentTimeline(
        policy="p99-rollback",
        condition="p99-above-800ms",
        service="chat",
        threshold_seconds=0.8,
        series=series,
        rollout_at=T0,
        rollout_revision="r2",
        onset_at=T0 - 2.0,
        fired_at=T0 + 14.0,
        rollback_at=T0 + 15.0,
        rollback_to="r1",
        resolved_at=T0 + 60.0,
        decision_id="6f47a7ad521b7192",
        rollout_source="the tier's revision record of r2 (created_at)",
        evidence=((T0 - 2.0, 0.9312), (T0 + 14.0, 1.4087)),
    )


def test_the_markdown_is_a_postmortem_skeleton_with_dates_units_and_sources() -> None:
    text = render_markdown(timeline())
    for heading in ("## Summary", "## Impact", "## Timeline (UTC)", "## Evidence", "## Root cause", "## Follow-ups"):
        assert heading in text
    assert "| 2025-12-01 14:40:00Z | 0 s | rollout of r2 |" in text
    assert "| 2025-12-01 14:39:58Z | -2.0 s | breach onset" in text
    assert "| 2025-12-01 14:39:58Z | 931 ms |" in text and "| 2025-12-01 14:40:14Z | 1.41 s |" in text
    assert "The rollout's time is the tier's revision record of r2 (created_at)." in text
    assert "The breach onset is 2.0 s before that time" in text
    assert "fires when > 800 ms" in text and "peak 1.40 s" in text
    assert "[[" not in text and "1764600" not in text, "no raw epoch floats"


def test_the_png_is_written_on_wall_clock_time(tmp_path: Path) -> None:
    paths = write_report(timeline(), tmp_path)
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths["png"].stat().st_size > 10_000
    assert (tmp_path / "incident.md").read_text().startswith("# Incident: chat P99 end-to-end latency above 800 ms")
