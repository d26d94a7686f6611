"""The continuous-batching model of one vLLM engine, as a pure core.

No I/O and no clock of its own: the caller says what time it is. One engine
step is planned with `plan_step(now)` (which requests run, how many prefill and
decode tokens, how long the forward pass takes) and applied with
`finish_step(plan, end)` at the time the step actually ended, so the asyncio
engine can use real time and tests can use virtual time (`simulate`).

The model follows vLLM's v1 scheduler closely enough to reproduce its failure
modes from configuration alone:
- a waiting queue ordered by arrival (`fcfs`) or by (priority, arrival) (`priority`);
- a running set limited by `max_num_seqs`; each step spends at most
  `max_num_batched_tokens` tokens, decodes first (one token per running
  sequence), then chunked prefill of running and newly admitted requests;
- a paged KV cache of `num_gpu_blocks` blocks of `block_size` tokens, one of
  which vLLM keeps as its null block; a request is admitted only when its whole
  prompt fits; when a running sequence needs a block and none is free, the most
  recently admitted (or, with priority scheduling, the lowest-priority) sequence
  is preempted: its blocks are freed and it goes back to the waiting queue,
  keeping its output, whose KV is recomputed with the prompt when it resumes
  (vLLM's recompute preemption);
- prefix caching: with `enable_prefix_caching`, a fixed share of each prompt
  (whole blocks, `hardware.prefix_cache_hit_ratio`) is a cache hit and is not
  recomputed;
- step time = `decode_step_base_s + decode_per_seq_s * decoding sequences +
  decode_kv_s_per_token * their context tokens + prefill tokens / prefill_tokens_per_s`,
  each scaled for quantization (weight bytes), the KV dtype (fp8: KV bytes per token) and tensor parallelism by
  `EngineProfile.step_costs()` (estimates until calibrated on a GPU); the same
  factors size the KV cache (`num_gpu_blocks`).
Every request generates exactly `max_tokens` tokens (the simulator never emits
EOS), so finished_reason is "length", or "error" for an injected fault.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tailguard.controller import InputError
from tailguard.serving.tier.priority import BatchWindows, PriorityClass
from tailguard.serving.tier.profiles import EngineProfile


class RequestRejected(InputError, ValueError):
    """The request can never be served by this engine (vLLM answers 400)."""


# eq=False: requests are compared by identity (the scheduler removes them from lists; field-by-field
# equality made every removal a scan of all fields and the simulation 8x slower).
@dataclass(eq=False)
class SimRequest:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrival: float
    priority: int = 0
    fail: bool = False
    # Filled in by the engine.
    cached_tokens: int = 0
    computed_tokens: int = 0  # prompt tokens whose KV exists (cache hits included)
    generated: int = 0
    blocks: int = 0
    preemptions: int = 0
    first_scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    inter_token_latencies: list[float] = field(default_factory=list)
    prompt_tokens_computed: int = 0  # prefill work actually done, recomputation included
    # Output tokens whose KV was dropped by a preemption: recomputed with the prompt when it resumes.
    recompute_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def prefill_target(self) -> int:
        """Tokens whose KV a prefill must compute: the prompt, plus the output kept across a preemption."""
        return self.prompt_tokens + self.recompute_tokens

    @property
    def in_prefill(self) -> bool:
        return self.computed_tokens < self.prefill_target


@dataclass(frozen=True)
class StepPlan:
    started_at: float
    duration: float
    decode: tuple[SimRequest, ...]
    prefill: tuple[tuple[SimRequest, int], ...]  # (request, prompt tokens computed this step)
    preempted: int

    @property
    def num_tokens(self) -> int:
        return len(self.decode) + sum(tokens for _, tokens in self.prefill)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


@dataclass(frozen=True)
class StepOutcome:
    plan: StepPlan
    ended_at: float
    finished: tuple[SimRequest, ...]
    first_tokens: tuple[SimRequest, ...]


class BatchingModel:
    def __init__(self, profile: EngineProfile):
        self.profile = profile
        args = profile.engineArgs
        self.block_size = args.block_size
        # vLLM's block pool keeps one block aside as the null block (padding for skipped positions):
        # of `num_gpu_blocks` blocks, one fewer ever holds KV, and usage is counted over those.
        self.num_blocks = max(profile.num_gpu_blocks() - 1, 0)
        self.free_blocks = self.num_blocks
        self.max_num_seqs = args.max_num_seqs
        self.token_budget = args.max_num_batched_tokens
        self.priority_scheduling = args.scheduling_policy == "priority"
        # Quantization, KV dtype and tensor parallelism scale the hardware's step costs (estimates).
        self._step_costs = profile.step_costs()
        self._kv_s_per_token = profile.decode_kv_s_per_token()
        self.running: list[SimRequest] = []
        self._waiting: list[tuple[int, float, int, SimRequest]] = []
        self._order = itertools.count()
        self.num_preemptions = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    # -- admission -------------------------------------------------------------------------------
    def check(self, prompt_tokens: int, max_tokens: int) -> None:
        """Raise RequestRejected for a request that could never run (too long for the model or cache)."""
        args = self.profile.engineArgs
        total = prompt_tokens + max_tokens
        if prompt_tokens < 1 or max_tokens < 1:
            raise RequestRejected("prompt and max_tokens must each be at least 1 token")
        if total > args.max_model_len:
            raise RequestRejected(
                f"This model's maximum context length is {args.max_model_len} tokens. However, you requested "
                f"{total} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion)."
            )
        if self._blocks_for(total) > self.num_blocks:
            raise RequestRejected(
                f"request needs {self._blocks_for(total)} KV-cache blocks but the engine has {self.num_blocks}"
            )

    def add(self, request: SimRequest) -> None:
        self.check(request.prompt_tokens, request.max_tokens)
        self._push_waiting(request)

    def _push_waiting(self, request: SimRequest) -> None:
        rank = request.priority if self.priority_scheduling else 0
        heapq.heappush(self._waiting, (rank, request.arrival, next(self._order), request))

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self._waiting)

    @property
    def kv_cache_usage(self) -> float:
        return 0.0 if self.num_blocks == 0 else (self.num_blocks - self.free_blocks) / self.num_blocks

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    # -- one step --------------------------------------------------------------------------------
    def _victim(self) -> SimRequest:
        if self.priority_scheduling:
            return max(self.running, key=lambda r: (r.priority, r.arrival))
        return self.running[-1]

    def _preempt(self, victim: SimRequest) -> None:
        self.running.remove(victim)
        self.free_blocks += victim.blocks
        victim.blocks = 0
        # Like vLLM's recompute preemption: the output so far is kept; its KV (and the prompt's) is
        # recomputed in one prefill when the request is scheduled again, then decoding continues.
        victim.recompute_tokens = victim.generated
        victim.computed_tokens = 0
        victim.cached_tokens = 0
        victim.preemptions += 1
        self.num_preemptions += 1
        self._push_waiting(victim)

    def _grow(self, request: SimRequest, tokens: int) -> bool:
        """Make `request` hold blocks for `tokens` tokens, preempting others if needed; False if preempted."""
        needed = self._blocks_for(tokens) - request.blocks
        while needed > self.free_blocks:
            victim = self._victim()
            self._preempt(victim)
            if victim is request:
                return False
        if needed > 0:
            self.free_blocks -= needed
            request.blocks += needed
        return True

    def plan_step(self, now: float) -> StepPlan:
        budget = self.token_budget
        decode: list[SimRequest] = []
        prefill: list[tuple[SimRequest, int]] = []
        preempted_before = self.num_preemptions
        for request in list(self.running):
            if budget <= 0:
                break
            if request not in self.running:  # preempted by an earlier request of this step
                continue
            if request.in_prefill:
                chunk = min(request.prefill_target - request.computed_tokens, budget)
                if self._grow(request, request.computed_tokens + chunk):
                    prefill.append((request, chunk))
                    budget -= chunk
            else:
                # This step computes the KV of the newest token: prompt + generated tokens in all (vLLM
                # allocates slots for exactly the tokens computed so far plus this step's).
                if self._grow(request, request.prompt_tokens + request.generated):
                    decode.append(request)
                    budget -= 1
        decode = [r for r in decode if r in self.running]
        prefill = [(r, c) for r, c in prefill if r in self.running]
        # Like vLLM, admit nothing new in a step that had to preempt.
        if self.num_preemptions == preempted_before:
            while self._waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                request = self._waiting[0][3]
                cached = self._cache_hit_tokens(request)
                chunk = min(request.prefill_target - cached, budget)
                blocks = self._blocks_for(cached + chunk)
                if blocks > self.free_blocks:
                    break
                heapq.heappop(self._waiting)
                self.prefix_cache_queries += request.prompt_tokens if self._prefix_caching else 0
                self.prefix_cache_hits += cached
                request.cached_tokens = cached
                request.computed_tokens = cached
                request.blocks = blocks
                self.free_blocks -= blocks
                if request.first_scheduled_at is None:
                    request.first_scheduled_at = now
                self.running.append(request)
                prefill.append((request, chunk))
                budget -= chunk
        base_s, per_seq_s, prefill_tokens_per_s = self._step_costs
        prefill_tokens = sum(tokens for _, tokens in prefill)
        duration = 0.0
        if decode or prefill:
            duration = base_s + per_seq_s * len(decode) + prefill_tokens / prefill_tokens_per_s
            if self._kv_s_per_token and decode:
                # Memory-bound decode: each running sequence's whole KV cache (prompt + output) is read once.
                context = sum(request.prompt_tokens + request.generated for request in decode)
                duration += self._kv_s_per_token * context
        return StepPlan(now, duration, tuple(decode), tuple(prefill), self.num_preemptions - preempted_before)

    @property
    def _prefix_caching(self) -> bool:
        return self.profile.engineArgs.enable_prefix_caching

    def _cache_hit_tokens(self, request: SimRequest) -> int:
        if not self._prefix_caching:
            return 0
        hit = int(request.prompt_tokens * self.profile.hardware.prefix_cache_hit_ratio)
        hit = hit // self.block_size * self.block_size
        return min(hit, request.prompt_tokens - 1)  # vLLM always recomputes the last prompt token

    def finish_step(self, plan: StepPlan, ended_at: float) -> StepOutcome:
        finished: list[SimRequest] = []
        first_tokens: list[SimRequest] = []
        for request, tokens in plan.prefill:
            request.computed_tokens += tokens
            request.prompt_tokens_computed += tokens
            if not request.in_prefill:
                # The step that completes the prefill samples the next token: the first one, or, after a
                # preemption, the one after the kept output (the wait in between is one inter-token gap).
                if request.last_token_at is not None:
                    request.inter_token_latencies.append(ended_at - request.last_token_at)
                request.generated += 1
                request.first_token_at = request.first_token_at or ended_at
                request.last_token_at = ended_at
                first_tokens.append(request)
                if request.fail or request.generated >= request.max_tokens:
                    finished.append(request)
        for request in plan.decode:
            request.generated += 1
            if request.last_token_at is not None:
                request.inter_token_latencies.append(ended_at - request.last_token_at)
            request.last_token_at = ended_at
            if request.generated >= request.max_tokens:
                finished.append(request)
        for request in finished:
            request.finished_at = ended_at
            request.finish_reason = "error" if request.fail else "length"
            self.running.remove(request)
            self.free_blocks += request.blocks
            request.blocks = 0
        return StepOutcome(plan, ended_at, tuple(finished), tuple(first_tokens))


@dataclass(frozen=True)
class Arrival:
    at: float
    prompt_tokens: int
    max_tokens: int
    priority: int = 0


def simulate(
    profile: EngineProfile,
    arrivals: Iterable[Arrival],
    *,
    max_steps: int = 5_000_000,
    windows: Sequence[PriorityClass] | None = None,
) -> list[SimRequest]:
    """Run the model in virtual time over `arrivals`; returns every request, finished, in arrival order.

    With `windows` (e.g. tailguard.serving.tier.priority.SEED_CLASSES) requests pass through their priority class's
    batching window first, as behind the router: a request's latency includes its wait in the window.
    """
    model = BatchingModel(profile)
    pending = sorted(arrivals, key=lambda a: a.at)
    held: BatchWindows[SimRequest] | None = BatchWindows(windows) if windows else None
    requests: list[SimRequest] = []
    index = 0
    now = pending[0].at if pending else 0.0

    def admit(until: float) -> None:
        """Every arrival and window deadline up to `until`, in time order."""
        nonlocal index
        while True:
            deadline = held.next_deadline() if held is not None else None
            arrival_at = pending[index].at if index < len(pending) else None
            if deadline is not None and deadline <= until and (arrival_at is None or deadline < arrival_at):
                assert held is not None
                for release in held.due(deadline):
                    for request in release.items:
                        model.add(request)
                continue
            if arrival_at is None or arrival_at > until:
                return
            arrival = pending[index]
            request = SimRequest(
                f"sim-{index}", arrival.prompt_tokens, arrival.max_tokens, arrival.at, arrival.priority
            )
            requests.append(request)
            index += 1
            if held is None:
                model.add(request)
                continue
            model.check(request.prompt_tokens, request.max_tokens)
            filled = held.offer(request, request.priority, arrival.at)
            for item in filled.items if filled is not None else ():
                model.add(item)

    for _ in range(max_steps):
        admit(now)
        if not model.has_work:
            deadline = held.next_deadline() if held is not None else None
            upcoming = [t for t in (deadline, pending[index].at if index < len(pending) else None) if t is not None]
            if not upcoming:
                return requests
            now = max(now, min(upcoming))
            continue
        plan = model.plan_step(now)
        if plan.empty:
            raise RuntimeError("the engine cannot make progress")  # check() rules this out
        now += plan.duration
        model.finish_step(plan, now)
    raise RuntimeError(f"simulation did not finish within {max_steps} steps")
