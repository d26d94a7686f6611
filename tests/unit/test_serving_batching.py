"""The continuous-batching model, in virtual time."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from tailguard.serving.lab.load import quantile
from tailguard.serving.tier.batching import Arrival, BatchingModel, RequestRejected, SimRequest, simulate
from tailguard.serving.tier.profiles import EngineProfile, resolve_profile
from tailguard.serving.tier.simulator import ReplicaEngine


def _arrivals(rate: float, seconds: float, seed: int = 7) -> list[Arrival]:
    rng = random.Random(seed)
    at, out = 0.0, []
    while at < seconds:
        at += rng.expovariate(rate)
        out.append(Arrival(at, rng.randint(20, 200), rng.randint(5, 60)))
    return out


def _p99(requests: list[SimRequest]) -> float:
    value = quantile([r.finished_at - r.arrival for r in requests if r.finished_at is not None], 0.99)
    assert value is not None
    return value


def _with_args(profile: EngineProfile, **args: object) -> EngineProfile:
    return profile.model_copy(update={"engineArgs": profile.engineArgs.model_copy(update=args)})


def test_bad_max_num_seqs_regresses_p99_on_the_same_arrivals() -> None:
    arrivals = _arrivals(rate=10, seconds=60)
    stable = simulate(resolve_profile("stable"), arrivals)
    bad = simulate(resolve_profile("bad-max-num-seqs"), arrivals)
    assert all(r.finished for r in stable + bad)
    assert _p99(stable) < 0.8
    assert _p99(bad) > 1.0
    assert _p99(bad) > 3 * _p99(stable)


def test_running_set_never_exceeds_max_num_seqs() -> None:
    model = BatchingModel(_with_args(resolve_profile("stable"), max_num_seqs=3))
    for i in range(10):
        model.add(SimRequest(f"r{i}", 10, 5, 0.0))
    now = 0.0
    while model.has_work:
        plan = model.plan_step(now)
        assert model.num_running <= 3
        now += plan.duration
        model.finish_step(plan, now)


def test_kv_exhaustion_preempts_and_every_request_still_finishes() -> None:
    profile = _with_args(resolve_profile("stable"), num_gpu_blocks_override=12, enable_prefix_caching=False)
    arrivals = [Arrival(0.001 * i, 40, 60) for i in range(8)]  # 8 x 100 tokens want 56 blocks of 16
    requests = simulate(profile, arrivals)
    assert sum(r.preemptions for r in requests) > 0
    assert all(r.finished and r.generated == 60 for r in requests)
    # Preempted requests recompute their prompt, and the output they had kept.
    assert any(r.prompt_tokens_computed > r.prompt_tokens for r in requests)
    once = [r for r in requests if r.preemptions == 1]
    assert once and all(r.prompt_tokens_computed == 2 * r.prompt_tokens + r.recompute_tokens for r in once)


def _run_until(model: BatchingModel, now: float, done: Callable[[], bool]) -> float:
    while not done():
        plan = model.plan_step(now)
        now += plan.duration
        model.finish_step(plan, now)
    return now


def test_a_preempted_request_keeps_its_output_and_recomputes_it_with_the_prompt() -> None:
    # 5 usable blocks of 16 tokens (vLLM keeps one of the 6 as its null block).
    profile = _with_args(
        resolve_profile("stable"), num_gpu_blocks_override=6, block_size=16, enable_prefix_caching=False
    )
    model = BatchingModel(profile)
    first, second = SimRequest("first", 30, 40, 0.0), SimRequest("second", 30, 40, 0.0)
    model.add(first)
    model.add(second)
    # Each takes 2 blocks for its prompt; the fifth block goes to the first one to cross 32 tokens;
    # the next crossing needs a block that is not there: the most recently admitted one is preempted.
    now = _run_until(model, 0.0, lambda: second.preemptions > 0)
    assert second.generated > 1 and second.recompute_tokens == second.generated and second.blocks == 0
    kept, last_token = second.generated, second.last_token_at
    assert last_token is not None
    now = _run_until(model, now, lambda: second.computed_tokens == second.prefill_target)
    # The step that finished the recompute sampled the token after the kept output; the wait was one gap.
    assert second.generated == kept + 1 and second.prompt_tokens_computed == 30 + 30 + kept
    assert second.inter_token_latencies[-1] == pytest.approx(now - last_token)
    _run_until(model, now, lambda: second.finished)
    assert second.generated == 40 and len(second.inter_token_latencies) == 39
    assert first.finished and first.preemptions == 0


def test_the_null_block_is_never_used_and_usage_counts_the_others() -> None:
    profile = _with_args(resolve_profile("stable"), num_gpu_blocks_override=6, block_size=16)
    model = BatchingModel(profile)
    assert model.num_blocks == 5
    with pytest.raises(RequestRejected, match="has 5"):
        model.check(90, 1)  # 91 tokens want 6 blocks
    model.add(SimRequest("r", 40, 5, 0.0))
    plan = model.plan_step(0.0)
    model.finish_step(plan, plan.duration)
    assert model.kv_cache_usage == pytest.approx(3 / 5)  # 41 tokens in 3 blocks


def test_ample_kv_cache_never_preempts() -> None:
    requests = simulate(resolve_profile("stable"), [Arrival(0.001 * i, 40, 60) for i in range(8)])
    assert sum(r.preemptions for r in requests) == 0


def test_kv_capacity_comes_from_memory_and_doubles_with_fp8() -> None:
    stable = resolve_profile("stable")
    fp8 = _with_args(stable, kv_cache_dtype="fp8")
    # (80 GiB * 0.9 - 16 - 2) / (128 KiB * 16 tokens) blocks
    assert stable.num_gpu_blocks() == int((80 * 0.9 - 18) * 1024**3 // (131072 * 16))
    assert fp8.num_gpu_blocks() == 2 * stable.num_gpu_blocks()
    assert _with_args(stable, num_gpu_blocks_override=7).num_gpu_blocks() == 7


def test_prefix_caching_skips_cached_prompt_tokens() -> None:
    on = simulate(resolve_profile("stable"), [Arrival(0.0, 1000, 1)])[0]
    off = simulate(_with_args(resolve_profile("stable"), enable_prefix_caching=False), [Arrival(0.0, 1000, 1)])[0]
    assert on.cached_tokens == 112 and off.cached_tokens == 0  # 12% rounded down to whole blocks
    assert on.prompt_tokens_computed == 888 and off.prompt_tokens_computed == 1000


def test_priority_scheduling_admits_the_lowest_priority_value_first() -> None:
    profile = _with_args(resolve_profile("stable"), max_num_seqs=1, scheduling_policy="priority")
    requests = simulate(
        profile,
        [
            Arrival(0.0, 10, 10, priority=0),
            Arrival(0.001, 10, 10, priority=5),
            Arrival(0.002, 10, 10, priority=-1),
        ],
    )
    low, high, urgent = requests
    assert low.finished_at is not None and urgent.finished_at is not None and high.finished_at is not None
    assert low.finished_at < urgent.finished_at < high.finished_at


def test_requests_longer_than_the_model_are_rejected() -> None:
    model = BatchingModel(resolve_profile("stable"))
    with pytest.raises(RequestRejected, match="maximum context length is 8192"):
        model.check(8000, 500)


def test_engine_metrics_count_every_request() -> None:
    fast = resolve_profile("stable").model_copy(
        update={"hardware": resolve_profile("stable").hardware.model_copy(update={"decode_step_base_s": 0.001})}
    )

    async def run() -> ReplicaEngine:
        engine = ReplicaEngine(fast, "m")
        engine.start()
        try:
            await asyncio.gather(*(engine.generate(10 + i, 3) for i in range(12)))
        finally:
            await engine.stop()
        return engine

    engine = asyncio.run(run())
    labels = {"model_name": "m", "engine": "0"}
    value = engine.registry.get_sample_value
    assert value("vllm:e2e_request_latency_seconds_count", labels) == 12
    assert value("vllm:request_success_total", {**labels, "finished_reason": "length"}) == 12
    assert value("vllm:generation_tokens_total", labels) == 36
    assert value("vllm:request_prompt_tokens_sum", labels) == sum(10 + i for i in range(12))
    assert value("vllm:inter_token_latency_seconds_count", labels) == 24
    assert value("vllm:num_requests_running", labels) == 0
    assert value("vllm:kv_cache_usage_perc", labels) == 0
