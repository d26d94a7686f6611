"""The seed's serving profile (TP 2, AWQ, fp8 KV, max_num_seqs 256, LoRA) and the cost model's quantization/KV dtype.

vLLM's own parser checks the profile in tests/integration/test_vllm_profile_args.py (needs .venv-serving).
"""

from __future__ import annotations

import pytest

from tailguard.serving.tier.batching import Arrival, simulate
from tailguard.serving.tier.manifests import MANIFESTS_DIR, render_kustomization, vllm_args
from tailguard.serving.tier.profiles import EngineProfile, profile_from_dict, resolve_profile
from tailguard.serving.tier.vllm_args import profile_cli_args
from tailguard.serving.tier.yamlfile import ConfigFileError

SEED = "seed-tp2-awq"


def _with(profile: EngineProfile, **engine_args: object) -> EngineProfile:
    return profile.model_copy(update={"engineArgs": profile.engineArgs.model_copy(update=engine_args)})


def test_seed_profile_carries_the_seed_serving_settings() -> None:
    args = profile_cli_args(resolve_profile(SEED), max_model_len_cap=None)
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert args[args.index("--quantization") + 1] == "awq"
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8"
    assert args[args.index("--max-num-seqs") + 1] == "256"
    assert "--enable-lora" in args and args[args.index("--max-loras") + 1] == "4"
    assert args[args.index("--max-lora-rank") + 1] == "16"
    lora = args.index("--lora-modules")
    assert args[lora + 1 : lora + 3] == [
        "sql-assistant=/models/lora/sql-assistant",
        "support-tone=/models/lora/support-tone",
    ]
    assert "--trust-remote-code" not in args  # Llama is built into vLLM
    assert "--trust-remote-code" in profile_cli_args(_with(resolve_profile(SEED), trust_remote_code=True))


def test_seed_overlay_ships_the_seed_profile_on_two_gpus() -> None:
    objects = render_kustomization(MANIFESTS_DIR / "overlays" / SEED)
    (canary,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "chat-canary"]
    (container,) = canary["spec"]["template"]["spec"]["containers"]
    assert container["args"] == vllm_args(resolve_profile(SEED))
    assert "--lora-modules" in container["args"] and "--quantization" in container["args"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_lora_settings_need_enable_lora() -> None:
    with pytest.raises(ConfigFileError, match="enable_lora"):
        profile_from_dict({"name": "p", "model": "m", "engineArgs": {"lora_modules": {"a": "/a"}}})


def test_unquantized_16_bit_single_gpu_costs_are_the_hardware_values() -> None:
    stable = resolve_profile("stable")
    hardware = stable.hardware
    assert stable.step_costs() == (
        hardware.decode_step_base_s,
        hardware.decode_per_seq_s,
        hardware.prefill_tokens_per_s,
    )


def test_awq_shrinks_weights_and_the_decode_step_and_fp8_doubles_kv_capacity() -> None:
    seed = resolve_profile(SEED)
    fp16_weights = _with(seed, quantization=None)
    kv_16_bit = _with(seed, kv_cache_dtype="auto")
    # AWQ: ~0.28 of the 16-bit weight bytes per GPU, so a faster (bandwidth-bound) decode step and more KV room.
    assert seed.weight_gib_per_gpu() == pytest.approx(131 * 0.28 / 2)
    assert seed.step_costs()[0] < fp16_weights.step_costs()[0]
    assert seed.num_gpu_blocks() > fp16_weights.num_gpu_blocks()
    # fp8 KV: half the bytes per token -> twice the tokens in the same pool, and cheaper per-sequence reads.
    assert seed.kv_bytes_per_token() == kv_16_bit.kv_bytes_per_token() / 2
    assert seed.num_gpu_blocks() == pytest.approx(2 * kv_16_bit.num_gpu_blocks(), abs=1)
    assert seed.step_costs()[1] < kv_16_bit.step_costs()[1]


def test_the_simulator_runs_the_seed_profile_with_fewer_preemptions_than_16_bit() -> None:
    seed = resolve_profile(SEED)
    unquantized = _with(seed, quantization=None, kv_cache_dtype="auto")
    arrivals = [Arrival(at=i * 0.004, prompt_tokens=1500, max_tokens=200) for i in range(400)]
    fast = simulate(seed, arrivals)
    slow = simulate(unquantized, arrivals)
    assert sum(r.preemptions for r in fast) < sum(r.preemptions for r in slow)
    p99 = sorted((r.finished_at or 0) - r.arrival for r in fast)[int(0.99 * len(fast))]
    p99_slow = sorted((r.finished_at or 0) - r.arrival for r in slow)[int(0.99 * len(slow))]
    assert p99 < p99_slow
