"""The seed's engine profile (TP 2, AWQ, fp8 KV, max_num_seqs 256, LoRA, --trust-remote-code) passes vLLM's own
parser, and a bad LoRA rank in it is refused by name.

Runs `python -m tailguard.serving.tier.vllm_args` in .venv-serving (vLLM installed there), as the tier does before a
rollout, with the profile's flags exactly as rendered into the manifests (context not capped). Each call imports vLLM
(~20-40 s on 2 busy cores), so only the seed profile is checked here; the tier's tests check the others.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.serving.tier.profiles import resolve_profile
from tailguard.serving.tier.vllm_args import profile_cli_args, validate_cli_args

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

SERVING_PYTHON = Path(__file__).resolve().parents[2] / ".venv-serving" / "bin" / "python"


@pytest.fixture(autouse=True)
def _needs_serving_env() -> None:
    if not SERVING_PYTHON.exists():
        pytest.skip("no .venv-serving (make serving-env)")


def test_the_seed_profile_passes_vllms_parser_and_a_bad_lora_rank_is_named() -> None:
    seed = profile_cli_args(resolve_profile("seed-tp2-awq"), max_model_len_cap=None)
    for flag in ("--tensor-parallel-size", "--quantization", "--kv-cache-dtype", "--lora-modules", "--max-loras"):
        assert flag in seed
    verdict = validate_cli_args(SERVING_PYTHON, [*seed, "--trust-remote-code"])
    assert verdict.ok, verdict.error
    seed[seed.index("--max-lora-rank") + 1] = "17"
    refused = validate_cli_args(SERVING_PYTHON, seed)
    assert not refused.ok and refused.argument == "--max-lora-rank"
