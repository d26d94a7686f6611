"""Engine profiles: versioned YAML files of vLLM engine arguments plus the simulator's hardware model.

A profile is what a rollout ships. `engineArgs` uses vLLM's own argument names
(snake_case, as on the `vllm serve` command line); `hardware` describes the
simulated accelerator and the cost model the simulator derives latency from;
`faults` injects failures so error-rate policies can be exercised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tailguard.serving.tier.yamlfile import ConfigFileError, load_yaml_model, validate

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
# Calibrated profiles (tailguard.serving.lab.calibration): a base profile plus engine/hardware values fitted on a real
# engine.
CALIBRATIONS_DIR = Path(__file__).resolve().parent / "calibrations"
GIB = 1024**3

# -- the cost model's quantization and KV-dtype factors --------------------------------------------------
# ESTIMATES, not measurements: uncalibrated until fitted on a GPU (docs/simulator-fidelity.md, "Quantization
# and KV dtype"). Weight bytes relative to 16-bit weights (AWQ/GPTQ 4-bit: 0.25 plus group scales and zeros).
QUANT_WEIGHT_FACTOR = {
    "awq": 0.28,
    "awq_marlin": 0.28,
    "gptq": 0.28,
    "gptq_marlin": 0.28,
    "int4": 0.28,
    "fp8": 0.5,
    "int8": 0.5,
}
# Dequantization inside the GEMM: a decode step reads fewer bytes but does more work per byte.
QUANT_DECODE_OVERHEAD = {
    "awq": 1.3,
    "awq_marlin": 1.3,
    "gptq": 1.3,
    "gptq_marlin": 1.3,
    "int4": 1.3,
    "fp8": 1.05,
    "int8": 1.1,
}
# Prefill is compute-bound: 4-bit weights save no FLOPs and cost dequantization.
QUANT_PREFILL_OVERHEAD = {
    "awq": 1.15,
    "awq_marlin": 1.15,
    "gptq": 1.15,
    "gptq_marlin": 1.15,
    "int4": 1.15,
    "fp8": 1.0,
    "int8": 1.05,
}
# fp8 KV: half the bytes per token; attention dequantizes it on the fly.
FP8_KV_ATTENTION_OVERHEAD = 1.1
# Tensor parallelism: each extra GPU adds an all-reduce per layer, as a share of the step.
TP_COMMUNICATION_OVERHEAD = 0.1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineArgs(_Strict):
    """The subset of vLLM engine arguments the simulator models (defaults as in vLLM 0.32)."""

    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(2048, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    enable_prefix_caching: bool = True
    max_model_len: int = Field(8192, ge=1)
    block_size: int = Field(16, ge=1)
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"] = "auto"
    tensor_parallel_size: int = Field(1, ge=1)
    quantization: str | None = None
    enable_lora: bool = False
    # LoRA serving (vLLM's --max-loras, --max-lora-rank, --lora-modules NAME=PATH ...): adapters are served
    # under their own model names next to the base model; they need enable_lora.
    max_loras: int | None = Field(None, ge=1)
    max_lora_rank: int | None = Field(None, ge=1)
    lora_modules: dict[str, str] | None = None
    # Runs the model repository's own Python code: only for models whose architecture is not built into vLLM.
    trust_remote_code: bool = False
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    num_gpu_blocks_override: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _lora_needs_enable_lora(self) -> EngineArgs:
        lora = [name for name in ("max_loras", "max_lora_rank", "lora_modules") if getattr(self, name) is not None]
        if lora and not self.enable_lora:
            raise ValueError(f"{', '.join(lora)} need enable_lora: true")
        return self


class Hardware(_Strict):
    """The simulated GPU and the step-time cost model.

    One engine step (one forward pass of the continuous batch) takes
    `decode_step_base_s + decode_per_seq_s * running + KV bytes of the running sequences' contexts /
    decode_kv_bandwidth_gbps + prefill_tokens / prefill_tokens_per_s`, with the values as written here for
    16-bit weights, a 16-bit KV cache and one GPU; `EngineProfile.step_costs()` scales them for the profile's
    quantization, kv_cache_dtype and tensor_parallel_size. Decoding is memory-bound: the base is the weights
    streamed once per step, the KV term each sequence's cache streamed once (fitted on an H200:
    serving/tier/calibrations/h200-llama-3-8b.yaml). Without `decode_kv_bandwidth_gbps` the KV read is folded into
    `decode_per_seq_s` (a step's cost does not grow with context: the tiny-model CPU calibrations).
    """

    gpu_model: str = "NVIDIA H100 80GB HBM3"
    hbm_gib: float = Field(80.0, gt=0)
    weight_gib: float = Field(16.0, ge=0)
    # CUDA context, activations and graphs: memory that is neither weights nor KV cache.
    overhead_gib: float = Field(2.0, ge=0)
    # bytes of KV cache per token at 16-bit precision (Llama-3-8B: 2 * 32 layers * 8 heads * 128 * 2 B).
    kv_bytes_per_token: int = Field(131072, ge=1)
    hbm_bandwidth_gbps: float = Field(3350.0, gt=0)
    decode_step_base_s: float = Field(0.007, gt=0)
    decode_per_seq_s: float = Field(0.00015, ge=0)
    # Effective HBM bandwidth at which a decode step reads the KV cache of each running sequence's context
    # (context tokens x kv_bytes_per_token); None: no context-dependent term.
    decode_kv_bandwidth_gbps: float | None = Field(None, gt=0)
    prefill_tokens_per_s: float = Field(60000.0, gt=0)
    # Framebuffer the driver keeps for itself (DCGM_FI_DEV_FB_RESERVED): neither used nor free; hbm_gib is
    # what CUDA sees (FB_USED + FB_FREE), the base of gpu_memory_utilization.
    fb_reserved_mib: float = Field(0.0, ge=0)
    # Fraction of prompt tokens found in the prefix cache when enable_prefix_caching is on.
    prefix_cache_hit_ratio: float = Field(0.12, ge=0.0, lt=1.0)
    # Client-observed minus engine-reported latency per request (HTTP, tokenization), fitted by
    # tailguard.serving.lab.calibration; the fidelity comparison adds it to the simulated e2e latency.
    request_overhead_s: float = Field(0.0, ge=0.0)


class Faults(_Strict):
    """Injected failures: a fraction of requests finishes with finished_reason="error" (HTTP 500)."""

    error_ratio: float = Field(0.0, ge=0.0, le=1.0)


class EngineProfile(_Strict):
    name: str = Field(min_length=1)
    model: str = Field(min_length=1)
    description: str | None = None
    engineArgs: EngineArgs = Field(default_factory=EngineArgs)
    hardware: Hardware = Field(default_factory=Hardware)
    faults: Faults = Field(default_factory=Faults)

    def kv_bytes_per_token(self) -> float:
        fp8 = self.engineArgs.kv_cache_dtype.startswith("fp8")
        per_gpu = self.hardware.kv_bytes_per_token / self.engineArgs.tensor_parallel_size
        return per_gpu / 2 if fp8 else per_gpu

    def weight_factor(self) -> float:
        """Weight bytes relative to 16-bit weights (1.0 unquantized; an estimate, see QUANT_WEIGHT_FACTOR)."""
        return QUANT_WEIGHT_FACTOR.get(self.engineArgs.quantization or "", 1.0)

    def weight_gib_per_gpu(self) -> float:
        return self.hardware.weight_gib * self.weight_factor() / self.engineArgs.tensor_parallel_size

    def step_costs(self) -> tuple[float, float, float]:
        """(decode_step_base_s, decode_per_seq_s, prefill_tokens_per_s) for this profile's engine arguments.

        The base of a decode step streams the weights: it scales with the weight bytes per GPU (quantization,
        tensor parallelism) times the dequantization overhead; the per-sequence part streams each sequence's
        KV cache: it scales with the KV bytes per token per GPU (fp8 halves them); prefill is compute-bound and
        divides over the GPUs. Each extra GPU costs TP_COMMUNICATION_OVERHEAD of the step. Unquantized, 16-bit
        KV on one GPU returns the hardware values unchanged. Estimates until calibrated on a GPU.
        """
        hardware, args = self.hardware, self.engineArgs
        quantization = args.quantization or ""
        tp = args.tensor_parallel_size
        communication = 1.0 + TP_COMMUNICATION_OVERHEAD * (tp - 1)
        base = hardware.decode_step_base_s * self.weight_factor() * QUANT_DECODE_OVERHEAD.get(quantization, 1.0)
        per_seq = hardware.decode_per_seq_s
        if args.kv_cache_dtype.startswith("fp8"):
            per_seq = per_seq * 0.5 * FP8_KV_ATTENTION_OVERHEAD
        prefill = hardware.prefill_tokens_per_s / QUANT_PREFILL_OVERHEAD.get(quantization, 1.0)
        if tp == 1:
            return base, per_seq, prefill
        return base / tp * communication, per_seq / tp * communication, prefill * tp / communication

    def decode_kv_s_per_token(self) -> float:
        """Seconds a decode step spends reading one token of a running sequence's KV cache (0: not modelled).

        The per-GPU KV bytes per token (fp8 halves them, tensor parallelism splits them) over the effective
        bandwidth, times fp8's dequantization overhead and the all-reduce share of tensor parallelism.
        """
        bandwidth = self.hardware.decode_kv_bandwidth_gbps
        if bandwidth is None:
            return 0.0
        seconds = self.kv_bytes_per_token() / (bandwidth * 1e9)
        if self.engineArgs.kv_cache_dtype.startswith("fp8"):
            seconds *= FP8_KV_ATTENTION_OVERHEAD
        return seconds * (1.0 + TP_COMMUNICATION_OVERHEAD * (self.engineArgs.tensor_parallel_size - 1))

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """A pure decode step of `batch` sequences, each attending over `context_tokens` tokens of KV cache."""
        base, per_seq, _ = self.step_costs()
        if batch <= 0:
            return 0.0
        return base + per_seq * batch + self.decode_kv_s_per_token() * batch * context_tokens

    def kv_cache_bytes(self) -> float:
        """The KV pool vLLM preallocates: HBM * gpu_memory_utilization - weights - overhead."""
        budget = self.hardware.hbm_gib * self.engineArgs.gpu_memory_utilization
        return max(0.0, (budget - self.weight_gib_per_gpu() - self.hardware.overhead_gib) * GIB)

    def num_gpu_blocks(self) -> int:
        if self.engineArgs.num_gpu_blocks_override is not None:
            return self.engineArgs.num_gpu_blocks_override
        return int(self.kv_cache_bytes() // (self.kv_bytes_per_token() * self.engineArgs.block_size))


def load_profile(path: str | Path) -> EngineProfile:
    """Load a profile file; raises ConfigFileError naming file, line and field."""
    return load_yaml_model(EngineProfile, path)


def profile_from_dict(data: Any, source: str = "<profile>") -> EngineProfile:
    if not isinstance(data, dict):
        raise ConfigFileError(source, 1, "", "expected a profile mapping")
    return validate(EngineProfile, data, None, source)


def builtin_profile_names() -> list[str]:
    return sorted(path.stem for path in PROFILES_DIR.glob("*.yaml"))


def resolve_profile(name_or_path: str, search_dirs: list[Path] | None = None) -> EngineProfile:
    """A profile by file path, or by name in `search_dirs` then the shipped serving/tier/profiles/."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return load_profile(candidate)
    for directory in [*(search_dirs or []), PROFILES_DIR]:
        for suffix in (".yaml", ".yml"):
            path = directory / f"{name_or_path}{suffix}"
            if path.is_file():
                return load_profile(path)
    calibrated = CALIBRATIONS_DIR / f"{name_or_path}.yaml"
    if calibrated.is_file():
        return load_calibrated_profile(calibrated, search_dirs)
    raise ConfigFileError(name_or_path, 0, "", f"no such profile; expected a file or one of {builtin_profile_names()}")


# -- calibrated profiles (fitted by tailguard.serving.lab.calibration) ------------------------------------------------


class FitReport(_Strict):
    """How the values were obtained: enough to judge them and to reproduce them."""

    intervals: int = Field(ge=0)
    requests: int = Field(ge=0)
    r2: float | None = None
    rmse_s: float | None = None
    measured_at: str | None = None
    machine: str | None = None
    command: str | None = None
    runs: list[str] = Field(default_factory=list)


class CalibrationFile(_Strict):
    """serving/tier/calibrations/<name>.yaml: a base profile, the real engine's arguments, the fitted hardware."""

    name: str = Field(min_length=1)
    base: str = Field(min_length=1)
    model: str | None = None
    description: str | None = None
    engineArgs: dict[str, Any] = Field(default_factory=dict)
    hardware: dict[str, Any] = Field(default_factory=dict)
    fit: FitReport | None = None


def load_calibration(path: str | Path) -> CalibrationFile:
    return load_yaml_model(CalibrationFile, path)


def apply_calibration(
    base: EngineProfile, calibration: CalibrationFile, source: str = "<calibration>"
) -> EngineProfile:
    """The calibrated profile: `base` with the calibration's engine arguments and hardware values over it.

    Validated as a whole, so an unknown engine argument or hardware field in the calibration is a
    ConfigFileError naming it.
    """
    data = base.model_dump()
    data["name"] = calibration.name
    if calibration.model is not None:
        data["model"] = calibration.model
    if calibration.description is not None:
        data["description"] = calibration.description
    data["engineArgs"] = {**data["engineArgs"], **calibration.engineArgs}
    data["hardware"] = {**data["hardware"], **calibration.hardware}
    return validate(EngineProfile, data, None, source)


def load_calibrated_profile(path: str | Path, search_dirs: list[Path] | None = None) -> EngineProfile:
    """Read a calibration file and resolve it against its base profile."""
    calibration = load_calibration(path)
    if calibration.base == calibration.name:
        raise ConfigFileError(str(path), 1, "base", "a calibration cannot be its own base profile")
    return apply_calibration(resolve_profile(calibration.base, search_dirs), calibration, str(path))


def resolve_any_profile(name_or_path: str) -> EngineProfile:
    """A profile by name or file, where the file may also be a calibration file (it has a `base`)."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        try:
            data = yaml.safe_load(candidate.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            data = None  # resolve_profile reports it with file and line
        if isinstance(data, dict) and "base" in data:
            return load_calibrated_profile(candidate)
    return resolve_profile(name_or_path)


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), item, out)
    else:
        out[prefix] = value


def profile_diff(a: EngineProfile, b: EngineProfile) -> dict[str, dict[str, Any]]:
    """Engine arguments that differ from `a` to `b`: {arg: {"from": old, "to": new}} (rollout annotations).

    Hardware and fault settings are included as `hardware.<field>` / `faults.<field>` when they differ,
    as is `model`.
    """
    left: dict[str, Any] = {}
    right: dict[str, Any] = {}
    _flatten("", a.engineArgs.model_dump(), left)
    _flatten("", b.engineArgs.model_dump(), right)
    for section in ("hardware", "faults"):
        _flatten(section, getattr(a, section).model_dump(), left)
        _flatten(section, getattr(b, section).model_dump(), right)
    left["model"], right["model"] = a.model, b.model
    return {
        key: {"from": left.get(key), "to": right.get(key)}
        for key in sorted(set(left) | set(right))
        if left.get(key) != right.get(key)
    }
