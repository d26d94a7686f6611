"""Benchmark: one tailguard evaluation cycle vs the 4 bare queries it needs, against a real Prometheus.

For N targets = 100, 1,000, 5,000, four signals (P99 from vLLM's histogram buckets, a queue gauge, an error
ratio, an HBM ratio) are backfilled into a real Prometheus (promtool); then, side by side in one run, medians of
--repeats:
  cycle      evaluate() of one policy: its queries (issued at once), the engine, the SQLite journal commit,
             the metrics and the log line (the dispatcher is a fake: nothing fires)
  bare seq   the same 4 rendered queries as plain HTTP GETs, one after another (json decoded, nothing else)
  bare max   the slowest of those 4 bare queries (the floor of a concurrent cycle)
with the ratios cycle/bare-seq and cycle/bare-max. Figures only, nothing asserted.

    python tests/bench/bench_cycle.py [--targets 100 1000 5000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry

from controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from controller.adapters.stores.journal import Journal
from controller.core.engine import PolicyState
from controller.core.policy import Policy
from controller.core.signals import query_signals, render_signal_queries
from controller.kit.clock import SystemClock
from controller.loop.evaluation import EvaluationPorts, UnconfiguredPredictions, evaluate
from controller.loop.metrics import ControllerMetrics
from controller.testing import FakeDispatcher
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
THRESHOLDS = {"p99": 5.0, "queue": 1000.0, "errors": 0.5, "hbm": 0.99}  # healthy targets: nothing fires


def policy(targets: int) -> Policy:
    return Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": f"bench{targets}",
            "targets": {"groupBy": ["service"], "match": {"namespace": f"bench{targets}"}},
            "signals": [{"name": name, "query": query} for name, query in SIGNALS.items()],
            "conditions": [
                {
                    "name": f"{name}-high",
                    "signal": name,
                    "when": {"op": ">", "value": THRESHOLDS[name]},
                    "for": 3,
                    "noData": "hold",
                    "actions": [{"type": "annotate", "text": "{{ value }}"}],
                }
                for name in SIGNALS
            ],
        }
    )


def history(targets: int) -> tuple[str, int]:
    writer = OpenMetricsWriter()
    times = [T0 + i * STEP for i in range(POINTS)]
    for index in range(targets):
        labels = {"namespace": f"bench{targets}", "service": f"svc-{index:05d}"}
        latency = 0.2 + (index % 10) * 0.05

        def constant(timestamp: float, value: float = latency) -> float:
            return value

        writer.histogram(VLLM_E2E, labels, VLLM_E2E_BUCKETS, latency_histogram_points(times, lambda t: 50.0, constant))
        writer.gauge("vllm:num_requests_waiting", labels, [(t, float(index % 7)) for t in times])
        writer.gauge("bench_error_ratio", labels, [(t, 0.001 * (index % 5)) for t in times])
        writer.gauge("bench_hbm_ratio", labels, [(t, 0.5 + 0.01 * (index % 30)) for t in times])
    return writer.render(), writer.sample_count


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


def measure(url: str, targets: int, repeats: int, work: Path) -> dict[str, Any]:
    the_policy = policy(targets)
    queries = list(render_signal_queries(the_policy).values())
    source = PrometheusSource(PrometheusSettings(url=url, timeout=60), SystemClock())
    journal = Journal(work / f"journal-{targets}.db")
    clock = SystemClock()
    ports = EvaluationPorts(
        source=source,
        journal=journal,
        dispatcher=FakeDispatcher(),
        clock=clock,
        metrics=ControllerMetrics(CollectorRegistry()),
        predictions=UnconfiguredPredictions(),
        query_signals=lambda src, pol, _at: query_signals(src, pol, AT),  # the backfilled instant
    )
    state = evaluate(the_policy, PolicyState(), AT, ports).state  # warm: every target has state
    expected = 4 * targets
    if len(state.conditions) != expected:
        raise SystemExit(f"bench: {len(state.conditions)} target states at N={targets}, expected {expected}")
    cycles: list[float] = []
    sequential: list[float] = []
    slowest: list[float] = []
    for repeat in range(repeats):
        started = time.perf_counter()
        state = evaluate(the_policy, state, AT + repeat + 1, ports).state
        cycles.append(time.perf_counter() - started)
        total, longest, series = bare(url, queries)
        if series != expected:
            raise SystemExit(f"bench: bare queries answered {series} series at N={targets}, expected {expected}")
        sequential.append(total)
        slowest.append(longest)
    source.close()
    journal.close()
    cycle, seq, floor = (statistics.median(v) for v in (cycles, sequential, slowest))
    return {"targets": targets, "cycle_s": cycle, "bare_seq_s": seq, "bare_max_s": floor}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--targets", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--repeats", type=int, default=5, help="cycles per N; medians are reported")
    args = parser.parse_args(argv)
    logging.disable(logging.INFO)  # the evaluation's log line is formatted, not printed

    from serving.promstack import PrometheusServer, PromStackError, backfill_openmetrics

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tailguard-bench-cycle-") as tmp:
        work = Path(tmp)
        data = work / "data"
        started = time.perf_counter()
        for targets in args.targets:
            text, samples = history(targets)
            backfill_openmetrics(text, data, expected_samples=samples)
        print(f"backfilled {len(args.targets)} target sets in {time.perf_counter() - started:.1f} s", flush=True)
        try:
            server = PrometheusServer(data_dir=data, workdir=work / "run").start()
        except PromStackError as failed:
            print(f"bench: {failed}", file=sys.stderr)
            return 2
        with server:
            for targets in args.targets:
                rows.append(measure(server.url, targets, args.repeats, work))
    print(
        f"{'targets':>7} | {'cycle s':>9} | {'bare seq s':>10} | {'bare max s':>10} | "
        f"{'cycle/seq':>9} | {'cycle/max':>9}"
    )
    for row in rows:
        print(
            f"{row['targets']:>7} | {row['cycle_s']:>9.4f} | {row['bare_seq_s']:>10.4f} | {row['bare_max_s']:>10.4f} | "
            f"{row['cycle_s'] / row['bare_seq_s']:>9.2f} | {row['cycle_s'] / row['bare_max_s']:>9.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
