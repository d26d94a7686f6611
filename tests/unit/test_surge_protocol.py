"""The surge scenario's protocol (tailguard.serving.lab.surge_protocol): disjoint trace segments checked by the harness,
the onset shapes, the HPA baselines' algorithm and the per-onset leads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tailguard.serving.lab.load import BUILTIN_TRACES, read_trace
from tailguard.serving.lab.surge import (
    ScenarioConfig,
    SurgeError,
    merge_figures,
    render_table,
    run_scenario,
    shape_segments,
    trace_slice,
)
from tailguard.serving.lab.surge_protocol import (
    SHAPES,
    HpaLike,
    ProtocolError,
    TraceSegment,
    check_disjoint,
    controller_table,
    make_shape,
    onset_lead,
)


def test_the_shipped_plan_keeps_training_and_evaluation_on_disjoint_trace_segments() -> None:
    for config in (ScenarioConfig(), ScenarioConfig.short()):
        config.check()
        train = [config.trace_segment(s) for s in config.train_seeds]
        evaluated = [config.trace_segment(s) for s in config.eval_seeds]
        assert all(a.end_s <= b.start_s for a in train for b in evaluated)
        assert [s.end_s - s.start_s for s in train + evaluated] == pytest.approx(
            [config.duration_s] * len(train + evaluated)
        )


def test_overlapping_segments_are_refused() -> None:
    a, b = TraceSegment(101, "train", 100.0, 700.0), TraceSegment(1, "eval", 650.0, 1250.0)
    with pytest.raises(ProtocolError, match="training seed 101 replays 100-700 s .* evaluated seed 1 650-1250 s"):
        check_disjoint([a], [b])
    check_disjoint([a], [dataclasses.replace(b, start_s=700.0)])  # touching is not sharing
    with pytest.raises(ProtocolError, match=r"seeds \[1\] are both trained on and evaluated"):
        check_disjoint([dataclasses.replace(a, seed=1)], [dataclasses.replace(b, start_s=900.0)])


def test_the_harness_refuses_an_overlapping_plan_before_it_runs_anything(tmp_path: Path) -> None:
    """Evaluation drawn from the whole trace: some evaluated slice shares seconds with a training slice."""
    overlapping = dataclasses.replace(ScenarioConfig(), eval_region=(0.0, 3502.0))
    with pytest.raises(SurgeError, match="must not share trace segments"):
        run_scenario(overlapping, tmp_path / "out", log=lambda _line: None)
    assert not (tmp_path / "out").exists()
    with pytest.raises(SurgeError, match="both trained on and evaluated"):
        run_scenario(dataclasses.replace(ScenarioConfig(), eval_seeds=(1, 101)), tmp_path / "out")


def test_a_region_shorter_than_a_run_is_refused() -> None:
    with pytest.raises(ProtocolError, match="shorter than one run"):
        dataclasses.replace(ScenarioConfig(), eval_region=(3000.0, 3502.0)).check()


def test_a_slice_is_the_traces_own_requests_from_zero_without_wrapping() -> None:
    trace = read_trace(BUILTIN_TRACES["conv"])
    config = ScenarioConfig()
    segment = config.trace_segment(1)
    sliced = trace_slice(trace, segment)
    inside = [item for item in trace if segment.start_s <= item.offset < segment.end_s]
    assert len(sliced) == len(inside) > 1000
    assert 0.0 <= sliced[0].offset and sliced[-1].offset < config.duration_s
    assert [r.prompt_tokens for r in sliced] == [r.prompt_tokens for r in inside]


@pytest.mark.parametrize("kind", [*SHAPES, "calm", "ramp"])
def test_every_shape_starts_calm_and_its_segments_carry_its_rate(kind: str) -> None:
    shape = make_shape(kind, 3.0, 10.0, 130.0, 600.0)
    segments = shape_segments(shape, 600.0, 1)
    assert segments[0].start == 0.0 and segments[-1].end >= 600.0
    for t in (0.0, 129.0, 133.0, 200.0, 300.0, 420.0, 599.0):
        (segment,) = [s for s in segments if s.start <= t < s.end]
        assert segment.at(t, segment.rate_from, segment.rate_to) == pytest.approx(shape.rate_at(t))
    assert shape.rate_at(100.0) == 3.0
    if kind in ("calm", "bad-config"):
        assert max(shape.rate_at(t) for t in range(600)) == 3.0
    else:
        assert max(shape.rate_at(t) for t in range(600)) == pytest.approx(10.0)
    assert (shape.rollout_profile is not None) == (kind == "bad-config")


def test_the_shapes_differ_where_they_should() -> None:
    sudden, slow, steps, diurnal = (make_shape(k, 3.0, 11.0, 120.0, 600.0) for k in SHAPES[:4])
    assert sudden.rate_at(125.0) == 11.0 and slow.rate_at(125.0) < 3.2
    assert steps.rate_at(200.0) == 7.0 and steps.rate_at(300.0) == 11.0
    rise = [diurnal.rate_at(120.0 + t) for t in range(0, 361, 30)]
    assert rise == sorted(rise) and rise[-1] == pytest.approx(11.0)


def test_the_hpa_follows_kubernetes_defaults() -> None:
    hpa = HpaLike("q", "sum(q)", target=5.0, min_replicas=1, max_replicas=8)
    assert hpa.decide(0.0, 1, None) == 1  # no metric: the sync is skipped
    assert hpa.decide(15.0, 1, 5.4) == 1  # within the 10% tolerance
    assert hpa.decide(30.0, 1, 60.0) == 5  # ceil(60 / 5) = 12, but at most max(2x, +4) per sync
    assert hpa.decide(45.0, 5, 60.0) == 8  # 12, capped at maxReplicas
    assert hpa.decide(60.0, 8, 0.0) == 8  # scale-down waits for the 5-minute window's highest recommendation
    assert hpa.decide(344.0, 8, 0.0) == 8
    assert hpa.decide(346.0, 8, 0.0) == 1  # 45 s's recommendation has left the window, 60 s's was 1


def test_an_onsets_lead_and_outcome() -> None:
    acted_before = onset_lead(1, "sudden", 100.0, [130.0, 200.0], [190.0])
    assert (acted_before.first_action_s, acted_before.lead_to_violation_s, acted_before.outcome) == (
        30.0,
        60.0,
        "acted before",
    )
    assert onset_lead(1, "sudden", 100.0, [200.0], [190.0]).lead_to_violation_s == -10.0
    assert onset_lead(1, "sudden", 100.0, [], [190.0]).outcome == "missed"
    assert onset_lead(1, "sudden", 100.0, [80.0], []).outcome == "prevented"


def test_the_table_counts_surge_and_calm_together() -> None:
    def run(trace: str, violation: float, replicas: float, outs: int, before: int = 0) -> dict[str, object]:
        return {
            "trace": trace,
            "minutes": 10.0,
            "slo_violation_minutes": violation,
            "replica_minutes": replicas,
            "scale_outs": outs,
            "scale_outs_before_onset": before,
        }

    leads = [onset_lead(1, "sudden", 0.0, [30.0], [90.0]), onset_lead(2, "diurnal", 0.0, [], [60.0])]
    table = controller_table(
        [run("surge", 2.0, 30.0, 1, 1), run("surge", 3.0, 20.0, 0), run("calm", 0.5, 15.0, 2)], leads
    )
    assert table["violation_minutes"] == 5.5 and table["replica_minutes"] == 65.0
    assert table["false_scale_outs_per_calm_hour"] == 12.0  # 2 in 10 minutes
    assert table["scale_outs_before_onset"] == 1
    assert table["outcomes"] == {"acted before": 1, "missed": 1}
    assert table["lead_to_violation_s"]["median"] == 60.0 and table["lead_to_violation_s"]["n"] == 1


def test_an_unknown_controller_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(SurgeError, match=r"unknown controllers \['hpa-magic'\]"):
        run_scenario(dataclasses.replace(ScenarioConfig(), controllers=("hpa-magic",)), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _part(seed: int, start_s: float, violation: float) -> dict[str, object]:
    run = {
        "controller": "hpa-queue-5",
        "seed": seed,
        "trace": "surge",
        "shape": "sudden",
        "minutes": 10.0,
        "slo_violation_minutes": violation,
        "replica_minutes": 20.0,
        "scale_outs": 1,
        "scale_outs_before_onset": 0,
    }
    lead = {"seed": seed, "shape": "sudden", "first_action_s": 30.0, "first_violation_s": 60.0 + seed}
    return {
        "protocol": {
            "train_seeds": [101],
            "train_segments": [{"seed": 101, "role": "train", "start_s": 0.0, "end_s": 600.0}],
            "eval_seeds": [seed],
            "eval_segments": [{"seed": seed, "role": "eval", "start_s": start_s, "end_s": start_s + 600.0}],
            "shapes": ["sudden"],
            "run_minutes": 10.0,
            "config": {
                "baseline": 3.0,
                "floor": 1,
                "peak": [9.0, 11.0],
                "shapes": ["sudden"],
                "duration_s": 600.0,
                "queue_slo_s": 1.0,
                "e2e_slo_s": 5.0,
            },
        },
        "runs": [run],
        "table": {"hpa-queue-5": {}},
        "leads": {"hpa-queue-5": [lead]},
        "model": {"train_seeds": [101], "rows": 1, "breach_rows": 1, "cpu_cut": 0.5},
        "seconds": 1.0,
    }


def test_reports_of_seeds_run_in_parallel_merge_into_one_table() -> None:
    merged = merge_figures([_part(1, 2000.0, 1.0), _part(4, 2700.0, 2.0)])
    row = merged["table"]["hpa-queue-5"]
    assert row["violation_minutes"] == 3.0 and row["onsets"] == 2
    assert row["lead_to_violation_s"]["median"] == 32.5  # 31 and 34 s
    assert merged["protocol"]["eval_seeds"] == [1, 4]
    assert merged["targets"]["best_reactive"] == "hpa-queue-5"
    assert "| hpa-queue-5 | 3 (3 + 0) |" in render_table(merged)
    with pytest.raises(ProtocolError, match="must not share trace segments"):
        merge_figures([_part(1, 2000.0, 1.0), _part(4, 300.0, 2.0)])
    other = _part(4, 2700.0, 2.0)
    other["protocol"]["train_seeds"] = [102]  # type: ignore[index]
    with pytest.raises(ValueError, match="train_seeds"):
        merge_figures([_part(1, 2000.0, 1.0), other])


def test_each_seed_runs_its_own_shapes_so_every_shape_is_run() -> None:
    config = ScenarioConfig()
    assert config.seed_shapes(1) == ["sudden", "slow-ramp", "two-steps", "diurnal"]
    assert config.seed_shapes(2) == ["slow-ramp", "two-steps", "diurnal", "bad-config"]
    assert {shape for seed in config.eval_seeds for shape in config.seed_shapes(seed)} == set(SHAPES)
    # A one-shape run and its completion (--after-first-shape) together are the four shapes of the seed.
    one = dataclasses.replace(config, shapes_per_seed=1)
    assert one.seed_shapes(3) + config.seed_shapes(3)[1:] == config.seed_shapes(3)
    assert ScenarioConfig.short().seed_shapes(1) == ["sudden"] and ScenarioConfig.short().seed_shapes(2) == [
        "bad-config"
    ]
