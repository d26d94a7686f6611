"""A vLLM-compatible simulated replica: the batching model run in real time behind an OpenAI API.

`ReplicaEngine` runs `tailguard.serving.tier.batching.BatchingModel` in an asyncio task: it
plans a step, sleeps for the step's modelled duration, then applies the step at
the time it actually ended (so CPU contention shows up as latency, as on a real
server). `make_replica_app` serves it with aiohttp:

- POST /v1/completions, /v1/chat/completions (non-streaming; `max_tokens`,
  `ignore_eos` and `priority` honoured). Prompt tokens are the whitespace-separated
  words of the prompt (for chat: of all message contents); the reply is
  `max_tokens` words. A request that does not fit the model gets 400, as in vLLM.
- GET /health, /v1/models, /metrics (vLLM 0.32 names plus DCGM HBM gauges).

Defaults: `max_tokens` 16 for completions and `max_model_len - prompt` for
chat, as vLLM does. The simulator never emits EOS, so every request that is
not an injected fault ends with finished_reason "length".
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tailguard.controller import InputError
from tailguard.serving.errors import LabError
from tailguard.serving.tier.batching import BatchingModel, RequestRejected, SimRequest
from tailguard.serving.tier.profiles import EngineProfile
from tailguard.serving.tier.vllm_metrics import DcgmCollector, HbmModel, VllmMetrics


class EngineStopped(LabError, RuntimeError):
    """The replica was stopped before the request finished (vLLM's "abort")."""


class ReplicaEngine:
    def __init__(
        self,
        profile: EngineProfile,
        model_name: str,
        *,
        hostname: str = "sim-0",
        now: Callable[[], float] = time.monotonic,
        seed: int = 0,
    ):
        self.profile = profile
        self.model_name = model_name
        self.now = now
        self.core = BatchingModel(profile)
        self.registry = CollectorRegistry()
        self.metrics = VllmMetrics(self.registry, model_name)
        self.hbm = HbmModel(profile, now)
        self.registry.register(DcgmCollector(self.hbm, hostname))
        self._futures: dict[str, asyncio.Future[SimRequest]] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Seeded so an injected error ratio fails the same requests on every run.
        self._random = random.Random(seed)
        self._prefix_seen = (0, 0)
        self.metrics.set_queue_state(0, 0, 0.0)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"engine-{self.model_name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for future in self._futures.values():
            if not future.done():
                future.set_exception(EngineStopped("the replica was stopped"))
        self._futures.clear()

    @property
    def in_flight(self) -> int:
        return len(self._futures)

    async def generate(
        self, prompt_tokens: int, max_tokens: int, *, priority: int = 0, request_id: str | None = None
    ) -> SimRequest:
        """Queue one request and wait for it to finish; raises RequestRejected for an impossible one."""
        self.core.check(prompt_tokens, max_tokens)
        fail = self._random.random() < self.profile.faults.error_ratio
        request = SimRequest(request_id or uuid.uuid4().hex, prompt_tokens, max_tokens, self.now(), priority, fail)
        while request.request_id in self._futures:
            request.request_id = uuid.uuid4().hex
        future: asyncio.Future[SimRequest] = asyncio.get_running_loop().create_future()
        self._futures[request.request_id] = future
        self.core.add(request)
        self._publish_queue_state()
        self._wakeup.set()
        try:
            return await future
        finally:
            self._futures.pop(request.request_id, None)

    def _publish_queue_state(self) -> None:
        self.metrics.set_queue_state(self.core.num_running, self.core.num_waiting, self.core.kv_cache_usage)

    async def _run(self) -> None:
        while True:
            if not self.core.has_work:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            started = self.now()
            plan = self.core.plan_step(started)
            if plan.empty:  # cannot happen for requests that passed check(); never spin
                await asyncio.sleep(0.01)
                continue
            await asyncio.sleep(max(0.0, started + plan.duration - self.now()))
            outcome = self.core.finish_step(plan, self.now())
            queries, hits = self.core.prefix_cache_queries, self.core.prefix_cache_hits
            self.metrics.observe_step(outcome, queries - self._prefix_seen[0], hits - self._prefix_seen[1])
            self._prefix_seen = (queries, hits)
            kv_tokens = (self.core.num_blocks - self.core.free_blocks) * self.core.block_size
            self.hbm.record_step(outcome.ended_at, kv_tokens)
            for request in outcome.finished:
                self.metrics.observe_finished(request)
                future = self._futures.get(request.request_id)
                if future is not None and not future.done():
                    future.set_result(request)
            self._publish_queue_state()


# -- HTTP ----------------------------------------------------------------------------------------


def count_tokens(text: str) -> int:
    """Prompt tokens of the simulator: whitespace-separated words (at least one)."""
    return max(1, len(text.split()))


class BadRequest(InputError, ValueError):
    pass


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.json_response(
        {"object": "error", "message": message, "type": kind, "param": None, "code": status}, status=status
    )


@dataclass(frozen=True)
class _Parsed:
    prompt_tokens: int
    max_tokens: int
    priority: int


def _int_field(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer, got {value!r}")
    return value


def _parse(body: Any, chat: bool, served: tuple[str, ...], max_model_len: int) -> _Parsed:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model not in served:
        raise LookupError(f"The model `{model}` does not exist.")
    if body.get("stream"):
        raise BadRequest("streaming is not supported by the simulator; send stream=false")
    if _int_field(body, "n", 1) != 1:
        raise BadRequest("only n=1 is supported by the simulator")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        words = 0
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):  # OpenAI content parts
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise BadRequest("every message needs a string 'content'")
            words += len(content.split())
        prompt_tokens = max(1, words)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BadRequest("'prompt' must be a string (batched prompts are not supported)")
        prompt_tokens = count_tokens(prompt)
    default_max = max(1, max_model_len - prompt_tokens) if chat else 16
    max_tokens = _int_field(body, "max_tokens", None)
    if max_tokens is None:
        max_tokens = _int_field(body, "max_completion_tokens", default_max) or default_max
    priority = _int_field(body, "priority", 0) or 0
    return _Parsed(prompt_tokens, max_tokens, priority)


def make_replica_app(engine: ReplicaEngine, served_model_names: tuple[str, ...]) -> web.Application:
    """The aiohttp app of one replica. The engine loop starts and stops with the app."""
    app = web.Application(client_max_size=8 * 1024 * 1024)
    max_model_len = engine.profile.engineArgs.max_model_len

    async def complete(request: web.Request, chat: bool) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not valid JSON")
        try:
            parsed = _parse(body, chat, served_model_names, max_model_len)
            result = await engine.generate(
                parsed.prompt_tokens,
                parsed.max_tokens,
                priority=parsed.priority,
                request_id=request.headers.get("X-Request-Id"),
            )
        except LookupError as exc:
            return _error(404, str(exc), "NotFoundError")
        except (BadRequest, RequestRejected) as exc:
            return _error(400, str(exc))
        except EngineStopped as exc:
            return _error(503, str(exc), "ServiceUnavailableError")
        if result.finish_reason == "error":
            return _error(500, "simulated engine error (faults.error_ratio)", "InternalServerError")
        text = " tok" * result.generated
        usage = {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.generated,
            "total_tokens": result.prompt_tokens + result.generated,
        }
        created = int(time.time())
        model = body.get("model") or served_model_names[0]
        if chat:
            return web.json_response(
                {
                    "id": f"chatcmpl-{result.request_id}",
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "usage": usage,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text.strip()},
                            "finish_reason": result.finish_reason,
                            "stop_reason": None,
                            "logprobs": None,
                        }
                    ],
                }
            )
        return web.json_response(
            {
                "id": f"cmpl-{result.request_id}",
                "object": "text_completion",
                "created": created,
                "model": model,
                "usage": usage,
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "finish_reason": result.finish_reason,
                        "stop_reason": None,
                        "logprobs": None,
                    }
                ],
            }
        )

    async def completions(request: web.Request) -> web.Response:
        return await complete(request, chat=False)

    async def chat_completions(request: web.Request) -> web.Response:
        return await complete(request, chat=True)

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(_: web.Request) -> web.Response:
        data = [
            {
                "id": name,
                "object": "model",
                "owned_by": "vllm",
                "root": engine.profile.model,
                "max_model_len": max_model_len,
            }
            for name in served_model_names
        ]
        return web.json_response({"object": "list", "data": data})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(engine.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def lifecycle(_: web.Application) -> Any:
        engine.start()
        yield
        await engine.stop()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    return app
