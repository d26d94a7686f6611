"""Router: a request's `priority` reaches the engine unchanged; replica weights (failover) split the traffic."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from tailguard.serving.tier.router import ReplicaTarget, Router, VersionTarget


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def _recording_engine(name: str, seen: list[tuple[str, dict[str, Any]]]) -> web.Application:
    async def completions(request: web.Request) -> web.Response:
        seen.append((name, json.loads(await request.read())))
        return web.json_response({"choices": [{"text": "ok"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())


def test_priority_is_passed_through_to_the_engine_and_labels_the_histogram() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    async def scenario() -> None:
        engine_runner, engine_url = await _serve(_recording_engine("a", seen))
        registry = CollectorRegistry()
        router = Router(registry=registry)
        router.set_service("chat", "tiny", [VersionTarget("r1", 100, (ReplicaTarget("a", engine_url),))])
        router_runner, router_url = await _serve(router.app())
        try:
            async with aiohttp.ClientSession() as session:
                for priority in (7, -3):
                    body = {"model": "tiny", "prompt": "x", "max_tokens": 2, "priority": priority}
                    async with session.post(router_url + "/v1/completions", json=body) as response:
                        assert response.status == 200
                async with session.post(router_url + "/v1/completions", json={"model": "tiny", "prompt": "x"}) as r:
                    assert r.status == 200
        finally:
            await router_runner.cleanup()
            await engine_runner.cleanup()
        count = registry.get_sample_value(
            "tailguard_router_request_duration_seconds_count", {"service": "chat", "version": "r1", "priority": "7"}
        )
        assert count == 1

    _run(scenario)
    assert [body.get("priority") for _, body in seen] == [7, -3, None]
    assert all(body["prompt"] == "x" for _, body in seen)


def test_half_weight_replica_gets_a_third_of_sequential_traffic_and_weight_zero_gets_none() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    async def scenario() -> None:
        runners = []
        urls = {}
        for name in ("full", "half", "out"):
            runner, url = await _serve(_recording_engine(name, seen))
            runners.append(runner)
            urls[name] = url
        router = Router(registry=CollectorRegistry())
        replicas = (
            ReplicaTarget("full", urls["full"], weight=100),
            ReplicaTarget("half", urls["half"], weight=50),
            ReplicaTarget("out", urls["out"], weight=0),
        )
        router.set_service("chat", "tiny", [VersionTarget("r1", 100, replicas)])
        router_runner, router_url = await _serve(router.app())
        try:
            async with aiohttp.ClientSession() as session:
                for _ in range(30):
                    body = {"model": "tiny", "prompt": "x"}
                    async with session.post(router_url + "/v1/completions", json=body) as response:
                        assert response.status == 200
        finally:
            await router_runner.cleanup()
            for runner in runners:
                await runner.cleanup()

    _run(scenario)
    names = [name for name, _ in seen]
    assert names.count("full") == 20 and names.count("half") == 10 and names.count("out") == 0
