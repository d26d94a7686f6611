"""The H200-calibrated profile against the measured H200 data (serving/tier/calibrations/h200-2026-12-04/).

The decode table: the profile's step-time model, and the simulator's batching engine stepping real batches,
reproduce every measured step (batch 1-256, context 1,024 and 4,096) within 15%; the fit that wrote the
profile's values is reproducible from the file. The NVML series: the simulator's HBM model on the same profile
reports the recorded pool phase (FB_USED, FB_FREE, FB_RESERVED and the 0.900 ratio) and the recorded weights.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tailguard.serving.lab.gpu_calibration import DecodeTableError, fit_decode_table, load_decode_table, main
from tailguard.serving.tier.batching import BatchingModel, SimRequest
from tailguard.serving.tier.profiles import GIB, resolve_profile
from tailguard.serving.tier.vllm_metrics import MIB, HbmModel

ROOT = Path(__file__).resolve().parents[2]
DECODE_TABLE = ROOT / "serving" / "tier" / "calibrations" / "h200-2026-12-04" / "decode.json"
HBM_RECORDING = ROOT / "tests" / "fixtures" / "dcgm" / "h200-2026-12-04" / "hbm.om"
PHASES = ROOT / "tests" / "fixtures" / "dcgm" / "h200-2026-12-04" / "phases.json"
TOLERANCE = 0.15


def test_the_table_covers_batch_1_to_256_at_both_contexts() -> None:
    rows = load_decode_table(DECODE_TABLE).rows
    assert {(row.batch, row.context) for row in rows} >= {(b, 1024) for b in (1, 4, 16, 32, 64, 128, 256)} | {
        (b, 4096) for b in (1, 4, 16, 32, 64, 128)
    }


def test_the_profiles_step_time_model_reproduces_the_h200_decode_table() -> None:
    profile = resolve_profile("h200-llama-3-8b")
    errors = {
        (row.batch, row.context): profile.decode_step_s(row.batch, row.context) / row.step_s - 1.0
        for row in load_decode_table(DECODE_TABLE).rows
    }
    worst = max(errors, key=lambda key: abs(errors[key]))
    assert abs(errors[worst]) <= TOLERANCE, (worst, errors)
    # Memory-bound: at batch 128 the 4,096-token contexts cost twice the 1,024-token ones (measured 2.06x).
    assert profile.decode_step_s(128, 4096) / profile.decode_step_s(128, 1024) == pytest.approx(2.06, rel=0.15)


def test_the_uncalibrated_profile_misses_the_table() -> None:
    """The check can fail: stable's context-free H100 model is off by far more than 15% on the H200 table."""
    profile = resolve_profile("stable")
    errors = [abs(profile.decode_step_s(row.batch, row.context) / row.step_s - 1.0)
              for row in load_decode_table(DECODE_TABLE).rows]  # fmt: skip
    assert max(errors) > TOLERANCE


@pytest.mark.parametrize("context", [1024, 4096])
def test_the_batching_engine_steps_at_the_measured_times(context: int) -> None:
    """The simulator itself: `batch` sequences decoding over `context` tokens take the measured step time."""
    calibrated = resolve_profile("h200-llama-3-8b")
    # One prefill step for the whole batch, so every sequence then decodes over exactly `context` tokens.
    profile = calibrated.model_copy(
        update={"engineArgs": calibrated.engineArgs.model_copy(update={"max_num_batched_tokens": 1 << 20})}
    )
    for row in (r for r in load_decode_table(DECODE_TABLE).rows if r.context == context):
        engine = BatchingModel(profile)
        for i in range(row.batch):
            engine.add(SimRequest(f"r{i}", prompt_tokens=context - 1, max_tokens=16, arrival=0.0))
        prefill = engine.plan_step(0.0)
        assert len(prefill.prefill) == row.batch
        engine.finish_step(prefill, prefill.duration)
        plan = engine.plan_step(prefill.duration)
        assert len(plan.decode) == row.batch and not plan.prefill
        assert plan.duration == pytest.approx(row.step_s, rel=TOLERANCE), (row.batch, context)


def test_the_shipped_values_are_the_fit_of_the_table() -> None:
    fit = fit_decode_table(load_decode_table(DECODE_TABLE))
    hardware = resolve_profile("h200-llama-3-8b").hardware
    assert fit.max_relative_error < 0.06
    assert hardware.decode_step_base_s == pytest.approx(fit.decode_step_base_s, rel=1e-4)
    assert hardware.decode_per_seq_s == pytest.approx(fit.decode_per_seq_s, rel=1e-3)
    assert hardware.decode_kv_bandwidth_gbps == pytest.approx(fit.decode_kv_bandwidth_gbps, rel=1e-3)


def test_a_broken_table_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "decode.json"
    bad.write_text(json.dumps({"gpu": "x", "model": "y", "weights_GiB": 1, "decode": [{"batch": 1}]}))
    with pytest.raises(DecodeTableError, match="step_ms"):
        load_decode_table(bad)
    assert main([str(bad)]) == 2
    assert "decode.json" in capsys.readouterr().err


def recorded(name: str) -> list[tuple[float, float]]:
    pattern = re.compile(rf"^{name}\{{.*\}} (\S+) (\S+)$")
    matches = (pattern.match(line) for line in HBM_RECORDING.read_text(encoding="utf-8").splitlines())
    return [(float(m.group(2)), float(m.group(1))) for m in matches if m]


def phase_window(name: str) -> tuple[float, float]:
    phases = json.loads(PHASES.read_text(encoding="utf-8"))["phases"]
    (index,) = [i for i, (_, phase) in enumerate(phases) if phase == name]
    return phases[index][0], phases[index + 1][0]


def in_phase(series: list[tuple[float, float]], name: str) -> list[float]:
    start, end = phase_window(name)
    return [value for at, value in series if start + 0.5 <= at < end]  # half a second to settle


def test_the_hbm_model_reports_the_recorded_pool_phase() -> None:
    profile = resolve_profile("h200-llama-3-8b")
    hbm = HbmModel(profile, lambda: 0.0)
    for phase in ("kv-pool-preallocated-0.9", "decoding-inside-pool"):
        used, free = in_phase(recorded("DCGM_FI_DEV_FB_USED"), phase), in_phase(recorded("DCGM_FI_DEV_FB_FREE"), phase)
        assert used and max(used) - min(used) < 16  # flat, busy or idle
        assert [u / (u + f) for u, f in zip(used, free, strict=True)] == pytest.approx([0.900] * len(used), abs=5e-4)
        assert hbm.fb_used_mib() == pytest.approx(sum(used) / len(used), rel=0.005)
        assert hbm.fb_free_mib() == pytest.approx(sum(free) / len(free), rel=0.02)
    # A full batch's step changes nothing: the activations live inside the preallocated budget.
    before = hbm.fb_used_mib()
    hbm.record_step(0.0, profile.num_gpu_blocks() * profile.engineArgs.block_size)
    assert hbm.fb_used_mib() == before
    (reserved,) = set(in_phase(recorded("DCGM_FI_DEV_FB_RESERVED"), "decoding-inside-pool"))
    assert profile.hardware.fb_reserved_mib == reserved
    # Weights loaded, no pool yet: the profile's weights + CUDA context.
    weights = in_phase(recorded("DCGM_FI_DEV_FB_USED"), "weights-loaded")[0]
    loaded = (profile.weight_gib_per_gpu() + profile.hardware.overhead_gib) * GIB / MIB
    assert loaded == pytest.approx(weights, rel=0.01)
