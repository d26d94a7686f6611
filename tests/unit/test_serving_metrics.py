"""The simulator's /metrics page against a real vLLM 0.32 page (tests/fixtures/vllm-0.32-cpu-metrics.txt)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tailguard.serving.tier.profiles import resolve_profile
from tailguard.serving.tier.simulator import ReplicaEngine

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-0.32-cpu-metrics.txt"
REQUIRED = {
    "vllm:e2e_request_latency_seconds",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions",
    "vllm:request_success",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
}


def _shape(text: str) -> dict[str, tuple[str, str, frozenset[str], tuple[str, ...]]]:
    """family -> (type, help, label names without le, sorted bucket boundaries)."""
    shapes = {}
    for family in text_string_to_metric_families(text):
        labels = frozenset(k for s in family.samples for k in s.labels if k != "le")
        buckets = tuple(sorted({s.labels["le"] for s in family.samples if s.name.endswith("_bucket")}, key=float))
        shapes[family.name] = (family.type, family.documentation, labels, buckets)
    return shapes


def _simulator_page() -> str:
    async def run() -> str:
        engine = ReplicaEngine(resolve_profile("stable"), "tiny", hostname="chat-r1-0")
        engine.start()
        try:
            await asyncio.gather(*(engine.generate(30, 4) for _ in range(3)))
        finally:
            await engine.stop()
        return generate_latest(engine.registry).decode()

    return asyncio.run(run())


def test_vllm_families_match_the_real_page() -> None:
    real = _shape(FIXTURE.read_text())
    ours = _shape(_simulator_page())
    vllm = {name for name in ours if name.startswith("vllm:")}
    assert REQUIRED <= vllm
    for name in sorted(vllm):
        assert name in real, f"{name} is not on the real vLLM page"
        assert ours[name] == real[name], name


def test_finished_reasons_and_label_values_match() -> None:
    real = FIXTURE.read_text()
    page = _simulator_page()
    for reason in ("stop", "length", "abort", "error", "repetition"):
        assert f'finished_reason="{reason}"' in real
        assert f'finished_reason="{reason}"' in page
    samples = {s.name: s for f in text_string_to_metric_families(page) for s in f.samples}
    assert samples["vllm:e2e_request_latency_seconds_count"].labels == {"engine": "0", "model_name": "tiny"}
    assert samples["vllm:e2e_request_latency_seconds_count"].value == 3


def test_dcgm_hbm_gauges_follow_the_profile() -> None:
    families = {f.name: f for f in text_string_to_metric_families(_simulator_page())}
    used = families["DCGM_FI_DEV_FB_USED"].samples[0]
    free = families["DCGM_FI_DEV_FB_FREE"].samples[0]
    active = families["DCGM_FI_PROF_DRAM_ACTIVE"].samples[0]
    assert set(used.labels) == {"gpu", "UUID", "device", "modelName", "Hostname"}
    assert used.labels["Hostname"] == "chat-r1-0" and used.labels["UUID"].startswith("GPU-")
    assert used.value + free.value == 80 * 1024  # MiB of an 80 GiB device
    assert abs(used.value - 0.9 * 80 * 1024) < 64  # vLLM preallocates gpu_memory_utilization of HBM
    assert 0.0 < active.value <= 1.0  # the steps just run read weights and KV
