"""`tailguard demo --scenario surge --short`, end to end on the simulator: the SLA model trained by the scenario's
own pipeline on training seeds' trace slices, then every controller (a static floor, HPAs on queue length and on
requests/s, the shipped queue-scale rule, the SLA model's policy) on two evaluated seeds' onsets (a sudden surge,
a bad config under steady load) and their calm control traces, replayed from trace slices disjoint from training,
in a closed loop through a real Prometheus. Asserts the protocol and behaviour, not scores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tailguard.serving.cli import main as tailguard
from tailguard.serving.lab.surge import ScenarioConfig, evaluated_controllers

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


@pytest.mark.timeout(1800)
def test_short_surge_scenario_runs_the_protocol_and_prints_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tailguard(["demo", "--scenario", "surge", "--short", "--out", str(tmp_path)]) == 0
    figures = json.loads((tmp_path / "surge.json").read_text())
    config = ScenarioConfig.short()
    controllers = [name for name, _ in evaluated_controllers(config)]
    protocol = figures["protocol"]
    # The protocol: no evaluated seed trained on, no second of an evaluated slice of the trace seen in training.
    assert not set(figures["model"]["train_seeds"]) & set(config.eval_seeds)
    for trained in protocol["train_segments"]:
        for evaluated in protocol["eval_segments"]:
            assert trained["end_s"] <= evaluated["start_s"] or evaluated["end_s"] <= trained["start_s"]
    assert figures["model"]["breach_rows"] > 0
    runs = {(r["controller"], r["seed"], r["shape"]): r for r in figures["runs"]}
    # Every controller on every seed's onset and on its calm control trace.
    expected = {
        (name, seed, shape)
        for name in controllers
        for seed in config.eval_seeds
        for shape in [*config.seed_shapes(seed), "calm"]
    }
    assert set(runs) == expected
    assert {shape for _, _, shape in expected} == {"sudden", "bad-config", "calm"}
    for (name, seed, shape), run in runs.items():
        assert run["trace"] == ("calm" if shape == "calm" else "surge")
        if name == "static-2":  # the static floor never scales and pays two replicas all along
            assert run["scale_outs"] == 0 and run["peak_replicas"] == 2
            two_replicas = 2 * (config.duration_s / 60.0 + 0.25)
            if shape == "bad-config":  # and the rollout's new replicas while the old ones still serve
                assert two_replicas < run["replica_minutes"] < two_replicas + 2
            else:
                assert run["replica_minutes"] == pytest.approx(two_replicas)
    # The bad config breaks the SLO at steady load even on two replicas; the calm trace does not.
    for seed, shape in ((s, sh) for _, s, sh in expected if sh == "bad-config"):
        assert runs["static-2", seed, shape]["slo_violation_minutes"] > 0
    for seed in config.eval_seeds:
        assert runs["static-2", seed, "calm"]["slo_violation_minutes"] == 0
        assert runs["reactive", seed, "calm"]["scale_outs"] == 0  # the shipped rule waits for a queue
    # The sudden surge: the HPA on queue length scales out after its onset (the queue is its only signal).
    for seed, shape in ((s, sh) for _, s, sh in expected if sh == "sudden"):
        assert runs["hpa-queue-5", seed, shape]["first_scale_out_s"] is not None
        assert runs["hpa-queue-5", seed, shape]["first_scale_out_s"] > 0
    # The table: per controller, surge and calm together, one onset per evaluated seed, leads per onset.
    table = figures["table"]
    assert list(table) == controllers
    for name, row in table.items():
        mine = [r for r in figures["runs"] if r["controller"] == name]
        assert row["violation_minutes"] == pytest.approx(sum(r["slo_violation_minutes"] for r in mine), abs=0.01)
        assert row["replica_minutes"] == pytest.approx(sum(r["replica_minutes"] for r in mine), abs=0.1)
        assert row["onsets"] == len(config.eval_seeds) and len(figures["leads"][name]) == row["onsets"]
        assert row["calm_hours"] == pytest.approx(len(config.eval_seeds) * config.duration_s / 3600, abs=0.01)
    assert figures["targets"]["best_reactive"] in controllers
    report = (tmp_path / "surge.md").read_text()
    assert "| hpa-queue-5 |" in report and "false scale-outs / calm h" in report
    assert "Targets (issue 27)" in report
    assert "| hpa-queue-5 |" in capsys.readouterr().out  # printed, not only written
    assert (tmp_path / "surge.png").stat().st_size > 10_000
