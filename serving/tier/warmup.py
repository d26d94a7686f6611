"""Shadow warm-up: a new replica gets user traffic only after it proved it can serve.

Checks, in order, each with its own timeout: `GET /health` answers 200, `GET /v1/models` lists the served
model, `GET /metrics` exposes vLLM's metrics, and `completions` short completions succeed. The result is data
(which step failed and why), never an exception: the supervisor decides what a failed warm-up means.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import aiohttp

WARMUP_STEPS = ("health", "models", "metrics", "completions")


@dataclass(frozen=True)
class WarmupResult:
    ok: bool
    step: str = ""  # the step that failed ('' when ok)
    detail: str = ""


async def warm_up(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    *,
    completions: int = 3,
    max_tokens: int = 4,
    timeout_s: float = 30.0,
    request_id_prefix: str = "warmup",
) -> WarmupResult:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    step = "health"
    try:
        async with session.get(base_url + "/health", timeout=timeout) as response:
            if response.status != 200:
                return WarmupResult(False, step, f"/health answered {response.status}")
        step = "models"
        async with session.get(base_url + "/v1/models", timeout=timeout) as response:
            if response.status != 200:
                return WarmupResult(False, step, f"/v1/models answered {response.status}")
            listing = json.loads(await response.read())
        ids = [item.get("id") for item in listing.get("data", []) if isinstance(item, dict)]
        if model not in ids:
            return WarmupResult(False, step, f"/v1/models lists {ids}, not {model!r}")
        step = "metrics"
        async with session.get(base_url + "/metrics", timeout=timeout) as response:
            text = (await response.read()).decode("utf-8", "replace")
            if response.status != 200 or "vllm:" not in text:
                return WarmupResult(False, step, f"/metrics answered {response.status} without vllm: metrics")
        step = "completions"
        for index in range(completions):
            body = {"model": model, "prompt": "warm up", "max_tokens": max_tokens, "ignore_eos": True}
            headers = {"X-Request-Id": f"{request_id_prefix}-{index}"}
            async with session.post(base_url + "/v1/completions", json=body, headers=headers, timeout=timeout) as r:
                payload = await r.read()
                if r.status != 200:
                    snippet = payload[:200].decode("utf-8", "replace")
                    return WarmupResult(False, step, f"completion {index + 1} answered {r.status}: {snippet}")
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError) as exc:
        return WarmupResult(False, step, f"{type(exc).__name__}: {exc}")
    return WarmupResult(True)
