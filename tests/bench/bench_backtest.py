"""Benchmark: `tailguard backtest` over 7 days x 100 targets vs the bare range queries it needs, on a real Prometheus.

Four signals per target, as in bench_cycle.py (P99 from vLLM's histogram buckets, a queue gauge, an error ratio,
an HBM ratio), backfilled with promtool for --days days at a --scrape interval (5 min by default: 7 days of 15 s
scrapes of 27 series x 100 targets would be 1.1e8 samples, too many to backfill in a bench), with a few breach
episodes (three targets' P99 above the threshold for 30 minutes on alternate days). The policy evaluates every
--step (60 s by default: 10,080 evaluations over 7 days; at 15 s Prometheus alone needs over 10 minutes for the
range queries on the shared 2-core machine, so use --step 15 where there is time). Side by side in one run:
  backtest   `tailguard backtest --prometheus URL --rules POLICY --start --end` as a child process
             (its wall time, start-up included; its own peak RSS from wait4)
  start-up   the command's imports alone (a child that only imports it), to tell the replay from the interpreter
  bare       the same range requests the backtest sends (one per signal per chunk of the grid), as plain GETs one
             after another, the body decoded with orjson (the fastest decoder: the strictest floor)
with the ratios backtest / bare. Figures only, nothing asserted.

    python tests/bench/bench_backtest.py [--days 7] [--targets 100] [--scrape 300] [--step 60] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import requests

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tailguard.controller.core.policy import Policy
from tailguard.controller.core.signals import range_chunks, render_signal_queries
from tailguard.controller.kit.durations import format_duration
from tailguard.controller.tools.backtest_feed import CHUNK_POINTS
from tests.support.openmetrics import VLLM_E2E, VLLM_E2E_BUCKETS, format_le

T0 = 1_700_000_000.0
NAMESPACE = "backtest"
THRESHOLDS = {"p99": 5.0, "queue": 1000.0, "errors": 0.5, "hbm": 0.99}
BAD_TARGETS = 3  # targets with breach episodes
EPISODE = 1800.0  # seconds of high latency, every other day at 10:00


def policy_document(scrape: float, step: float) -> dict[str, Any]:
    window = format_duration(2 * scrape)  # two scrapes at least: rate() needs two samples
    signals = {
        "p99": "histogram_quantile(0.99, sum by (le, {{ by }}) "
        f"(rate(vllm:e2e_request_latency_seconds_bucket{{ {{{{ selector }}}} }}[{window}])))",
        "queue": "max by ({{ by }}) (vllm:num_requests_waiting{ {{ selector }} })",
        "errors": "max by ({{ by }}) (bench_error_ratio{ {{ selector }} })",
        "hbm": "max by ({{ by }}) (bench_hbm_ratio{ {{ selector }} })",
    }
    return {
        "apiVersion": "tailguard.io/v1alpha1",
        "kind": "Policy",
        "name": "backtest-bench",
        "interval": format_duration(step),
        "targets": {"groupBy": ["service"], "match": {"namespace": NAMESPACE}},
        "signals": [{"name": name, "query": query} for name, query in signals.items()],
        "conditions": [
            {
                "name": f"{name}-high",
                "signal": name,
                "when": {"op": ">", "value": THRESHOLDS[name]},
                "for": 3,
                "noData": "hold",
                "actions": [{"type": "annotate", "text": "{{ value }}"}],
            }
            for name in signals
        ],
    }


def _in_episode(index: int, at: float) -> bool:
    if index >= BAD_TARGETS:
        return False
    day, second = divmod(at - T0, 86_400.0)
    return int(day) % 2 == 1 and 36_000.0 <= second < 36_000.0 + EPISODE


def write_history(path: Path, targets: int, days: int, scrape: float) -> int:
    """OpenMetrics text straight to `path` (families contiguous, series ascending in time); the sample count."""
    times = [T0 + i * scrape for i in range(int(days * 86_400 / scrape) + 1)]
    stamps = [f"{t:.0f}" for t in times]
    bounds = [format_le(b) for b in VLLM_E2E_BUCKETS]
    samples = 0
    with path.open("w", encoding="utf-8") as out:
        out.write(f"# TYPE {VLLM_E2E} histogram\n")
        for index in range(targets):
            labels = f'namespace="{NAMESPACE}",service="svc-{index:05d}"'
            latency = 0.2 + (index % 10) * 0.05
            counts = [0.0] * len(bounds)
            total = 0.0
            total_sum = 0.0
            lines: list[str] = []
            for at, stamp in zip(times, stamps, strict=True):
                seconds = 6.0 if _in_episode(index, at) else latency
                requests_per_scrape = 50.0
                for b, bound in enumerate(VLLM_E2E_BUCKETS):
                    if seconds <= bound:
                        counts[b] += requests_per_scrape
                total += requests_per_scrape
                total_sum += requests_per_scrape * seconds
                for b, le in enumerate(bounds):
                    lines.append(f'{VLLM_E2E}_bucket{{{labels},le="{le}"}} {counts[b]!r} {stamp}')
                lines.append(f'{VLLM_E2E}_bucket{{{labels},le="+Inf"}} {total!r} {stamp}')
                lines.append(f"{VLLM_E2E}_count{{{labels}}} {total!r} {stamp}")
                lines.append(f"{VLLM_E2E}_sum{{{labels}}} {total_sum!r} {stamp}")
            out.write("\n".join(lines) + "\n")
            samples += len(lines)
        for family, value in (
            ("vllm:num_requests_waiting", lambda i: float(i % 7)),
            ("bench_error_ratio", lambda i: 0.001 * (i % 5)),
            ("bench_hbm_ratio", lambda i: 0.5 + 0.01 * (i % 30)),
        ):
            out.write(f"# TYPE {family} gauge\n")
            for index in range(targets):
                labels = f'namespace="{NAMESPACE}",service="svc-{index:05d}"'
                text = repr(value(index))
                out.write("".join(f"{family}{{{labels}}} {text} {stamp}\n" for stamp in stamps))
                samples += len(stamps)
        out.write("# EOF\n")
    return samples


def bare(url: str, requests_needed: list[dict[str, str]]) -> tuple[float, int]:
    """The backtest's range requests as plain GETs, one after another: (wall, samples answered)."""
    samples = 0
    started = time.perf_counter()
    with requests.Session() as session:
        for params in requests_needed:
            response = session.get(f"{url}/api/v1/query_range", params=params, timeout=600)
            body = orjson.loads(response.content)
            samples += sum(len(series["values"]) for series in body["data"]["result"])
    return time.perf_counter() - started, samples


def run_backtest(url: str, rules: Path, start: float, end: float, report: Path) -> tuple[float, float, int]:
    """The CLI as a child process: (wall seconds, its peak RSS in MiB, exit code)."""
    started = time.perf_counter()
    with report.open("wb") as out:
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from tailguard.controller.cli import main; sys.exit(main(sys.argv[1:]))",
                "backtest",
                "--prometheus",
                url,
                "--rules",
                str(rules),
                "--start",
                f"{start:.0f}",
                "--end",
                f"{end:.0f}",
                "--timeout",
                "600",
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.PIPE,
        )
        _pid, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    if code != 0 and child.stderr is not None:
        print(child.stderr.read().decode(errors="replace")[-2000:], file=sys.stderr)
    return wall, usage.ru_maxrss / 1024.0, code


def startup() -> float:
    """Wall seconds of the command's start-up alone (its imports), to tell the replay from the interpreter."""
    started = time.perf_counter()
    command = "import tailguard.controller.cli, tailguard.controller.app.cli, tailguard.controller.tools.backtest"
    subprocess.run([sys.executable, "-c", command], cwd=ROOT, check=True)
    return time.perf_counter() - started


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--targets", type=int, default=100)
    parser.add_argument("--scrape", type=float, default=300.0, help="seconds between backfilled samples")
    parser.add_argument("--step", type=float, default=60.0, help="the policy's interval (seconds)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each side; medians are reported")
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds): that it runs, figures meaningless")
    args = parser.parse_args(argv)
    if args.smoke:
        args.days, args.targets, args.scrape, args.step, args.repeats = 1, 3, 300.0, 300.0, 1
    # A SIGTERM (e.g. from `timeout`) unwinds like an exception, so the Prometheus this started is stopped.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))

    from tailguard.serving.lab.promstack import PrometheusServer, PromStackError, backfill_openmetrics

    document = policy_document(args.scrape, args.step)
    policy = Policy.model_validate(document)
    start, end = T0 + 2 * args.scrape, T0 + args.days * 86_400.0
    needed = [
        {
            "query": query,
            "start": f"{chunk_start:.3f}",
            "end": f"{chunk_end:.3f}",
            "step": format_duration(args.step),
        }
        for query in render_signal_queries(policy).values()
        for chunk_start, chunk_end in range_chunks(start, end, args.step, CHUNK_POINTS)
    ]
    with tempfile.TemporaryDirectory(prefix="tailguard-bench-backtest-") as tmp:
        work = Path(tmp)
        rules = work / "policy.yaml"
        rules.write_text(json.dumps(document), encoding="utf-8")  # JSON is YAML
        started = time.perf_counter()
        history = work / "history.om"
        samples = write_history(history, args.targets, args.days, args.scrape)
        backfill_openmetrics(history, work / "data", expected_samples=samples, timeout=900)
        history.unlink()
        print(
            f"backfilled {samples:,} samples ({args.targets} targets x {args.days} days, one per "
            f"{args.scrape:g} s) in {time.perf_counter() - started:.1f} s",
            flush=True,
        )
        try:
            server = PrometheusServer(
                data_dir=work / "data", workdir=work / "run", extra_args=["--query.timeout=10m"]
            ).start()
        except PromStackError as failed:
            print(f"bench: {failed}", file=sys.stderr)
            return 2
        walls: list[float] = []
        rss: list[float] = []
        bare_walls: list[float] = []
        starts: list[float] = []
        answered = 0
        with server:
            for _ in range(args.repeats):
                seconds, answered = bare(server.url, needed)
                bare_walls.append(seconds)
                wall, peak, code = run_backtest(server.url, rules, start, end, work / "report.json")
                if code != 0:
                    print(f"bench: the backtest exited {code}", file=sys.stderr)
                    return 2
                walls.append(wall)
                rss.append(peak)
                starts.append(startup())
        report = json.loads((work / "report.json").read_text(encoding="utf-8"))
    wall, peak = statistics.median(walls), max(rss)
    floor = statistics.median(bare_walls)
    print(
        f"backtest {args.days} days x {args.targets} targets, 4 signals, step {args.step:g} s: "
        f"{report['evaluations']:,} "
        f"evaluations, {len(report['decisions'])} incidents; {len(needed)} range requests, {answered:,} samples"
    )
    begin = statistics.median(starts)
    print(
        f"{'backtest s':>10} | {'start-up s':>10} | {'bare s':>8} | {'backtest/bare':>13} | "
        f"{'(backtest - start-up)/bare':>26} | backtest peak RSS"
    )
    print(
        f"{wall:>10.2f} | {begin:>10.2f} | {floor:>8.2f} | {wall / floor:>13.2f} | {(wall - begin) / floor:>26.2f} | "
        f"{peak:.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
