"""vLLM 0.32's /metrics families (names, help, labels, buckets as in tests/fixtures/vllm-0.32-cpu-metrics.txt)
and the DCGM exporter's HBM gauges, on a per-replica CollectorRegistry."""

from __future__ import annotations

import collections
import uuid
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tailguard.serving.tier.batching import SimRequest, StepOutcome
from tailguard.serving.tier.profiles import EngineProfile

MIB = 1024**2
GIB = 1024**3

LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
TOKEN_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)
ITERATION_TOKEN_BUCKETS = (
    1.0,
    8.0,
    16.0,
    32.0,
    64.0,
    128.0,
    256.0,
    512.0,
    1024.0,
    2048.0,
    4096.0,
    8192.0,
    16384.0,
)
N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
PREEMPTION_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")

_BASE = ["model_name", "engine"]


class VllmMetrics:
    """The engine-level vLLM metrics of one replica (engine="0")."""

    def __init__(self, registry: CollectorRegistry, model_name: str):
        self.labels = {"model_name": model_name, "engine": "0"}
        r = registry

        def hist(name: str, doc: str, buckets: Iterable[float]) -> Histogram:
            return Histogram(name, doc, _BASE, buckets=tuple(buckets), registry=r)

        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", _BASE, registry=r
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", _BASE, registry=r
        )
        self.waiting_by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
            "Sum of all reasons equals vllm:num_requests_waiting.",
            [*_BASE, "reason"],
            registry=r,
        )
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", _BASE, registry=r
        )
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            _BASE,
            registry=r,
        )
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            _BASE,
            registry=r,
        )
        self.preemptions = Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", _BASE, registry=r
        )
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", _BASE, registry=r)
        self.prompt_tokens_cached = Counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            _BASE,
            registry=r,
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", _BASE, registry=r
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*_BASE, "finished_reason"],
            registry=r,
        )
        self.request_prompt_tokens = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_BUCKETS
        )
        self.request_generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", TOKEN_BUCKETS
        )
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        )
        self.max_generation_tokens = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            TOKEN_BUCKETS,
        )
        self.params_n = hist("vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS)
        self.params_max_tokens = hist(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", TOKEN_BUCKETS
        )
        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LATENCY_BUCKETS,
        )
        self.queue = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LATENCY_BUCKETS,
        )
        self.inference = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            LATENCY_BUCKETS,
        )
        self.prefill = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            LATENCY_BUCKETS,
        )
        self.decode = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            LATENCY_BUCKETS,
        )
        self.request_preemptions = hist(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            PREEMPTION_BUCKETS,
        )
        self.prefill_kv_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            TOKEN_BUCKETS,
        )
        # Touch every labelled child so the page shows zeros before the first request, as vLLM does.
        for family in (
            self.running,
            self.waiting,
            self.kv_usage,
            self.prefix_queries,
            self.prefix_hits,
            self.preemptions,
            self.prompt_tokens,
            self.prompt_tokens_cached,
            self.generation_tokens,
        ):
            family.labels(**self.labels)
        for histogram in (
            self.request_prompt_tokens,
            self.request_generation_tokens,
            self.iteration_tokens,
            self.max_generation_tokens,
            self.params_n,
            self.params_max_tokens,
            self.ttft,
            self.itl,
            self.tpot,
            self.e2e,
            self.queue,
            self.inference,
            self.prefill,
            self.decode,
            self.request_preemptions,
            self.prefill_kv_computed,
        ):
            histogram.labels(**self.labels)
        for reason in FINISHED_REASONS:
            self.success.labels(**self.labels, finished_reason=reason)
        for waiting_reason in ("capacity", "deferred"):
            self.waiting_by_reason.labels(**self.labels, reason=waiting_reason)

    def set_queue_state(self, running: int, waiting: int, kv_usage: float) -> None:
        self.running.labels(**self.labels).set(running)
        self.waiting.labels(**self.labels).set(waiting)
        self.waiting_by_reason.labels(**self.labels, reason="capacity").set(waiting)
        self.kv_usage.labels(**self.labels).set(kv_usage)

    def observe_step(self, outcome: StepOutcome, prefix_queries: int, prefix_hits: int) -> None:
        plan = outcome.plan
        self.iteration_tokens.labels(**self.labels).observe(plan.num_tokens)
        prompt = sum(tokens for _, tokens in plan.prefill)
        if prompt:
            self.prompt_tokens.labels(**self.labels).inc(prompt)
        generated = len(plan.decode) + len(outcome.first_tokens)
        if generated:
            self.generation_tokens.labels(**self.labels).inc(generated)
        if plan.preempted:
            self.preemptions.labels(**self.labels).inc(plan.preempted)
        if prefix_queries:
            self.prefix_queries.labels(**self.labels).inc(prefix_queries)
        if prefix_hits:
            self.prefix_hits.labels(**self.labels).inc(prefix_hits)
            self.prompt_tokens_cached.labels(**self.labels).inc(prefix_hits)

    def observe_finished(self, request: SimRequest) -> None:
        """Per-request histograms, observed once when the request finishes (as vLLM does)."""
        assert request.finished_at is not None and request.finish_reason is not None
        labels = self.labels
        scheduled = request.first_scheduled_at if request.first_scheduled_at is not None else request.arrival
        first_token = request.first_token_at if request.first_token_at is not None else request.finished_at
        self.success.labels(**labels, finished_reason=request.finish_reason).inc()
        self.e2e.labels(**labels).observe(request.finished_at - request.arrival)
        self.queue.labels(**labels).observe(scheduled - request.arrival)
        self.inference.labels(**labels).observe(request.finished_at - scheduled)
        self.prefill.labels(**labels).observe(first_token - scheduled)
        self.decode.labels(**labels).observe(request.finished_at - first_token)
        self.ttft.labels(**labels).observe(first_token - request.arrival)
        for gap in request.inter_token_latencies:
            self.itl.labels(**labels).observe(gap)
        if request.generated > 1:
            self.tpot.labels(**labels).observe((request.finished_at - first_token) / (request.generated - 1))
        self.request_prompt_tokens.labels(**labels).observe(request.prompt_tokens)
        self.request_generation_tokens.labels(**labels).observe(request.generated)
        self.max_generation_tokens.labels(**labels).observe(request.max_tokens)
        self.params_max_tokens.labels(**labels).observe(request.max_tokens)
        self.params_n.labels(**labels).observe(1)
        self.request_preemptions.labels(**labels).observe(request.preemptions)
        self.prefill_kv_computed.labels(**labels).observe(request.prompt_tokens - request.cached_tokens)


class HbmModel:
    """DCGM HBM signals derived from the profile's memory budget and the engine's recent steps.

    FB_USED = weights + overhead + the KV pool vLLM preallocates: flat at gpu_memory_utilization of the
    CUDA-visible framebuffer from start-up, busy or idle, as measured on an H200 (the ratio stayed 0.900 while
    decoding inside a 0.9 pool: tests/fixtures/dcgm/h200-2026-12-04/; vLLM sizes the pool after profiling
    the activation peak, so activations live inside the budget). FB_RESERVED is the driver's share, neither
    used nor free. DRAM_ACTIVE = bytes the recent steps read
    (weights once per step plus the KV of the tokens in use) over what the HBM bandwidth could move in
    the last `window_s` seconds, so it rises with load and with KV-cache usage and falls to 0 when idle.
    """

    def __init__(self, profile: EngineProfile, now: Callable[[], float], window_s: float = 2.0):
        self.profile = profile
        self.now = now
        self.window_s = window_s
        self._steps: collections.deque[tuple[float, float]] = collections.deque()  # (ended_at, bytes read)
        kv_pool = profile.num_gpu_blocks() * profile.engineArgs.block_size * profile.kv_bytes_per_token()
        self.static_bytes = (profile.weight_gib_per_gpu() + profile.hardware.overhead_gib) * GIB + kv_pool

    def record_step(self, ended_at: float, kv_tokens_in_use: int) -> None:
        read = self.profile.weight_gib_per_gpu() * GIB + kv_tokens_in_use * self.profile.kv_bytes_per_token()
        self._steps.append((ended_at, read))
        self._trim(ended_at)

    def _trim(self, now: float) -> None:
        while self._steps and self._steps[0][0] < now - self.window_s:
            self._steps.popleft()

    def fb_used_mib(self) -> float:
        return min(self.profile.hardware.hbm_gib * GIB, self.static_bytes) / MIB

    def fb_free_mib(self) -> float:
        return max(0.0, self.profile.hardware.hbm_gib * GIB / MIB - self.fb_used_mib())

    def dram_active(self) -> float:
        self._trim(self.now())
        moved = sum(read for _, read in self._steps)
        capacity = self.profile.hardware.hbm_bandwidth_gbps * 1e9 * self.window_s
        return min(1.0, moved / capacity)


class DcgmCollector(Collector):
    """DCGM exporter gauges with its usual labels (gpu, UUID, device, modelName, Hostname), one per GPU."""

    def __init__(self, hbm: HbmModel, hostname: str):
        self.hbm = hbm
        self.hostname = hostname
        gpus = hbm.profile.engineArgs.tensor_parallel_size
        self.gpus = [(str(i), f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{hostname}/{i}')}") for i in range(gpus)]

    def collect(self) -> Iterable[Metric]:
        names = ["gpu", "UUID", "device", "modelName", "Hostname"]
        model = self.hbm.profile.hardware.gpu_model
        used = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=names)
        free = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=names)
        reserved = GaugeMetricFamily("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", labels=names)
        active = GaugeMetricFamily(
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "Ratio of cycles the device memory interface is active sending or receiving data.",
            labels=names,
        )
        used_mib, free_mib, dram = self.hbm.fb_used_mib(), self.hbm.fb_free_mib(), self.hbm.dram_active()
        for gpu, gpu_uuid in self.gpus:
            values = [gpu, gpu_uuid, f"nvidia{gpu}", model, self.hostname]
            used.add_metric(values, round(used_mib))
            free.add_metric(values, round(free_mib))
            reserved.add_metric(values, round(self.hbm.profile.hardware.fb_reserved_mib))
            active.add_metric(values, dram)
        return [used, free, reserved, active]
