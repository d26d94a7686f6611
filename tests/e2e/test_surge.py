"""`tailguard demo --scenario surge --short`, end to end on the simulator: the SLA model trained by the scenario's
own pipeline on other seeds, then no controller, reactive (queue-scale) and predictive
(predicted-queue-breach-scale) on the same arrivals, in a closed loop through a real Prometheus, and both again on
the calm control trace. Asserts behaviour, not scores: the predictive scale-out comes before the reactive one,
both scale back to the floor after the calm, nothing scales on the calm trace, the costs are counted, the
report is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.app.cli import main as tailguard
from serving.surge import ScenarioConfig

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


@pytest.mark.timeout(1800)
def test_short_surge_scenario_prevents_with_prediction_and_scales_back(tmp_path: Path) -> None:
    assert tailguard(["demo", "--scenario", "surge", "--short", "--out", str(tmp_path)]) == 0
    figures = json.loads((tmp_path / "surge.json").read_text())
    config = ScenarioConfig.short()
    (seed,) = config.eval_seeds
    assert not set(figures["model"]["train_seeds"]) & {seed}, "the model must never see the evaluated seed"
    assert figures["model"]["breach_rows"] > 0
    runs = {(r["controller"], r["trace"]): r for r in figures["runs"]}
    assert set(runs) == {
        ("none", "surge"),
        ("reactive", "surge"),
        ("predictive", "surge"),
        ("reactive", "calm"),
        ("predictive", "calm"),
    }
    none, reactive, predictive = runs["none", "surge"], runs["reactive", "surge"], runs["predictive", "surge"]
    # The surge is more than the floor absorbs: without a controller the SLO breaks and nothing scales.
    assert none["slo_violation_minutes"] > 0 and none["scale_outs"] == 0
    assert none["peak_replicas"] == config.floor
    # Both controllers scale out; the predictive one first, and it breaks the SLO for less time than reactive.
    assert reactive["first_scale_out_s"] is not None and predictive["first_scale_out_s"] is not None
    assert predictive["first_scale_out_s"] < reactive["first_scale_out_s"]
    assert predictive["slo_violation_minutes"] < reactive["slo_violation_minutes"]
    # Scale down too: after the calm both are back at the operator's floor, and that is in the replica-minutes.
    for run in (reactive, predictive):
        assert run["scale_in_s"] is not None and run["scale_in_s"] > run["first_scale_out_s"]
        assert run["final_replicas"] == config.floor
        assert run["peak_replicas"] > config.floor
        assert run["replica_minutes"] > none["replica_minutes"]
    # The floor alone for the whole run: one replica x the run's minutes (its 15 s samples).
    assert none["replica_minutes"] == pytest.approx(config.floor * (config.duration_s / 60.0 + 0.25))
    # The calm control trace: no scale-out at all, by either.
    assert figures["targets"]["false_scale_outs_on_calm"] == {"reactive": 0, "predictive": 0}
    assert runs["reactive", "calm"]["slo_violation_minutes"] == 0
    assert figures["targets"]["lead_s_per_seed"] == [
        round(reactive["first_scale_out_s"] - predictive["first_scale_out_s"], 1)
    ]
    report = (tmp_path / "surge.md").read_text()
    assert "| 1 | surge | predictive |" in report and "median" in report
    assert (tmp_path / "surge.png").stat().st_size > 10_000
