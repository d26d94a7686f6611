"""Priority classes with the seed's batching windows (interactive 5 ms / 8, batch 20 ms / 32): the pure windows,
the virtual-time simulator behind them, and the router (its per-priority latency histogram)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from tailguard.controller.core.model import target_key
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.core.ports import RangeResult
from tailguard.controller.core.signals import render_signal_queries
from tailguard.controller.testing import FakeSource
from tailguard.controller.tools.backtest import run_backtest
from tailguard.serving.tier.batching import Arrival, simulate
from tailguard.serving.tier.manifests import DEPLOY_POLICIES_DIR, EXAMPLE_POLICIES_DIR
from tailguard.serving.tier.priority import BATCH, INTERACTIVE, SEED_CLASSES, BatchWindows, PriorityClass, classify
from tailguard.serving.tier.profiles import resolve_profile
from tailguard.serving.tier.router import ReplicaTarget, Router, VersionTarget
from tailguard.serving.tier.server import TierConfig


def test_the_seed_windows() -> None:
    assert (INTERACTIVE.max_wait_s, INTERACTIVE.max_batch) == (0.005, 8)
    assert (BATCH.max_wait_s, BATCH.max_batch) == (0.020, 32)
    assert classify(0) is INTERACTIVE and classify(-5) is INTERACTIVE and classify(1) is BATCH


def test_a_window_releases_when_full_or_when_its_wait_ran_out() -> None:
    windows: BatchWindows[int] = BatchWindows()
    for item in range(7):
        assert windows.offer(item, 0, 10.0 + item * 0.0001) is None
    full = windows.offer(7, 0, 10.001)
    assert full is not None and full.full and full.items == tuple(range(8)) and full.priority_class is INTERACTIVE
    assert windows.offer(100, 3, 20.0) is None
    assert windows.offer(101, 0, 20.01) is None
    assert windows.next_deadline() == pytest.approx(20.015)
    assert windows.due(20.0149) == []
    (interactive,) = windows.due(20.015)
    assert interactive.items == (101,)
    assert windows.due(20.0199) == []
    (batch,) = windows.due(20.02)
    assert batch.items == (100,) and batch.priority_class is BATCH and windows.pending == 0
    for item in range(31):
        assert windows.offer(item, 1, 30.0) is None
    assert windows.offer(31, 1, 30.0) is not None  # 32 batch requests fill their window


def test_due_windows_release_interactive_first() -> None:
    windows: BatchWindows[str] = BatchWindows()
    windows.offer("batch", 2, 0.0)
    windows.offer("interactive", 0, 0.018)
    assert [r.priority_class.name for r in windows.due(0.03)] == ["interactive", "batch"]


def _p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def test_the_simulator_holds_requests_in_their_window_and_serves_interactive_first() -> None:
    profile = resolve_profile("stable")
    lone = [Arrival(at=0.0, prompt_tokens=10, max_tokens=4, priority=0)]
    (direct,) = simulate(profile, lone)
    (windowed,) = simulate(profile, lone, windows=SEED_CLASSES)
    assert (windowed.first_scheduled_at or 0) - (direct.first_scheduled_at or 0) == pytest.approx(0.005)
    (batch_lone,) = simulate(profile, [Arrival(0.0, 10, 4, priority=5)], windows=SEED_CLASSES)
    assert batch_lone.first_scheduled_at == pytest.approx(0.020)
    # Overload (max_num_seqs 64, priority scheduling; 1 request in 4 interactive): batch absorbs the queueing.
    prioritised = profile.model_copy(
        update={"engineArgs": profile.engineArgs.model_copy(update={"scheduling_policy": "priority"})}
    )
    arrivals = [Arrival(i * 0.003, 400, 64, priority=0 if i % 4 == 0 else 1) for i in range(1500)]
    done = simulate(prioritised, arrivals, windows=SEED_CLASSES)
    latency: dict[int, list[float]] = {0: [], 1: []}
    for request in done:
        latency[request.priority].append((request.finished_at or 0.0) - request.arrival)
    assert _p99(latency[0]) * 3 < _p99(latency[1])


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def _engine(seen: list[tuple[float, dict[str, Any]]]) -> web.Application:
    async def completions(request: web.Request) -> web.Response:
        seen.append((time.monotonic(), json.loads(await request.read())))
        return web.json_response({"choices": [{"text": "ok"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


def test_the_router_batches_by_class_and_exports_per_priority_latency() -> None:
    seen: list[tuple[float, dict[str, Any]]] = []
    registry = CollectorRegistry()
    slow = (PriorityClass("interactive", 5.0, 8, max_priority=0), PriorityClass("batch", 0.3, 32))

    async def scenario() -> dict[str, float]:
        engine_runner, engine_url = await _serve(_engine(seen))
        router = Router(registry=registry, priority_classes=slow, batching_windows=True)
        router.set_service("chat", "tiny", [VersionTarget("r1", 100, (ReplicaTarget("a", engine_url),))])
        router_runner, router_url = await _serve(router.app())
        took: dict[str, float] = {}
        try:
            async with aiohttp.ClientSession() as session:

                async def send(priority: int) -> None:
                    body = {"model": "tiny", "prompt": "x", "max_tokens": 1, "priority": priority}
                    async with session.post(router_url + "/v1/completions", json=body) as response:
                        assert response.status == 200

                started = time.monotonic()
                await send(3)  # alone in the batch window: released by its 0.3 s wait
                took["batch"] = time.monotonic() - started
                started = time.monotonic()
                await asyncio.gather(*(send(0) for _ in range(8)))  # fills the interactive window: no 5 s wait
                took["interactive"] = time.monotonic() - started
        finally:
            await router_runner.cleanup()
            await engine_runner.cleanup()
        return took

    took = asyncio.run(scenario())
    assert took["batch"] >= 0.3 and took["interactive"] < 4.0
    assert [body["priority"] for _, body in seen] == [3] + [0] * 8

    def sample(name: str, priority: str) -> float | None:
        return registry.get_sample_value(name, {"service": "chat", "priority": priority})

    assert sample("tailguard_serving_request_latency_seconds_count", "interactive") == 8
    assert sample("tailguard_serving_request_latency_seconds_count", "batch") == 1
    assert (sample("tailguard_serving_request_latency_seconds_sum", "batch") or 0) >= 0.3
    assert sample("tailguard_router_priority_batch_size_sum", "interactive") == 8
    assert sample("tailguard_router_priority_batch_size_count", "interactive") == 1


def test_the_seed_classes_are_the_routers_default_and_the_tier_switches_their_windows_on() -> None:
    router = Router(registry=CollectorRegistry())
    assert router.priority_classes == SEED_CLASSES and not router.batching_windows
    services = [{"name": "chat", "model": "tiny"}]
    assert TierConfig.model_validate({"services": services}).priority_windows is False
    assert TierConfig.model_validate({"services": services, "priority_windows": True}).priority_windows is True


def test_the_example_policy_guards_interactive_first_and_lets_batch_degrade() -> None:
    path = EXAMPLE_POLICIES_DIR / "priority-slo.yaml"
    assert (DEPLOY_POLICIES_DIR / path.name).read_text() == path.read_text()  # shipped in the ConfigMap
    loaded, errors = load_policies([path])
    assert errors == []
    policy = loaded[0].policy
    queries = render_signal_queries(policy)
    assert 'priority="interactive"' in queries["interactive-p99"] and 'priority="batch"' in queries["batch-p99"]
    assert "tailguard_serving_request_latency_seconds_bucket" in queries["batch-p99"]
    chat, jobs = target_key({"service": "chat"}), target_key({"service": "jobs"})
    times = [t * 15.0 for t in range(8)]
    # chat: interactive P99 1.5 s (batch fine); jobs: batch P99 45 s (interactive fine).
    source = FakeSource(
        range_answers={
            queries["interactive-p99"]: RangeResult({chat: dict.fromkeys(times, 1.5), jobs: dict.fromkeys(times, 0.2)}),
            queries["batch-p99"]: RangeResult({chat: dict.fromkeys(times, 2.0), jobs: dict.fromkeys(times, 45.0)}),
        }
    )
    decisions = run_backtest(source, [policy], 0.0, times[-1], 15.0).to_json()["decisions"]
    by_service = {d["target"]["service"]: d for d in decisions}
    assert [a["type"] for a in by_service["chat"]["actions"] if a["on"] == "fire"] == ["scale", "annotate"]
    assert [a["type"] for a in by_service["jobs"]["actions"] if a["on"] == "fire"] == ["annotate"]
