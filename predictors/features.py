"""The SLA model's features and SLIs: batched PromQL shared by training (range queries) and serving (instant).

Every feature is ONE query for every target at once: it aggregates `by ({{ by }})`, the policy's target
labels, and selects with `{{ selector }}`, the policy's equality matchers (tailguard.controller.kit.templating escapes
them). A query only reads samples at or before its evaluation time, so a feature evaluated at t uses
only data available at prediction time t. Metric names are those of vLLM 0.32
(tests/fixtures/vllm-0.32-cpu-metrics.txt), the tier's router (serving/tier/router.py) and the DCGM exporter.

The three SLIs (one per SLA dimension; docs/sla-model.md):
- cpu: P99 of vllm:request_queue_time_seconds over 1m (scheduling: time spent WAITING);
- gpu: P99 of vllm:request_inference_time_seconds over 1m (RUNNING = prefill + decode);
- network: P99 over 1m of router-observed latency minus the engine exchange, per request
  (tailguard_router_proxy_overhead_seconds, serving/tier/router.py).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tailguard.controller.core.model import SignalResult, TargetKey
from tailguard.controller.kit.templating import render_query


@dataclass(frozen=True)
class FeatureSpec:
    name: str
    query: str  # PromQL template with {{ selector }} and {{ by }}
    description: str


def _quantile(q: float, metric: str, window: str = "1m", offset: str = "") -> str:
    shift = f" offset {offset}" if offset else ""
    return (
        f"histogram_quantile({q}, sum by (le, {{{{ by }}}})"
        f" (rate({metric}_bucket{{ {{{{ selector }}}} }}[{window}]{shift})))"
    )


def _over(function: str, expression: str, window: str) -> str:
    # A subquery evaluates `expression` every scrape interval in the window before t (never after it).
    return f"{function}(({expression})[{window}:15s])"


def _ratio(numerator: str, denominator: str) -> str:
    return f"(sum by ({{{{ by }}}}) ({numerator}) / sum by ({{{{ by }}}}) ({denominator}))"


def _rate(metric: str, window: str) -> str:
    return f"rate({metric}{{ {{{{ selector }}}} }}[{window}])"


def _agg(how: str, expression: str) -> str:
    return f"{how} by ({{{{ by }}}}) ({expression})"


def _cumulative_entropy(metric: str, window: str = "5m") -> str:
    # Entropy needs per-bucket shares, which PromQL cannot difference out of cumulative buckets. The
    # cumulative entropy sum_le H(F(le)) (H = binary entropy, F = share of prompts <= le) is computable in
    # one query and measures the same thing: 0 when every prompt falls in one bucket, larger as they spread.
    share = (
        f"clamp(sum by (le, {{{{ by }}}}) (rate({metric}_bucket{{ {{{{ selector }}}} }}[{window}]))"
        f" / ignoring(le) group_left sum by ({{{{ by }}}}) (rate({metric}_count{{ {{{{ selector }}}} }}[{window}])),"
        " 0.000001, 0.999999)"
    )
    return f"sum by ({{{{ by }}}}) (-({share}) * ln({share}) - (1 - ({share})) * ln(1 - ({share})))"


CPU_SLI = _quantile(0.99, "vllm:request_queue_time_seconds")
GPU_SLI = _quantile(0.99, "vllm:request_inference_time_seconds")
# Per request, the router observes its latency minus the upstream exchange with the engine
# (serving/tier/router.py); the P99 of that difference is the network SLI. A difference of two P99s (router P99
# minus engine P99) is not a quantile of anything and goes far negative under overload, so it is only a feature.
NETWORK_SLI = _quantile(0.99, "tailguard_router_proxy_overhead_seconds")
ROUTER_MINUS_ENGINE_P99 = (
    f"({_quantile(0.99, 'tailguard_router_request_duration_seconds')})"
    f" - ({_quantile(0.99, 'vllm:e2e_request_latency_seconds')})"
)
# The SLI of each SLA dimension: a breach is SLI > threshold (seconds).
SLI_QUERIES: dict[str, str] = {"cpu": CPU_SLI, "gpu": GPU_SLI, "network": NETWORK_SLI}
DEFAULT_SLI_THRESHOLDS: dict[str, float] = {"cpu": 1.0, "gpu": 20.0, "network": 0.5}

_OVERHEAD_MEAN = _ratio(
    _rate("tailguard_router_proxy_overhead_seconds_sum", "30s"),
    _rate("tailguard_router_proxy_overhead_seconds_count", "30s"),
)

_ITL_MEAN_30S = _ratio(
    _rate("vllm:inter_token_latency_seconds_sum", "30s"), _rate("vllm:inter_token_latency_seconds_count", "30s")
)

# Prometheus' synthetic `up` of every vLLM replica target (the tier's SD labels them with `replica`).
_UP = 'up{ replica!="", {{ selector }} }'
_SEQ_LIMIT = 'tailguard_serving_engine_arg{ arg="max_num_seqs", {{ selector }} }'


# -- load against capacity (issue 27). vLLM counts requests when they finish; arrivals are not exported. By
# conservation, arrivals = completions + the growth of the requests in the engine (running + waiting), so the
# arrival rate is read from two series every vLLM exports, and it moves as soon as arrivals outrun completions,
# before the batch fills and anyone queues. A replica's capacity is Little's law at a full batch: max_num_seqs
# (the tier's tailguard_serving_engine_arg) over the mean time a request spends running; an estimate (time in the
# engine grows with the batch), which is why the models also see the raw parts. Absent parts give NaN (no-data),
# never 0: without the engine-arg series every capacity feature is missing, not an idle tier.
_IN_ENGINE = (
    "(sum by ({{ by }}) (vllm:num_requests_running{ {{ selector }} })"
    " + sum by ({{ by }}) (vllm:num_requests_waiting{ {{ selector }} }))"
)
_REPLICAS = "count by ({{ by }}) (vllm:num_requests_running{ {{ selector }} })"
ARRIVAL_RATE = f"({_agg('sum', _rate('vllm:request_success_total', '1m'))} + {_over('deriv', _IN_ENGINE, '1m')})"
ARRIVAL_FORECAST_60S = f"predict_linear(({ARRIVAL_RATE})[3m:15s], 60)"
_ENGINE_TIME = _ratio(
    _rate("vllm:request_inference_time_seconds_sum", "5m"), _rate("vllm:request_inference_time_seconds_count", "5m")
)
REPLICA_CAPACITY = f"({_agg('min', _SEQ_LIMIT)} / {_ENGINE_TIME})"
_TIER_CAPACITY = f"({_REPLICAS} * {REPLICA_CAPACITY})"

CAPACITY_FEATURES: tuple[FeatureSpec, ...] = (
    FeatureSpec(
        "arrival_rate",
        ARRIVAL_RATE,
        "requests arriving per second: finished over 1m plus the growth of running + waiting over 1m (least "
        "squares); vLLM exports no arrival counter, and this moves before the queue does",
    ),
    FeatureSpec(
        "arrival_rate_forecast_60s",
        ARRIVAL_FORECAST_60S,
        "the arrival rate one minute ahead: its linear trend over the last 3 minutes (predict_linear)",
    ),
    FeatureSpec(
        "replica_capacity_rps",
        REPLICA_CAPACITY,
        "requests per second one replica finishes at a full batch, by Little's law: the smallest listed "
        "max_num_seqs over the mean running time of the requests finished in the last 5m",
    ),
    FeatureSpec(
        "utilisation",
        f"{ARRIVAL_RATE} / {_TIER_CAPACITY}",
        "arrival rate over the serving replicas' capacity (replicas x replica_capacity_rps); above 1 the queue grows",
    ),
    FeatureSpec(
        "utilisation_forecast_60s",
        f"{ARRIVAL_FORECAST_60S} / {_TIER_CAPACITY}",
        "the arrival rate one minute ahead over today's capacity: a surge the current replicas cannot absorb",
    ),
    FeatureSpec(
        "batch_fill",
        f"{_agg('avg', 'vllm:num_requests_running{ {{ selector }} }')} / {_agg('min', _SEQ_LIMIT)}",
        "mean running requests per replica over the smallest listed max_num_seqs: at 1 the next arrival queues",
    ),
    FeatureSpec(
        "expected_wait_forecast_60s",
        f"({_agg('sum', 'vllm:num_requests_waiting{ {{ selector }} }')}"
        f" + 60 * clamp_min({ARRIVAL_FORECAST_60S} - {_TIER_CAPACITY}, 0)) / {_TIER_CAPACITY}",
        "Little's law one minute ahead: the queue then (waiting now plus a minute of forecast arrivals beyond "
        "capacity) over the rate the tier drains it, in seconds a request joining then can expect to wait",
    ),
)


def _by_version(how: str, expression: str) -> str:
    return _agg(how, expression).replace("by (", "by (version, ", 1)


FEATURES: tuple[FeatureSpec, ...] = (
    FeatureSpec(
        "request_rate",
        _agg("sum", _rate("vllm:request_success_total", "1m")),
        "finished requests per second over 1m (all finished reasons)",
    ),
    FeatureSpec(
        "request_surge_ratio",
        f"{_agg('sum', _rate('vllm:request_success_total', '1m'))}"
        f" / {_agg('sum', _rate('vllm:request_success_total', '10m'))}",
        "request rate over 1m divided by the rate over 10m: > 1 while load is rising",
    ),
    FeatureSpec(
        "prompt_token_entropy",
        _cumulative_entropy("vllm:request_prompt_tokens"),
        "spread of the prompt-length distribution over 5m: cumulative entropy sum_le H(F(le)) of the "
        "vllm:request_prompt_tokens histogram (0 = all prompts in one bucket)",
    ),
    FeatureSpec(
        "mean_prompt_tokens",
        _ratio(_rate("vllm:request_prompt_tokens_sum", "5m"), _rate("vllm:request_prompt_tokens_count", "5m")),
        "mean prompt length (tokens) of the requests finished in the last 5m",
    ),
    FeatureSpec(
        "mean_output_tokens",
        _ratio(_rate("vllm:request_generation_tokens_sum", "5m"), _rate("vllm:request_generation_tokens_count", "5m")),
        "mean generated length (tokens) of the requests finished in the last 5m",
    ),
    FeatureSpec(
        "queue_waiting", _agg("sum", "vllm:num_requests_waiting{ {{ selector }} }"), "requests waiting, all replicas"
    ),
    FeatureSpec(
        "queue_running", _agg("sum", "vllm:num_requests_running{ {{ selector }} }"), "requests running, all replicas"
    ),
    FeatureSpec(
        "waiting_per_replica",
        _agg("avg", "vllm:num_requests_waiting{ {{ selector }} }"),
        "mean waiting requests per replica",
    ),
    FeatureSpec(
        "kv_cache_usage",
        _agg("max", "vllm:kv_cache_usage_perc{ {{ selector }} }"),
        "KV-cache usage (0..1) of the fullest replica",
    ),
    FeatureSpec(
        "kv_cache_slope",
        _agg("max", "deriv(vllm:kv_cache_usage_perc{ {{ selector }} }[2m])"),
        "fastest-growing replica's KV-cache usage slope (per second, least squares over 2m)",
    ),
    FeatureSpec(
        "preemption_rate",
        _agg("sum", _rate("vllm:num_preemptions_total", "1m")),
        "preemptions per second over 1m (KV cache exhausted, sequences recomputed)",
    ),
    FeatureSpec(
        "prefix_cache_hit_ratio",
        _ratio(_rate("vllm:prefix_cache_hits_total", "5m"), _rate("vllm:prefix_cache_queries_total", "5m")),
        "share of queried prompt tokens found in the prefix cache over 5m",
    ),
    FeatureSpec("ttft_p90", _quantile(0.9, "vllm:time_to_first_token_seconds"), "P90 time to first token over 1m"),
    FeatureSpec("itl_p90", _quantile(0.9, "vllm:inter_token_latency_seconds"), "P90 inter-token latency over 1m"),
    FeatureSpec("queue_time_p99", CPU_SLI, "current CPU SLI: P99 queue time over 1m"),
    FeatureSpec("inference_time_p99", GPU_SLI, "current GPU SLI: P99 inference (prefill + decode) time over 1m"),
    FeatureSpec("prefill_time_p99", _quantile(0.99, "vllm:request_prefill_time_seconds"), "P99 prefill time, 1m"),
    FeatureSpec("decode_time_p99", _quantile(0.99, "vllm:request_decode_time_seconds"), "P99 decode time, 1m"),
    FeatureSpec("e2e_p99", _quantile(0.99, "vllm:e2e_request_latency_seconds"), "P99 engine end-to-end latency"),
    FeatureSpec(
        "network_overhead_p99", NETWORK_SLI, "current network SLI: P99 of router latency minus upstream time, 1m"
    ),
    FeatureSpec(
        "router_minus_engine_p99",
        ROUTER_MINUS_ENGINE_P99,
        "router-observed P99 latency minus engine-reported P99 end-to-end latency, 1m",
    ),
    FeatureSpec(
        "replicas",
        _agg("count", "vllm:num_requests_running{ {{ selector }} }"),
        "replicas scraped (one vllm:num_requests_running series each)",
    ),
    FeatureSpec(
        "hbm_used_ratio",
        _ratio(
            "DCGM_FI_DEV_FB_USED{ {{ selector }} }",
            "DCGM_FI_DEV_FB_USED{ {{ selector }} } + DCGM_FI_DEV_FB_FREE{ {{ selector }} }",
        ),
        "HBM used / total (DCGM; absent without a GPU exporter -> NaN)",
    ),
    FeatureSpec(
        "dram_active",
        _agg("max", "DCGM_FI_PROF_DRAM_ACTIVE{ {{ selector }} }"),
        "busiest GPU's DRAM activity ratio (DCGM; absent without a GPU exporter -> NaN)",
    ),
    FeatureSpec(
        "process_cpu",
        _agg("sum", _rate("process_cpu_seconds_total", "1m")),
        "CPU seconds per second used by the serving processes (scheduler/tokenizer pressure)",
    ),
    FeatureSpec(
        "network_jitter",
        f"stddev_over_time(({_OVERHEAD_MEAN})[5m:15s])",
        "standard deviation over 5m of the router's mean proxy overhead (30s means, every 15s)",
    ),
    # -- trends, recent extremes and lags: what the next horizon is likely to bring (issue 5, round 2) --
    FeatureSpec(
        "queue_time_p99_max_1m",
        _over("max_over_time", CPU_SLI, "1m"),
        "highest CPU SLI over the last minute (what persistence knows)",
    ),
    FeatureSpec("queue_time_p99_slope", _over("deriv", CPU_SLI, "2m"), "CPU SLI slope over 2m (s per s)"),
    FeatureSpec(
        "queue_time_p99_1m_ago",
        _quantile(0.99, "vllm:request_queue_time_seconds", offset="1m"),
        "CPU SLI one minute ago (lag)",
    ),
    FeatureSpec(
        "inference_time_p99_max_1m",
        _over("max_over_time", GPU_SLI, "1m"),
        "highest GPU SLI over the last minute",
    ),
    FeatureSpec("inference_time_p99_slope", _over("deriv", GPU_SLI, "2m"), "GPU SLI slope over 2m (s per s)"),
    FeatureSpec(
        "inference_time_p99_1m_ago",
        _quantile(0.99, "vllm:request_inference_time_seconds", offset="1m"),
        "GPU SLI one minute ago (lag)",
    ),
    FeatureSpec(
        "network_overhead_p99_max_1m",
        _over("max_over_time", NETWORK_SLI, "1m"),
        "highest network SLI over the last minute",
    ),
    FeatureSpec("network_overhead_p99_slope", _over("deriv", NETWORK_SLI, "2m"), "network SLI slope over 2m"),
    FeatureSpec(
        "network_overhead_mean_30s",
        _OVERHEAD_MEAN,
        "mean router proxy overhead over the last 30s (reacts before the 1m P99)",
    ),
    FeatureSpec(
        "queue_waiting_slope",
        _over("deriv", _agg("sum", "vllm:num_requests_waiting{ {{ selector }} }"), "1m"),
        "growth of the waiting queue over 1m (requests per second)",
    ),
    FeatureSpec(
        "queue_waiting_max_1m",
        _over("max_over_time", _agg("sum", "vllm:num_requests_waiting{ {{ selector }} }"), "1m"),
        "longest waiting queue over the last minute",
    ),
    FeatureSpec(
        "request_rate_per_replica",
        f"{_agg('sum', _rate('vllm:request_success_total', '1m'))}"
        f" / {_agg('count', 'vllm:num_requests_running{ {{ selector }} }')}",
        "finished requests per second per replica over 1m (load against capacity)",
    ),
    FeatureSpec(
        "request_surge_ratio_short",
        f"{_agg('sum', _rate('vllm:request_success_total', '30s'))}"
        f" / {_agg('sum', _rate('vllm:request_success_total', '5m'))}",
        "request rate over 30s divided by the rate over 5m (a faster surge signal)",
    ),
    FeatureSpec(
        "request_rate_slope",
        _over("deriv", _agg("sum", _rate("vllm:request_success_total", "1m")), "2m"),
        "acceleration of the request rate over 2m (requests per second per second)",
    ),
    FeatureSpec(
        "kv_cache_usage_max_1m",
        _over("max_over_time", _agg("max", "vllm:kv_cache_usage_perc{ {{ selector }} }"), "1m"),
        "highest KV-cache usage of any replica over the last minute",
    ),
    FeatureSpec(
        "mean_output_tokens_1m",
        _ratio(_rate("vllm:request_generation_tokens_sum", "1m"), _rate("vllm:request_generation_tokens_count", "1m")),
        "mean generated length of the requests finished in the last minute (engine time grows with it)",
    ),
    FeatureSpec(
        "itl_p90_slope",
        _over("deriv", _quantile(0.9, "vllm:inter_token_latency_seconds"), "2m"),
        "inter-token latency P90 slope over 2m (engine slowing down)",
    ),
    FeatureSpec(
        "expected_queue_wait",
        f"{_agg('sum', 'vllm:num_requests_waiting{ {{ selector }} }')}"
        f" / {_agg('sum', _rate('vllm:request_success_total', '1m'))}",
        "requests waiting divided by the rate they finish at (Little's law): seconds a request now joining the "
        "queue can expect to wait; the queue-time SLI only sees a wait once that request has finished",
    ),
    FeatureSpec(
        "expected_inference_time",
        f"histogram_quantile(0.99, sum by (le, {{{{ by }}}}) (rate(vllm:request_generation_tokens_bucket"
        f"{{ {{{{ selector }}}} }}[5m]))) * {_ITL_MEAN_30S}",
        "P99 output length (5m) times the mean inter-token latency of the last 30s: the engine time a long "
        "request running now will take, before the GPU SLI (finished requests) shows it",
    ),
    FeatureSpec(
        "running_per_replica",
        _agg("avg", "vllm:num_requests_running{ {{ selector }} }"),
        "mean running requests per replica (batch size: inter-token latency grows with it)",
    ),
    FeatureSpec(
        "youngest_replica_samples_10m",
        _agg("min", "count_over_time(vllm:num_requests_running{ {{ selector }} }[10m])"),
        "scrapes of the youngest replica in the last 10m: small right after a rollout or scale-up",
    ),
    FeatureSpec(
        "versions",
        _agg("count", _agg("count", "vllm:num_requests_running{ {{ selector }} }").replace("by (", "by (version, ", 1)),
        "versions serving at once (> 1 while a rollout drains the old one)",
    ),
    # -- the tier's replicas before they take traffic (issue 5, round 3). A new replica is listed by the tier's
    # service discovery at once, but vLLM answers /health (and /metrics) only after 17-48 s, and the shadow
    # warm-up keeps it out of rotation a few seconds more: Prometheus' own `up` series shows a rollout or a
    # scale-up up to a minute before the new replicas serve. `replica!=""` keeps the router's target out.
    FeatureSpec(
        "replicas_starting",
        _agg("sum", f"{_UP} == bool 0"),
        "replicas listed by the tier's service discovery whose vLLM does not answer yet (up 0): capacity or a "
        "new version that will take traffic within about a minute",
    ),
    FeatureSpec(
        "versions_starting",
        _agg("sum", f"({_by_version('max', _UP)}) == bool 0"),
        "versions none of whose replicas is up yet: a rollout (or rollback) in its start-up",
    ),
    FeatureSpec(
        "versions_listed",
        _agg("count", _by_version("count", _UP)),
        "versions with a target in service discovery, started or not (> versions while a new one starts)",
    ),
    FeatureSpec(
        "newest_version_samples_10m",
        _agg("min", _by_version("max", f"count_over_time({_UP}[10m])")),
        "scrapes since the newest version's first replica was listed, starting included (capped at 10m = 40): "
        "the age of the last rollout, unlike youngest_replica_samples_10m which a scale-up resets too",
    ),
    FeatureSpec(
        "hbm_used_ratio_min",
        _agg(
            "min",
            "DCGM_FI_DEV_FB_USED{ {{ selector }} } / (DCGM_FI_DEV_FB_USED{ {{ selector }} }"
            " + DCGM_FI_DEV_FB_FREE{ {{ selector }} })",
        ),
        "HBM used / total of the emptiest GPU: vLLM preallocates its KV-cache pool at start, so a replica whose "
        "KV cache is small (a bad num_gpu_blocks_override) shows it while it warms up, before it takes traffic",
    ),
    FeatureSpec(
        "youngest_target_samples_10m",
        _agg("min", f"count_over_time({_UP}[10m])"),
        "scrapes of the youngest replica target in the last 10m, starting included (a scale-up or rollout)",
    ),
    # -- the listed replicas' scheduler limits (issue 5, round 4). vLLM does not export max_num_seqs; the tier
    # does, for every replica it lists, from the moment it lists it (serving/tier/engine_args_metric.py). A rollout
    # whose limit cannot hold the sequences the current replicas carry queues as soon as it takes traffic.
    FeatureSpec(
        "seq_limit_min",
        _agg("min", _SEQ_LIMIT),
        "smallest max_num_seqs among the replicas the tier lists, starting ones included",
    ),
    FeatureSpec(
        "load_over_seq_limit",
        f"(({_agg('sum', 'vllm:num_requests_running{ {{ selector }} }')}"
        f" + {_agg('sum', 'vllm:num_requests_waiting{ {{ selector }} }')})"
        f" / {_agg('count', 'vllm:num_requests_running{ {{ selector }} }')}) / {_agg('min', _SEQ_LIMIT)}",
        "sequences per serving replica (running + waiting) over the smallest listed max_num_seqs: above 1, a "
        "replica with that limit queues at today's load (a bad rollout, before it takes traffic)",
    ),
    # -- round 5: the CPU SLI is the tail of the queue-time histogram, set by the few slowest requests of a
    # minute; its median says whether the whole queue is backing up or one request was unlucky.
    FeatureSpec(
        "queue_time_p50",
        _quantile(0.5, "vllm:request_queue_time_seconds"),
        "median queue time over 1m (same histogram as the CPU SLI): broad queueing, not one slow request",
    ),
    # -- round 6 (issue 27): load against capacity, and where it is heading. The queue and its SLI move only once
    # the batch is full; these move with the arrivals (`capacity_features`).
    *CAPACITY_FEATURES,
)


def feature_names() -> list[str]:
    return [spec.name for spec in FEATURES]


def feature_hash(names: Sequence[str] | None = None) -> str:
    """sha256 over the ordered feature names and their query texts: a model trained on other features mismatches."""
    by_name = {spec.name: spec for spec in FEATURES}
    chosen = list(names) if names is not None else feature_names()
    digest = hashlib.sha256()
    for name in chosen:
        spec = by_name.get(name)
        if spec is None:
            raise KeyError(f"unknown feature {name!r}; expected one of {', '.join(by_name)}")
        digest.update(name.encode())
        digest.update(b"\x00")
        digest.update(spec.query.encode())
        digest.update(b"\x00")
    return digest.hexdigest()


def render(template: str, match: Mapping[str, str], group_by: Sequence[str]) -> str:
    return render_query(template, match=match, group_by=list(group_by), variables={})


def feature_queries(match: Mapping[str, str], group_by: Sequence[str]) -> dict[str, str]:
    """The rendered PromQL of every feature, by feature name: one query per feature for all targets."""
    return {spec.name: render(spec.query, match, group_by) for spec in FEATURES}


def sli_queries(match: Mapping[str, str], group_by: Sequence[str]) -> dict[str, str]:
    """The rendered PromQL of each dimension's SLI, by dimension."""
    return {dimension: render(query, match, group_by) for dimension, query in SLI_QUERIES.items()}


def feature_matrix(results: Mapping[str, SignalResult], targets: Sequence[TargetKey]) -> npt.NDArray[np.float64]:
    """(n_targets, n_features) in FEATURES order; NaN where a feature is missing, errored or not finite."""
    matrix = np.full((len(targets), len(FEATURES)), np.nan, dtype=np.float64)
    for column, spec in enumerate(FEATURES):
        result = results.get(spec.name)
        if result is None or result.error is not None:
            continue
        for row, target in enumerate(targets):
            value = result.values.get(target)
            if value is not None and math.isfinite(value):
                matrix[row, column] = value
    return matrix
