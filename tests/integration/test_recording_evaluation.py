"""The committed real-vLLM recording, end to end without vLLM: a slice of it (16 minutes with the first surge)
backfilled into a REAL Prometheus with promtool, simulator history next to it, then the SLA model trained and
evaluated both ways (simulator -> recording; the slice's first 60% -> the rest) against the baselines.

Behaviour, not scores: every sample of the slice lands in the TSDB (the backfill checks promtool's count),
both experiments report every method on both SLIs, the rows evaluated are the slice's (after the split for the
in-recording one), every breach onset is either warned of or missed by each method (the onsets are the data's,
the same for all of them), and lead times never exceed the horizon.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tailguard.serving.lab.recording import Recording, evaluate_recording, sliced_openmetrics

pytestmark = pytest.mark.integration

RECORDING = Path(__file__).resolve().parents[2] / "serving" / "lab" / "recordings" / "vllm-cpu-2026-12-01"
# Seconds into the recording: calm, surge 1 (300-630 s) and its drain, calm; the first 60% (to ~720 s) holds
# calm and surge rows in each of 3 cross-validation folds' training parts, the rest the drain and the calm.
SLICE_S = (150.0, 1100.0)
STEP_S, HORIZON_S = 5.0, 60.0
METHODS = {"model", "reactive", "reactive queue>20", "persistence"}
VIEWS = {"queue time P99 (cpu)", "e2e P99"}


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Recording, Path, list[dict[str, Any]]]:
    recording = Recording.load(RECORDING)
    out = tmp_path_factory.mktemp("recording-eval")
    window = (recording.start + SLICE_S[0], recording.start + SLICE_S[1])
    experiments = evaluate_recording(
        recording,
        out,
        sim_seeds=[101],
        sim_hours=0.15,
        step_s=STEP_S,
        horizon_s=HORIZON_S,
        window=window,
        folds=3,
    )
    return recording, out, experiments


def test_the_recording_describes_itself() -> None:
    recording = Recording.load(RECORDING)
    assert recording.history.exists() and recording.history.suffix == ".xz"
    assert recording.end - recording.start >= 30 * 60
    assert (RECORDING / "README.md").exists() and (RECORDING / "scenario.json").exists()
    types = [line for line in sliced_openmetrics(recording.history, 0, 0) if line.startswith("# TYPE")]
    families = {line.split()[2] for line in types}
    assert {"vllm:request_queue_time_seconds", "vllm:num_requests_waiting", "up"} <= families


def test_both_experiments_report_every_method_on_both_slis(
    evaluated: tuple[Recording, Path, list[dict[str, Any]]],
) -> None:
    _, out, experiments = evaluated
    assert [e["experiment"] for e in experiments] == [
        "transfer: simulator -> real vLLM",
        "real: first 60% -> last 40%",
    ]
    report = json.loads((out / "report.json").read_text())
    assert [e["experiment"] for e in report] == [e["experiment"] for e in experiments]
    markdown = (out / "report.md").read_text()
    for experiment in experiments:
        assert f"### {experiment['experiment']}" in markdown
        assert "cpu" in experiment["trained_dimensions"]
        assert set(experiment["dimensions"]) == VIEWS
        for entry in experiment["dimensions"].values():
            assert METHODS <= set(entry["methods"])
            assert entry["labelled_rows"] > 0


def test_the_rows_are_the_slice_and_the_held_out_part_follows_the_split(
    evaluated: tuple[Recording, Path, list[dict[str, Any]]],
) -> None:
    recording, _, (transfer, real) = evaluated
    start, end = recording.start + SLICE_S[0], recording.start + SLICE_S[1]
    assert transfer["rows"] == math.floor((end - start) / STEP_S) + 1
    assert transfer["window"] == pytest.approx([start, start + (transfer["rows"] - 1) * STEP_S])
    # the transfer model was fitted on the simulator's window, far from the recording's
    assert transfer["trained_window"][1] < start
    # the in-recording model was fitted before the split, and scored only after it
    assert real["trained_window"][1] <= real["window"][0]
    assert real["window"][1] == transfer["window"][1]
    assert 0.3 * transfer["rows"] < real["rows"] < 0.55 * transfer["rows"]


def test_every_onset_is_warned_or_missed_and_leads_stay_within_the_horizon(
    evaluated: tuple[Recording, Path, list[dict[str, Any]]],
) -> None:
    _, _, experiments = evaluated
    transfer = experiments[0]["dimensions"]["queue time P99 (cpu)"]
    onsets = {name: s["lead_time_s"]["count"] + s["missed_breaches"] for name, s in transfer["methods"].items()}
    assert len(set(onsets.values())) == 1 and next(iter(onsets.values())) >= 1, onsets  # the surge's onset
    for experiment in experiments:
        for entry in experiment["dimensions"].values():
            for name, scores in entry["methods"].items():
                lead = scores["lead_time_s"]
                assert scores["positives"] == entry["positives"], name
                assert 0.0 <= scores["precision"] <= 1.0 and 0.0 <= scores["recall"] <= 1.0
                if lead["count"]:
                    assert 0.0 <= lead["p10"] <= lead["p50"] <= HORIZON_S, (name, lead)
