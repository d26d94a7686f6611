"""Replay the Azure LLM inference trace (or any CSV like it) against an OpenAI-compatible endpoint.

    python -m tailguard.serving.lab.load --url http://127.0.0.1:PORT --model NAME [--trace conv|code|PATH] [--speedup
    10]
        [--rate-scale 1.0] [--start-offset S] [--duration S] [--token-scale 0.1] [--max-requests N]
        [--concurrency-limit N] [--csv out.csv] [--summary-json out.json]

Time: arrival offsets in the trace are divided by `--speedup`; `--start-offset` is
a position in the trace (trace seconds), `--duration` is wall-clock seconds of
replay (so it covers `duration * speedup` trace seconds). `--rate-scale` thins
(< 1) or duplicates (> 1) arrivals deterministically. Token counts are scaled by
`--token-scale` (at least 1): the prompt is that many words and `max_tokens`
the scaled output length, with `ignore_eos` so lengths are exact. With the tiny
model's tokenizer (serving/tier/tiny_model.py) " word" is exactly one token, so the
prompt is exactly that many tokens; `--max-model-len` trims requests that would
not fit the engine's context.

Requests are deliberately not retried: a failed request is a measurement.
Each one carries an `X-Request-Id`.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from tqdm import tqdm

from tailguard.controller import InputError

DATA_DIR = Path(__file__).resolve().parent / "data" / "azure-llm-inference-2023"
BUILTIN_TRACES = {"conv": DATA_DIR / "conv.csv", "code": DATA_DIR / "code.csv"}
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceError(InputError, ValueError):
    """A trace file is unusable; str() is `file:line: what was expected`."""


@dataclass(frozen=True)
class TraceRequest:
    offset: float  # seconds since the trace's first request
    prompt_tokens: int
    output_tokens: int


def _parse_timestamp(text: str) -> float:
    # The trace has 7 fractional digits, which datetime does not take: split them off.
    whole, _, fraction = text.strip().partition(".")
    moment = datetime.fromisoformat(whole)
    return moment.timestamp() + (float("0." + fraction) if fraction else 0.0)


def read_trace(path: str | Path) -> list[TraceRequest]:
    """Parse a trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens); raises TraceError naming file and line."""
    file = str(path)
    try:
        handle = open(path, newline="", encoding="utf-8")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise TraceError(f"{file}: cannot read trace: {exc.strerror or exc}") from None
    requests: list[TraceRequest] = []
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != COLUMNS:
            raise TraceError(f"{file}:1: expected the header {','.join(COLUMNS)}, got {','.join(header or [])!r}")
        first: float | None = None
        previous = -math.inf
        for row in reader:
            line = reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != 3:
                raise TraceError(
                    f"{file}:{line}: expected 3 columns (TIMESTAMP,ContextTokens,GeneratedTokens), got {len(row)}"
                )
            try:
                at = _parse_timestamp(row[0])
            except ValueError:
                raise TraceError(
                    f"{file}:{line}: TIMESTAMP: expected a time like 2023-11-16 18:15:46.6805900, got {row[0]!r}"
                ) from None
            tokens = []
            for name, cell in zip(COLUMNS[1:], row[1:]):
                try:
                    value = int(cell)
                except ValueError:
                    value = -1
                if value < 0:
                    raise TraceError(f"{file}:{line}: {name}: expected a non-negative integer, got {cell!r}")
                tokens.append(value)
            if at < previous:
                raise TraceError(
                    f"{file}:{line}: TIMESTAMP: expected times in ascending order, "
                    f"{row[0]!r} is earlier than the row before"
                )
            previous = at
            first = at if first is None else first
            requests.append(TraceRequest(at - first, tokens[0], tokens[1]))
    if not requests:
        raise TraceError(f"{file}: the trace has no requests")
    return requests


@dataclass(frozen=True)
class PlannedRequest:
    at: float  # wall seconds after the replay starts
    prompt_tokens: int
    max_tokens: int


def plan(
    trace: list[TraceRequest],
    *,
    speedup: float = 10.0,
    rate_scale: float = 1.0,
    start_offset: float = 0.0,
    duration: float | None = None,
    token_scale: float = 0.1,
    max_requests: int | None = None,
    max_model_len: int | None = None,
) -> list[PlannedRequest]:
    """The replay schedule: a pure function of the trace and the options.

    With `max_model_len`, a request whose scaled prompt plus output would not fit the engine's context is
    trimmed (output first kept, then the prompt cut) instead of being refused by the engine with a 400.
    """
    if speedup <= 0 or rate_scale <= 0 or token_scale <= 0:
        raise ValueError("speedup, rate-scale and token-scale must be positive")
    planned: list[PlannedRequest] = []
    credit = 0.0
    for item in trace:
        if item.offset < start_offset:
            continue
        at = (item.offset - start_offset) / speedup
        if duration is not None and at > duration:
            break
        credit += rate_scale
        copies = int(credit)
        credit -= copies
        prompt_tokens = max(1, round(item.prompt_tokens * token_scale))
        output_tokens = max(1, round(item.output_tokens * token_scale))
        if max_model_len is not None:
            # A few tokens of headroom: the chat template and special tokens take some.
            budget = max(2, max_model_len - 8)
            output_tokens = min(output_tokens, budget - 1)
            prompt_tokens = min(prompt_tokens, budget - output_tokens)
        for copy in range(copies):
            # Duplicates are spread a little so they are not one synchronized burst.
            planned.append(PlannedRequest(at + copy * 0.001, prompt_tokens, output_tokens))
            if max_requests is not None and len(planned) >= max_requests:
                return planned
    return planned


@dataclass(frozen=True)
class RequestResult:
    scheduled_at: float
    sent_at: float
    latency: float
    status: int  # 0 = no HTTP answer
    prompt_tokens: int
    max_tokens: int
    error: str | None


@dataclass(frozen=True)
class Summary:
    count: int
    ok: int
    errors: int
    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None
    throughput_rps: float
    duration_s: float
    error_kinds: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value * 1000:.0f} ms"

        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(self.error_kinds.items())) or "none"
        return (
            f"requests {self.count}  ok {self.ok}  errors {self.errors} ({kinds})\n"
            f"latency p50 {ms(self.p50)}  p90 {ms(self.p90)}  p99 {ms(self.p99)}  mean {ms(self.mean)}\n"
            f"throughput {self.throughput_rps:.2f} req/s over {self.duration_s:.1f} s"
        )


def quantile(values: list[float], q: float) -> float | None:
    """Linear-interpolated quantile of `values` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(results: list[RequestResult], duration_s: float) -> Summary:
    ok = [r.latency for r in results if r.error is None]
    kinds: dict[str, int] = {}
    for r in results:
        if r.error is not None:
            kind = f"http {r.status}" if r.status else r.error.split(":")[0]
            kinds[kind] = kinds.get(kind, 0) + 1
    return Summary(
        len(results),
        len(ok),
        len(results) - len(ok),
        quantile(ok, 0.5),
        quantile(ok, 0.9),
        quantile(ok, 0.99),
        sum(ok) / len(ok) if ok else None,
        len(results) / duration_s if duration_s > 0 else 0.0,
        duration_s,
        kinds,
    )


async def replay(
    url: str,
    model: str,
    requests: list[PlannedRequest],
    *,
    endpoint: str = "completions",
    concurrency_limit: int | None = None,
    timeout_s: float = 60.0,
    progress: bool = True,
    now: Callable[[], float] = time.monotonic,
) -> tuple[list[RequestResult], float]:
    """Send `requests` at their planned times; returns the results (in plan order) and the wall duration."""
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    target = url.rstrip("/") + path
    limit = asyncio.Semaphore(concurrency_limit) if concurrency_limit else None
    results: list[RequestResult | None] = [None] * len(requests)
    bar = tqdm(total=len(requests), unit="req", disable=not progress, file=sys.stderr, dynamic_ncols=True)
    timeout = aiohttp.ClientTimeout(total=timeout_s, connect=min(5.0, timeout_s))
    start = now()

    async def one(index: int, item: PlannedRequest, session: aiohttp.ClientSession) -> None:
        delay = start + item.at - now()
        if delay > 0:
            await asyncio.sleep(delay)
        if limit is not None:
            await limit.acquire()
        prompt = " ".join(["word"] * item.prompt_tokens)
        body: dict[str, Any] = {"model": model, "max_tokens": item.max_tokens, "ignore_eos": True}
        if endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        sent = now()
        status, error = 0, None
        try:
            async with session.post(target, json=body, headers={"X-Request-Id": uuid.uuid4().hex}) as response:
                status = response.status
                await response.read()
                if status >= 400:
                    error = f"http {status}"
        except TimeoutError:
            error = "timeout: no answer in time"
        except aiohttp.ClientError as exc:
            error = f"connection: {type(exc).__name__}"
        finally:
            if limit is not None:
                limit.release()
        results[index] = RequestResult(
            item.at, sent - start, now() - sent, status, item.prompt_tokens, item.max_tokens, error
        )
        bar.update(1)

    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
            await asyncio.gather(*(one(i, item, session) for i, item in enumerate(requests)))
    finally:
        bar.close()
    return [r for r in results if r is not None], now() - start


def run_replay(
    url: str,
    model: str,
    trace: str = "conv",
    *,
    speedup: float = 10.0,
    rate_scale: float = 1.0,
    start_offset: float = 0.0,
    duration: float | None = None,
    token_scale: float = 0.1,
    max_requests: int | None = None,
    max_model_len: int | None = None,
    concurrency_limit: int | None = None,
    endpoint: str = "completions",
    timeout_s: float = 60.0,
    progress: bool = True,
) -> tuple[Summary, list[RequestResult]]:
    """Read the trace, replay it, summarize: the programmatic entry point (blocking)."""
    path = BUILTIN_TRACES.get(trace, Path(trace))
    schedule = plan(
        read_trace(path),
        speedup=speedup,
        rate_scale=rate_scale,
        start_offset=start_offset,
        duration=duration,
        token_scale=token_scale,
        max_requests=max_requests,
        max_model_len=max_model_len,
    )
    results, wall = asyncio.run(
        replay(
            url,
            model,
            schedule,
            endpoint=endpoint,
            concurrency_limit=concurrency_limit,
            timeout_s=timeout_s,
            progress=progress,
        )
    )
    return summarize(results, wall), results


def write_csv(path: str | Path, results: list[RequestResult]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["scheduled_at", "sent_at", "latency_s", "status", "prompt_tokens", "max_tokens", "error"])
        for r in results:
            writer.writerow(
                [
                    f"{r.scheduled_at:.4f}",
                    f"{r.sent_at:.4f}",
                    f"{r.latency:.4f}",
                    r.status,
                    r.prompt_tokens,
                    r.max_tokens,
                    r.error or "",
                ]
            )


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tailguard load",
        description="Replay an LLM trace against an OpenAI-compatible endpoint, time-compressed.",
    )
    parser.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the 'model' field to send")
    parser.add_argument(
        "--trace", default="conv", help="conv, code, or a CSV path (TIMESTAMP,ContextTokens,GeneratedTokens)"
    )
    parser.add_argument("--speedup", type=_positive, default=10.0, help="time compression factor")
    parser.add_argument("--rate-scale", type=_positive, default=1.0, help="arrival rate multiplier")
    parser.add_argument("--start-offset", type=float, default=0.0, help="trace seconds to skip")
    parser.add_argument("--duration", type=_positive, default=None, help="wall seconds of replay")
    parser.add_argument("--token-scale", type=_positive, default=0.1, help="token count multiplier")
    parser.add_argument("--max-requests", type=int, default=None)
    parser.add_argument(
        "--max-model-len", type=int, default=None, help="trim prompt+output to the engine's context (e.g. 512)"
    )
    parser.add_argument("--concurrency-limit", type=int, default=None)
    parser.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    parser.add_argument("--timeout", type=_positive, default=60.0, help="per-request timeout in seconds")
    parser.add_argument("--csv", default=None, help="write one row per request")
    parser.add_argument("--summary-json", default=None, help="write the latency summary as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary, results = run_replay(
            args.url,
            args.model,
            args.trace,
            speedup=args.speedup,
            rate_scale=args.rate_scale,
            start_offset=args.start_offset,
            duration=args.duration,
            token_scale=args.token_scale,
            max_requests=args.max_requests,
            max_model_len=args.max_model_len,
            concurrency_limit=args.concurrency_limit,
            endpoint=args.endpoint,
            timeout_s=args.timeout,
            progress=not args.no_progress,
        )
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print(summary.text())
    try:
        if args.csv:
            write_csv(args.csv, results)
        if args.summary_json:
            Path(args.summary_json).write_text(json.dumps(summary.to_json(), indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        print(f"error: cannot write output: {exc}", file=sys.stderr)
        return 1
    return 0 if summary.count else 1


if __name__ == "__main__":
    sys.exit(main())
