"""`tailguard demo --scenario surge`: prevention measured. No controller, reactive and predictive scaling on the
same recorded arrivals of a load surge, in a closed loop, in virtual time.

    Azure conv trace + a surge -> VirtualTier (tailguard.serving.lab.dataset: BatchingModel replicas, start-up +
    warm-up)
         |  every 15 s (virtual): the tier's scrape, remote-written into a real Prometheus
         v
    real Prometheus  <--- PromQL (signals, the SLA model's features) ---  the controller's own evaluation
         ^
         (tailguard.controller.loop.evaluation.evaluate:
         |                                                                 engine, journal, dispatcher, limits)
         +--- scale / restore (ScalePort) sets the tier's replica count ------------+

The protocol (tailguard.serving.lab.surge_protocol, issue 27): the SLA model is trained by this pipeline on training
seeds whose trace slices lie in the first half of the Azure conv trace; every controller is evaluated on other seeds
whose slices lie in the second half (the harness refuses overlapping slices before it runs anything), on onsets of
several shapes (sudden, slow ramp, two steps, diurnal rise, a bad config rolled out under steady load) and on each
seed's calm control trace (the same arrivals, no onset). The controllers: a static floor of 2 replicas; HPAs with
Kubernetes/KEDA defaults on waiting requests (target 5 per replica) and on finished requests/s (the seed's target
50, and 26: 70% of a replica's capacity); the shipped rule (rules/examples/queue-scale.yaml: waiting > 20 per
replica for 30 s); the SLA model's policy (rules/examples/predicted-queue-breach-scale.yaml: the queue-time breach
probability over its trained cut). The policies restore the floor after a sustained calm (their `recovery`). Each
run lives in its own time window of the one Prometheus, so every figure is read back with PromQL exactly as an
operator would read it.

Figures per controller, over surge and calm runs together: SLO-violation minutes (queue-time P99 or e2e P99 over
its threshold, per 15 s step), replica-minutes (every replica from its start request to its retirement: start-up
and warm-up are paid for), false scale-outs per calm hour, scale-outs before an onset, and per onset the time
from the first scale-out to the first violation (the lead) and to the onset.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import random
import shutil
import signal
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from prometheus_client import CollectorRegistry

from tailguard.controller import (
    ActionOutcome,
    Actuators,
    Clock,
    EmbeddedLoop,
    ForSpec,
    Journal,
    ManualClock,
    MetricsSource,
    OutcomeStatus,
    Policy,
    PolicyState,
    PrometheusSettings,
    PrometheusSource,
    RangeResult,
    ScaleRequest,
    ScaleState,
    SignalResult,
    WouldRun,
    embed_loop,
    load_policies,
)
from tailguard.serving.errors import LabError
from tailguard.serving.lab.dataset import (
    NAMESPACE,
    RECORDED_PREFIXES,
    Segment,
    VirtualTier,
    arrivals,
    segment_at,
)
from tailguard.serving.lab.load import BUILTIN_TRACES, TraceRequest, read_trace
from tailguard.serving.lab.promstack import PrometheusServer, write_prometheus_config
from tailguard.serving.lab.surge_protocol import (
    SHAPES,
    Baseline,
    HpaLike,
    LoadShape,
    OnsetLead,
    ProtocolError,
    TraceSegment,
    baselines,
    check_disjoint,
    controller_table,
    draw_segment,
    make_shape,
    onset_lead,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
RULES = PROJECT_ROOT / "rules" / "examples"
REACTIVE_POLICY = RULES / "queue-scale.yaml"
PREDICTIVE_POLICY = RULES / "predicted-queue-breach-scale.yaml"
CONCURRENCY_POLICY = RULES / "concurrency-scale.yaml"
STEP_S = 15.0
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z; run k lives in [START + k * WINDOW_S, ...)
WINDOW_S = 2 * 3600.0
HTTP_TIMEOUT = 10.0
QUEUE_P99 = (
    "histogram_quantile(0.99, sum by (le, service) "
    f'(rate(vllm:request_queue_time_seconds_bucket{{namespace="{NAMESPACE}"}}[1m])))'
)
E2E_P99 = (
    "histogram_quantile(0.99, sum by (le, service) "
    f'(rate(vllm:e2e_request_latency_seconds_bucket{{namespace="{NAMESPACE}"}}[1m])))'
)


class SurgeError(LabError, RuntimeError):
    """The scenario could not run (Prometheus, a policy, training): one sentence."""


# -- the load ----------------------------------------------------------------------------------------


def shape_segments(shape: LoadShape, duration_s: float, replicas: int) -> list[Segment]:
    """The shape's piecewise-linear load as the tier's segments (the stable profile; a rollout is the run's)."""

    def seg(start: float, end: float, rate_from: float, rate_to: float) -> Segment:
        return Segment(start, end, "stable", replicas, rate_from, rate_to, 1.0, 1.0, 0.005, 0.005, 0.002)

    points = [point for point in shape.points if point[0] < duration_s]
    out = [seg(t0, t1, r0, r1) for (t0, r0), (t1, r1) in itertools.pairwise(points) if t1 > t0]
    last_t, last_rate = points[-1]
    out.append(seg(last_t, max(duration_s, last_t + 1.0), last_rate, last_rate))
    if out[0].start > 0.0:
        out.insert(0, seg(0.0, out[0].start, points[0][1], points[0][1]))
    return out


@dataclass(frozen=True)
class ScenarioConfig:
    """The scenario's sizes. `short()` is the end-to-end test's variant (two evaluated seeds, two shapes)."""

    duration_s: float = 10 * 60.0
    floor: int = 1  # the operator's replica count / HPA floor before the surge
    baseline: float = 3.0  # ~45% of one stable replica
    peak: tuple[float, float] = (9.0, 11.0)  # drawn per seed: 1.3-1.6x one replica's capacity
    surge_start_s: tuple[float, float] = (120.0, 150.0)
    calm_bump: tuple[float, float] = (3.8, 5.0)  # training only: a load bump one replica absorbs
    queue_slo_s: float = 1.0  # queue-time P99 (the model's cpu dimension)
    e2e_slo_s: float = 5.0  # calm: 1.5-2.3 s
    # The calm the recovery waits for before the restore; None: the policies' own `for` (10m). 150 s keeps a run
    # (and its simulation of up to 8 replicas) to 10 virtual minutes; the restore path is the same.
    recovery_hold_s: float | None = 150.0
    train_seeds: tuple[int, ...] = (101, 102, 103, 104, 105, 106)
    eval_seeds: tuple[int, ...] = (1, 2, 3, 4, 5)
    # Evaluated shapes; seed s runs `shapes_per_seed` of them, starting at shape s - 1 (so every shape is run).
    shapes: tuple[str, ...] = SHAPES
    shapes_per_seed: int = 4
    # The trace regions (seconds of the 58-minute conv trace): training slices never overlap evaluated ones.
    train_region: tuple[float, float] = (0.0, 1750.0)
    eval_region: tuple[float, float] = (1750.0, 3502.0)
    # The tuned requests/s baseline: 70% of a replica's capacity (baseline 3x the trace's 5.5 requests/s is
    # ~45% of a replica: ~37 requests/s per replica at saturation).
    tuned_rps: float = 26.0
    # Only these controllers (names of `evaluated_controllers`); empty: all.
    controllers: tuple[str, ...] = ()
    # Completes an earlier run of one shape per seed: each seed's shapes after its first, without the calm trace.
    after_first_shape: bool = False
    # The model's label horizon: a breach within the next 90 s. Longer than a replica's start-up and warm-up
    # (19-54 s), so an alarm can come early enough for the new replica to take traffic before the queue builds.
    horizon_s: float = 90.0

    @staticmethod
    def short() -> ScenarioConfig:
        return ScenarioConfig(eval_seeds=(1, 2), shapes=("sudden", "bad-config"), shapes_per_seed=1)

    def seed_shapes(self, seed: int) -> list[str]:
        count = min(self.shapes_per_seed, len(self.shapes))
        return [self.shapes[(seed - 1 + k) % len(self.shapes)] for k in range(count)]

    def shape(self, seed: int, kind: str = "ramp", *, bump: bool = False) -> LoadShape:
        """The seed's onset of `kind` ("calm": the control trace, the same arrivals without it); `bump`: a
        training trace whose load rises at the same point to a bump one replica absorbs (rising load that must
        not read as a breach)."""
        rng = random.Random(seed * 7907 + 13)
        onset = rng.uniform(*self.surge_start_s)
        peak = rng.uniform(*self.peak)
        if bump:
            return make_shape("ramp", self.baseline, rng.uniform(*self.calm_bump), onset, self.duration_s)
        return make_shape(kind, self.baseline, peak, onset, self.duration_s)

    def trace_segment(self, seed: int) -> TraceSegment:
        train = seed in self.train_seeds
        region = self.train_region if train else self.eval_region
        return draw_segment(seed, "train" if train else "eval", region, self.duration_s)

    def check(self) -> None:
        """The protocol: no evaluated seed trained on, no evaluated slice of the trace seen in training."""
        check_disjoint(
            [self.trace_segment(seed) for seed in self.train_seeds],
            [draw_segment(seed, "eval", self.eval_region, self.duration_s) for seed in self.eval_seeds],
        )


def trace_slice(trace: Sequence[TraceRequest], segment: TraceSegment) -> list[TraceRequest]:
    """The requests of the trace inside the segment, from 0 (never wrapping around the trace's end)."""
    out = [
        dataclasses.replace(item, offset=item.offset - segment.start_s)
        for item in trace
        if segment.start_s <= item.offset < segment.end_s
    ]
    if not out:
        raise SurgeError(f"the trace has no request in {segment.start_s:.0f}-{segment.end_s:.0f} s")
    return out


# -- Prometheus remote write (the virtual scrape) ---------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def encode_write_request(series: Sequence[tuple[Mapping[str, str], float]], timestamp_ms: int) -> bytes:
    """A remote-write WriteRequest (prometheus/prompb): one sample per series, all at `timestamp_ms`."""
    stamp = b"\x10" + _varint(timestamp_ms & 0xFFFFFFFFFFFFFFFF)
    body = bytearray()
    for labels, value in series:
        message = b"".join(
            _field(1, _field(1, name.encode()) + _field(2, str(text).encode())) for name, text in sorted(labels.items())
        )
        message += _field(2, b"\x09" + struct.pack("<d", value) + stamp)
        body += _field(1, message)
    return bytes(body)


def snappy_block(data: bytes) -> bytes:
    """Snappy's block format with literals only (valid snappy, no compression): what the receiver decodes."""
    out = bytearray(_varint(len(data)))
    for offset in range(0, len(data), 65536):
        chunk = data[offset : offset + 65536]
        length = len(chunk) - 1
        if length < 60:
            out.append(length << 2)
        elif length < 256:
            out += bytes([60 << 2, length])
        else:
            out += bytes([61 << 2]) + struct.pack("<H", length)
        out += chunk
    return bytes(out)


class RemoteWriter:
    """Writes one scrape at a time into Prometheus' remote-write receiver, in time order."""

    def __init__(self, url: str) -> None:
        self.url = f"{url}/api/v1/write"
        self.session = requests.Session()
        self.samples = 0

    def write(self, series: Sequence[tuple[Mapping[str, str], float]], at: float) -> None:
        body = snappy_block(encode_write_request(series, round(at * 1000)))
        response = self.session.post(
            self.url,
            data=body,
            headers={
                "Content-Encoding": "snappy",
                "Content-Type": "application/x-protobuf",
                "X-Prometheus-Remote-Write-Version": "0.1.0",
            },
            timeout=HTTP_TIMEOUT,
        )
        if response.status_code >= 300:
            raise SurgeError(f"Prometheus refused the scrape at {at:.0f}: {response.status_code} {response.text[:200]}")
        self.samples += len(series)


def scrape(tier: VirtualTier, at: float) -> list[tuple[dict[str, str], float]]:
    """What Prometheus would scrape from the tier at `at` (tailguard.serving.lab.dataset's recording, as series)."""
    out: list[tuple[dict[str, str], float]] = []
    tier.now = at
    tier.serving()
    registries: list[tuple[CollectorRegistry, dict[str, str]]] = []
    for replica in tier.replicas:
        if not tier.is_listed(replica):
            continue
        up = replica.up_at <= at
        out.append(({"__name__": "up", **replica.labels}, 1.0 if up else 0.0))
        if up:
            core = replica.core
            replica.metrics.set_queue_state(core.num_running, core.num_waiting, core.kv_cache_usage)
            registries.append((replica.registry, replica.labels))
    registries.append((tier.router_registry, {"namespace": NAMESPACE, "job": "router", "instance": "router:8080"}))
    for registry, labels in registries:
        for metric in registry.collect():
            if not metric.name.startswith(RECORDED_PREFIXES):
                continue
            for sample in metric.samples:
                if sample.name.endswith("_created"):
                    continue
                out.append(({**sample.labels, **labels, "__name__": sample.name}, float(sample.value)))
    tier.retire_drained()
    return out


# -- the controller's view of the tier ----------------------------------------------------------------


class TierScaler:
    """The ScalePort over the virtual tier: what the local tier adapter does to real replicas, in virtual time.
    A new replica starts and warms up before it takes traffic; scale-in drains the newest. A restore never
    goes below the operator's floor."""

    def __init__(self, tier: VirtualTier, floor: int, clock: Clock) -> None:
        self.tier = tier
        self.floor = floor
        self.clock = clock
        self.count = floor
        self.changes: list[tuple[float, int, int, str]] = []  # (at, from, to, method)

    def _set(self, replicas: int, method: str) -> None:
        self.tier.now = self.clock.now()
        self.tier.configure(Segment(0.0, 0.0, self.tier.profile_name, replicas, 0, 0, 1, 1, 0, 0, 0))
        self.changes.append((self.clock.now(), self.count, replicas, method))
        self.count = replicas

    def replicas(self, service: str) -> int:
        return self.count

    def scale_target(self, replicas: int) -> dict[str, int]:
        """A scale sets the simulated tier's replica count."""
        return {"replicas": replicas}

    def set_replicas(self, request: ScaleRequest) -> ActionOutcome:
        replicas = request.replicas
        if replicas == self.count:
            return ActionOutcome(OutcomeStatus.SKIPPED, {"reason": f"already {replicas} replicas"})
        before = self.count
        self._set(replicas, "set_replicas")
        return ActionOutcome(OutcomeStatus.SUCCEEDED, {"from": before, "to": replicas})

    def scale_state(self, service: str) -> ScaleState:
        return ScaleState(replicas=self.count)

    def restore_scale(
        self, service: str, state: ScaleState, *, expected: ScaleState | None, idempotency_key: str
    ) -> ActionOutcome:
        wanted = max(self.floor, state.replicas if state.replicas is not None else self.count)
        if expected is not None and (expected.replicas if expected.replicas is not None else self.count) != self.count:
            return ActionOutcome(OutcomeStatus.SKIPPED, {"reason": "changed by someone else since"})
        if wanted == self.count:
            return ActionOutcome(OutcomeStatus.SKIPPED, {"reason": "already so"})
        before = self.count
        self._set(wanted, "restore_scale")
        return ActionOutcome(OutcomeStatus.SUCCEEDED, {"from": before, "to": wanted})


class PinnedSource:
    """Prometheus asked at the virtual clock's time (an evaluation's `now`), never at the wall clock's."""

    def __init__(self, source: MetricsSource, clock: Clock) -> None:
        self.source = source
        self.clock = clock

    def instant(self, query: str, group_by: Sequence[str], at: float | None = None) -> SignalResult:
        return self.source.instant(query, group_by, self.clock.now() if at is None else at)

    def range(self, query: str, group_by: Sequence[str], start: float, end: float, step: float) -> RangeResult:
        return self.source.range(query, group_by, start, end, step)


# -- one closed-loop run ------------------------------------------------------------------------------


@dataclass
class RunResult:
    controller: str
    seed: int
    calm: bool
    start: float
    end: float
    shape: LoadShape
    replica_timeline: list[tuple[float, int]] = field(default_factory=list)  # (at, replicas paid for)
    desired_timeline: list[tuple[float, int]] = field(default_factory=list)  # (at, count the controller set)
    changes: list[tuple[float, int, int, str]] = field(default_factory=list)
    decisions: list[tuple[float, str, str]] = field(default_factory=list)  # (at, kind, condition)
    requests: int = 0
    samples: int = 0
    queue_p99: list[tuple[float, float]] = field(default_factory=list)
    e2e_p99: list[tuple[float, float]] = field(default_factory=list)

    @property
    def surge_at(self) -> float:
        """The onset (on the calm trace: where the seed's onsets start)."""
        return self.start + self.shape.onset_s

    def replica_minutes(self) -> float:
        return sum(count for _, count in self.replica_timeline) * STEP_S / 60.0

    def scale_outs(self) -> list[float]:
        return [at for at, before, after, _ in self.changes if after > before]

    def onset_lead(self, queue_slo: float, e2e_slo: float) -> OnsetLead:
        return onset_lead(
            self.seed, self.shape.kind, self.surge_at, self.scale_outs(), self.violations(queue_slo, e2e_slo)
        )

    def scale_ins(self) -> list[float]:
        return [at for at, before, after, _ in self.changes if after < before]

    def violations(self, queue_slo: float, e2e_slo: float) -> list[float]:
        """The 15 s steps at which either SLI is over its SLO (NaN: no request finished, not a violation)."""
        e2e = dict(self.e2e_p99)
        bad = []
        for at, queue in self.queue_p99:
            other = e2e.get(at, math.nan)
            if (not math.isnan(queue) and queue > queue_slo) or (not math.isnan(other) and other > e2e_slo):
                bad.append(at)
        return bad

    def summary(self, queue_slo: float, e2e_slo: float) -> dict[str, Any]:
        bad = self.violations(queue_slo, e2e_slo)
        queue_bad = [at for at, v in self.queue_p99 if not math.isnan(v) and v > queue_slo]
        e2e_bad = [at for at, v in self.e2e_p99 if not math.isnan(v) and v > e2e_slo]
        outs, ins = self.scale_outs(), self.scale_ins()
        return {
            "controller": self.controller,
            "seed": self.seed,
            "trace": "calm" if self.calm else "surge",
            "shape": self.shape.kind,
            "minutes": round((self.end - self.start) / 60.0, 2),
            "scale_outs_before_onset": sum(1 for at in outs if at < self.surge_at),
            "slo_violation_minutes": len(bad) * STEP_S / 60.0,
            "queue_violation_minutes": len(queue_bad) * STEP_S / 60.0,
            "e2e_violation_minutes": len(e2e_bad) * STEP_S / 60.0,
            "first_violation_s": round(bad[0] - self.surge_at, 1) if bad else None,
            "first_scale_out_s": round(outs[0] - self.surge_at, 1) if outs else None,
            "scale_outs": len(outs),
            "scale_in_s": round(ins[0] - self.surge_at, 1) if ins else None,
            "final_replicas": self.desired_timeline[-1][1] if self.desired_timeline else None,
            "peak_replicas": max((c for _, c in self.desired_timeline), default=None),
            "replica_minutes": round(self.replica_minutes(), 2),
            "peak_queue_p99_s": _peak(self.queue_p99),
            "peak_e2e_p99_s": _peak(self.e2e_p99),
            "requests": self.requests,
        }


def _peak(series: Sequence[tuple[float, float]]) -> float | None:
    values = [v for _, v in series if not math.isnan(v)]
    return round(max(values), 3) if values else None


def remote_write_prometheus(work: Path) -> PrometheusServer:
    """A Prometheus in `work` that scrapes nothing and takes the virtual tier's series by remote write (the surge
    scenario's and the model comparison's history)."""
    prometheus_config = write_prometheus_config(work / "prometheus.yml", scrape_configs=[])
    return PrometheusServer(
        prometheus_config,
        work / "data",
        workdir=work / "prometheus",
        extra_args=["--web.enable-remote-write-receiver"],
    )


def load_policy(path: Path, *, cut: float | None = None, recovery_hold_s: float | None = None) -> Policy:
    """A shipped example policy, as `tailguard run` loads it; `cut` replaces the firing threshold (the trained
    model's decision threshold), `recovery_hold_s` the recovery's `for` (the short variant)."""
    loaded, errors = load_policies([path])
    if errors or len(loaded) != 1:
        raise SurgeError(f"{path}: cannot load the policy: {'; '.join(str(e) for e in errors) or 'not one policy'}")
    policy = loaded[0].policy
    conditions = []
    for condition in policy.conditions:
        update: dict[str, Any] = {}
        if cut is not None:
            update["when"] = condition.when.model_copy(update={"value": cut})
        if recovery_hold_s is not None:
            hold = ForSpec(seconds=recovery_hold_s)
            update["recovery"] = condition.recovery.model_copy(update={"for_": hold})
        conditions.append(condition.model_copy(update=update))
    return policy.model_copy(update={"conditions": conditions})


def run_closed_loop(
    prometheus_url: str,
    config: ScenarioConfig,
    seed: int,
    start: float,
    policy: Policy | None,
    controller: str,
    *,
    shape: LoadShape,
    calm: bool = False,
    predictions: Callable[[Clock], Any] | None = None,
    journal_dir: Path,
    trace: Sequence[TraceRequest],
    hpa: HpaLike | None = None,
    floor: int | None = None,
) -> RunResult:
    """One run: the tier replays `trace` (the seed's slice) under `shape` from `start`; every 15 s its scrape is
    written into Prometheus and `policy` is evaluated by the controller's own evaluation, or `hpa` (a reactive
    baseline) takes its sync, whose scale actions set the tier's replica count (neither: no controller, at
    `floor` replicas, config.floor by default). A bad-config shape rolls its profile out at the onset. The SLIs
    are read back from Prometheus at the end."""
    replicas = config.floor if floor is None else floor
    segments = shape_segments(shape, config.duration_s, replicas)
    clock = ManualClock(start)
    tier = VirtualTier(seed, start)
    tier.configure(segments[0])
    scaler = TierScaler(tier, replicas, clock)
    rollout_at = start + shape.onset_s if shape.rollout_profile is not None and not calm else math.inf
    writer = RemoteWriter(prometheus_url)
    result = RunResult(controller, seed, calm, start, start + config.duration_s, shape)
    journal: Journal | None = None
    loop: EmbeddedLoop | None = None
    state = PolicyState()
    source = PinnedSource(PrometheusSource(PrometheusSettings(url=prometheus_url, timeout=HTTP_TIMEOUT), clock), clock)
    if policy is not None:
        journal = Journal(journal_dir / f"journal-{controller}-{seed}-{'calm' if calm else 'surge'}.db")
        world = WouldRun(clock)
        loop = embed_loop(
            journal,
            Actuators(rollback=world, scale=scaler, router=world, annotator=world, notifier=world),
            clock,
            source,
            # The controller's PredictionProvider on this run's clock (it judges the model's age by it).
            predictions(clock) if predictions is not None else _NoPredictions(),
        )
    rng = random.Random(seed + 2)
    pending = arrivals(trace, segments, config.duration_s)
    next_arrival = next(pending, None)
    next_scrape = start
    end = start + config.duration_s
    try:
        while next_scrape <= end:
            steps = [(r.step_end, i) for i, r in enumerate(tier.replicas) if r.step_end is not None]
            next_step = min(steps) if steps else None
            arrival_at = start + next_arrival.at if next_arrival is not None else math.inf
            step_at = next_step[0] if next_step is not None else math.inf
            if rollout_at <= min(next_scrape, arrival_at, step_at):
                assert shape.rollout_profile is not None
                tier.now = rollout_at
                tier.configure(dataclasses.replace(segments[0], profile=shape.rollout_profile, replicas=scaler.count))
                result.decisions.append((rollout_at, "rollout", shape.rollout_profile))
                rollout_at = math.inf
                continue
            if next_scrape <= arrival_at and next_scrape <= step_at:
                if next_scrape > clock.now():
                    clock.advance(next_scrape - clock.now())
                paid = sum(1 for r in tier.replicas if not r.draining or r.in_flight > 0)
                result.replica_timeline.append((next_scrape, paid))
                writer.write(scrape(tier, next_scrape), next_scrape)
                if policy is not None and loop is not None:
                    outcome = loop.evaluate(policy, state, next_scrape)
                    state = outcome.state
                    for decision in outcome.decisions:
                        result.decisions.append((decision.at, decision.kind.value, decision.condition))
                if hpa is not None:
                    desired = hpa.decide(next_scrape, scaler.count, _scalar(prometheus_url, hpa.query, next_scrape))
                    if desired != scaler.count:
                        scaler.set_replicas(ScaleRequest("chat", desired, f"{hpa.name}-{next_scrape}"))
                        result.decisions.append((next_scrape, "hpa", f"{hpa.name} -> {desired}"))
                result.desired_timeline.append((next_scrape, scaler.count))
                next_scrape += STEP_S
                continue
            if arrival_at <= step_at:
                assert next_arrival is not None
                tier.now = arrival_at
                segment = segment_at(segments, next_arrival.at)
                delay = max(0.0, rng.gauss(segment.at(next_arrival.at, segment.delay_from, segment.delay_to), 0.002))
                tier.route(dataclasses.replace(next_arrival, at=arrival_at), delay)
                result.requests += 1
                next_arrival = next(pending, None)
                continue
            assert next_step is not None
            tier.now = step_at
            tier.finish_step(tier.replicas[next_step[1]])
    finally:
        if journal is not None:
            journal.close()
    result.changes = list(scaler.changes)
    result.samples = writer.samples
    result.queue_p99 = _series(source, QUEUE_P99, start, end)
    result.e2e_p99 = _series(source, E2E_P99, start, end)
    return result


def _scalar(prometheus_url: str, query: str, at: float) -> float | None:
    """One instant value from Prometheus (the HPA's metrics adapter); None when absent or unreadable."""
    try:
        response = requests.get(
            f"{prometheus_url}/api/v1/query", params={"query": query, "time": f"{at:.3f}"}, timeout=HTTP_TIMEOUT
        )
        result = response.json()["data"]["result"]
    except (requests.RequestException, ValueError, KeyError) as exc:
        raise SurgeError(f"the HPA baseline's query {query!r} at {at:.0f} failed: {exc}") from exc
    if not result:
        return None
    return float(result[0]["value"][1])


class _NoPredictions:
    def predict(self, source: MetricsSource, policy: Policy, at: float | None = None) -> dict[str, SignalResult]:
        return {}

    def warnings(self) -> list[str]:
        return []


def _series(source: PinnedSource, query: str, start: float, end: float) -> list[tuple[float, float]]:
    result = source.range(query, ["service"], start, end, STEP_S)
    if result.error is not None:
        raise SurgeError(f"reading back {query}: {result.error}")
    values: dict[float, float] = {}
    for samples in result.series.values():
        for at, value in samples.items():
            values[round(at, 3)] = value
    grid = [round(start + STEP_S * k, 3) for k in range(int((end - start) / STEP_S) + 1)]
    return [(at, values.get(at, math.nan)) for at in grid]


# -- the SLA model, trained by this pipeline on other seeds ---------------------------------------------


@dataclass(frozen=True)
class TrainedModel:
    directory: Path
    cut: float  # the artifact's decision threshold for the cpu (queue-time) dimension
    seeds: tuple[int, ...]
    rows: int
    breaches: int
    held_out: Mapping[str, Any] | None


def train_model(
    prometheus_url: str,
    config: ScenarioConfig,
    start: float,
    out: Path,
    journal_dir: Path,
    trace: Sequence[TraceRequest],
) -> tuple[TrainedModel, float]:
    """Record the training seeds back to back, then `tailguard train`'s own fit on that window. Every other seed is
    a calm trace (a bump one replica absorbs: rising load that must not read as a breach); every fourth a surge
    under reactive scaling (so the model sees several replicas under load too). Returns the model and the end of
    the training window."""
    from tailguard.predictors.artifact import save_artifact
    from tailguard.predictors.train import fit_artifact

    policy = load_policy(PREDICTIVE_POLICY)
    rows, end = record_training_rows(prometheus_url, config, start, journal_dir, trace)
    artifact, _skipped = fit_artifact(
        rows,
        match=policy.targets.match,
        group_by=policy.targets.groupBy,
        seed=0,
        now=end,
        holdout=0.0,
        # Blocked folds of a surge seed and the calm seed after it: each fold holds breaches to score.
        folds=max(2, len(config.train_seeds) // 2),
    )
    if "cpu" not in artifact.decision_thresholds:
        raise SurgeError(f"the training window gave no queue-time (cpu) model: {artifact.report.get('skipped')}")
    directory = save_artifact(artifact, out)
    labels = rows.labels["cpu"]
    breaches = int((labels[~_isnan(labels)] > 0).sum())
    trained = TrainedModel(
        directory, float(artifact.decision_thresholds["cpu"]), config.train_seeds, len(rows), breaches, None
    )
    return trained, end


def record_training_rows(
    prometheus_url: str, config: ScenarioConfig, start: float, journal_dir: Path, trace: Sequence[TraceRequest]
) -> tuple[Any, float]:
    """The training seeds recorded back to back from `start` (see `train_model`), as the model's labelled rows
    (tailguard.predictors.data.Rows, every feature); returns (rows, the end of the training window)."""
    from tailguard.predictors.data import build_rows, policy_thresholds

    policy = load_policy(PREDICTIVE_POLICY)
    reactive = load_policy(REACTIVE_POLICY, recovery_hold_s=config.recovery_hold_s)
    at = start
    for index, seed in enumerate(config.train_seeds):
        scaled = index % 4 == 2
        run_closed_loop(
            prometheus_url,
            config,
            seed,
            at,
            reactive if scaled else None,
            "reactive" if scaled else "none",
            shape=config.shape(seed, "ramp", bump=index % 2 == 1),
            journal_dir=journal_dir,
            trace=trace_slice(trace, config.trace_segment(seed)),
        )
        at += config.duration_s + STEP_S
    end = at - STEP_S
    source = PrometheusSource(PrometheusSettings(url=prometheus_url, timeout=60.0), ManualClock(end))
    rows = build_rows(
        source,
        policy.targets.match,
        policy.targets.groupBy,
        start,
        end,
        STEP_S,
        config.horizon_s,
        policy_thresholds(policy),
    )
    return rows, end


def _isnan(values: Any) -> Any:
    import numpy as np

    return np.isnan(values)


def prediction_provider(model_dir: Path) -> Callable[[Clock], Any]:
    """The controller's own PredictionProvider (skops allow-list, feature hash, age) over the trained artifact."""
    from tailguard.predictors.serving import ModelSpec, PredictionProvider

    return lambda clock: PredictionProvider({"sla": ModelSpec("sla", model_dir)}, clock)


# -- the scenario ---------------------------------------------------------------------------------------


def evaluated_controllers(config: ScenarioConfig) -> list[tuple[str, Baseline | None]]:
    """The evaluated controllers (config.controllers, or all): the reactive baselines, the shipped rule and the SLA
    model's policy."""
    every = [
        *((b.name, b) for b in baselines(config.tuned_rps)),
        ("reactive", None),
        ("concurrency-rule", None),
        ("predictive", None),
    ]
    if not config.controllers:
        return every
    unknown = set(config.controllers) - {name for name, _ in every}
    if unknown:
        raise SurgeError(f"unknown controllers {sorted(unknown)}; expected some of {[name for name, _ in every]}")
    return [(name, baseline) for name, baseline in every if name in config.controllers]


@dataclass
class ScenarioResult:
    config: ScenarioConfig
    model: TrainedModel
    runs: list[RunResult]
    seconds: float = 0.0

    def run(self, controller: str, seed: int, *, calm: bool = False, shape: str | None = None) -> RunResult:
        return next(
            r
            for r in self.runs
            if r.controller == controller
            and r.seed == seed
            and r.calm == calm
            and (shape is None or r.shape.kind == shape)
        )

    def controllers(self) -> list[str]:
        return list(dict.fromkeys(r.controller for r in self.runs))

    def figures(self) -> dict[str, Any]:
        """Per run its summary; per controller the protocol's table (surge and calm runs together, per-onset
        leads); the issue's targets for the predictive policy against the best reactive baseline."""
        cfg = self.config
        summaries = [r.summary(cfg.queue_slo_s, cfg.e2e_slo_s) for r in self.runs]
        table: dict[str, Any] = {}
        leads: dict[str, list[dict[str, Any]]] = {}
        for name in self.controllers():
            runs = [r for r in self.runs if r.controller == name]
            onsets = [r.onset_lead(cfg.queue_slo_s, cfg.e2e_slo_s) for r in runs if not r.calm]
            table[name] = controller_table([r.summary(cfg.queue_slo_s, cfg.e2e_slo_s) for r in runs], onsets)
            leads[name] = [dataclasses.asdict(lead) | {"lead_to_violation_s": lead.lead_to_violation_s,
                                                        "outcome": lead.outcome} for lead in onsets]  # fmt: skip
        targets = targets_against_best_reactive(table)
        return {
            "protocol": {
                "train_seeds": list(cfg.train_seeds),
                "eval_seeds": list(cfg.eval_seeds),
                "train_segments": [dataclasses.asdict(cfg.trace_segment(s)) for s in cfg.train_seeds],
                "eval_segments": [dataclasses.asdict(cfg.trace_segment(s)) for s in cfg.eval_seeds],
                "shapes": list(cfg.shapes),
                "run_minutes": cfg.duration_s / 60.0,
                "config": {
                    key: getattr(cfg, key)
                    for key in ("baseline", "floor", "peak", "shapes", "duration_s", "queue_slo_s", "e2e_slo_s")
                },
            },
            "runs": summaries,
            "table": table,
            "leads": leads,
            "model": {
                "train_seeds": list(self.model.seeds),
                "rows": self.model.rows,
                "breach_rows": self.model.breaches,
                "cpu_cut": round(self.model.cut, 4),
            },
            "targets": targets,
            "seconds": round(self.seconds, 1),
        }


def reuse_model(directory: Path, config: ScenarioConfig) -> TrainedModel:
    """A model this scenario trained before on the same training seeds (verified as the controller loads it)."""
    from tailguard.predictors.artifact import ArtifactError, load_artifact

    try:
        artifact = load_artifact(directory)
    except ArtifactError as bad:
        raise SurgeError(f"--model {directory}: {bad}") from bad
    if "cpu" not in artifact.decision_thresholds:
        raise SurgeError(f"--model {directory}: the model has no queue-time (cpu) dimension")
    return TrainedModel(directory, float(artifact.decision_thresholds["cpu"]), config.train_seeds, 0, 0, None)


def run_scenario(
    config: ScenarioConfig,
    out: Path,
    *,
    log: Callable[[str], None] = print,
    keep_prometheus: bool = False,
    model_dir: Path | None = None,
) -> ScenarioResult:
    """Train on config.train_seeds (their trace slices in the training region), then every controller on every
    evaluated seed's shapes and its calm control trace (slices in the evaluation region); every run in its own
    window of one Prometheus. Refuses a plan that breaks the protocol before anything runs."""
    began = time.monotonic()
    try:
        config.check()
    except ProtocolError as refused:
        raise SurgeError(str(refused)) from refused
    evaluated_controllers(config)  # an unknown name is refused before anything runs
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tailguard-surge-"))
    trace = read_trace(BUILTIN_TRACES["conv"])
    try:
        server = remote_write_prometheus(work)
        with server.start():
            if model_dir is not None:
                model, at = reuse_model(model_dir, config), START
                log(f"surge: reusing the SLA model in {model_dir} (trained on seeds {list(config.train_seeds)})")
            else:
                log(f"surge: training the SLA model on seeds {list(config.train_seeds)} (never evaluated)")
                model, at = train_model(server.url, config, START, out / "model", work, trace)
            if model_dir is None:
                log(
                    f"surge: model trained on {model.rows} rows ({model.breaches} breach rows); cpu cut {model.cut:.3f}"
                )
            provider = prediction_provider(model.directory)
            policies = {
                "reactive": load_policy(REACTIVE_POLICY, recovery_hold_s=config.recovery_hold_s),
                "concurrency-rule": load_policy(CONCURRENCY_POLICY, recovery_hold_s=config.recovery_hold_s),
                "predictive": load_policy(PREDICTIVE_POLICY, cut=model.cut, recovery_hold_s=config.recovery_hold_s),
            }
            runs: list[RunResult] = []
            at += WINDOW_S
            for seed in config.eval_seeds:
                seed_trace = trace_slice(trace, config.trace_segment(seed))
                kinds = (
                    config.seed_shapes(seed)[1:] if config.after_first_shape else [*config.seed_shapes(seed), "calm"]
                )
                for kind in kinds:
                    for name, baseline in evaluated_controllers(config):
                        result = run_closed_loop(
                            server.url,
                            config,
                            seed,
                            at,
                            policies.get(name),
                            name,
                            shape=config.shape(seed, kind),
                            calm=kind == "calm",
                            predictions=provider if name == "predictive" else None,
                            journal_dir=work,
                            trace=seed_trace,
                            hpa=baseline.hpa(config.floor) if baseline is not None else None,
                            floor=baseline.static_replicas if baseline is not None else None,
                        )
                        runs.append(result)
                        summary = result.summary(config.queue_slo_s, config.e2e_slo_s)
                        log(
                            f"surge: seed {seed} {kind:10s} {name:13s} violation "
                            f"{summary['slo_violation_minutes']:5.2f} min, scale-outs {summary['scale_outs']} "
                            f"(first {summary['first_scale_out_s']} s), "
                            f"replica-minutes {summary['replica_minutes']:.1f}"
                        )
                        at += config.duration_s + WINDOW_S
    finally:
        if not keep_prometheus:
            shutil.rmtree(work, ignore_errors=True)
    return ScenarioResult(config, model, runs, time.monotonic() - began)


# -- the report (like the incident report: Markdown, JSON, PNG) -------------------------------------------


def _cell(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}{unit}"
    return f"{value}{unit}"


def merge_figures(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Reports of the same protocol run on different evaluated seeds (in parallel), as one: runs and onsets
    together, the table and the targets recomputed. Refuses parts of different training or trace regions."""
    first = parts[0]
    for part in parts[1:]:
        for key in ("train_seeds", "train_segments", "shapes", "run_minutes"):
            if part["protocol"][key] != first["protocol"][key]:
                raise ValueError(f"the reports differ in {key}: not the same protocol")
    runs = [run for part in parts for run in part["runs"]]
    names = list(dict.fromkeys(name for part in parts for name in part["table"]))
    leads = {name: [lead for part in parts for lead in part["leads"].get(name, [])] for name in names}
    table = {
        name: controller_table(
            [r for r in runs if r["controller"] == name],
            [OnsetLead(x["seed"], x["shape"], x["first_action_s"], x["first_violation_s"]) for x in leads[name]],
        )
        for name in names
    }
    protocol = dict(first["protocol"])
    # Parts may split the seeds (in parallel) or the controllers (a controller added later) of one protocol.
    protocol["eval_seeds"] = sorted({seed for part in parts for seed in part["protocol"]["eval_seeds"]})
    segments = {s["seed"]: s for part in parts for s in part["protocol"]["eval_segments"]}
    protocol["eval_segments"] = [segments[seed] for seed in protocol["eval_seeds"]]
    check_disjoint(
        [TraceSegment(**segment) for segment in protocol["train_segments"]],
        [TraceSegment(**segment) for segment in protocol["eval_segments"]],
    )
    return {
        "protocol": protocol,
        "runs": runs,
        "table": table,
        "leads": leads,
        "model": first["model"],
        "targets": targets_against_best_reactive(table),
        "seconds": round(sum(part["seconds"] for part in parts), 1),
    }


def targets_against_best_reactive(table: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Issue 27's targets: the SLA model's policy against the reactive controller with the fewest violation
    minutes."""
    # The SLA model's policies: "predictive" and the model classes compared beside it ("predictive-mlp", ...).
    reactive_names = [n for n in table if not n.startswith("predictive") and n != "none"]
    best = min(reactive_names, key=lambda n: table[n]["violation_minutes"]) if reactive_names else None
    targets: dict[str, Any] = {"best_reactive": best}
    if best is not None and "predictive" in table:
        ours, theirs = table["predictive"], table[best]
        targets |= {
            "violation_reduction_vs_best_reactive": (
                round(1.0 - ours["violation_minutes"] / theirs["violation_minutes"], 3)
                if theirs["violation_minutes"]
                else None
            ),
            "extra_replica_minutes_vs_best_reactive": round(
                ours["replica_minutes"] / theirs["replica_minutes"] - 1.0, 3
            ),
            "false_scale_outs_per_calm_hour": ours["false_scale_outs_per_calm_hour"],
            "median_lead_to_violation_s": ours["lead_to_violation_s"]["median"],
        }
    return targets


def render_markdown(result: ScenarioResult) -> str:
    first = next((r for r in result.runs if not r.calm), result.runs[0])
    plotted = f"seed {first.seed}, {first.shape.kind}"
    return render_table(result.figures()) + f"\n![surge](surge.png) ({plotted})\n"


def render_table(figures: Mapping[str, Any]) -> str:
    protocol = figures["protocol"]
    cfg = argparse.Namespace(**protocol["config"])
    spans = ", ".join(f"{s['start_s']:.0f}-{s['end_s']:.0f}" for s in protocol["eval_segments"])
    train_spans = ", ".join(f"{s['start_s']:.0f}-{s['end_s']:.0f}" for s in protocol["train_segments"])
    intro = (
        f"Azure conv trace at {cfg.baseline:g}x its rate on {cfg.floor} replica(s); onsets to "
        f"{cfg.peak[0]:g}-{cfg.peak[1]:g}x (more than one replica absorbs) of shapes {', '.join(cfg.shapes)} "
        f"(bad-config: max_num_seqs 2 rolled out under steady load); replicas start in 17-48 s and warm up 2-6 s. "
        f"Closed loop in virtual time, {cfg.duration_s / 60:g}-minute runs. SLO: queue-time P99 <= "
        f"{cfg.queue_slo_s:g} s and e2e P99 <= {cfg.e2e_slo_s:g} s (1m windows). Model trained on seeds "
        f"{protocol['train_seeds']} (trace seconds {train_spans}), evaluated on seeds {protocol['eval_seeds']} "
        f"(trace seconds {spans}: disjoint, checked), each also run calm (the same arrivals, no onset). "
        f"Queue-time cut {figures['model']['cpu_cut']}."
    )
    lines = ["# Surge: the reactive baselines, the shipped rule and the SLA model, on one protocol", "", intro, ""]
    lines.append(
        "| controller | violation min (surge + calm) | replica-min | false scale-outs / calm h | scale-outs before "
        "onset | onsets: acted before / after violation, missed, prevented | lead to violation p25 / median / p75 "
        "(n) | first action after onset, median |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    for name, row in figures["table"].items():
        outcomes = row["outcomes"]
        lead = row["lead_to_violation_s"]
        cells = [
            name,
            f"{row['violation_minutes']:g} ({row['violation_minutes_surge']:g} + {row['violation_minutes_calm']:g})",
            f"{row['replica_minutes']:g}",
            (
                f"{_cell(row['false_scale_outs_per_calm_hour'])} ({row['false_scale_outs_calm']} in "
                f"{row['calm_hours']:g} h)"
            ),
            row["scale_outs_before_onset"],
            (
                f"{outcomes.get('acted before', 0)} / {outcomes.get('acted after', 0)}, {outcomes.get('missed', 0)}, "
                f"{outcomes.get('prevented', 0)} of {row['onsets']}"
            ),
            f"{_cell(lead['p25'], ' s')} / {_cell(lead['median'], ' s')} / {_cell(lead['p75'], ' s')} ({lead['n']})",
            _cell(row["action_after_onset_s"]["median"], " s"),
        ]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    shapes = list(dict.fromkeys(r["shape"] for r in figures["runs"]))
    names = list(figures["table"])
    lines += ["", "SLO-violation minutes per shape (all evaluated seeds):", ""]
    lines.append("| shape | " + " | ".join(names) + " |")
    lines.append("|---" * (len(names) + 1) + "|")
    for shape in shapes:
        runs = [r for r in figures["runs"] if r["shape"] == shape]
        cells = [f"{sum(r['slo_violation_minutes'] for r in runs if r['controller'] == n):g}" for n in names]
        lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    targets = figures["targets"]
    lines += [
        "",
        f"Targets (issue 27), the SLA model's policy against the best reactive baseline ({targets['best_reactive']}):",
        "",
    ]
    reduction = targets.get("violation_reduction_vs_best_reactive")
    extra = targets.get("extra_replica_minutes_vs_best_reactive")
    lines.append(
        "- SLO-violation minutes: "
        + (
            "-"
            if reduction is None
            else f"{reduction * 100:+.0f}% fewer"
            if reduction >= 0
            else f"{-reduction * 100:.0f}% more"
        )
        + " (target >= 30% fewer)"
    )
    lines.append(f"- replica-minutes: {'-' if extra is None else f'{extra * 100:+.0f}%'} (target <= +10%)")
    lines.append(
        f"- false scale-outs per calm hour: {_cell(targets.get('false_scale_outs_per_calm_hour'))} (target <= 0.1)"
    )
    lines.append(f"- median lead before the first violation: {_cell(targets.get('median_lead_to_violation_s'), ' s')}"
                 " (target >= 30 s)")  # fmt: skip
    return "\n".join(lines) + "\n"


def render_plot(result: ScenarioResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The first onset this run evaluated (a completing run, --after-first-shape, has no seed's first shape).
    first = next((r for r in result.runs if not r.calm), result.runs[0])
    seed, shape = first.seed, first.shape.kind
    palette = ["#888888", "#9467bd", "#8c564b", "#2ca02c", "#ff7f0e", "#d62728", "#1f77b4"]
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for color, name in zip(palette, result.controllers(), strict=False):
        run = result.run(name, seed, shape=shape)
        origin = run.surge_at

        def minutes(at: float, origin: float = origin) -> float:
            return (at - origin) / 60.0

        top.plot([minutes(a) for a, _ in run.queue_p99], [v for _, v in run.queue_p99], color=color, label=name)
        middle.plot([minutes(a) for a, _ in run.e2e_p99], [v for _, v in run.e2e_p99], color=color, label=name)
        bottom.step(
            [minutes(a) for a, _ in run.replica_timeline],
            [c for _, c in run.replica_timeline],
            where="post",
            color=color,
            label=name,
        )
        for at in run.scale_outs()[:1]:
            for axis in (top, middle, bottom):
                axis.axvline(minutes(at), color=color, linestyle=":", linewidth=1)
    top.axhline(result.config.queue_slo_s, color="black", linestyle="--", linewidth=1, label="SLO")
    middle.axhline(result.config.e2e_slo_s, color="black", linestyle="--", linewidth=1, label="SLO")
    top.set_ylabel("queue-time P99 (s)")
    middle.set_ylabel("e2e P99 (s)")
    bottom.set_ylabel("replicas (paid)")
    bottom.set_xlabel("minutes since the onset (dotted: first scale-out)")
    top.set_title(f"Seed {seed}, {shape}: reactive baselines, the shipped rule and the SLA model")
    top.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(result: ScenarioResult, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "surge.md", "json": out / "surge.json", "png": out / "surge.png"}
    paths["markdown"].write_text(render_markdown(result), encoding="utf-8")
    paths["json"].write_text(json.dumps(result.figures(), indent=2) + "\n", encoding="utf-8")
    render_plot(result, paths["png"])
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tailguard demo --scenario surge",
        description="Reactive baselines, the shipped rule and the SLA model on surges of several shapes and calm "
        "control traces, on trace segments disjoint from training (closed loop, virtual time).",
    )
    parser.add_argument("--out", type=Path, default=Path("surge-report"), help="report directory")
    parser.add_argument("--short", action="store_true", help="two seeds, one shape each (the e2e test's variant)")
    parser.add_argument("--seeds", type=int, default=None, help="evaluated seeds (default 5; the first is plotted)")
    parser.add_argument("--model", type=Path, default=None, help="reuse a model this scenario trained before")
    parser.add_argument("--shapes-per-seed", type=int, default=None, help="onset shapes per evaluated seed")
    parser.add_argument(
        "--after-first-shape",
        action="store_true",
        help="each seed's shapes after its first, no calm trace: completes a --shapes-per-seed 1 run (then --merge)",
    )
    parser.add_argument("--seed-list", default="", help="evaluated seeds by number, comma-separated (e.g. 4,5)")
    parser.add_argument(
        "--merge", type=Path, nargs="+", default=None, help="merge these report directories' surge.json into --out"
    )
    parser.add_argument(
        "--controllers", default="", help="comma-separated controllers to evaluate (default: all; see the report)"
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    config = ScenarioConfig.short() if args.short else ScenarioConfig()
    if args.controllers:
        config = dataclasses.replace(config, controllers=tuple(n.strip() for n in args.controllers.split(",")))
    if args.seeds is not None:
        if args.seeds < 1:
            print("tailguard demo: error: --seeds must be at least 1", file=sys.stderr)
            return 2
        config = dataclasses.replace(config, eval_seeds=tuple(range(1, args.seeds + 1)))
    if args.seed_list:
        try:
            config = dataclasses.replace(config, eval_seeds=tuple(int(n) for n in args.seed_list.split(",")))
        except ValueError:
            print(f"tailguard demo: error: --seed-list {args.seed_list!r}: expected numbers", file=sys.stderr)
            return 2
    if args.after_first_shape:
        config = dataclasses.replace(config, after_first_shape=True)
    if args.shapes_per_seed is not None:
        config = dataclasses.replace(config, shapes_per_seed=max(1, args.shapes_per_seed))
    if args.merge:
        try:
            merged = merge_figures([json.loads((d / "surge.json").read_text(encoding="utf-8")) for d in args.merge])
        except (OSError, ValueError, KeyError) as failed:
            print(f"tailguard demo: error: cannot merge {args.merge}: {failed}", file=sys.stderr)
            return 1
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "surge.json").write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
        print(render_table(merged))
        return 0

    def terminate(signum: int, _frame: object) -> None:
        # SIGTERM's default action would skip the cleanup and leave Prometheus behind.
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        result = run_scenario(config, args.out, model_dir=args.model)
    except (SurgeError, LabError, OSError) as failed:
        print(f"tailguard demo: error: {failed}", file=sys.stderr)
        return 1
    paths = write_report(result, args.out)
    print(render_markdown(result))
    print(f"report: {paths['markdown']} {paths['png']} {paths['json']} ({result.seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
