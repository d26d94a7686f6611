"""Benchmark: one tailguard evaluation cycle vs the Prometheus engine, the bare queries and per-target queries.

For N targets = 100, 1,000, 5,000, four signals (P99 from vLLM's histogram buckets, a queue gauge, an error
ratio, an HBM ratio) are backfilled into a real Prometheus (promtool); then, side by side in one run, medians of
--repeats (issue 15's table):
  cycle       evaluate() of one policy: its queries (issued at once), the engine, the SQLite journal commit,
              the metrics and the log line (the dispatcher is a fake: nothing fires); with the process CPU time
              it used, the bytes it wrote (/proc/self/io wchar: the journal's), and the process' RSS afterwards
  rule engine the same 4 expressions evaluated inside Prometheus, no HTTP or JSON (the `stats=all` timings of each
              query: evalTotalTime, what a recording/alerting rule's evaluation costs), summed as a rule group
              evaluates them (one after another)
  bare seq    the same 4 rendered queries as plain HTTP GETs, one after another (json decoded, nothing else)
  bare max    the slowest of those 4 bare queries (the floor of a concurrent cycle; issue 15's target: <= 1.2x)
  bare once   the same 4 bare GETs issued at once (4 threads): what they take together when they share this
              machine's cores with each other (on a 2-core host Prometheus evaluates them side by side and the
              slowest one slows down): the floor of a concurrent cycle here
  per-target  Flagger/Argo style: the 4 queries once per target (selector on its service), 8 at a time (1 run)
  paired      the median of each cycle's ratio to the floors measured right after it (less exposed to the host's
              drift than the ratio of the medians), and the cycle's own share: from the last answer to its end
and the ratios; for two sets of 4 queries: the bench signals (three of them precomputed gauges) and the shipped
policies' own queries (rules/examples: p99-rollback's P99 over histogram buckets, error-rate-shift's ratio of two
rates, queue-scale's sum over a count, hbm-headroom's DCGM used / (used + free) joined with vLLM's KV gauge), with
their series backfilled too. Targets (issue 22): cycle <= 1.2x "bare once" at 1,000 and 5,000 targets, the
cycle's own share after the last answer <= 30 ms at 1,000.
Reaction: evaluation start -> the rollback port's call when one target among N breaches (a real Dispatcher over a
fresh journal, the rollback a recording fake), for the bench policy (the breach in its slowest query, the P99),
for a policy of one cheap gauge signal (an HBM ratio) and for the shipped P99-histogram and HBM-ratio queries
alone. Figures only, nothing asserted. CPU is also shown as a share of one core at a 15 s interval.

    python tests/bench/bench_cycle.py [--targets 100 1000 5000] [--repeats 5] [--per-target-max 5000]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.signals import query_signals, render_signal_queries
from tailguard.controller.kit.clock import SystemClock
from tailguard.controller.kit.gc_tuning import tune_for_long_running
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.evaluation import EvaluationPorts, UnconfiguredPredictions, evaluate
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.testing import FakeDispatcher, FakeRollback
from tests.support.openmetrics import VLLM_E2E, VLLM_E2E_BUCKETS, OpenMetricsWriter, latency_histogram_points

T0 = 1_700_000_000.0
STEP = 15.0
POINTS = 9  # two minutes of 15 s scrapes: enough for rate(...[1m])
AT = T0 + (POINTS - 1) * STEP
SIGNALS = {
    "p99": "histogram_quantile(0.99, sum by (le, {{ by }}) "
    "(rate(vllm:e2e_request_latency_seconds_bucket{ {{ selector }} }[1m])))",
    "queue": "max by ({{ by }}) (vllm:num_requests_waiting{ {{ selector }} })",
    "errors": "max by ({{ by }}) (bench_error_ratio{ {{ selector }} })",
    "hbm": "max by ({{ by }}) (bench_hbm_ratio{ {{ selector }} })",
}
# The shipped policies' own queries (rules/examples), read from their files: the P99 over histogram buckets, the
# error ratio of two rates, the queue per replica (a sum over a count) and the HBM used / (used + free) ratio under
# KV-cache pressure (DCGM's two gauges, vLLM's KV gauge, joined `on` the target labels).
SHIPPED_FILES = {
    "p99": "p99-rollback.yaml",
    "errors": "error-rate-shift.yaml",
    "queue": "queue-scale.yaml",
    "hbm": "hbm-headroom.yaml",
}


def shipped_queries() -> dict[str, str]:
    from tailguard.controller.core.policy_files import load_policies

    queries: dict[str, str] = {}
    for name, file in SHIPPED_FILES.items():
        loaded, errors = load_policies([ROOT / "rules" / "examples" / file])
        if errors or not loaded:
            raise SystemExit(f"bench: cannot read rules/examples/{file}: {errors}")
        queries[name] = loaded[0].policy.signals[0].query
    return queries


QUERY_SETS = {"bench signals": SIGNALS, "shipped queries": shipped_queries()}
THRESHOLDS = {"p99": 10.0, "queue": 1000.0, "errors": 0.5, "hbm": 0.99}  # nothing fires
BREACHING = 7  # the one target whose P99 (6 s) breaches a 5 s threshold: the reaction measurement's
BREACHING_HBM = 0.97  # and its HBM ratio (under the healthy 0.99), above REACTION_HBM_THRESHOLD
REACTION_HBM_THRESHOLD = 0.95
# The reaction measurement's two policies: the bench policy (the breach is in its slowest query, the P99 over
# histogram buckets) and one gauge signal (an HBM-ratio rollback: a cheap query).
# The shipped ones: the P99 policy (p99-rollback's histogram query alone) and the HBM ratio policy (hbm-headroom's
# used / (used + free) query alone).
REACTIONS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "p99 of 4 signals": (("p99", "queue", "errors", "hbm"), SIGNALS),
    "HBM gauge alone": (("hbm",), SIGNALS),
    "shipped P99 histogram": (("p99",), QUERY_SETS["shipped queries"]),
    "shipped HBM ratio": (("hbm",), QUERY_SETS["shipped queries"]),
}


def policy(
    targets: int,
    action: str = "annotate",
    p99_threshold: float = 10.0,
    signals: tuple[str, ...] = tuple(SIGNALS),
    hbm_threshold: float = THRESHOLDS["hbm"],
    queries: dict[str, str] = SIGNALS,
) -> Policy:
    """The bench policy; with the default thresholds no target breaches (a healthy cycle), with a P99 threshold
    of 5 s or an HBM threshold of 0.95 the BREACHING target does (the reaction measurement)."""
    thresholds = {**THRESHOLDS, "p99": p99_threshold, "hbm": hbm_threshold}
    actions = [{"type": "annotate", "text": "{{ value }}"}] if action == "annotate" else [{"type": "rollback"}]
    return Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": f"bench{targets}",
            "targets": {"groupBy": ["service"], "match": {"namespace": f"bench{targets}"}},
            "signals": [{"name": name, "query": queries[name]} for name in signals],
            "conditions": [
                {
                    "name": f"{name}-high",
                    "signal": name,
                    "when": {"op": ">", "value": thresholds[name]},
                    "for": 3,
                    "noData": "hold",
                    "actions": actions,
                }
                for name in signals
            ],
        }
    )


def history(targets: int) -> tuple[str, int]:
    writer = OpenMetricsWriter()
    times = [T0 + i * STEP for i in range(POINTS)]
    for index in range(targets):
        labels = {"namespace": f"bench{targets}", "service": f"svc-{index:05d}"}
        latency = 6.0 if index == BREACHING else 0.2 + (index % 10) * 0.05

        def constant(timestamp: float, value: float = latency) -> float:
            return value

        writer.histogram(VLLM_E2E, labels, VLLM_E2E_BUCKETS, latency_histogram_points(times, lambda t: 50.0, constant))
        writer.gauge("vllm:num_requests_waiting", labels, [(t, float(index % 7)) for t in times])
        writer.gauge("bench_error_ratio", labels, [(t, 0.001 * (index % 5)) for t in times])
        hbm = BREACHING_HBM if index == BREACHING else 0.5 + 0.01 * (index % 30)
        writer.gauge("bench_hbm_ratio", labels, [(t, hbm) for t in times])
        # the shipped queries' series: request outcomes (50 a scrape, 0.1% errors), DCGM's framebuffer gauges
        # (MiB, used / (used + free) = the ratio above) and vLLM's KV-cache usage (above 0.85: under pressure)
        for reason, share in (("stop", 0.999), ("error", 0.001 * (index % 5))):
            writer.counter(
                "vllm:request_success",
                {**labels, "finished_reason": reason},
                [(t, 50.0 * share * i) for i, t in enumerate(times)],
            )
        framebuffer = 81_920.0
        writer.gauge("DCGM_FI_DEV_FB_USED", labels, [(t, framebuffer * hbm) for t in times])
        writer.gauge("DCGM_FI_DEV_FB_FREE", labels, [(t, framebuffer * (1 - hbm)) for t in times])
        writer.gauge("vllm:kv_cache_usage_perc", labels, [(t, 0.9) for t in times])
    return writer.render(), writer.sample_count


def backfill(target_sets: list[int], data: str) -> None:
    from tailguard.serving.lab.promstack import backfill_openmetrics

    for targets in target_sets:
        text, samples = history(targets)
        backfill_openmetrics(text, Path(data), expected_samples=samples)


def bare_at_once(url: str, queries: list[str], pool: ThreadPoolExecutor) -> float:
    """The queries as plain GETs issued at once (one session each): the wall until the last answer is decoded."""

    def one(query: str) -> int:
        with requests.Session() as session:
            response = session.get(f"{url}/api/v1/query", params={"query": query, "time": AT}, timeout=60)
            return len(response.json()["data"]["result"])

    started = time.perf_counter()
    list(pool.map(one, queries))
    return time.perf_counter() - started


def bare(url: str, queries: list[str]) -> tuple[float, float, int]:
    """The queries as plain GETs, one after another: (total wall, slowest one, series answered)."""
    walls: list[float] = []
    series = 0
    with requests.Session() as session:
        for query in queries:
            started = time.perf_counter()
            response = session.get(f"{url}/api/v1/query", params={"query": query, "time": AT}, timeout=60)
            body = response.json()
            walls.append(time.perf_counter() - started)
            series += len(body["data"]["result"])
    return sum(walls), max(walls), series


class _TimedRollback(FakeRollback):
    """The rollback port, recording when the dispatcher first called it for an action (time.perf_counter()): its
    plan, journaled before the rollback itself. Many revisions to roll back through."""

    def __init__(self) -> None:
        super().__init__({f"svc-{BREACHING:05d}": 1_000_000})
        self.called_at: list[float] = []

    def plan_rollback(self, service: str, *, rollout_revision: str | None = None) -> Any:
        self.called_at.append(time.perf_counter())
        return super().plan_rollback(service, rollout_revision=rollout_revision)


def _io_written() -> int:
    """Bytes this process has passed to write() so far (/proc/self/io wchar): the journal's, logging being off."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def engine_time(url: str, queries: list[str]) -> float:
    """The 4 expressions as Prometheus' own engine evaluates them (no HTTP, no JSON): the sum of each query's
    evalTotalTime (`stats=all`), as one rule group evaluates its rules one after another."""
    total = 0.0
    with requests.Session() as session:
        for query in queries:
            body = session.get(
                f"{url}/api/v1/query", params={"query": query, "time": AT, "stats": "all"}, timeout=60
            ).json()
            total += float(body["data"]["stats"]["timings"]["evalTotalTime"])
    return total


def per_target(url: str, the_policy: Policy, targets: int) -> float:
    """Flagger/Argo style: each target's 4 queries on their own (its service in the selector), 8 at a time."""
    template = the_policy.model_copy(update={"targets": the_policy.targets.model_copy(update={"match": {}})})
    queries = list(render_signal_queries(template).values())
    local = threading.local()

    def one(index: int) -> int:
        session = getattr(local, "session", None)
        if session is None:
            session = local.session = requests.Session()
        selector = f'namespace="bench{targets}",service="svc-{index:05d}"'
        answered = 0
        for query in queries:
            narrowed = query.replace("{  }", "{ " + selector + " }")
            body = session.get(f"{url}/api/v1/query", params={"query": narrowed, "time": AT}, timeout=60).json()
            answered += len(body["data"]["result"])
        return answered

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=8) as pool:
        answered = sum(pool.map(one, range(targets)))
    wall = time.perf_counter() - started
    if answered != 4 * targets:
        raise SystemExit(f"bench: per-target queries answered {answered} series at N={targets}, expected {4 * targets}")
    return wall


def reaction(
    url: str, targets: int, repeats: int, work: Path, signals: tuple[str, ...], queries: dict[str, str], tag: str
) -> tuple[float, float]:
    """Evaluation start -> the rollback port's call, one target breaching among `targets` (median of `repeats`),
    and of that the part after the last of the evaluation's queries answered (the controller's own share):
    each repeat's third breaching evaluation (for: 3) fires; its incidents are hours apart (cooldown, budget).
    `signals`: the policy's (REACTIONS); the breach is in its P99 if it has one, else in its HBM ratio."""
    answered: list[float] = []

    def timed_query(src: Any, pol: Policy, _at: float | None) -> Any:
        result = query_signals(src, pol, AT)
        answered.append(time.perf_counter())
        return result

    if "p99" in signals:
        the_policy = policy(targets, action="rollback", p99_threshold=5.0, signals=signals, queries=queries)
    else:
        the_policy = policy(
            targets, action="rollback", signals=signals, hbm_threshold=REACTION_HBM_THRESHOLD, queries=queries
        )
    source = PrometheusSource(PrometheusSettings(url=url, timeout=60), SystemClock())
    journal = Journal(work / f"reaction-{targets}-{tag}.db")
    clock = SystemClock()
    port = _TimedRollback()
    ports = EvaluationPorts(
        source=source,
        journal=journal,
        dispatcher=Dispatcher(journal, Actuators(rollback=port), clock, GlobalLimits()),
        clock=clock,
        metrics=ControllerMetrics(CollectorRegistry()),
        predictions=UnconfiguredPredictions(),
        query_signals=timed_query,
    )
    latencies: list[float] = []
    after_queries: list[float] = []
    state = PolicyState()
    for repeat in range(repeats):
        base = AT + 10_000.0 * (repeat + 1)
        state = evaluate(the_policy, state, base, ports).state
        state = evaluate(the_policy, state, base + 15.0, ports).state
        calls = len(port.called_at)
        started = time.perf_counter()
        outcome = evaluate(the_policy, state, base + 30.0, ports)
        state = outcome.state
        if len(port.called_at) != calls + 1:
            raise SystemExit(f"bench: expected one rollback at N={targets}, got {len(port.called_at) - calls}")
        latencies.append(port.called_at[-1] - started)
        after_queries.append(port.called_at[-1] - max(answered[-len(signals) :]))
        # the next repeat's incident starts from healthy: resolve this one by forgetting it (a new onset)
        state = PolicyState(
            conditions={k: v for k, v in state.conditions.items() if k[1] != (("service", f"svc-{BREACHING:05d}"),)},
            evaluations=state.evaluations,
            last_evaluated_at=state.last_evaluated_at,
        )
    source.close()
    journal.close()
    return statistics.median(latencies), statistics.median(after_queries)


def measure(
    url: str, targets: int, repeats: int, work: Path, per_target_max: int, templates: dict[str, str], tag: str
) -> dict[str, Any]:
    the_policy = policy(targets, queries=templates)
    queries = list(render_signal_queries(the_policy).values())
    source = PrometheusSource(PrometheusSettings(url=url, timeout=60), SystemClock())
    journal = Journal(work / f"journal-{targets}-{tag}.db")
    clock = SystemClock()
    answered: list[float] = []

    def timed_query(src: Any, pol: Policy, _at: float | None) -> Any:
        result = query_signals(src, pol, AT)  # the backfilled instant
        answered.append(time.perf_counter())
        return result

    ports = EvaluationPorts(
        source=source,
        journal=journal,
        dispatcher=FakeDispatcher(),
        clock=clock,
        metrics=ControllerMetrics(CollectorRegistry()),
        predictions=UnconfiguredPredictions(),
        query_signals=timed_query,
    )
    state = evaluate(the_policy, PolicyState(), AT, ports).state  # warm: every target has state
    expected = 4 * targets
    if len(state.conditions) != expected:
        raise SystemExit(f"bench: {len(state.conditions)} target states at N={targets}, expected {expected}")
    cycles: list[float] = []
    cpu: list[float] = []
    written: list[int] = []
    sequential: list[float] = []
    slowest: list[float] = []
    engine: list[float] = []
    at_once: list[float] = []
    after: list[float] = []
    pool = ThreadPoolExecutor(max_workers=len(queries))
    for repeat in range(repeats):
        before_io = _io_written()
        before_cpu = time.process_time()
        started = time.perf_counter()
        state = evaluate(the_policy, state, AT + 15.0 * (repeat + 1), ports).state
        ended = time.perf_counter()
        cycles.append(ended - started)
        after.append(ended - max(answered[-len(queries) :]))
        cpu.append(time.process_time() - before_cpu)
        written.append(_io_written() - before_io)
        total, longest, series = bare(url, queries)
        if series != expected:
            raise SystemExit(f"bench: bare queries answered {series} series at N={targets}, expected {expected}")
        sequential.append(total)
        slowest.append(longest)
        engine.append(engine_time(url, queries))
        at_once.append(bare_at_once(url, queries, pool))
    pool.shutdown()
    rss = _rss_mib()
    source.close()
    journal.close()
    cycle, seq, floor, rules = (statistics.median(v) for v in (cycles, sequential, slowest, engine))
    return {
        "targets": targets,
        "cycle_s": cycle,
        "cpu_s": statistics.median(cpu),
        "written_bytes": statistics.median(written),
        "rss_mib": rss,
        "bare_seq_s": seq,
        "bare_max_s": floor,
        "bare_once_s": statistics.median(at_once),
        # each cycle against the floor measured right after it (less exposed to the host's drift than the
        # ratio of the medians)
        "paired_max": statistics.median(c / m for c, m in zip(cycles, slowest, strict=True)),
        "paired_once": statistics.median(c / o for c, o in zip(cycles, at_once, strict=True)),
        "after_s": statistics.median(after),
        "rules_s": rules,
        "per_target_s": per_target(url, the_policy, targets) if targets <= per_target_max else None,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--targets", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--repeats", type=int, default=5, help="cycles per N; medians are reported")
    parser.add_argument(
        "--per-target-max", type=int, default=5000, help="largest N the per-target (8-way) queries run at (slow)"
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds): that it runs, figures meaningless")
    args = parser.parse_args(argv)
    if args.smoke:
        args.targets, args.repeats, args.per_target_max = [20], 1, 20
    # A SIGTERM (e.g. from `timeout`) unwinds like an exception, so the Prometheus this started is stopped.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    logging.disable(logging.INFO)  # the evaluation's log line is not printed (nor formatted)
    tune_for_long_running()  # as `tailguard run` does (controller/kit/gc_tuning.py)
    logging.getLogger("tailguard").setLevel(logging.WARNING)

    from tailguard.serving.lab.promstack import PrometheusServer, PromStackError

    rows: list[dict[str, Any]] = []
    reactions: dict[int, dict[str, tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="tailguard-bench-cycle-") as tmp:
        work = Path(tmp)
        data = work / "data"
        started = time.perf_counter()
        # In a child process: the history text (hundreds of MB at 5,000 targets) never counts in this process' RSS,
        # which is then the controller's own (its modules, the states and the journal of the cycles measured).
        child = multiprocessing.get_context("spawn").Process(target=backfill, args=(args.targets, str(data)))
        child.start()
        child.join()
        if child.exitcode != 0:
            print(f"bench: backfilling failed (exit code {child.exitcode})", file=sys.stderr)
            return 2
        print(f"backfilled {len(args.targets)} target sets in {time.perf_counter() - started:.1f} s", flush=True)
        try:
            server = PrometheusServer(data_dir=data, workdir=work / "run").start()
        except PromStackError as failed:
            print(f"bench: {failed}", file=sys.stderr)
            return 2
        with server:
            for targets in args.targets:
                for number, (name, templates) in enumerate(QUERY_SETS.items()):
                    # per-target queries (slow) for the bench signals only: the comparison is the same for both
                    most = args.per_target_max if number == 0 else 0
                    row = measure(server.url, targets, args.repeats, work, most, templates, f"set{number}")
                    rows.append({**row, "set": name})
                reactions[targets] = {
                    name: reaction(url=server.url, targets=targets, repeats=max(3, args.repeats), work=work,
                                   signals=signals, queries=queries, tag=f"r{number}")
                    for number, (name, (signals, queries)) in enumerate(REACTIONS.items())
                }  # fmt: skip
                print(f"measured N={targets}", flush=True)
    print(f"medians of {args.repeats} (per-target: one run); ratios to the cycle's own figures")
    print(
        f"{'queries':<15} | {'targets':>7} | {'cycle s':>8} | {'rule eng s':>10} | {'bare seq s':>10} | "
        f"{'bare max s':>10} | "
        f"{'bare once s':>11} | {'per-target s':>12} | {'cyc/max':>7} | {'cyc/once':>8} | {'cyc/seq':>7} | "
        f"{'pt/cyc':>6}"
    )
    for row in rows:
        per = row["per_target_s"]
        per_text = "-" if per is None else f"{per:.2f}"
        per_ratio = "-" if per is None else f"{per / row['cycle_s']:.1f}"
        print(
            f"{row['set']:<15} | {row['targets']:>7} | {row['cycle_s']:>8.4f} | {row['rules_s']:>10.4f} | "
            f"{row['bare_seq_s']:>10.4f} | {row['bare_max_s']:>10.4f} | {row['bare_once_s']:>11.4f} | {per_text:>12} | "
            f"{row['cycle_s'] / row['bare_max_s']:>7.2f} | {row['cycle_s'] / row['bare_once_s']:>8.2f} | "
            f"{row['cycle_s'] / row['bare_seq_s']:>7.2f} | "
            f"{per_ratio:>6}"
        )
    print(
        f"{'queries':<15} | {'targets':>7} | {'cyc/max paired':>14} | {'cyc/once paired':>15} | "
        f"{'after last answer ms':>20} | "
        f"{'CPU s/cycle':>11} | {'% core @15s':>11} | {'RSS MiB':>7} | {'written B/cycle':>15}"
    )
    for row in rows:
        print(
            f"{row['set']:<15} | {row['targets']:>7} | {row['paired_max']:>14.2f} | {row['paired_once']:>15.2f} | "
            f"{1000 * row['after_s']:>20.1f} | {row['cpu_s']:>11.4f} | {100 * row['cpu_s'] / 15:>11.2f} | "
            f"{row['rss_mib']:>7.0f} | {row['written_bytes']:>15,.0f}"
        )
    print("evaluation start -> the rollback call, one target breaching (and of it, after the last answer)")
    print(f"{'targets':>7} | " + " | ".join(f"{name + ' ms':>30}" for name in REACTIONS))
    for targets, measured in reactions.items():
        cells = [f"{1000 * total:>12.1f} (after {1000 * after:>6.1f})" for total, after in measured.values()]
        print(f"{targets:>7} | " + " | ".join(f"{cell:>30}" for cell in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
