"""Benchmark: batched signal queries vs one query per target (what Flagger and Argo Rollouts do).

For N targets = 10, 100, 1000, synthetic vLLM latency histograms are backfilled into a real
Prometheus; then one evaluation cycle of the p99 signal is timed both ways, each in its own child
process so that peak RSS belongs to that mode alone. Prints a table; --json PATH writes it as JSON.

    python tests/bench/bench_batching.py [--targets 10 100 1000] [--cycles 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.signals import query_signals
from tailguard.controller.kit.clock import SystemClock
from tailguard.controller.kit.templating import render_query
from tests.support.openmetrics import VLLM_E2E, VLLM_E2E_BUCKETS, OpenMetricsWriter, latency_histogram_points

T0 = 1_700_000_000.0
STEP = 15.0
POINTS = 21  # five minutes of 15 s scrapes
QUERY = (
    "histogram_quantile(0.99, sum by (le, {{ by }}) "
    "(rate(vllm:e2e_request_latency_seconds_bucket{ {{ selector }} }[1m])))"
)


def _policy(match: dict[str, str]) -> Policy:
    return Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": "bench",
            "targets": {"groupBy": ["service"], "match": match},
            "signals": [{"name": "p99", "query": QUERY}],
            "conditions": [
                {
                    "name": "slow",
                    "signal": "p99",
                    "when": {"op": ">", "value": 0.8},
                    "for": 3,
                    "noData": "hold",
                    "actions": [{"type": "rollback"}],
                }
            ],
        }
    )


def history(targets: int) -> tuple[str, int]:
    writer = OpenMetricsWriter()
    times = [T0 + i * STEP for i in range(POINTS)]
    for index in range(targets):
        latency = 0.2 if index % 10 else 1.2

        def constant(timestamp: float, value: float = latency) -> float:
            return value

        writer.histogram(
            VLLM_E2E,
            {"namespace": f"bench{targets}", "service": f"svc-{index:04d}"},
            VLLM_E2E_BUCKETS,
            latency_histogram_points(times, lambda t: 50.0, constant),
        )
    return writer.render(), writer.sample_count


def child(mode: str, url: str, targets: int, cycles: int) -> dict[str, Any]:
    """One mode measured in this process: requests, wall and CPU time per cycle, peak RSS."""
    requests: list[int] = []
    source = PrometheusSource(
        PrometheusSettings(url=url, timeout=30),
        SystemClock(),
        on_query=lambda kind, seconds, ok: requests.append(int(ok)),
    )
    at = T0 + (POINTS - 1) * STEP
    match = {"namespace": f"bench{targets}"}
    walls: list[float] = []
    cpus: list[float] = []
    values = 0
    for _ in range(cycles):
        requests.clear()
        wall, cpu = time.perf_counter(), time.process_time()
        if mode == "batched":
            results = query_signals(source, _policy(match), at)
            values = len(results["p99"].values)
        else:
            values = 0
            for index in range(targets):  # one query per target, as per-target analysis runs do
                per_target = render_query(
                    QUERY, match={**match, "service": f"svc-{index:04d}"}, group_by=["service"], variables={}
                )
                values += len(source.instant(per_target, ["service"], at).values)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    source.close()
    return {
        "mode": mode,
        "targets": targets,
        "requests_per_cycle": len(requests),
        "values": values,
        "wall_s": min(walls),
        "cpu_s": min(cpus),
        "peak_rss_mib": peak_rss_mib(),
    }


def peak_rss_mib() -> float:
    """VmHWM of this process (getrusage's ru_maxrss would carry the parent's peak across fork/exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--targets", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--cycles", type=int, default=3, help="cycles per mode; the fastest is reported")
    parser.add_argument("--json", type=Path, default=None, help="also write the table as JSON here")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "URL", "TARGETS"), help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds): that it runs, figures meaningless")
    args = parser.parse_args(argv)
    if args.smoke:
        args.targets, args.cycles = [5], 1
    if args.child:
        mode, url, targets = args.child
        print(json.dumps(child(mode, url, int(targets), args.cycles)))
        return 0

    from tailguard.serving.lab.promstack import PrometheusServer, PromStackError, backfill_openmetrics

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tailguard-bench-") as work:
        data = Path(work) / "data"
        for targets in args.targets:
            text, samples = history(targets)
            backfill_openmetrics(text, data, expected_samples=samples)
        try:
            server = PrometheusServer(data_dir=data, workdir=Path(work) / "run").start()
        except PromStackError as failed:
            print(f"bench: {failed}", file=sys.stderr)
            return 2
        with server:
            for targets in args.targets:
                measured = {}
                for mode in ("batched", "per-target"):
                    done = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--cycles",
                            str(args.cycles),
                            "--child",
                            mode,
                            server.url,
                            str(targets),
                        ],
                        capture_output=True,
                        text=True,
                        check=True,
                        timeout=600,
                    )
                    measured[mode] = json.loads(done.stdout)
                batched, naive = measured["batched"], measured["per-target"]
                if batched["values"] != targets or naive["values"] != targets:
                    print(
                        f"bench: expected {targets} values, got {batched['values']} / {naive['values']}",
                        file=sys.stderr,
                    )
                    return 1
                rows.append(
                    {
                        "targets": targets,
                        "batched": batched,
                        "per_target": naive,
                        "ratio": {
                            key: (naive[key] / batched[key] if batched[key] else None)
                            for key in ("requests_per_cycle", "wall_s", "cpu_s", "peak_rss_mib")
                        },
                    }
                )
    print(
        f"{'targets':>7} | {'requests b/p':>13} | {'wall s b/p':>17} | {'cpu s b/p':>17} | "
        f"{'peak RSS MiB b/p':>17} | {'wall x':>7} | {'cpu x':>7}"
    )
    for row in rows:
        b, p, r = row["batched"], row["per_target"], row["ratio"]
        print(
            f"{row['targets']:>7} | {b['requests_per_cycle']:>5} / {p['requests_per_cycle']:>5} | "
            f"{b['wall_s']:>7.4f} / {p['wall_s']:>7.4f} | {b['cpu_s']:>7.4f} / {p['cpu_s']:>7.4f} | "
            f"{b['peak_rss_mib']:>7.1f} / {p['peak_rss_mib']:>7.1f} | {r['wall_s']:>7.1f} | {r['cpu_s']:>7.1f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
