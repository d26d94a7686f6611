"""The local router: OpenAI requests spread across a service's versions by weight, then across replicas.

The `model` field of a request names the service (its served model or the
service name). A version is chosen by smooth weighted round-robin (the nginx
algorithm: deterministic, and exact over any window of `sum(weights)`
requests); within the version, the healthy replica with the fewest requests in
flight gets it, ties broken round-robin. A connection failure to a replica is
retried once on another replica of the same version (nothing reached the
engine, so this cannot double-run a request); timeouts and HTTP errors are not.
Each forwarded request carries an `X-Request-Id` (the client's, or a new one).

The body is forwarded byte for byte, so a request's `priority` reaches vLLM unchanged (vLLM honours it when
the version's profile sets `scheduling_policy: priority`; lower values are served first); the router also
labels its latency histogram with it.

Priority classes (tailguard.serving.tier.priority, the seed's batching windows; on with `batching_windows=True`, the
tier's `priority_windows: true`): a request of priority <= 0 is `interactive` (held at most 5 ms, released in batches of
up to 8), any other is `batch` (20 ms / 32); each service has its own windows, and a due interactive window is
released before a due batch one. The latency per class, window wait
included, is `tailguard_serving_request_latency_seconds{service, priority="interactive"|"batch"}`.

Network/proxy overhead (`tailguard_router_proxy_overhead_seconds`, the network dimension of the SLA model):
client-observed latency at the router (request received to response ready) minus the upstream exchange
(request sent to the replica until its whole response was read). vLLM's completion responses carry no engine
timing, so the upstream exchange is the engine-reported side: it is what the engine's own
`vllm:e2e_request_latency_seconds` measures plus one loopback round trip.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tailguard.serving.tier.priority import SEED_CLASSES, BatchWindows, PriorityClass, Release, classify
from tailguard.serving.tier.vllm_metrics import LATENCY_BUCKETS

PROXY_OVERHEAD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# Per-priority latency: fine at the bottom (an interactive SLO is often under vLLM's smallest bucket, 0.3 s).
PRIORITY_LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 40.0, 60.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class ReplicaTarget:
    id: str
    url: str
    healthy: bool = True
    # Relative share within its version: 100 in rotation, 50 while recovering from a failover
    # (tailguard.serving.tier.failover).
    weight: int = 100


@dataclass(frozen=True)
class VersionTarget:
    version: str
    weight: int
    replicas: tuple[ReplicaTarget, ...]


@dataclass
class _ServiceRoutes:
    name: str
    model: str
    versions: tuple[VersionTarget, ...]
    current: dict[str, int] = field(default_factory=dict)  # smooth WRR state per version

    def pick_version(self) -> VersionTarget | None:
        candidates = [v for v in self.versions if v.weight > 0 and any(r.healthy for r in v.replicas)]
        if not candidates:
            return None
        total = sum(v.weight for v in candidates)
        for v in candidates:
            self.current[v.version] = self.current.get(v.version, 0) + v.weight
        best = max(candidates, key=lambda v: self.current[v.version])
        self.current[best.version] -= total
        return best


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.duration = Histogram(
            "tailguard_router_request_duration_seconds",
            "Time from the router receiving a request to its answer, by upstream version.",
            ["service", "version", "priority"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.requests = Counter(
            "tailguard_router_requests",
            "Requests answered by the router, by status code.",
            ["service", "version", "code"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            "tailguard_router_upstream_errors",
            "Requests the router could not get an answer for from a replica.",
            ["service", "version", "reason"],
            registry=registry,
        )
        self.priority_latency = Histogram(
            "tailguard_serving_request_latency_seconds",
            "Time from the router receiving a request to its answer, batching window included, by priority class.",
            ["service", "priority"],
            buckets=PRIORITY_LATENCY_BUCKETS,
            registry=registry,
        )
        self.window_batch = Histogram(
            "tailguard_router_priority_batch_size",
            "Requests released together by a priority class's batching window.",
            ["service", "priority"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=registry,
        )
        self.overhead = Histogram(
            "tailguard_router_proxy_overhead_seconds",
            "Client-observed latency at the router minus the upstream exchange with the replica.",
            ["service"],
            buckets=PROXY_OVERHEAD_BUCKETS,
            registry=registry,
        )


class Router:
    def __init__(
        self,
        *,
        upstream_timeout_s: float = 300.0,
        connect_timeout_s: float = 2.0,
        now: Callable[[], float] = time.monotonic,
        registry: CollectorRegistry | None = None,
        priority_classes: Sequence[PriorityClass] = SEED_CLASSES,
        batching_windows: bool = False,
    ):
        self.priority_classes = tuple(priority_classes)
        # False: requests go straight through (still labelled by class); True: the classes' batching windows.
        self.batching_windows = batching_windows
        self._windows: dict[str, BatchWindows[asyncio.Future[None]]] = {}
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self.registry = registry or CollectorRegistry()
        self.metrics = RouterMetrics(self.registry)
        self.now = now
        self._services: dict[str, _ServiceRoutes] = {}
        self._in_flight: dict[str, int] = {}
        self._replica_credit: dict[str, int] = {}  # smooth WRR state per replica
        self._timeout = aiohttp.ClientTimeout(total=upstream_timeout_s, connect=connect_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    # -- topology (called by the tier) -----------------------------------------------------------
    def set_service(self, name: str, model: str, versions: Sequence[VersionTarget]) -> None:
        previous = self._services.get(name)
        routes = _ServiceRoutes(name, model, tuple(versions))
        if previous is not None:
            routes.current = {k: v for k, v in previous.current.items() if any(x.version == k for x in versions)}
        self._services[name] = routes

    def remove_service(self, name: str) -> None:
        self._services.pop(name, None)

    def in_flight(self, replica_id: str) -> int:
        return self._in_flight.get(replica_id, 0)

    def lookup(self, model: str) -> _ServiceRoutes | None:
        if model in self._services:
            return self._services[model]
        return next((s for s in self._services.values() if s.model == model), None)

    def _pick_replica(self, version: VersionTarget, exclude: set[str]) -> ReplicaTarget | None:
        """Fewest requests in flight per unit of weight; ties go by smooth weighted round-robin.

        With equal weights this is least-loaded with round-robin ties; a replica at weight 50 gets half the
        share of one at 100, both when idle (the round-robin) and under load (in flight / weight).
        """
        healthy = [r for r in version.replicas if r.healthy and r.weight > 0 and r.id not in exclude]
        if not healthy:
            return None
        total = sum(r.weight for r in healthy)
        for r in healthy:
            self._replica_credit[r.id] = self._replica_credit.get(r.id, 0) + r.weight
        best = min(healthy, key=lambda r: (self._in_flight.get(r.id, 0) / r.weight, -self._replica_credit[r.id]))
        self._replica_credit[best.id] -= total
        return best

    # -- priority windows --------------------------------------------------------------------------
    async def _admit(self, service: str, priority: int) -> None:
        """Wait until this request's priority window releases it (at once when the windows are off)."""
        if not self.batching_windows:
            return
        windows = self._windows.get(service)
        if windows is None:
            windows = self._windows[service] = BatchWindows(self.priority_classes)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        release = windows.offer(future, priority, self.now())
        if release is not None:
            self._release(service, release)
        self._arm(service)
        await future

    def _release(self, service: str, release: Release[asyncio.Future[None]]) -> None:
        self.metrics.window_batch.labels(service, release.priority_class.name).observe(len(release.items))
        for future in release.items:
            if not future.done():  # a client that went away while waiting
                future.set_result(None)

    def _arm(self, service: str) -> None:
        deadline = self._windows[service].next_deadline()
        armed = self._timers.get(service)
        if armed is not None and (deadline is None or armed[0] > deadline):
            armed[1].cancel()
            del self._timers[service]
            armed = None
        if deadline is None or armed is not None:
            return
        delay = max(deadline - self.now(), 0.0005)
        handle = asyncio.get_running_loop().call_later(delay, self._on_deadline, service)
        self._timers[service] = (deadline, handle)

    def _on_deadline(self, service: str) -> None:
        self._timers.pop(service, None)
        for release in self._windows[service].due(self.now()):
            self._release(service, release)
        self._arm(service)

    # -- HTTP ------------------------------------------------------------------------------------
    async def _start(self, _: web.Application) -> Any:
        self._session = aiohttp.ClientSession(timeout=self._timeout, connector=aiohttp.TCPConnector(limit=0))
        yield
        for _deadline, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for service, windows in self._windows.items():
            for release in windows.flush(self.now()):
                self._release(service, release)
        await self._session.close()

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        received = self.now()
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "the request body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return _error(400, "the request needs a string 'model' naming a service or its model")
        routes = self.lookup(body["model"])
        if routes is None:
            return _error(404, f"The model `{body['model']}` does not exist.", "NotFoundError")
        priority = str(body.get("priority", 0))
        raw_priority = body.get("priority", 0)
        numeric = raw_priority if isinstance(raw_priority, int) and not isinstance(raw_priority, bool) else 0
        priority_class = classify(numeric, self.priority_classes).name
        await self._admit(routes.name, numeric)
        version = routes.pick_version()
        if version is None:
            self.metrics.upstream_errors.labels(routes.name, "none", "no_healthy_replica").inc()
            return _error(
                503,
                f"service {routes.name!r} has no healthy replica with a non-zero weight",
                "ServiceUnavailableError",
            )
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        tried: set[str] = set()
        upstream_time = 0.0
        response: web.Response | None = None
        for _attempt in range(2):
            replica = self._pick_replica(version, tried)
            if replica is None:
                break
            tried.add(replica.id)
            self._in_flight[replica.id] = self._in_flight.get(replica.id, 0) + 1
            sent = self.now()
            try:
                assert self._session is not None
                async with self._session.post(replica.url + request.path, data=raw, headers=headers) as upstream:
                    payload = await upstream.read()
                    response = web.Response(body=payload, status=upstream.status, content_type=upstream.content_type)
                upstream_time += self.now() - sent
                break
            except aiohttp.ClientConnectorError:
                upstream_time += self.now() - sent
                self.metrics.upstream_errors.labels(routes.name, version.version, "connect").inc()
                await asyncio.sleep(0.01)
                continue
            except TimeoutError:
                upstream_time += self.now() - sent
                self.metrics.upstream_errors.labels(routes.name, version.version, "timeout").inc()
                response = _error(504, f"replica {replica.id} did not answer in time", "GatewayTimeout")
                break
            except aiohttp.ClientError as exc:
                upstream_time += self.now() - sent
                self.metrics.upstream_errors.labels(routes.name, version.version, "protocol").inc()
                response = _error(502, f"replica {replica.id} failed: {type(exc).__name__}", "BadGateway")
                break
            finally:
                self._in_flight[replica.id] -= 1
                if self._in_flight[replica.id] <= 0:
                    del self._in_flight[replica.id]
        if response is None:
            response = _error(
                502, f"no replica of {routes.name} {version.version} accepted the connection", "BadGateway"
            )
        elapsed = self.now() - received
        self.metrics.duration.labels(routes.name, version.version, priority).observe(elapsed)
        self.metrics.priority_latency.labels(routes.name, priority_class).observe(elapsed)
        self.metrics.requests.labels(routes.name, version.version, str(response.status)).inc()
        self.metrics.overhead.labels(routes.name).observe(max(0.0, elapsed - upstream_time))
        response.headers["X-Tailguard-Version"] = version.version
        return response

    async def _models(self, _: web.Request) -> web.Response:
        data = [
            {"id": s.model, "object": "model", "owned_by": "tailguard", "service": s.name}
            for s in self._services.values()
        ]
        return web.json_response({"object": "list", "data": data})

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.cleanup_ctx.append(self._start)
        app.router.add_post("/v1/completions", self._proxy)
        app.router.add_post("/v1/chat/completions", self._proxy)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        return app


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.json_response(
        {"object": "error", "message": message, "type": kind, "param": None, "code": status}, status=status
    )
