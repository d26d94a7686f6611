"""Reproducible training/evaluation data for the SLA model: the serving tier's model run in virtual time.

    python -m tailguard.serving.lab.dataset generate --seed 7 --hours 2 --out DIR [--start UNIX] [--trace conv|code]
    python -m tailguard.serving.lab.dataset generate --seed 7 --hours 2 --out DIR --backfill     # + TSDB blocks
    (promtool) python -m tailguard.serving.lab.dataset live --out DIR --minutes 10 [--rate-scale 2]         # real tier,
    real scrape

`generate` replays the Azure LLM inference trace (serving/lab/data/) through the tier's continuous-batching
model (tailguard.serving.tier.batching.BatchingModel, the same core the simulated vLLM replicas run) in VIRTUAL time, so
hours take minutes. A seeded scenario varies, segment by segment: load (ramps and surges of the trace's
rate), capacity (replicas 1-4), bad-config rollouts (profiles bad-max-num-seqs, small-kv-cache), network
delay and jitter injected at the router, and CPU contention (engine steps slowed by a factor). New replicas
(rollouts, scale-ups) start and warm up before they take traffic, as the tier's vLLM replicas do. Every
scrape interval it records what the real tier exposes: Prometheus' `up` of each replica target, each
replica's vLLM metrics (tailguard.serving.tier.vllm_metrics, same names, labels and buckets), DCGM HBM/DRAM gauges, a
process CPU counter, and the router's latency and proxy-overhead histograms, with the labels the tier's
service discovery adds (namespace, service, version, replica). The output is OpenMetrics
(`DIR/history.om`, byte-identical for a seed) plus `DIR/scenario.json`; `--backfill` turns it into
Prometheus TSDB blocks in `DIR/data` with promtool (tailguard.serving.lab.promstack.backfill_openmetrics) for a real
Prometheus to serve: `prometheus --storage.tsdb.path=DIR/data ...`.

`live` drives the real tier process (python -m tailguard.serving.tier) with the trace replayer in real time and a
real Prometheus scraping it, for spot checks of the virtual path; its data dir is left in DIR/data.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from prometheus_client import CollectorRegistry, Counter
from tqdm import tqdm

from tailguard.controller import ConfigError
from tailguard.serving.lab.load import BUILTIN_TRACES, TraceRequest, read_trace, run_replay
from tailguard.serving.lab.promstack import (
    ManagedProcess,
    ProcessNotReady,
    PrometheusServer,
    backfill_openmetrics,
    http_sd_scrape_config,
    static_scrape_config,
    write_prometheus_config,
)
from tailguard.serving.tier.batching import BatchingModel, RequestRejected, SimRequest
from tailguard.serving.tier.engine_args_metric import EngineArgCollector, ListedReplica
from tailguard.serving.tier.profiles import PROFILES_DIR, EngineProfile, load_profile
from tailguard.serving.tier.router import RouterMetrics
from tailguard.serving.tier.vllm_metrics import ITL_BUCKETS, DcgmCollector, HbmModel, VllmMetrics

DEFAULT_START = 1_767_225_600.0  # 2026-01-01T00:00:00Z: fixed, so the blocks are reproducible
SCRAPE_INTERVAL_S = 15.0
NAMESPACE = "llm"
SERVICE = "chat"
MODEL = "llama-3-8b-instruct"
TOKEN_SCALE = 0.25
# Families the features and SLIs read (tailguard.predictors.features); the rest of a vLLM page is not written.
RECORDED_PREFIXES = (
    "vllm:request_success",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions",
    "vllm:prefix_cache_",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:e2e_request_latency_seconds",
    "DCGM_FI_",
    "process_cpu_seconds",
    "tailguard_router_request_duration_seconds",
    "tailguard_router_proxy_overhead_seconds",
    "tailguard_router_requests",
    "tailguard_serving_engine_arg",
    "tailguard_router_upstream_errors",
)
PROFILE_CHOICES = (("stable", 0.72), ("bad-max-num-seqs", 0.1), ("small-kv-cache", 0.1), ("high-memory", 0.08))
# A new replica (rollout or scale-up) is not scrapable until its vLLM process answers /health: 17-48 s on this
# machine (the fidelity runs of the vLLM engine); Prometheus records `up 0` for its target meanwhile. Then the
# tier's shadow warm-up (health, models, metrics, 3 short completions) keeps it out of rotation a few seconds
# more while it already exports its metrics, with no traffic (serving/tier/warmup.py, serving/tier/server.py _sync).
STARTUP_S = (17.0, 48.0)
WARMUP_S = (2.0, 6.0)


class DatasetError(ConfigError, ValueError):
    """Bad arguments for the generator (one clear sentence)."""


# -- scenario --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """One stretch of the scenario; rate, contention and network delay ramp linearly from start to end."""

    start: float  # seconds since the scenario start
    end: float
    profile: str
    replicas: int
    rate_from: float
    rate_to: float
    contention_from: float
    contention_to: float
    delay_from: float  # router-added network delay, seconds
    delay_to: float
    jitter: float  # stdev of the added delay, seconds

    def at(self, t: float, low: float, high: float) -> float:
        share = 0.0 if self.end <= self.start else min(1.0, max(0.0, (t - self.start) / (self.end - self.start)))
        return low + (high - low) * share


def make_scenario(seed: int, duration_s: float, *, profile_change: float = 0.3) -> list[Segment]:
    """The seeded sequence of segments covering [0, duration_s).

    Each segment re-draws the engine profile with probability `profile_change` (from stable: a weighted
    draw of PROFILE_CHOICES, so most draws keep stable; from any other: back to stable). A larger value
    makes training data richer in rollouts; held-out data keep the default mix.

    Load is a multiple of the trace's own rate (~5 requests/s) per replica: 1.5-5x is 20-70% of a stable
    replica's capacity at TOKEN_SCALE; surges ramp to 7-12x (over capacity, so queues build over minutes).
    """
    rng = random.Random(seed)
    segments: list[Segment] = []
    t = 0.0
    replicas = 2
    rate = 3.0 * replicas
    profile = "stable"
    while t < duration_s:
        end = min(duration_s, t + rng.uniform(120.0, 360.0))
        if rng.random() < profile_change:
            profile = _weighted(rng, PROFILE_CHOICES) if profile == "stable" else "stable"
        if rng.random() < 0.3:
            replicas = rng.randint(1, 4)
        roll = rng.random()
        target = rng.uniform(7.0, 12.0) * replicas if roll < 0.3 else rng.uniform(1.5, 5.0) * replicas
        contention = (1.0, rng.uniform(2.0, 4.0)) if rng.random() < 0.15 else (1.0, 1.0)
        if rng.random() < 0.15:
            delay, jitter = (0.005, rng.uniform(0.4, 1.5)), rng.uniform(0.05, 0.3)
        else:
            delay, jitter = (0.005, 0.005), 0.002
        segments.append(Segment(t, end, profile, replicas, rate, target, *contention, *delay, jitter))
        rate = target
        t = end
    return segments


def _weighted(rng: random.Random, choices: Sequence[tuple[str, float]]) -> str:
    roll = rng.random() * sum(w for _, w in choices)
    for name, weight in choices:
        roll -= weight
        if roll <= 0:
            return name
    return choices[-1][0]


def segment_at(segments: Sequence[Segment], t: float) -> Segment:
    for segment in segments:
        if segment.start <= t < segment.end:
            return segment
    return segments[-1]


@dataclass(frozen=True)
class Arrival:
    at: float
    prompt_tokens: int
    output_tokens: int


def arrivals(
    trace: Sequence[TraceRequest], segments: Sequence[Segment], duration_s: float, *, token_scale: float = TOKEN_SCALE
) -> Iterator[Arrival]:
    """The trace looped over the scenario, thinned or duplicated by the segment's rate (deterministic credit)."""
    if not trace:
        return
    period = trace[-1].offset + 1.0
    credit = 0.0
    loop = 0
    while True:
        for item in trace:
            t = loop * period + item.offset
            if t >= duration_s:
                return
            segment = segment_at(segments, t)
            credit += segment.at(t, segment.rate_from, segment.rate_to)
            copies = int(credit)
            credit -= copies
            for copy in range(copies):
                yield Arrival(
                    t + copy * 0.001,
                    max(1, round(item.prompt_tokens * token_scale)),
                    max(1, round(item.output_tokens * token_scale)),
                )
        loop += 1


# -- the simulated tier ------------------------------------------------------------------------------


class _Request(SimRequest):
    """A SimRequest compared by identity: BatchingModel tests membership in its running list, and the
    dataclass field-by-field __eq__ made that quadratic cost dominate the whole simulation."""

    __eq__ = object.__eq__
    __hash__ = object.__hash__


@dataclass
class _Replica:
    name: str
    version: str
    profile: EngineProfile
    core: BatchingModel
    registry: CollectorRegistry
    metrics: VllmMetrics
    hbm: HbmModel
    cpu: Counter
    draining: bool = False
    # Virtual times: its process answers /health (scrapable) at up_at, it joins the router at ready_at.
    up_at: float = 0.0
    ready_at: float = 0.0
    superseded: bool = False  # an older version: serves only until a replica of the newest version is ready
    step_end: float | None = None
    plan: Any = None
    prefix_seen: tuple[int, int] = (0, 0)
    in_flight: int = 0
    labels: dict[str, str] = field(default_factory=dict)


class VirtualTier:
    """One service: replicas of BatchingModel behind a least-loaded router, all in virtual time.

    As the tier does with vLLM replicas: a new replica starts (STARTUP_S, not scrapable), warms up (WARMUP_S,
    scrapable, no traffic), then takes traffic; during a rollout the superseded version keeps serving until a
    replica of the new version is ready (shadow warm-up), then drains. The replicas present when the
    recording starts were deployed before it: ready at once.
    """

    def __init__(self, seed: int, start: float, service: str = SERVICE):
        self.service = service
        self.rng = random.Random(seed + 1)
        self.start = start
        self.now = start
        self.replicas: list[_Replica] = []
        self.version_number = 0
        self.profile_name = ""
        self.profiles: dict[str, EngineProfile] = {}
        self.router_registry = CollectorRegistry()
        self.router = RouterMetrics(self.router_registry)
        self.router_registry.register(EngineArgCollector(self.listed))
        self.counter = 0
        self.contention = 1.0

    def _profile(self, name: str) -> EngineProfile:
        if name not in self.profiles:
            self.profiles[name] = load_profile(PROFILES_DIR / f"{name}.yaml")
        return self.profiles[name]

    def configure(self, segment: Segment) -> None:
        """Apply a segment's capacity: a new profile is a rollout (new version); replica counts change."""
        deployed_before = not self.replicas
        active = [r for r in self.replicas if not r.draining and not r.superseded]
        if segment.profile != self.profile_name:
            self.profile_name = segment.profile
            self.version_number += 1
            for replica in active:
                replica.superseded = True  # keeps serving until the new version has a ready replica
            active = []
        while len(active) < segment.replicas:
            active.append(self._new_replica(ready_now=deployed_before))
        # Scale-down stops the newest replicas first (the tier drains the highest indexes).
        for replica in active[segment.replicas :]:
            replica.draining = True

    def serving(self) -> list[_Replica]:
        """The replicas the router sends traffic to now; retires the superseded ones once the newest version
        has a ready replica (until then they keep serving, as the tier's shadow warm-up does)."""
        newest = [r for r in self.replicas if not r.draining and not r.superseded and r.ready_at <= self.now]
        if newest:
            for replica in self.replicas:
                if replica.superseded:
                    replica.draining = True
            return newest
        return [r for r in self.replicas if not r.draining and r.ready_at <= self.now]

    def is_listed(self, replica: _Replica) -> bool:
        """Whether the tier's service discovery lists it now: a replica stopped before it ever answered is not."""
        return not (replica.draining and replica.up_at > self.now)

    def listed(self) -> list[ListedReplica]:
        """The replicas service discovery lists now (those with an `up` sample) and their engine args."""
        return [
            ListedReplica(self.service, r.version, r.name, r.profile.engineArgs)
            for r in self.replicas
            if self.is_listed(r)
        ]

    def _new_replica(self, ready_now: bool = False) -> _Replica:
        self.counter += 1
        profile = self._profile(self.profile_name)
        version = f"r{self.version_number}"
        name = f"{self.service}-{version}-{self.counter}"
        registry = CollectorRegistry()
        metrics = VllmMetrics(registry, MODEL)
        hbm = HbmModel(profile, lambda: self.now)
        registry.register(DcgmCollector(hbm, name))
        cpu = Counter("process_cpu_seconds", "Total user and system CPU time spent in seconds.", registry=registry)
        metrics.set_queue_state(0, 0, 0.0)
        replica = _Replica(name, version, profile, BatchingModel(profile), registry, metrics, hbm, cpu)
        if ready_now:
            replica.up_at = replica.ready_at = self.now
        else:
            replica.up_at = self.now + self.rng.uniform(*STARTUP_S)
            replica.ready_at = replica.up_at + self.rng.uniform(*WARMUP_S)
        replica.labels = {
            "namespace": NAMESPACE,
            "service": self.service,
            "version": version,
            "replica": name,
            "job": "vllm",
            "instance": f"{name}:8000",
        }
        self.replicas.append(replica)
        return replica

    def route(self, arrival: Arrival, network_delay: float) -> None:
        candidates = self.serving()
        if not candidates:
            self.router.upstream_errors.labels(self.service, "none", "no_healthy_replica").inc()
            return
        replica = min(candidates, key=lambda r: (r.core.num_running + r.core.num_waiting, r.name))
        request = _Request(f"q{id(arrival)}", arrival.prompt_tokens, arrival.output_tokens, arrival.at)
        try:
            replica.core.add(request)
        except RequestRejected:
            self.router.requests.labels(self.service, replica.version, "400").inc()
            return
        request.network_delay = network_delay  # type: ignore[attr-defined]
        replica.in_flight += 1
        if replica.step_end is None:
            self._start_step(replica, arrival.at)

    def _start_step(self, replica: _Replica, now: float) -> None:
        plan = replica.core.plan_step(now)
        if plan.empty:
            replica.step_end = None
            replica.plan = None
            return
        plan = dataclasses.replace(plan, duration=plan.duration * self.contention)
        replica.plan = plan
        replica.step_end = now + plan.duration

    def finish_step(self, replica: _Replica) -> None:
        assert replica.plan is not None and replica.step_end is not None
        plan, ended = replica.plan, replica.step_end
        outcome = replica.core.finish_step(plan, ended)
        core = replica.core
        replica.metrics.observe_step(
            outcome, core.prefix_cache_queries - replica.prefix_seen[0], core.prefix_cache_hits - replica.prefix_seen[1]
        )
        replica.prefix_seen = (core.prefix_cache_queries, core.prefix_cache_hits)
        kv_tokens = (core.num_blocks - core.free_blocks) * core.block_size
        replica.hbm.record_step(ended, kv_tokens)
        # The engine's scheduler/tokenizer CPU per step grows with the batch; contention stretches it too.
        replica.cpu.inc(plan.duration * 0.25 + 0.0004 * (len(plan.decode) + len(plan.prefill)) * self.contention)
        for request in outcome.finished:
            _observe_finished(replica.metrics, request)
            replica.in_flight -= 1
            delay = float(getattr(request, "network_delay", 0.0))
            assert request.finished_at is not None
            self.router.duration.labels(self.service, replica.version, "0").observe(
                request.finished_at - request.arrival + delay + 0.0008
            )
            self.router.requests.labels(self.service, replica.version, "200").inc()
            self.router.overhead.labels(self.service).observe(delay + 0.0008)
        self._start_step(replica, ended)

    def retire_drained(self) -> None:
        self.replicas = [r for r in self.replicas if not (r.draining and r.in_flight == 0 and not r.core.has_work)]


def _observe_finished(metrics: VllmMetrics, request: SimRequest) -> None:
    """VllmMetrics.observe_finished, with the per-token inter-token latencies added in bulk.

    Observing every gap through prometheus_client costs more than the whole simulation; the bulk add
    below gives the same bucket counts and sum (it uses the client's value objects directly).
    """
    gaps = np.asarray(request.inter_token_latencies, dtype=np.float64)
    request.inter_token_latencies = []
    metrics.observe_finished(request)
    if gaps.shape[0] == 0:
        return
    child = metrics.itl.labels(**metrics.labels)
    bounds = np.asarray(ITL_BUCKETS + (math.inf,))
    per_bucket = np.bincount(np.searchsorted(bounds, gaps, side="left"), minlength=bounds.shape[0])
    for value, count in zip(child._buckets, per_bucket, strict=True):
        if count:
            value.inc(float(count))
    child._sum.inc(float(gaps.sum()))


# -- recording ---------------------------------------------------------------------------------------


def _stamp(timestamp: float) -> str:
    """OpenMetrics timestamps are seconds; millisecond precision, no trailing zeros."""
    return f"{timestamp:.3f}".rstrip("0").rstrip(".")


class Recorder:
    """OpenMetrics text, one block of lines per family (OpenMetrics wants a family's samples together)."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, list[str]]] = {}
        self.samples = 0

    def scrape(self, registry: CollectorRegistry, labels: dict[str, str], timestamp: float) -> None:
        stamp = _stamp(timestamp)
        for metric in registry.collect():
            if not metric.name.startswith(RECORDED_PREFIXES):
                continue
            kind = metric.type if metric.type in ("counter", "gauge", "histogram") else "gauge"
            # Registered when first collected, samples or not: the family order (and the bytes) of a seed's file.
            self.families.setdefault(metric.name, (kind, []))
            for sample in metric.samples:
                if sample.name.endswith("_created"):
                    continue
                self._add(metric.name, kind, sample.name, {**sample.labels, **labels}, sample.value, stamp)

    def sample(self, name: str, kind: str, labels: dict[str, str], value: float, timestamp: float) -> None:
        """One sample of a series no registry holds (Prometheus' synthetic `up`)."""
        self._add(name, kind, name, labels, value, _stamp(timestamp))

    def _add(self, family: str, kind: str, name: str, labels: dict[str, str], value: float, stamp: str) -> None:
        _, lines = self.families.setdefault(family, (kind, []))
        rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        lines.append(f"{name}{{{rendered}}} {_number(value)} {stamp}")
        self.samples += 1

    def render(self) -> str:
        out: list[str] = []
        for name, (kind, lines) in self.families.items():
            out.append(f"# TYPE {name} {kind}")
            out.extend(lines)
        out.append("# EOF")
        return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


@dataclass(frozen=True)
class GeneratedDataset:
    openmetrics: str
    samples: int
    start: float
    end: float
    segments: list[Segment]
    requests: int
    scrape_interval_s: float = SCRAPE_INTERVAL_S


def generate(
    seed: int,
    duration_s: float,
    *,
    start: float = DEFAULT_START,
    trace: str = "conv",
    segments: Sequence[Segment] | None = None,
    scrape_interval_s: float = SCRAPE_INTERVAL_S,
    profiles: Mapping[str, EngineProfile] | None = None,
    services: int = 1,
    progress: bool = False,
    profile_change: float = 0.3,
) -> GeneratedDataset:
    """Run the scenario of `seed` for `duration_s` virtual seconds; pure apart from reading the trace file.

    With `services` > 1, services chat, chat-1, chat-2, ... each run their own scenario (seed + 7919 * i),
    so one window holds several independent targets.
    """
    if scrape_interval_s <= 0 or duration_s < scrape_interval_s:
        raise DatasetError(f"duration ({duration_s:g}s) must be at least one scrape interval ({scrape_interval_s:g}s)")
    if services < 1:
        raise DatasetError(f"services must be at least 1, got {services}")
    if not 0.0 <= profile_change <= 1.0:
        raise DatasetError(f"profile change probability must be in [0, 1], got {profile_change:g}")
    requests = read_trace(BUILTIN_TRACES.get(trace, Path(trace)))
    recorder = Recorder()
    all_segments: list[Segment] = []
    routed = 0
    bar = tqdm(total=int(duration_s) * services, unit="vs", desc="virtual seconds", disable=not progress)
    for index in range(services):
        service_seed = seed + 7919 * index
        service = SERVICE if index == 0 else f"{SERVICE}-{index}"
        plan = (
            list(segments)
            if segments is not None
            else make_scenario(service_seed, duration_s, profile_change=profile_change)
        )
        all_segments.extend(plan)
        routed += _run_service(
            service, service_seed, plan, requests, recorder, start, duration_s, scrape_interval_s, profiles, bar
        )
    bar.close()
    return GeneratedDataset(
        recorder.render(), recorder.samples, start, start + duration_s, all_segments, routed, scrape_interval_s
    )


def _run_service(
    service: str,
    seed: int,
    segments: Sequence[Segment],
    requests: Sequence[TraceRequest],
    recorder: Recorder,
    start: float,
    duration_s: float,
    scrape_interval_s: float,
    profiles: Mapping[str, EngineProfile] | None,
    bar: Any,
) -> int:
    """The discrete-event loop of one service: arrivals, engine steps and scrapes in time order."""
    tier = VirtualTier(seed, start, service)
    tier.profiles.update(profiles or {})  # named in segments in addition to serving/tier/profiles/*.yaml
    rng = random.Random(seed + 2)
    pending = arrivals(requests, segments, duration_s)
    next_arrival = next(pending, None)
    next_scrape = start
    end = start + duration_s
    current: Segment | None = None
    routed = 0
    while next_scrape <= end:
        steps = [(r.step_end, i) for i, r in enumerate(tier.replicas) if r.step_end is not None]
        next_step = min(steps) if steps else None
        arrival_at = start + next_arrival.at if next_arrival is not None else math.inf
        step_at = next_step[0] if next_step is not None else math.inf
        if next_scrape <= arrival_at and next_scrape <= step_at:
            tier.now = next_scrape
            tier.serving()  # retire superseded replicas whose successor became ready since the last event
            for replica in tier.replicas:
                # Prometheus' own `up` series for each target the tier's SD lists: 0 while it starts.
                if not tier.is_listed(replica):
                    continue
                scrapable = replica.up_at <= next_scrape
                recorder.sample("up", "gauge", replica.labels, 1.0 if scrapable else 0.0, next_scrape)
                if not scrapable:
                    continue
                # Gauges only matter when scraped: set them here, not after every step (same values).
                core = replica.core
                replica.metrics.set_queue_state(core.num_running, core.num_waiting, core.kv_cache_usage)
                recorder.scrape(replica.registry, replica.labels, next_scrape)
            recorder.scrape(
                tier.router_registry, {"namespace": NAMESPACE, "job": "router", "instance": "router:8080"}, next_scrape
            )
            tier.retire_drained()
            bar.update(int(scrape_interval_s))
            next_scrape += scrape_interval_s
            continue
        if arrival_at <= step_at:
            assert next_arrival is not None
            t = next_arrival.at
            segment = segment_at(segments, t)
            tier.now = start + t
            if segment is not current:
                tier.configure(segment)
                current = segment
            tier.contention = segment.at(t, segment.contention_from, segment.contention_to)
            delay = max(0.0, rng.gauss(segment.at(t, segment.delay_from, segment.delay_to), segment.jitter))
            tier.route(dataclasses.replace(next_arrival, at=start + t), delay)
            routed += 1
            next_arrival = next(pending, None)
            continue
        assert next_step is not None
        tier.now = step_at
        tier.finish_step(tier.replicas[next_step[1]])
    return routed


# -- command line ------------------------------------------------------------------------------------


def write_dataset(dataset: GeneratedDataset, out: Path, *, backfill: bool) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "history.om").write_text(dataset.openmetrics, encoding="utf-8")
    summary = {
        "start": dataset.start,
        "end": dataset.end,
        "samples": dataset.samples,
        "requests": dataset.requests,
        "scrape_interval_s": dataset.scrape_interval_s,
        "segments": [dataclasses.asdict(s) for s in dataset.segments],
    }
    (out / "scenario.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if backfill:
        result = backfill_openmetrics(out / "history.om", out / "data", expected_samples=dataset.samples)
        summary["blocks"] = result.blocks
    return summary


def tier_process(config: Path, out: Path) -> ManagedProcess:
    """`python -m tailguard.serving.tier --config CONFIG`, its state in OUT/tier-state and its log in OUT/tier.log (not
    started yet)."""
    return ManagedProcess(
        "tier",
        [
            sys.executable,
            "-m",
            "tailguard.serving.tier",
            "--config",
            str(config),
            "--state-dir",
            str(out / "tier-state"),
        ],
        out / "tier.log",
    )


def tier_scrape_configs(ready: Mapping[str, Any], *, sd_refresh: str = "5s") -> list[dict[str, Any]]:
    """What Prometheus scrapes of a running tier (`ready`: its ready line): the replicas found through the
    control API's HTTP service discovery, and the router, whose series carry the namespace the features select on."""
    return [
        http_sd_scrape_config("vllm", f"{ready['control_url']}/api/v1/sd", refresh_interval=sd_refresh),
        static_scrape_config("router", [ready["router_url"].removeprefix("http://")], labels={"namespace": NAMESPACE}),
    ]


def generate_live(out: Path, *, minutes: float, rate_scale: float, replicas: int, profile: str) -> dict[str, Any]:
    """Real time: the tier process (real replicas, router) replays the trace and a real Prometheus scrapes it
    every SCRAPE_INTERVAL_S. Its TSDB is left in OUT/data. Not reproducible byte for byte (real time)."""
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    config = out / "tier.yaml"
    service = {"name": SERVICE, "namespace": NAMESPACE, "model": MODEL, "profile": profile, "replicas": replicas}
    config.write_text(yaml.safe_dump({"ports": {"control": 0, "router": 0}, "services": [service]}), encoding="utf-8")
    tier = tier_process(config, out)
    tier.start()
    try:
        try:
            ready = tier.wait_ready(30.0)
        except ProcessNotReady as exc:
            raise DatasetError(f"the serving tier did not start: {exc}") from None
        interval = f"{SCRAPE_INTERVAL_S:g}s"
        prometheus_config = write_prometheus_config(
            out / "prometheus.yml", scrape_interval=interval, scrape_configs=tier_scrape_configs(ready)
        )
        with PrometheusServer(prometheus_config, out / "data", workdir=out / "prometheus").start() as prometheus:
            prometheus.wait_target_up("vllm", count=replicas)
            summary, _ = run_replay(
                ready["router_url"],
                MODEL,
                speedup=1.0,
                rate_scale=rate_scale,
                duration=minutes * 60.0,
                token_scale=TOKEN_SCALE,
            )
            prometheus.wait_series("vllm:num_requests_running")
    finally:
        tier.stop()
    return {"data": str(out / "data"), "replay": summary.to_json()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tailguard.serving.lab.dataset", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="virtual-time replay through the batching model -> OpenMetrics")
    gen.add_argument("--seed", type=int, required=True)
    gen.add_argument("--hours", type=float, required=True)
    gen.add_argument("--out", type=Path, required=True)
    gen.add_argument("--start", type=float, default=DEFAULT_START, help="unix time of the first sample")
    gen.add_argument("--trace", default="conv", help="conv, code or a CSV path")
    gen.add_argument("--backfill", action="store_true", help="also write TSDB blocks to OUT/data with promtool")
    gen.add_argument("--services", type=int, default=1, help="independent services (targets), each its own scenario")
    gen.add_argument(
        "--profile-change",
        type=float,
        default=0.3,
        help="probability that a segment re-draws the engine profile (default 0.3; more = more rollouts)",
    )
    gen.add_argument("--live", action="store_true", help="real time: the tier process scraped by a real Prometheus")
    gen.add_argument("--minutes", type=float, default=10.0, help="--live: how long to replay (wall clock)")
    gen.add_argument("--rate-scale", type=float, default=4.0, help="--live: trace rate multiplier")
    gen.add_argument("--replicas", type=int, default=2, help="--live: replicas of the service")
    gen.add_argument("--profile", default="stable", help="--live: the service's engine profile")
    args = parser.parse_args(argv)
    if args.live:
        try:
            result = generate_live(
                args.out,
                minutes=args.minutes,
                rate_scale=args.rate_scale,
                replicas=args.replicas,
                profile=args.profile,
            )
        except (DatasetError, OSError, RuntimeError) as failed:
            print(f"error: {failed}", file=sys.stderr)
            return 1
        print(f"live data in {result['data']}: {json.dumps(result['replay'])}")
        return 0
    if args.hours <= 0:
        print("error: --hours must be positive", file=sys.stderr)
        return 2
    try:
        dataset = generate(
            args.seed,
            args.hours * 3600.0,
            start=args.start,
            trace=args.trace,
            services=args.services,
            progress=True,
            profile_change=args.profile_change,
        )
        summary = write_dataset(dataset, args.out, backfill=args.backfill)
    except (DatasetError, OSError, ValueError) as failed:
        print(f"error: {failed}", file=sys.stderr)
        return 1
    print(
        f"wrote {args.out}/history.om: {summary['samples']} samples, {summary['requests']} requests, "
        f"{len(dataset.segments)} segments, {dataset.start:.0f}..{dataset.end:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
