"""Calibration: the step-cost fit recovers known parameters; calibration files resolve as profiles."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tailguard.serving.lab.calibration import (
    CalibrationError,
    Interval,
    calibrate,
    fit_step_cost,
    intervals_from_samples,
    request_overhead,
    write_calibration,
)
from tailguard.serving.lab.fidelity import LoadSpec, simulate_run
from tailguard.serving.tier.profiles import CalibrationFile, apply_calibration, load_calibrated_profile, resolve_profile
from tailguard.serving.tier.yamlfile import ConfigFileError

BASE, PER_SEQ, RATE = 0.0012, 0.00011, 40_000.0


def synthetic_intervals(noise: float, count: int = 40, seed: int = 7) -> list[Interval]:
    rng = random.Random(seed)
    intervals = []
    for _ in range(count):
        running = rng.uniform(1, 40)
        steps = rng.uniform(200, 900)
        prompt = steps * rng.uniform(0, 30)
        itl_mean = BASE + PER_SEQ * running + (prompt / steps) / RATE
        itl_count = running * steps
        intervals.append(
            Interval(
                itl_sum=itl_mean * (1 + rng.gauss(0, noise)) * itl_count,
                itl_count=itl_count,
                steps=steps,
                prompt_tokens=prompt,
                running_weighted=running,
            )
        )
    return intervals


def test_fit_recovers_exact_parameters() -> None:
    fit = fit_step_cost(synthetic_intervals(noise=0.0))
    assert fit.decode_step_base_s == pytest.approx(BASE, rel=1e-6)
    assert fit.decode_per_seq_s == pytest.approx(PER_SEQ, rel=1e-6)
    assert fit.prefill_tokens_per_s == pytest.approx(RATE, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)


def test_fit_recovers_parameters_under_noise() -> None:
    fit = fit_step_cost(synthetic_intervals(noise=0.03, count=200))
    assert fit.decode_step_base_s == pytest.approx(BASE, rel=0.15)
    assert fit.decode_per_seq_s == pytest.approx(PER_SEQ, rel=0.1)
    assert fit.prefill_tokens_per_s == pytest.approx(RATE, rel=0.25)


def test_fit_without_prefill_cost_reports_an_unbounded_rate() -> None:
    intervals = [
        Interval(
            itl_sum=(BASE + PER_SEQ * r) * r * 500, itl_count=r * 500, steps=500, prompt_tokens=p, running_weighted=r
        )
        for r, p in [(1, 0), (5, 3000), (10, 100), (20, 9000), (30, 500)]
    ]
    fit = fit_step_cost(intervals)
    assert fit.prefill_tokens_per_s >= 1e8
    assert fit.decode_per_seq_s == pytest.approx(PER_SEQ, rel=1e-6)


def test_fit_refuses_too_little_data() -> None:
    with pytest.raises(CalibrationError, match="only 1 intervals"):
        fit_step_cost(synthetic_intervals(noise=0.0, count=1))
    idle = [Interval(0.0, 0.0, 0.0, 0.0, 0.0)] * 10
    with pytest.raises(CalibrationError, match="only 0 intervals"):
        fit_step_cost(idle)


def test_calibration_from_a_simulated_run_recovers_the_simulator_parameters() -> None:
    # The simulator with known hardware plays the real engine: its own runs must calibrate back to it.
    engine_args = {"max_model_len": 512, "block_size": 128, "num_gpu_blocks_override": 8192}
    truth = apply_calibration(
        resolve_profile("stable"),
        CalibrationFile(
            name="truth",
            base="stable",
            engineArgs=engine_args,
            hardware={"decode_step_base_s": 0.002, "decode_per_seq_s": 0.0003, "prefill_tokens_per_s": 30000},
        ),
    )
    runs = []
    for level in (1.0, 2.0):
        load = LoadSpec(level, duration_s=20.0)
        run = simulate_run(truth, load, load.schedule())
        run.engine = "vllm"  # calibrate() only reads real-engine runs
        runs.append(run)
    fitted = calibrate(runs, name="fitted", base="stable", engine_args=engine_args)
    assert fitted.hardware["decode_step_base_s"] == pytest.approx(0.002, rel=0.15)
    assert fitted.hardware["decode_per_seq_s"] == pytest.approx(0.0003, rel=0.2)
    assert fitted.hardware["prefill_tokens_per_s"] == pytest.approx(30000, rel=0.3)
    assert fitted.fit is not None and fitted.fit.intervals >= 10
    assert fitted.engineArgs == engine_args and fitted.base == "stable"
    # The experimental simulation-based correction still yields valid, positive costs.
    refined = calibrate(runs, name="fitted", base="stable", engine_args=engine_args, refine_iterations=1)
    assert refined.hardware["decode_step_base_s"] > 0 and refined.hardware["prefill_tokens_per_s"] > 0


def test_saturated_windows_measure_capacity_exactly() -> None:
    # max_num_seqs 4 under 3x load: requests wait throughout, so windows are wall time over steps.
    truth = apply_calibration(
        resolve_profile("stable"),
        CalibrationFile(
            name="truth",
            base="stable",
            engineArgs={"max_model_len": 512, "block_size": 128, "num_gpu_blocks_override": 8192, "max_num_seqs": 4},
            hardware={"decode_step_base_s": 0.002, "decode_per_seq_s": 0.0003, "prefill_tokens_per_s": 30000},
        ),
    )
    load = LoadSpec(3.0, duration_s=20.0)
    run = simulate_run(truth, load, load.schedule())
    busy = [i for i in intervals_from_samples(run.samples) if i.itl_count == i.steps and i.running_weighted > 0]
    assert len(busy) >= 5
    for interval in busy:
        expected = 0.002 + 0.0003 * interval.running_weighted + interval.prefill_per_step / 30000
        # Exact up to the one step that straddles each window's edge.
        assert interval.itl_mean == pytest.approx(expected, rel=0.02)


def test_intervals_are_windows_of_counter_deltas() -> None:
    load = LoadSpec(1.0, duration_s=10.0)
    run = simulate_run(resolve_profile("stable"), load, load.schedule())
    intervals = intervals_from_samples(run.samples, span=3)
    assert len(intervals) == (len(run.samples) - 1) // 3
    assert sum(i.steps for i in intervals) <= run.samples[-1].steps
    assert all(i.itl_count >= 0 and i.steps >= 0 for i in intervals)


def test_request_overhead_is_client_minus_engine_latency() -> None:
    profile = apply_calibration(
        resolve_profile("stable"), CalibrationFile(name="x", base="stable", hardware={"request_overhead_s": 0.012})
    )
    load = LoadSpec(1.0, duration_s=10.0)
    run = simulate_run(profile, load, load.schedule())
    assert request_overhead([run]) == pytest.approx(0.012, rel=1e-6)


def test_calibration_file_round_trips_and_resolves(tmp_path: Path) -> None:
    calibration = CalibrationFile(
        name="tiny-test",
        base="stable",
        model="tiny",
        engineArgs={"max_num_seqs": 8, "max_model_len": 512},
        hardware={"decode_step_base_s": 0.0015, "request_overhead_s": 0.004},
    )
    path = tmp_path / "tiny-test.yaml"
    write_calibration(path, calibration)
    profile = load_calibrated_profile(path)
    assert profile.name == "tiny-test" and profile.model == "tiny"
    assert profile.engineArgs.max_num_seqs == 8
    assert profile.hardware.decode_step_base_s == 0.0015
    assert profile.hardware.request_overhead_s == 0.004
    # Everything not calibrated comes from the base profile.
    assert profile.engineArgs.enable_prefix_caching is resolve_profile("stable").engineArgs.enable_prefix_caching


def test_shipped_calibrations_resolve_by_name() -> None:
    profile = resolve_profile("tiny-cpu-stable")
    assert profile.name == "tiny-cpu-stable"
    assert profile.engineArgs.max_model_len == 512
    # The demo profiles keep their H100-like defaults.
    assert resolve_profile("stable").hardware.decode_step_base_s == 0.007


def test_bad_calibration_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nbase: stable\nhardware:\n  decode_step_base_s: 0.001\nslope: 3\n", encoding="utf-8")
    with pytest.raises(ConfigFileError, match=r"bad.yaml:5: slope: unknown field"):
        load_calibrated_profile(path)
    path.write_text("name: bad\nbase: stable\nengineArgs:\n  max_num_seqz: 3\n", encoding="utf-8")
    with pytest.raises(ConfigFileError, match="max_num_seqz"):
        load_calibrated_profile(path)
    path.write_text("name: bad\nbase: no-such-profile\n", encoding="utf-8")
    with pytest.raises(ConfigFileError, match="no such profile"):
        load_calibrated_profile(path)


def test_request_overhead_is_the_median_over_runs() -> None:
    runs = []
    for overhead in (0.01, 0.02, 0.5):  # the last: a starved load generator under saturation
        profile = apply_calibration(
            resolve_profile("stable"),
            CalibrationFile(name="x", base="stable", hardware={"request_overhead_s": overhead}),
        )
        load = LoadSpec(1.0, duration_s=5.0)
        runs.append(simulate_run(profile, load, load.schedule()))
    assert request_overhead(runs) == pytest.approx(0.02, rel=1e-6)
    assert request_overhead([]) == 0.0
