"""Profiles as vLLM flags, and naming the refused argument from vLLM's messages (pure parts of
tailguard.serving.tier.vllm_args)."""

from __future__ import annotations

from tailguard.serving.tier.profiles import resolve_profile
from tailguard.serving.tier.vllm_args import argument_named_in, platform_args, profile_cli_args


def test_stable_profile_becomes_vllm_flags_with_the_context_capped() -> None:
    args = profile_cli_args(resolve_profile("stable"))
    pairs = dict(zip(args[::2], args[1::2], strict=False))
    assert pairs["--max-num-seqs"] == "64"
    assert args[args.index("--max-model-len") + 1] == "512"  # 8192 in the profile, capped for the tiny model
    assert "--enable-prefix-caching" in args
    assert "--enable-lora" not in args and "--quantization" not in args  # False / None are left to vLLM's default


def test_bad_profile_keeps_its_bad_value_and_prefix_caching_off_is_spelled_out() -> None:
    profile = resolve_profile("bad-max-num-seqs")
    args = profile_cli_args(profile)
    assert args[args.index("--max-num-seqs") + 1] == "2"
    off = profile.model_copy(
        update={"engineArgs": profile.engineArgs.model_copy(update={"enable_prefix_caching": False})}
    )
    assert "--no-enable-prefix-caching" in profile_cli_args(off)
    uncapped = profile_cli_args(profile, max_model_len_cap=None)
    assert uncapped[uncapped.index("--max-model-len") + 1] == "8192"


def test_argument_is_named_from_argparse_and_vllm_messages() -> None:
    assert argument_named_in("argument --max-num-seqs: invalid int value: 'abc'") == "--max-num-seqs"
    assert argument_named_in("unrecognized arguments: --bogus-flag 1") == "--bogus-flag"
    assert argument_named_in("something else went wrong") == ""


def test_cpu_platform_forces_32_token_blocks() -> None:
    assert platform_args(gpu=False) == ["--block-size", "32"]
    assert platform_args(gpu=True) == []
