"""The local serving tier: simulated vLLM replicas, the router and the control API in one process.

    python -m tailguard.serving.tier --config tier.yaml --state-dir DIR [--port N]

The control API is the contract in docs/architecture.md. It is the local
implementation of the actuator protocols (Deployer: rollback / replicas /
scale; TrafficRouter: weights). Semantics:
- Revisions are numbered per service from 1 (version label "r<N>"); the first
  comes from the config's profile. A rollout creates a new revision: full
  replacement (the new version alone, weight 100, same replica count) or, with
  `canary_weight`, next to the current primary version at that weight.
- The *active* revision is the newest live one (what a rollback leaves); the
  *primary* version is the live one with the highest weight: `scale` changes
  its replica count and `replicas` in a Service is its count.
- A rollback marks the active revision bad (with the reason) and makes the
  requested revision, or the newest earlier good one, the only live version;
  409 when there is none.
- `weights` sets one live version's share; the other live versions share the
  rest in proportion to their current weights. With `{"weights": {...}}` instead
  it sets every live version's weight at once (they must sum to 100): a restore.
- Every mutation carries an idempotency key. The first answer is stored with the
  new state in one atomic write of `state.json` in the state dir, so a replayed
  key returns that answer with "replayed": true, across restarts too. Failed
  requests (4xx/5xx) are not recorded: they changed nothing.
On start the tier prints one JSON line, `{"event": "ready", "control_url", "router_url", ...}`,
and it stops cleanly on SIGTERM / SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import math
import os
import signal
import sys
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from tailguard.controller import InputError
from tailguard.serving.tier.engine_args_metric import EngineArgCollector, ListedReplica
from tailguard.serving.tier.profiles import EngineArgs, EngineProfile, profile_diff, profile_from_dict, resolve_profile
from tailguard.serving.tier.router import ReplicaTarget, Router, VersionTarget
from tailguard.serving.tier.simulator import ReplicaEngine, make_replica_app
from tailguard.serving.tier.supervisor import (
    Replica,
    ReplicaSpec,
    Supervisor,
    free_port,
    short_scratch_dir,
    vllm_command,
    vllm_environment,
)
from tailguard.serving.tier.tiny_model import DEFAULT_MODEL_DIR, TinyModelError, ensure_tiny_model
from tailguard.serving.tier.vllm_args import platform_args, profile_cli_args, validate_cli_args
from tailguard.serving.tier.yamlfile import ConfigFileError, load_yaml_model

STATE_FILE = "state.json"
MAX_REPLICAS = 32
DRAIN_TIMEOUT_S = 5.0


# -- configuration -------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServiceConfig(_Strict):
    name: str = Field(min_length=1, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    namespace: str = "llm"
    model: str = Field(min_length=1)
    profile: str = Field("stable", description="a profile name (serving/tier/profiles or profiles_dir) or a path")
    replicas: int = Field(1, ge=0, le=MAX_REPLICAS)


class PortsConfig(_Strict):
    control: int = Field(0, ge=0, le=65535)
    router: int = Field(0, ge=0, le=65535)


class VllmConfig(_Strict):
    """Real vLLM replicas (engine: vllm): where the serving virtualenv and the model are, and how to watch them.

    Relative paths are relative to the current directory (the project root under `make`).
    """

    serving_python: str = ".venv-serving/bin/python"
    model_dir: str = str(DEFAULT_MODEL_DIR)
    extra_args: list[str] = Field(default_factory=list)
    startup_timeout_s: float = Field(300.0, gt=0)
    health_interval_s: float = Field(2.0, gt=0)
    warmup_completions: int = Field(3, ge=0)
    # vLLM's parser runs before every rollout; off only for tests of the tier's own logic.
    validate_profiles: bool = True
    # Like Argo Rollouts' scaleDownDelaySeconds: a superseded version's replicas stay up (out of the router) this
    # long, so a rollback to it is instant instead of a cold vLLM start. 0 stops them as soon as they are replaced.
    scale_down_delay_s: float = Field(0.0, ge=0)


class TierConfig(_Strict):
    services: list[ServiceConfig] = Field(min_length=1)
    ports: PortsConfig = Field(default_factory=PortsConfig)
    profiles_dir: str | None = None
    # simulator: in-process simulated replicas (fast tests); vllm: supervised real vLLM processes.
    engine: Literal["simulator", "vllm"] = "simulator"
    vllm: VllmConfig = Field(default_factory=VllmConfig)
    # The router's priority batching windows (serving/tier/priority.py: interactive 5 ms / 8, batch 20 ms / 32). Off by
    # default: holding and releasing requests in batches changes the latency every existing scenario was tuned on
    # (the real-vLLM demo's stable P99 crossed its 2 s threshold during a replica's cold start with them on).
    priority_windows: bool = False


def load_tier_config(path: str | Path) -> TierConfig:
    config = load_yaml_model(TierConfig, path)
    names = [s.name for s in config.services]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigFileError(str(path), 1, "services", f"duplicate service names {duplicates}")
    return config


# -- state ---------------------------------------------------------------------------------------


@dataclass
class Revision:
    revision: int
    profile: dict[str, Any]
    created_at: float
    bad: bool = False
    reason: str | None = None

    @property
    def version(self) -> str:
        return f"r{self.revision}"

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "version": self.version,
            "profile": self.profile,
            "created_at": self.created_at,
            "bad": self.bad,
            "reason": self.reason,
        }


def revisions_answer(revisions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """GET .../revisions: each revision's JSON plus `profile_diff`, what its profile changed from the revision before.

    `profile_diff` is tailguard.serving.tier.profiles.profile_diff ({arg: {"from": old, "to": new}}) from the next lower
    revision's profile; {} for the first revision, null when either profile cannot be read. The change
    tracker (controller/adapters/changes/tracker.py) reads it, so the controller never parses a profile.
    """
    ordered = sorted(revisions, key=lambda r: int(r["revision"]))
    diffs: dict[int, dict[str, Any] | None] = {int(ordered[0]["revision"]): {}} if ordered else {}
    for previous, current in itertools.pairwise(ordered):
        try:
            diff: dict[str, Any] | None = profile_diff(
                profile_from_dict(previous["profile"]), profile_from_dict(current["profile"])
            )
        except ConfigFileError:
            diff = None
        diffs[int(current["revision"])] = diff
    return [{**r, "profile_diff": diffs[int(r["revision"])]} for r in revisions]


@dataclass
class ServiceState:
    name: str
    namespace: str
    model: str
    revisions: list[Revision]
    weights: dict[str, int]  # live versions -> weight
    replicas: dict[str, int]  # live versions -> replica count

    def revision(self, number: int) -> Revision | None:
        return next((r for r in self.revisions if r.revision == number), None)

    @property
    def active_revision(self) -> int:
        return max(int(version[1:]) for version in self.weights)

    @property
    def primary_version(self) -> str:
        return max(self.weights, key=lambda v: (self.weights[v], int(v[1:])))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "namespace": self.namespace,
            "model": self.model,
            "revisions": [r.to_json() for r in self.revisions],
            "weights": self.weights,
            "replicas": self.replicas,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> ServiceState:
        revisions = [
            Revision(r["revision"], r["profile"], r["created_at"], r["bad"], r["reason"]) for r in data["revisions"]
        ]
        return ServiceState(
            data["name"],
            data["namespace"],
            data["model"],
            revisions,
            {k: int(v) for k, v in data["weights"].items()},
            {k: int(v) for k, v in data["replicas"].items()},
        )


def write_json_atomic(path: Path, data: Any) -> None:
    """Write-then-rename with fsync: a crash leaves the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with_suppressed_unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def with_suppressed_unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class ApiError(InputError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def split_weights(weights: dict[str, int], version: str, weight: int) -> dict[str, int]:
    """`version` gets `weight`; the others share 100 - weight in proportion to their current weights."""
    others = [v for v in weights if v != version]
    result = {version: weight}
    rest = 100 - weight
    if not others:
        return result
    current = sum(weights[v] for v in others)
    shares = {v: (rest * weights[v] / current if current else rest / len(others)) for v in others}
    floors = {v: math.floor(s) for v, s in shares.items()}
    leftover = rest - sum(floors.values())
    for v in sorted(others, key=lambda v: (shares[v] - floors[v], weights[v]), reverse=True)[:leftover]:
        floors[v] += 1
    result.update(floors)
    return result


# -- runtime -------------------------------------------------------------------------------------


@dataclass
class RunningReplica:
    id: str
    service: str
    version: str
    engine: ReplicaEngine | None  # simulator replicas
    runner: web.AppRunner | None  # simulator replicas
    url: str
    port: int
    draining: bool = False
    supervised: Replica | None = None  # vLLM replicas
    parked: bool = False  # superseded, kept warm for a quick rollback (scale_down_delay_s)

    @property
    def weight(self) -> int:
        """Routing weight: simulator replicas are always in; a vLLM replica only once warm (failover aside)."""
        return self.supervised.weight if self.supervised is not None else 100


@dataclass
class Tier:
    config: TierConfig
    state_dir: Path
    config_dir: Path
    now: Callable[[], float] = time.time
    services: dict[str, ServiceState] = field(default_factory=dict)
    idempotency: dict[str, dict[str, Any]] = field(default_factory=dict)
    replicas: dict[str, RunningReplica] = field(default_factory=dict)
    router: Router = field(default_factory=Router)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _background: set[asyncio.Task[None]] = field(default_factory=set)
    supervisor: Supervisor | None = None
    _validated: dict[tuple[str, ...], str] = field(default_factory=dict)  # vLLM args -> '' or the refusal
    _engine_args: dict[tuple[str, str], EngineArgs] = field(default_factory=dict)  # (service, version) -> args

    def __post_init__(self) -> None:
        self.router.batching_windows = self.config.priority_windows
        self.router.registry.register(EngineArgCollector(self.listed_replicas))
        if self.config.engine == "vllm":
            self.supervisor = Supervisor(
                on_change=self._replicas_changed,
                registry=self.router.registry,
                startup_timeout_s=self.config.vllm.startup_timeout_s,
                health_interval_s=self.config.vllm.health_interval_s,
                warmup_completions=self.config.vllm.warmup_completions,
            )

    # -- persistence ---
    def load_state(self) -> None:
        path = self.state_dir / STATE_FILE
        if path.exists():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                self.services = {name: ServiceState.from_json(s) for name, s in data["services"].items()}
                self.idempotency = dict(data["idempotency"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigFileError(
                    str(path), 1, "", f"unreadable tier state ({exc!r}); expected the JSON the tier writes"
                ) from None
        for service in self.config.services:
            if service.name in self.services:
                continue  # the state dir wins: it holds rollouts made since the config was written
            profile = self._resolve(service.profile)
            self.services[service.name] = ServiceState(
                service.name,
                service.namespace,
                service.model,
                [Revision(1, profile.model_dump(mode="json"), self.now())],
                {"r1": 100},
                {"r1": service.replicas},
            )
        self.save()

    def save(self) -> None:
        write_json_atomic(
            self.state_dir / STATE_FILE,
            {
                "services": {name: s.to_json() for name, s in self.services.items()},
                "idempotency": self.idempotency,
            },
        )

    def _resolve(self, name: str) -> EngineProfile:
        dirs = [self.config_dir]
        if self.config.profiles_dir:
            dirs.insert(0, (self.config_dir / self.config.profiles_dir).resolve())
        path = Path(name)
        if not path.is_absolute() and (self.config_dir / path).is_file():
            return resolve_profile(str(self.config_dir / path))
        return resolve_profile(name, dirs)

    # -- replicas ---
    def _serving_python(self) -> Path:
        # absolute(), not resolve(): the venv's python is a symlink, and resolving it escapes the venv.
        return Path(self.config.vllm.serving_python).absolute()

    async def prepare_engine(self) -> None:
        """engine: vllm needs the tiny model on disk before the first replica starts (built once, cached)."""
        if self.config.engine == "vllm":
            await asyncio.to_thread(ensure_tiny_model, self._serving_python(), Path(self.config.vllm.model_dir))

    def _start_vllm_replica(self, service: ServiceState, version: str, replica_id: str, profile: EngineProfile) -> None:
        assert self.supervisor is not None
        port = free_port()
        scratch = short_scratch_dir(replica_id)
        command = vllm_command(
            self._serving_python(),
            Path(self.config.vllm.model_dir).absolute(),
            service.model,
            port,
            profile,
            self.config.vllm.extra_args,
        )
        spec = ReplicaSpec(
            id=replica_id,
            service=service.name,
            version=version,
            model=service.model,
            command=tuple(command),
            port=port,
            log_path=self.state_dir / "replicas" / f"{replica_id}.log",
            env=vllm_environment(self.state_dir / "vllm-cache" / replica_id, scratch),
            scratch_dirs=(scratch,),
        )
        supervised = self.supervisor.start(spec)
        self.replicas[replica_id] = RunningReplica(
            replica_id, service.name, version, None, None, spec.url, port, supervised=supervised
        )

    async def _start_replica(self, service: ServiceState, version: str, index: int) -> None:
        revision = service.revision(int(version[1:]))
        assert revision is not None
        replica_id = f"{service.name}-{version}-{index}"
        profile = profile_from_dict(revision.profile, f"{service.name} {version}")
        if self.config.engine == "vllm":
            self._start_vllm_replica(service, version, replica_id, profile)
            return
        engine = ReplicaEngine(profile, service.model, hostname=replica_id, seed=zlib.crc32(replica_id.encode()))
        runner = web.AppRunner(make_replica_app(engine, (service.model, service.name)), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        self.replicas[replica_id] = RunningReplica(
            replica_id, service.name, version, engine, runner, f"http://127.0.0.1:{port}", port
        )

    async def _stop_replica(self, replica: RunningReplica) -> None:
        replica.draining = True
        deadline = asyncio.get_running_loop().time() + DRAIN_TIMEOUT_S
        while (
            (replica.engine is not None and replica.engine.in_flight) or self.router.in_flight(replica.id)
        ) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        if replica.runner is not None:
            await replica.runner.cleanup()
        if replica.supervised is not None and self.supervisor is not None:
            await self.supervisor.stop(replica.id)
        self.replicas.pop(replica.id, None)

    def _drain_in_background(self, replica: RunningReplica) -> None:
        replica.draining = True
        task = asyncio.get_running_loop().create_task(self._stop_replica(replica))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _live(self, service: str, version: str) -> list[RunningReplica]:
        found = [
            r
            for r in self.replicas.values()
            if r.service == service and r.version == version and not r.draining and not r.parked
        ]
        return sorted(found, key=lambda r: int(r.id.rsplit("-", 1)[1]))

    async def reconcile(self, name: str) -> None:
        """Start and stop replicas until the running ones match the service state; then update the router."""
        service = self.services[name]
        for version, count in service.replicas.items():
            parked = sorted(
                (r for r in self.replicas.values() if r.service == name and r.version == version and r.parked),
                key=lambda r: r.id,
            )
            for replica in parked[: max(0, count - len(self._live(name, version)))]:
                replica.parked = False  # a rollback to a parked version: already warm, back at once
            live = self._live(name, version)
            for replica in live[count:]:
                self._drain_in_background(replica)
            used = {
                int(r.id.rsplit("-", 1)[1])
                for r in self.replicas.values()
                if r.service == name and r.version == version
            }
            index = 0
            for _ in range(count - len(live)):
                while index in used:
                    index += 1
                used.add(index)
                await self._start_replica(service, version, index)
        self._sync(name)

    def _ready(self, name: str) -> bool:
        """Whether a live (weighted) version of the service has a replica that may take traffic."""
        service = self.services[name]
        return any(r.weight > 0 for version in service.weights for r in self._live(name, version))

    def _sync(self, name: str) -> None:
        """Retire superseded versions once the live ones can serve, and give the router the serving replicas.

        Shadow warm-up: until a new version's replicas passed warm-up (vLLM takes tens of seconds to start),
        the versions it replaces keep serving, so a rollout or rollback never leaves the service without
        replicas. Simulator replicas are ready at once, so for them this is the old immediate replacement.
        """
        service = self.services[name]
        # Simulator replicas start serving at once: the live versions replace the old ones immediately.
        ready = self.config.engine == "simulator" or self._ready(name)
        superseded = sorted(
            {r.version for r in self.replicas.values() if r.service == name and r.version not in service.weights},
            key=lambda v: int(v[1:]),
        )
        if ready:
            for replica in list(self.replicas.values()):
                if replica.service != name or replica.version in service.weights or replica.draining:
                    continue
                if self.config.engine == "vllm" and self.config.vllm.scale_down_delay_s > 0:
                    if not replica.parked:
                        replica.parked = True
                        self._retire_later(replica, self.config.vllm.scale_down_delay_s)
                else:
                    self._drain_in_background(replica)
        targets = [
            VersionTarget(
                version,
                weight,
                tuple(ReplicaTarget(r.id, r.url, weight=r.weight) for r in self._live(name, version) if r.weight > 0),
            )
            for version, weight in sorted(service.weights.items(), key=lambda item: int(item[0][1:]))
        ]
        if not ready:
            targets += [
                VersionTarget(
                    version,
                    100,
                    tuple(ReplicaTarget(r.id, r.url, weight=r.weight) for r in self._live(name, version) if r.weight),
                )
                for version in superseded
            ]
        self.router.set_service(name, service.model, targets)

    def _retire_later(self, replica: RunningReplica, delay_s: float) -> None:
        async def retire() -> None:
            await asyncio.sleep(delay_s)
            if replica.parked and not replica.draining:
                await self._stop_replica(replica)

        task = asyncio.get_running_loop().create_task(retire())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _replicas_changed(self) -> None:
        """The supervisor's callback: a replica became warm, left or rejoined rotation, or crashed."""
        for name in self.services:
            self._sync(name)

    # -- views ---
    def service_json(self, service: ServiceState) -> dict[str, Any]:
        versions = [
            {
                "version": version,
                "revision": int(version[1:]),
                "weight": weight,
                "replicas": [
                    {"id": r.id, "url": r.url, "healthy": r.weight > 0, "weight": r.weight}
                    for r in self._live(service.name, version)
                ],
            }
            for version, weight in sorted(service.weights.items(), key=lambda item: int(item[0][1:]))
        ]
        return {
            "name": service.name,
            "namespace": service.namespace,
            "model": service.model,
            "active_revision": service.active_revision,
            "replicas": service.replicas[service.primary_version],
            "versions": versions,
        }

    def _listed(self) -> list[RunningReplica]:
        """The replicas service discovery lists: starting, warming up, serving or parked; not draining."""
        return [r for r in sorted(self.replicas.values(), key=lambda r: r.id) if not r.draining]

    def listed_replicas(self) -> list[ListedReplica]:
        """The listed replicas with their revision's engine args (tailguard_serving_engine_arg)."""
        listed = []
        for replica in self._listed():
            key = (replica.service, replica.version)
            if key not in self._engine_args:
                service = self.services.get(replica.service)
                revision = service.revision(int(replica.version[1:])) if service is not None else None
                if revision is None:
                    continue
                # A revision's profile never changes once created, so its parsed args are cached.
                self._engine_args[key] = profile_from_dict(revision.profile, f"{key[0]} {key[1]}").engineArgs
            listed.append(ListedReplica(replica.service, replica.version, replica.id, self._engine_args[key]))
        return listed

    def sd_json(self) -> list[dict[str, Any]]:
        return [
            {
                "targets": [f"127.0.0.1:{r.port}"],
                "labels": {
                    "service": r.service,
                    "version": r.version,
                    "replica": r.id,
                    "namespace": self.services[r.service].namespace,
                },
            }
            for r in self._listed()
        ]

    # -- mutations (called under the lock; return the answer without "replayed") ---
    def _service(self, name: str) -> ServiceState:
        service = self.services.get(name)
        if service is None:
            raise ApiError(404, f"unknown service {name!r}")
        return service

    def rollout(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        service = self._service(name)
        if "profile" in body and body["profile"] is not None:
            try:
                profile = profile_from_dict(body["profile"], "rollout body: profile")
            except ConfigFileError as exc:
                raise ApiError(400, f"invalid profile: {exc.field}: {exc.message}") from None
        elif isinstance(body.get("profile_name"), str):
            try:
                profile = self._resolve(body["profile_name"])
            except ConfigFileError as exc:
                raise ApiError(400, str(exc)) from None
        else:
            raise ApiError(400, "the body needs 'profile' (an object) or 'profile_name' (a string)")
        canary = body.get("canary_weight")
        if canary is not None and (isinstance(canary, bool) or not isinstance(canary, int) or not 0 < canary < 100):
            raise ApiError(400, f"'canary_weight' must be an integer from 1 to 99 or null, got {canary!r}")
        number = max(r.revision for r in service.revisions) + 1
        revision = Revision(number, profile.model_dump(mode="json"), self.now())
        service.revisions.append(revision)
        primary = service.primary_version
        count = service.replicas[primary]
        if canary is None:
            service.weights = {revision.version: 100}
            service.replicas = {revision.version: count}
        else:
            service.weights = {primary: 100 - canary, revision.version: canary}
            service.replicas = {primary: count, revision.version: max(1, math.ceil(count * canary / 100))}
        return {"revision": number, "version": revision.version}

    def rollback(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        service = self._service(name)
        leaving = service.active_revision
        wanted = body.get("to_revision")
        if wanted is not None:
            target = service.revision(wanted) if isinstance(wanted, int) and not isinstance(wanted, bool) else None
            if target is None:
                raise ApiError(404, f"service {name!r} has no revision {wanted!r}")
            if target.bad or target.revision == leaving:
                raise ApiError(409, f"revision {wanted} is {'bad' if target.bad else 'the active one'}")
        else:
            earlier = [r for r in service.revisions if r.revision < leaving and not r.bad]
            if not earlier:
                raise ApiError(409, f"service {name!r} has no good revision earlier than r{leaving}")
            target = max(earlier, key=lambda r: r.revision)
        reason = body.get("reason")
        left = service.revision(leaving)
        assert left is not None
        left.bad = True
        left.reason = str(reason) if reason is not None else "rolled back"
        count = max(service.replicas.values())
        service.weights = {target.version: 100}
        service.replicas = {target.version: count}
        return {"from_revision": leaving, "to_revision": target.revision}

    def scale(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        service = self._service(name)
        replicas = body.get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 0 <= replicas <= MAX_REPLICAS:
            raise ApiError(400, f"'replicas' must be an integer from 0 to {MAX_REPLICAS}, got {replicas!r}")
        primary = service.primary_version
        before = service.replicas[primary]
        service.replicas[primary] = replicas
        return {"from": before, "to": replicas}

    def set_weight(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        service = self._service(name)
        if "weights" in body:
            return self._set_weights(service, body["weights"])
        version, weight = body.get("version"), body.get("weight")
        if not isinstance(version, str) or version not in service.weights:
            raise ApiError(
                409 if isinstance(version, str) else 400,
                f"'version' must be one of the live versions {sorted(service.weights)}, got {version!r}",
            )
        if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight <= 100:
            raise ApiError(400, f"'weight' must be an integer from 0 to 100, got {weight!r}")
        service.weights = split_weights(service.weights, version, weight)
        return {"weights": dict(service.weights)}

    @staticmethod
    def _set_weights(service: ServiceState, weights: Any) -> dict[str, Any]:
        """Every live version's weight at once (`{"weights": {version: percent}}`, summing to 100): a restore."""
        if not isinstance(weights, dict) or set(weights) != set(service.weights):
            raise ApiError(
                409 if isinstance(weights, dict) else 400,
                f"'weights' must give every live version {sorted(service.weights)} a weight, got {weights!r}",
            )
        if any(isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= 100 for w in weights.values()):
            raise ApiError(400, f"'weights' must be integers from 0 to 100, got {weights!r}")
        if sum(weights.values()) != 100:
            raise ApiError(400, f"'weights' must sum to 100, got {sum(weights.values())}")
        service.weights = {version: int(weights[version]) for version in service.weights}
        return {"weights": dict(service.weights)}

    # -- HTTP ---
    def control_app(self) -> web.Application:
        app = web.Application()

        def mutation(
            operation: Callable[[str, dict[str, Any]], dict[str, Any]],
        ) -> Callable[[web.Request], Awaitable[web.Response]]:
            async def handler(request: web.Request) -> web.Response:
                try:
                    body = await request.json()
                except ValueError:
                    return _error(400, "the request body is not valid JSON")
                if not isinstance(body, dict):
                    return _error(400, "the request body must be a JSON object")
                key = body.get("idempotency_key")
                if not isinstance(key, str) or not key:
                    return _error(400, "'idempotency_key' (a non-empty string) is required")
                name = request.match_info["service"]
                async with self.lock:
                    if key in self.idempotency:
                        return web.json_response({**self.idempotency[key]["answer"], "replayed": True})
                    if name not in self.services:
                        return _error(404, f"unknown service {name!r}")
                    if operation == self.rollout and self.config.engine == "vllm":
                        try:
                            await self._validate_rollout(body)
                        except ApiError as exc:
                            return _error(exc.status, exc.message)
                    snapshot = json.dumps(self.services[name].to_json())
                    try:
                        answer = operation(name, body)
                        self.idempotency[key] = {"answer": answer, "service": name, "at": self.now()}
                        self.save()
                    except ApiError as exc:
                        self.services[name] = ServiceState.from_json(json.loads(snapshot))
                        return _error(exc.status, exc.message)
                    except BaseException:
                        # Never leave memory ahead of the state file.
                        self.services[name] = ServiceState.from_json(json.loads(snapshot))
                        self.idempotency.pop(key, None)
                        raise
                    await self.reconcile(name)
                return web.json_response({**answer, "replayed": False})

            return handler

        async def healthz(_: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        async def list_services(_: web.Request) -> web.Response:
            return web.json_response([self.service_json(s) for s in self.services.values()])

        async def get_service(request: web.Request) -> web.Response:
            service = self.services.get(request.match_info["service"])
            if service is None:
                return _error(404, f"unknown service {request.match_info['service']!r}")
            return web.json_response(self.service_json(service))

        async def revisions(request: web.Request) -> web.Response:
            service = self.services.get(request.match_info["service"])
            if service is None:
                return _error(404, f"unknown service {request.match_info['service']!r}")
            return web.json_response(revisions_answer([r.to_json() for r in service.revisions]))

        async def sd(_: web.Request) -> web.Response:
            return web.json_response(self.sd_json())

        app.router.add_get("/healthz", healthz)
        app.router.add_get("/api/v1/services", list_services)
        app.router.add_get("/api/v1/services/{service}", get_service)
        app.router.add_get("/api/v1/services/{service}/revisions", revisions)
        app.router.add_post("/api/v1/services/{service}/rollout", mutation(self.rollout))
        app.router.add_post("/api/v1/services/{service}/rollback", mutation(self.rollback))
        app.router.add_post("/api/v1/services/{service}/scale", mutation(self.scale))
        app.router.add_post("/api/v1/services/{service}/weights", mutation(self.set_weight))
        app.router.add_get("/api/v1/sd", sd)
        return app

    async def _validate_rollout(self, body: dict[str, Any]) -> None:
        """engine: vllm: the profile must pass vLLM's own argument parser, or it is never deployed (422)."""
        if not self.config.vllm.validate_profiles:
            return
        try:
            if isinstance(body.get("profile"), dict):
                profile = profile_from_dict(body["profile"], "rollout body: profile")
            elif isinstance(body.get("profile_name"), str):
                profile = self._resolve(body["profile_name"])
            else:
                return  # rollout() answers the malformed body with its own 400
        except ConfigFileError:
            return  # likewise: rollout() names the field
        args = (*profile_cli_args(profile), *platform_args(), *self.config.vllm.extra_args)
        if args not in self._validated:
            result = await asyncio.to_thread(
                validate_cli_args, self._serving_python(), list(args), Path(self.config.vllm.model_dir).absolute()
            )
            if not result.verdict:
                # The parser did not run to a verdict (on a loaded 2-core host its vLLM import took over 180 s): not
                # vLLM refusing the profile, so a 503 the caller may retry, and nothing is cached.
                raise ApiError(503, f"could not check profile {profile.name!r} with vLLM's parser: {result.error}")
            self._validated[args] = "" if result.ok else result.error
        refusal = self._validated[args]
        if refusal:
            raise ApiError(422, f"vLLM refuses profile {profile.name!r}: {refusal}")

    async def stop(self) -> None:
        for task in list(self._background):
            task.cancel()
        for replica in list(self.replicas.values()):
            if replica.runner is not None:
                await replica.runner.cleanup()
        if self.supervisor is not None:
            await self.supervisor.stop_all()
        self.replicas.clear()

    async def wait_ready(self, timeout_s: float) -> bool:
        """Wait until every service with replicas has one that may take traffic (vLLM start-up + warm-up)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if all(self._ready(name) or not any(self.services[name].replicas.values()) for name in self.services):
                return True
            await asyncio.sleep(0.5)
        return False


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def serve(
    config: TierConfig,
    config_dir: Path,
    state_dir: Path,
    control_port: int,
    ready: Callable[[dict[str, Any]], None],
    stop: asyncio.Event,
) -> None:
    tier = Tier(config, state_dir, config_dir)
    tier.load_state()
    runners: list[web.AppRunner] = []
    try:
        await tier.prepare_engine()
        for name in tier.services:
            await tier.reconcile(name)
        if config.engine == "vllm" and not await tier.wait_ready(config.vllm.startup_timeout_s):
            raise ConfigFileError(
                "engine: vllm", 0, "", f"no replica became ready; see the logs in {state_dir / 'replicas'}"
            )
        urls = []
        for app, port in ((tier.router.app(), config.ports.router), (tier.control_app(), control_port)):
            runner = web.AppRunner(app, access_log=None)
            runners.append(runner)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
        ready(
            {
                "event": "ready",
                "control_url": urls[1],
                "router_url": urls[0],
                "pid": os.getpid(),
                "services": sorted(tier.services),
                "sd_url": urls[1] + "/api/v1/sd",
            }
        )
        await stop.wait()
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
        await tier.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tailguard.serving.tier", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="tier config YAML (services, ports, profiles_dir)")
    parser.add_argument("--state-dir", required=True, help="directory for state.json (revisions, idempotency)")
    parser.add_argument("--port", type=int, default=None, help="control API port (0 = any free port)")
    parser.add_argument("--engine", choices=("simulator", "vllm"), default=None, help="override the config's engine")
    args = parser.parse_args(argv)
    # The supervisor reports replica starts, warm-ups, failovers and restarts through logging (stderr).
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_tier_config(args.config)
        if args.engine is not None:
            config = config.model_copy(update={"engine": args.engine})
        state_dir = Path(args.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
    except (ConfigFileError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def ready(event: dict[str, Any]) -> None:
        print(json.dumps(event), flush=True)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        port = args.port if args.port is not None else config.ports.control
        await serve(config, Path(args.config).resolve().parent, state_dir, port, ready, stop)

    try:
        asyncio.run(run())
    except ConfigFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TinyModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
