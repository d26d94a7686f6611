"""Record real-vLLM history: the tier on real vLLM replicas, a scripted load and rollout, scraped by a real Prometheus.

    python -m tailguard.serving.lab.recording run --scenario serving/lab/recordings/SCENARIO.json --out DIR
    python -m tailguard.serving.lab.recording export --data DIR/data --out history.om.xz [--start UNIX --end UNIX]

`run` is the live dataset path (tailguard.serving.lab.dataset generate_live) with a scenario: the tier process
(python -m tailguard.serving.tier, engine vllm: supervised vLLM processes from .venv-serving serving the tiny offline
model), the Azure trace replayed in real time through the tier's router at a rate that follows the scenario's
phases (calm stretches under capacity, surges over it; tailguard.serving.lab.dataset.arrivals: the trace looped, thinned
or duplicated by the phase's rate), and the scenario's control actions (a bad-config rollout, the rollback) sent
to the tier's control API at their times. Prometheus scrapes the replicas (the tier's HTTP service discovery)
and the router every `scrape_interval_s`; its TSDB is left in DIR/data, with DIR/timeline.json (the wall time
of every phase and action, and what the tier answered), DIR/requests.csv (every request's send time, latency
and status) and the logs.

`export` reads every series the SLA model's features and SLIs use (tailguard.serving.lab.dataset.RECORDED_PREFIXES and
`up`) back out of that TSDB, raw samples with their own timestamps, and writes OpenMetrics (xz-compressed when the
name ends in .xz) that `promtool tsdb create-blocks-from openmetrics` backfills (tailguard.serving.lab.promstack.
backfill_openmetrics; predictors.recording reads it that way).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import lzma
import math
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import requests
import yaml
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from pydantic import BaseModel, ConfigDict, Field

from tailguard.controller import ConfigError, PrometheusSettings, PrometheusSource, SystemClock
from tailguard.predictors.data import DataError
from tailguard.predictors.features import DEFAULT_SLI_THRESHOLDS
from tailguard.predictors.train import TrainingError
from tailguard.serving.lab import transfer
from tailguard.serving.lab.dataset import (
    DEFAULT_START,
    NAMESPACE,
    RECORDED_PREFIXES,
    SERVICE,
    Segment,
    arrivals,
    generate,
    tier_process,
    tier_scrape_configs,
    write_dataset,
)
from tailguard.serving.lab.load import BUILTIN_TRACES, PlannedRequest, read_trace, replay, summarize, write_csv
from tailguard.serving.lab.promstack import (
    BackfillResult,
    ProcessNotReady,
    PrometheusServer,
    PromStackError,
    backfill_openmetrics,
    http_get,
    write_prometheus_config,
)
from tailguard.serving.tier.profiles import EngineProfile, resolve_profile
from tailguard.serving.tier.tiny_model import SERVED_MODEL_NAME
from tailguard.serving.tier.vllm_args import platform_args, profile_cli_args, validate_cli_args

PROJECT_ROOT = Path(__file__).resolve().parents[2]
HTTP_TIMEOUT_S = 10.0
# engine: vllm validates a rollout's profile with vLLM's own parser first (a vLLM import: seconds on 2 cores).
ROLLOUT_TIMEOUT_S = 240.0
MONITOR_INTERVAL_S = 5.0
LOAD_INTERVAL_S = 60.0


class RecordingError(ConfigError, ValueError):
    """A scenario or a recording step is unusable; one clear sentence."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Phase(_Strict):
    """A stretch of load: the trace's own rate (~5.5 requests/s) times a multiplier ramping from..to."""

    start_s: float = Field(ge=0)
    end_s: float = Field(gt=0)
    rate_from: float = Field(ge=0)
    rate_to: float = Field(ge=0)
    # A phase that starts a surge names its shape; the recording lists these as its onsets (recording.json).
    onset: Literal["sudden", "ramp", "two-steps"] | None = None
    note: str = ""


class Action(_Strict):
    """A control action at a time: a rollout of a profile (with engine-argument overrides) or a rollback.

    With `serving_for_s`, the action waits (from `at_s` on) until the service's newest version has served that
    long, and is sent at `latest_s` regardless: a rollout's cold start on a busy 2-core host took 2.5 to over
    7 minutes, so a fixed time could roll back a version that never served.

    A rollout with `canary_weight` starts the new revision beside the serving one at that weight (a canary that
    cold-starts in the background); `promote` later gives the newest revision all the traffic at once, once it
    has a healthy replica (skipped when it has none by `latest_s`). That puts a bad config's takeover at a known
    time under steady load instead of after a cold start of unknown length. `after_previous_s` sends the action
    no earlier than that long after the previous action was answered (a rollback after a promote that waited).
    """

    at_s: float = Field(ge=0)
    action: Literal["rollout", "rollback", "promote"]
    profile: str | None = None
    engine_args: dict[str, Any] = Field(default_factory=dict)
    canary_weight: int | None = Field(None, ge=1, le=99)
    serving_for_s: float | None = Field(None, ge=0)
    latest_s: float | None = Field(None, ge=0)
    after_previous_s: float | None = Field(None, ge=0)
    note: str = ""


class RecordingScenario(_Strict):
    duration_s: float = Field(gt=0)
    replicas: int = Field(2, ge=1, le=8)
    trace: str = "conv"
    token_scale: float = Field(0.1, gt=0)
    max_model_len: int = Field(512, ge=16)
    scrape_interval_s: float = Field(5.0, gt=0, le=15)
    # A superseded version stays up (out of the router) this long, so the rollback is instant, not a cold start.
    scale_down_delay_s: float = Field(600.0, ge=0)
    # How long the tier lets a replica cold-start before it kills and restarts it: on the loaded host a canary
    # took over 15 minutes (recording 2026-12-06-onsets), and a restart mid-start costs the whole start again.
    startup_timeout_s: float = Field(900.0, gt=0)
    phases: list[Phase] = Field(min_length=1)
    actions: list[Action] = Field(default_factory=list)

    def segments(self) -> list[Segment]:
        return [
            Segment(p.start_s, p.end_s, "stable", self.replicas, p.rate_from, p.rate_to, 1.0, 1.0, 0.0, 0.0, 0.0)
            for p in self.phases
        ]


def load_scenario(path: Path) -> RecordingScenario:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RecordingError(f"{path}: cannot read the scenario: {exc}") from None
    try:
        scenario = RecordingScenario.model_validate(document.get("scenario", document))
    except ValueError as exc:
        raise RecordingError(f"{path}: invalid scenario: {exc}") from None
    ordered = sorted(scenario.phases, key=lambda p: p.start_s)
    if ordered[0].start_s != 0 or ordered[-1].end_s < scenario.duration_s:
        raise RecordingError(f"{path}: the phases must cover 0..duration_s ({scenario.duration_s:g}s)")
    for before, after in itertools.pairwise(ordered):
        if after.start_s != before.end_s:
            raise RecordingError(f"{path}: phases must be contiguous (gap or overlap at {before.end_s:g}s)")
    for action in scenario.actions:
        if action.action == "rollout" and not action.profile:
            raise RecordingError(f"{path}: the rollout at {action.at_s:g}s needs a profile")
    return scenario


def planned_requests(scenario: RecordingScenario) -> list[PlannedRequest]:
    """The replay schedule: the trace at each phase's rate, lengths trimmed to the engine's context (as load.plan)."""
    trace = read_trace(BUILTIN_TRACES.get(scenario.trace, Path(scenario.trace)))
    budget = max(2, scenario.max_model_len - 8)  # the chat template and special tokens take a few
    planned: list[PlannedRequest] = []
    for arrival in arrivals(trace, scenario.segments(), scenario.duration_s, token_scale=scenario.token_scale):
        output = min(arrival.output_tokens, budget - 1)
        planned.append(PlannedRequest(arrival.at, min(arrival.prompt_tokens, budget - output), output))
    return planned


def tier_document(scenario: RecordingScenario, serving_python: Path, model_dir: Path) -> dict[str, Any]:
    return {
        "ports": {"control": 0, "router": 0},
        "engine": "vllm",
        "vllm": {
            "serving_python": str(serving_python),
            "model_dir": str(model_dir),
            "scale_down_delay_s": scenario.scale_down_delay_s,
            "health_interval_s": 2,
            "startup_timeout_s": scenario.startup_timeout_s,  # cold starts took 400-900+ s on the shared host
            # The rollout profiles pass vLLM's parser before the load starts (validate_rollouts): at rollout time
            # the tier's own check, a vLLM import at low priority, took over its 180 s on the loaded host, and the
            # tier answered the scripted rollout 422 (recorded 2026-12-01).
            "validate_profiles": False,
        },
        "services": [
            {
                "name": SERVICE,
                "namespace": NAMESPACE,
                "model": SERVED_MODEL_NAME,
                "profile": "stable",
                "replicas": scenario.replicas,
            }
        ],
    }


def rollout_profile(action: Action) -> EngineProfile:
    assert action.profile is not None
    profile = resolve_profile(action.profile)
    engine_args = profile.engineArgs.model_copy(update=action.engine_args)
    return profile.model_copy(update={"engineArgs": engine_args})


def _rollout_body(action: Action, index: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "profile": rollout_profile(action).model_dump(mode="json"),
        "idempotency_key": f"recording-{index}-rollout",
    }
    if action.canary_weight is not None:
        body["canary_weight"] = action.canary_weight
    return body


def validate_rollouts(scenario: RecordingScenario, serving_python: Path, model_dir: Path) -> None:
    """Every rollout's profile through vLLM's own parser, before any load (a refusal stops the recording).

    Each distinct argument set is parsed once: a vLLM import took minutes on the loaded host.
    """
    checked: set[tuple[str, ...]] = set()
    for action in scenario.actions:
        if action.action != "rollout":
            continue
        args = [*profile_cli_args(rollout_profile(action)), *platform_args()]
        if tuple(args) in checked:
            continue
        result = validate_cli_args(serving_python, args, model_dir, timeout_s=900.0)
        if not result.ok:
            raise RecordingError(f"the rollout at {action.at_s:g}s: vLLM refuses its profile: {result.error}")
        checked.add(tuple(args))


async def _act(control_url: str, scenario: RecordingScenario, started: float, timeline: list[dict[str, Any]]) -> None:
    """Send each action at its time; record when it was sent, what the tier answered and how long it took."""
    async with aiohttp.ClientSession() as session:
        previous_answered: float | None = None
        for index, action in enumerate(sorted(scenario.actions, key=lambda a: a.at_s)):
            due = started + action.at_s
            if action.after_previous_s is not None and previous_answered is not None:
                due = max(due, previous_answered + action.after_previous_s)
            delay = due - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            serving_since = None
            if action.serving_for_s is not None or action.action == "promote":
                serving_since = await _newest_serving_since(
                    session,
                    control_url,
                    started + (action.latest_s or scenario.duration_s),
                    action.serving_for_s or 0.0,
                )
            if action.action == "promote" and serving_since is None:
                skipped = {"action": "promote", "at_s": action.at_s, "skipped": "the newest version never served"}
                timeline.append(skipped)
                previous_answered = time.time()
                print(json.dumps({"event": "action", **skipped}), flush=True)
                continue
            if action.action == "rollout":
                path, body = "rollout", _rollout_body(action, index)
            elif action.action == "promote":
                path = "weights"
                body = {
                    "version": await _newest_version(session, control_url),
                    "weight": 100,
                    "idempotency_key": f"recording-{index}-promote",
                }
            else:
                path = "rollback"
                body = {
                    "reason": action.note or "recording: bad-config rollout",
                    "idempotency_key": f"recording-{index}",
                }
            sent = time.time()
            entry: dict[str, Any] = {
                "action": action.action,
                "at_s": action.at_s,
                "sent_at": sent,
                "newest_version_serving_since": serving_since,
                "note": action.note,
            }
            try:
                async with session.post(
                    f"{control_url}/api/v1/services/{SERVICE}/{path}",
                    json=body,
                    timeout=aiohttp.ClientTimeout(total=ROLLOUT_TIMEOUT_S),
                ) as response:
                    entry["status"] = response.status
                    entry["answer"] = await response.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError) as failed:
                entry["error"] = f"{type(failed).__name__}: {failed}"
            entry["answered_at"] = previous_answered = time.time()
            timeline.append(entry)
            print(json.dumps({"event": "action", **entry}), flush=True)


async def _newest_version(session: aiohttp.ClientSession, control_url: str) -> str:
    async with session.get(
        f"{control_url}/api/v1/services/{SERVICE}", timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    ) as response:
        answer = await response.json(content_type=None)
    return str(max(answer["versions"], key=lambda v: int(v["revision"]))["version"])


async def _newest_serving_since(
    session: aiohttp.ClientSession, control_url: str, latest: float, serving_for_s: float
) -> float | None:
    """Wait until the service's newest version has a replica in the router for `serving_for_s` (or `latest`);
    returns when it started serving (None if it never did)."""
    since: float | None = None
    while time.time() < latest:
        if since is None:
            try:
                async with session.get(
                    f"{control_url}/api/v1/services/{SERVICE}", timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
                ) as response:
                    answer = await response.json(content_type=None)
                newest = max(answer["versions"], key=lambda v: int(v["revision"]))
                if any(r["healthy"] for r in newest["replicas"]):
                    since = time.time()
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
                pass
        elif time.time() >= since + serving_for_s:
            return since
        await asyncio.sleep(1.0)
    return since


async def _monitor(control_url: str, until: float, states: list[dict[str, Any]]) -> None:
    """The tier's view of the service every few seconds: which versions serve, at what weight, how many replicas."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as session:
        while time.time() < until:
            try:
                async with session.get(f"{control_url}/api/v1/services/{SERVICE}") as response:
                    answer = await response.json(content_type=None)
                states.append({"at": time.time(), "service": answer})
            except (aiohttp.ClientError, TimeoutError, ValueError) as failed:
                states.append({"at": time.time(), "error": f"{type(failed).__name__}: {failed}"})
            await asyncio.sleep(MONITOR_INTERVAL_S)


async def _sample_load(until: float, samples: list[dict[str, Any]], interval_s: float = LOAD_INTERVAL_S) -> None:
    """The host's load average every minute (what `uptime` prints): the recording shares a 2-core host."""
    while time.time() < until:
        one, five, fifteen = os.getloadavg()
        samples.append({"at": time.time(), "load1": one, "load5": five, "load15": fifteen})
        await asyncio.sleep(interval_s)


async def _drive(
    router_url: str,
    control_url: str,
    scenario: RecordingScenario,
    planned: list[PlannedRequest],
    load: list[dict[str, Any]],
) -> tuple[float, Any, list[dict[str, Any]], list[dict[str, Any]]]:
    started = time.time()
    actions: list[dict[str, Any]] = []
    states: list[dict[str, Any]] = []
    monitor = asyncio.create_task(_monitor(control_url, started + scenario.duration_s + 30, states))
    sampler = asyncio.create_task(_sample_load(started + scenario.duration_s + 30, load))
    replayed, _ = await asyncio.gather(
        replay(router_url, SERVED_MODEL_NAME, planned, progress=False, timeout_s=180.0),
        _act(control_url, scenario, started, actions),
    )
    monitor.cancel()
    sampler.cancel()
    return started, replayed, actions, states


_REPLICA_STARTED = re.compile(r"replica \S+ started \(pid (\d+),")


def reap_replica_groups(tier_log: str) -> list[int]:
    """SIGKILL what is left of each replica's process group once the tier is gone; returns the groups found alive.

    The supervisor stops its replicas on a clean shutdown, and each replica dies with the tier (PDEATHSIG), but
    vLLM's own children (the EngineCore process, the model-registry probe) do not: seen here after a tier that
    was killed mid-startup or mid-shutdown, they kept a core and 1.7 GiB each.
    """
    alive = []
    for pid in sorted({int(found) for found in _REPLICA_STARTED.findall(tier_log)}):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
        alive.append(pid)
    return alive


def run_recording(
    scenario: RecordingScenario, out: Path, *, serving_python: Path, model_dir: Path, scenario_path: Path
) -> dict[str, Any]:
    """The whole recording; the tier and Prometheus are stopped whatever happens."""
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    config = out / "tier.yaml"
    config.write_text(yaml.safe_dump(tier_document(scenario, serving_python, model_dir), sort_keys=False), "utf-8")
    planned = planned_requests(scenario)
    load: list[dict[str, Any]] = [{"at": time.time(), **dict(zip(("load1", "load5", "load15"), os.getloadavg()))}]
    tier = tier_process(config, out)
    tier.start()
    # The profiles are parsed while the tier cold-starts (both took minutes on the loaded host), before any load.
    pool = ThreadPoolExecutor(max_workers=1)
    validation = pool.submit(validate_rollouts, scenario, serving_python, model_dir)
    pool.shutdown(wait=False)
    try:
        try:
            ready = tier.wait_ready(scenario.startup_timeout_s + 100.0)
        except ProcessNotReady as exc:
            raise RecordingError(f"the serving tier did not start: {exc}") from None
        validation.result()
        interval = f"{scenario.scrape_interval_s:g}s"
        prometheus_config = write_prometheus_config(
            out / "prometheus.yml",
            scrape_interval=interval,
            evaluation_interval=interval,
            scrape_configs=tier_scrape_configs(ready, sd_refresh="2s"),
        )
        with PrometheusServer(prometheus_config, out / "data", workdir=out / "prometheus").start() as prometheus:
            prometheus.wait_target_up("vllm", count=scenario.replicas, timeout=120.0)
            print(
                json.dumps({"event": "recording", "requests": len(planned), "prometheus": prometheus.url}), flush=True
            )
            started, (results, wall), actions, states = asyncio.run(
                _drive(ready["router_url"], ready["control_url"], scenario, planned, load)
            )
            ended = time.time()
            time.sleep(2 * scenario.scrape_interval_s)  # the last scrape of the final state lands
    finally:
        tier.stop(grace=60.0)
        reap_replica_groups(tier.log_text())
    write_csv(out / "requests.csv", results)
    summary = summarize(results, wall)
    timeline = {
        "scenario": scenario.model_dump(mode="json"),
        "scenario_file": str(scenario_path),
        "started_at": started,
        "ended_at": ended,
        "phases": [
            {**p.model_dump(mode="json"), "start_at": started + p.start_s, "end_at": started + p.end_s}
            for p in scenario.phases
        ],
        "actions": actions,
        "tier_states": states,
        "load_average": load,
        "replay": summary.to_json(),
    }
    (out / "timeline.json").write_text(json.dumps(timeline, indent=1) + "\n", encoding="utf-8")
    return {"data": str(out / "data"), "started_at": started, "ended_at": ended, "replay": summary.to_json()}


# -- export -------------------------------------------------------------------------------------------


def _family(name: str, names: set[str]) -> tuple[str, str]:
    """(family, OpenMetrics type) of a stored series name: histograms by their _bucket, counters by _total."""
    for suffix in ("_bucket", "_sum", "_count"):
        base = name.removesuffix(suffix)
        if base != name and f"{base}_bucket" in names:
            return base, "histogram"
    if name.endswith("_total"):
        return name.removesuffix("_total"), "counter"
    return name, "gauge"


def _number(value: str) -> str:
    number = float(value)
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    return repr(number)


def _stamp(timestamp: float) -> str:
    return f"{timestamp:.3f}".rstrip("0").rstrip(".")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def recorded_names(prometheus_url: str) -> list[str]:
    """The recorded metric names Prometheus knows, through prometheus-api-client (`all_metrics`: label discovery,
    what the library is for; docs/architecture.md, "HTTP libraries")."""
    client = PrometheusConnect(url=prometheus_url)
    try:
        names: list[str] = client.all_metrics()
    except (PrometheusApiClientException, requests.RequestException) as failed:
        raise RecordingError(f"Prometheus could not list metric names: {failed}") from None
    finally:
        client.close()
    # `_created` series are the client library's creation stamps, not measurements (the simulator skips them too).
    return sorted(n for n in names if (n == "up" or n.startswith(RECORDED_PREFIXES)) and not n.endswith("_created"))


def export_openmetrics(prometheus_url: str, start: float, end: float) -> Iterator[str]:
    """OpenMetrics lines of every recorded series' raw samples in [start, end] (a range selector at `end`)."""
    names = recorded_names(prometheus_url)
    known = set(names)
    by_family: dict[str, tuple[str, list[str]]] = {}
    for name in names:
        family, kind = _family(name, known)
        by_family.setdefault(family, (kind, []))[1].append(name)
    window = f"{math.ceil(end - start) + 1}s"
    for family, (kind, members) in by_family.items():
        yield f"# TYPE {family} {kind}"
        for name in members:
            query = quote(f"{{__name__={json.dumps(name)}}}[{window}]")
            status, body = http_get(f"{prometheus_url}/api/v1/query?query={query}&time={end}", timeout=120.0)
            if status != 200:
                raise RecordingError(f"Prometheus answered {status} reading {name}: {body[:200]!r}")
            for series in json.loads(body)["data"]["result"]:
                labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
                rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
                for timestamp, value in series["values"]:
                    if float(timestamp) >= start:
                        yield f"{name}{{{rendered}}} {_number(value)} {_stamp(float(timestamp))}"
    yield "# EOF"


def write_export(lines: Iterator[str], path: Path) -> int:
    """Write the lines (xz when the name ends in .xz); returns the number of samples."""
    samples = 0
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "wt", encoding="utf-8") as handle:
        for line in lines:
            if not line.startswith("#"):
                samples += 1
            handle.write(line + "\n")
    return samples


# -- backfill and evaluation ----------------------------------------------------------------------------


def open_openmetrics(path: Path) -> Any:
    """A text reader of an OpenMetrics file, xz-compressed or not (by its name)."""
    return lzma.open(path, "rt", encoding="utf-8") if path.suffix == ".xz" else path.open(encoding="utf-8")


def sliced_openmetrics(path: Path, start: float | None = None, end: float | None = None) -> Iterator[str]:
    """The file's lines with only the samples in [start, end] (all of them without bounds)."""
    with open_openmetrics(path) as handle:
        for raw in handle:
            line = raw.rstrip("\n")
            if line.startswith("#") or not line:
                yield line
                continue
            stamp = float(line.rsplit(" ", 1)[1])
            if (start is None or stamp >= start) and (end is None or stamp <= end):
                yield line


def backfill_recording(
    path: Path, data_dir: Path, *, start: float | None = None, end: float | None = None
) -> BackfillResult:
    """TSDB blocks in `data_dir` from a recording (a slice of it with start/end), checked sample for sample."""
    with tempfile.TemporaryDirectory(prefix="tailguard-recording-") as scratch:
        plain = Path(scratch) / "history.om"
        samples = write_export(sliced_openmetrics(path, start, end), plain)
        return backfill_openmetrics(plain, data_dir, expected_samples=samples)


@dataclass(frozen=True)
class Recording:
    """A committed recording: its OpenMetrics file and its window (from recording.json)."""

    directory: Path
    history: Path
    start: float
    end: float
    meta: dict[str, Any]

    @classmethod
    def load(cls, directory: Path) -> Recording:
        try:
            meta = json.loads((directory / "recording.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RecordingError(f"{directory}: cannot read recording.json: {exc}") from None
        return cls(directory, directory / meta["history"], float(meta["started_at"]), float(meta["ended_at"]), meta)


def _generated(where: Path, start: float, hours: float) -> dict[str, Any] | None:
    try:
        summary: dict[str, Any] = json.loads((where / "scenario.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    same = summary.get("start") == start and summary.get("end") == start + hours * 3600.0
    return summary if same and (where / "history.om").exists() else None


def simulated_windows(
    seeds: Sequence[int], hours: float, out: Path, data_dir: Path, *, profile_change: float = 0.5
) -> list[tuple[float, float]]:
    """Simulator history for each seed (tailguard.serving.lab.dataset generate), backfilled into `data_dir`; their
    windows."""
    windows = []
    for index, seed in enumerate(seeds):
        start = DEFAULT_START + index * (hours + 1.0) * 3600.0
        where = out / f"sim-{seed}"
        summary = _generated(where, start, hours)
        if summary is None:  # not generated before with these settings (generation is minutes per hour)
            dataset = generate(seed, hours * 3600.0, start=start, profile_change=profile_change)
            summary = write_dataset(dataset, where, backfill=False)
        backfill_openmetrics(where / "history.om", data_dir, expected_samples=int(summary["samples"]))
        windows.append((float(summary["start"]), float(summary["end"])))
    return windows


def evaluate_recording(
    recording: Recording,
    out: Path,
    *,
    sim_seeds: Sequence[int] = (101, 102),
    sim_hours: float = 1.0,
    train_share: float = 0.6,
    step_s: float = 5.0,
    horizon_s: float = 60.0,
    e2e_threshold_s: float = 10.0,
    window: tuple[float, float] | None = None,
    folds: int = 5,
    others: Sequence[Recording] = (),
) -> list[dict[str, Any]]:
    """Both experiments (tailguard.serving.lab.transfer): simulator -> recording, and the recording's first part ->
    rest; for each of `others` (held-out recordings), simulator -> it and all of `recording` -> it.

    `window` evaluates a slice of the recording only (the CI test's few minutes). Writes OUT/report.md and
    OUT/report.json; the backfilled TSDB is in OUT/data.
    """
    start, end = window or (recording.start, recording.end)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = out / "data"
    backfill_recording(recording.history, data_dir, start=start, end=end)
    for other in others:
        backfill_recording(other.history, data_dir)
    sims = simulated_windows(sim_seeds, sim_hours, out, data_dir)
    settings = transfer.Settings(
        match={"namespace": NAMESPACE},
        group_by=["service"],
        step_s=step_s,
        horizon_s=horizon_s,
        thresholds=dict(DEFAULT_SLI_THRESHOLDS),
        e2e_threshold_s=e2e_threshold_s,
        folds=folds,
    )
    config = write_prometheus_config(out / "prometheus.yml")
    with (
        PrometheusServer(config, data_dir, workdir=out / "prometheus").start() as prometheus,
        PrometheusSource(PrometheusSettings(url=prometheus.url, timeout=60.0), SystemClock()) as source,
    ):
        simulated = [transfer.read_rows(transfer.Window(source, a, b), settings)[0] for a, b in sims]
        rows, e2e = transfer.read_rows(transfer.Window(source, start, end), settings)
        experiments = [
            transfer.transfer(simulated, rows, e2e, settings),
            transfer.in_recording(rows, e2e, settings, train_share),
        ]
        for other in others:
            other_rows, other_e2e = transfer.read_rows(transfer.Window(source, other.start, other.end), settings)
            name = other.directory.name
            experiments.append(
                transfer.transfer(simulated, other_rows, other_e2e, settings, f"transfer: simulator -> {name}")
            )
            experiments.append(
                transfer.transfer(
                    [rows], other_rows, other_e2e, settings, f"real: all of {recording.directory.name} -> {name}"
                )
            )
    header = (
        f"Recording {recording.directory.name}: {datetime.fromtimestamp(start, UTC):%Y-%m-%dT%H:%M:%SZ} + "
        f"{(end - start) / 60:.1f} min; step {step_s:g}s, horizon {horizon_s:g}s; simulator seeds "
        f"{', '.join(map(str, sim_seeds))} ({sim_hours:g} h each)."
    )
    (out / "report.md").write_text(header + "\n\n" + transfer.render_markdown(experiments), encoding="utf-8")
    (out / "report.json").write_text(json.dumps(transfer.report_json(experiments), indent=1) + "\n", encoding="utf-8")
    return experiments


def version_changes(states: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tier's service states (every few seconds) reduced to the moments its versions or their replicas changed."""
    changes: list[dict[str, Any]] = []
    previous = None
    for state in states:
        service = state.get("service")
        if not isinstance(service, dict) or "versions" not in service:
            continue
        versions = [
            {
                "version": v["version"],
                "weight": v["weight"],
                "serving": sum(1 for r in v["replicas"] if r["healthy"]),
                "replicas": len(v["replicas"]),
            }
            for v in service["versions"]
        ]
        if versions != previous:
            changes.append({"at": state["at"], "versions": versions})
            previous = versions
    return changes


def bad_config_rollouts(actions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bad configs that took all the traffic at a known time: each answered promote (the scenario's or one
    sent by hand, from manual-actions.jsonl) and the rollback after it; `actions` in time order.

    (A rollout without a canary takes the traffic after its cold start: `versions` says when.)
    """
    rollouts: list[dict[str, Any]] = []
    for index, action in enumerate(actions):
        if action.get("action") != "promote" or action.get("status") != 200:
            continue
        rollback = next((a for a in actions[index + 1 :] if a.get("action") == "rollback"), None)
        rollouts.append(
            {
                "took_traffic_at": action["answered_at"],
                "rolled_back_at": rollback["sent_at"] if rollback is not None else None,
                "by_hand": bool(action.get("manual")),
                "note": action.get("note", ""),
            }
        )
    return rollouts


def action_time(action: dict[str, Any]) -> float:
    return float(action.get("sent_at") or action.get("answered_at") or 0.0)


def package_run(run: Path, into: Path) -> dict[str, Any]:
    """A run's TSDB exported to INTO/history.om.xz and what it was (timeline, actions, load) to INTO/recording.json."""
    timeline = json.loads((run / "timeline.json").read_text(encoding="utf-8"))
    start, end = float(timeline["started_at"]), float(timeline["ended_at"])
    into.mkdir(parents=True, exist_ok=True)
    config = write_prometheus_config(run / "export-prometheus.yml")
    with PrometheusServer(config, run / "data", workdir=run / "export-prometheus").start() as prometheus:
        samples = write_export(export_openmetrics(prometheus.url, start, end), into / "history.om.xz")
    manual = run / "manual-actions.jsonl"
    manual_actions = [json.loads(line) for line in manual.read_text().splitlines()] if manual.exists() else []
    meta = {
        "history": "history.om.xz",
        "samples": samples,
        "started_at": start,
        "ended_at": end,
        "scrape_interval_s": timeline["scenario"]["scrape_interval_s"],
        "phases": timeline["phases"],
        "actions": timeline["actions"],
        "manual_actions": manual_actions,
        "versions": version_changes(timeline["tier_states"]),
        "onsets": [
            {"shape": p["onset"], "at": p["start_at"], "at_s": p["start_s"], "note": p.get("note", "")}
            for p in timeline["phases"]
            if p.get("onset")
        ],
        "rollouts": bad_config_rollouts(sorted([*timeline["actions"], *manual_actions], key=action_time)),
        "load_average": timeline.get("load_average", []),
        "replay": timeline["replay"],
    }
    (into / "recording.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return meta


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tailguard.serving.lab.recording", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="record the scenario on real vLLM into a real Prometheus")
    run.add_argument("--scenario", type=Path, required=True)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--serving-python", type=Path, default=PROJECT_ROOT / ".venv-serving" / "bin" / "python")
    run.add_argument("--model-dir", type=Path, default=PROJECT_ROOT / ".tailguard" / "models" / "tiny-llama")
    export = commands.add_parser("export", help="a run's TSDB -> DIR/history.om.xz and DIR/recording.json")
    export.add_argument("--run", type=Path, required=True, help="the run's --out directory")
    export.add_argument("--into", type=Path, required=True, help="the recording's directory")
    evaluate = commands.add_parser("evaluate", help="transfer and in-recording evaluation of the SLA model")
    evaluate.add_argument("--recording", type=Path, required=True, help="a directory with recording.json")
    evaluate.add_argument("--held-out", type=Path, nargs="*", default=[], help="other recordings, only evaluated on")
    evaluate.add_argument("--out", type=Path, required=True)
    evaluate.add_argument("--sim-seeds", type=int, nargs="+", default=[101, 102])
    evaluate.add_argument("--sim-hours", type=float, default=1.0)
    evaluate.add_argument("--train-share", type=float, default=0.6)
    evaluate.add_argument("--step", type=float, default=5.0, help="seconds between rows")
    evaluate.add_argument("--horizon", type=float, default=60.0, help="label horizon, seconds")
    evaluate.add_argument("--e2e-threshold", type=float, default=10.0, help="e2e P99 SLO, seconds")
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            scenario = load_scenario(args.scenario)
            # SIGTERM unwinds like Ctrl-C, so the tier (its own process group) and Prometheus are stopped.
            signal.signal(signal.SIGTERM, signal.default_int_handler)
            result = run_recording(
                scenario,
                args.out,
                serving_python=args.serving_python,
                model_dir=args.model_dir,
                scenario_path=args.scenario,
            )
            print(json.dumps({"event": "done", **result}), flush=True)
            return 0
        if args.command == "evaluate":
            experiments = evaluate_recording(
                Recording.load(args.recording),
                args.out,
                sim_seeds=args.sim_seeds,
                sim_hours=args.sim_hours,
                train_share=args.train_share,
                step_s=args.step,
                horizon_s=args.horizon,
                e2e_threshold_s=args.e2e_threshold,
                others=[Recording.load(path) for path in args.held_out],
            )
            print(transfer.render_markdown(experiments))
            print(f"wrote {args.out / 'report.md'} and report.json")
            return 0
        meta = package_run(args.run, args.into)
        print(f"wrote {args.into / meta['history']}: {meta['samples']} samples; {args.into / 'recording.json'}")
        return 0
    except (RecordingError, DataError, TrainingError, PromStackError, OSError) as failed:
        print(f"error: {failed}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
