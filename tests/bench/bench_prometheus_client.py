"""Benchmark: prometheus-api-client's own query methods vs tailguard's PrometheusSource, on a real Prometheus.

Why the hot path (the live cycle's instant queries, the backtest's range answers) sends its requests through the
library's session but not through its query methods (docs/architecture.md, "HTTP libraries"): side by side in one
run, medians of --repeats, the same request each way:
  instant   `max by (service) (bench_gauge{...})` over --instant-targets targets
              library   PrometheusConnect.custom_query (json-decoded list of dicts), and then converted by
                        tailguard's vector_result (what the cycle needs)
              tailguard PrometheusSource.instant (orjson, straight to {target: value})
  range     the same over --range-targets targets, --days days at a 60 s step (one backtest chunk: 2,880 points a
            series, the answer size of the week-long backtest's)
              library   PrometheusConnect.custom_query_range (json-decoded list of dicts), and then put on
                        the grid by tailguard's matrix_grid (what the backtest needs)
              tailguard PrometheusSource.range_grid (orjson + numpy: the backtest's grid)
and the ratios (library + conversion) / tailguard. Where the library fits (no per-cycle budget: metric-name
discovery, metadata) tailguard uses it (serving/lab/recording.recorded_names). Figures only, nothing asserted.

    python tests/bench/bench_prometheus_client.py [--instant-targets 5000] [--range-targets 100] [--repeats 5]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from prometheus_api_client import PrometheusConnect

from tailguard.controller.adapters.metrics.prometheus import (
    PrometheusSettings,
    PrometheusSource,
    matrix_grid,
    vector_result,
)
from tailguard.controller.kit.clock import SystemClock
from tests.support.openmetrics import OpenMetricsWriter

T0 = 1_700_000_000.0
SCRAPE = 300.0
STEP = 60.0


def history(instant_targets: int, range_targets: int, days: int) -> tuple[str, int, float]:
    """bench_gauge per target: every SCRAPE over `days` for the first `range_targets`, the last 3 scrapes for the
    rest (an instant query needs no more); the end instant."""
    writer = OpenMetricsWriter()
    end = T0 + days * 86_400.0
    full = [T0 + i * SCRAPE for i in range(int(days * 86_400 / SCRAPE) + 1)]
    for index in range(max(instant_targets, range_targets)):
        times = full if index < range_targets else full[-3:]
        labels = {"namespace": "bench", "service": f"svc-{index:05d}", "tier": "range" if index < range_targets else ""}
        writer.gauge("bench_gauge", labels, [(t, (index % 97) / 10 + (t - T0) / 86_400) for t in times])
    return writer.render(), writer.sample_count, end


def timed(call: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    walls = []
    result = None
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        walls.append(time.perf_counter() - started)
    return statistics.median(walls), result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--instant-targets", type=int, default=5000)
    parser.add_argument("--range-targets", type=int, default=100)
    parser.add_argument("--days", type=int, default=2, help="the range query's span (2 days at 60 s: 2,880 points)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds): that it runs, figures meaningless")
    args = parser.parse_args(argv)
    if args.smoke:
        args.instant_targets, args.range_targets, args.days, args.repeats = 20, 5, 1, 1
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))

    from tailguard.serving.lab.promstack import PrometheusServer, PromStackError, backfill_openmetrics

    with tempfile.TemporaryDirectory(prefix="tailguard-bench-promclient-") as tmp:
        work = Path(tmp)
        text, samples, end = history(args.instant_targets, args.range_targets, args.days)
        backfill_openmetrics(text, work / "data", expected_samples=samples, timeout=900)
        del text
        try:
            server = PrometheusServer(data_dir=work / "data", workdir=work / "run").start()
        except PromStackError as failed:
            print(f"bench: {failed}", file=sys.stderr)
            return 2
        with server:
            library = PrometheusConnect(url=server.url)
            source = PrometheusSource(PrometheusSettings(url=server.url, timeout=300), SystemClock())
            instant = 'max by (service) (bench_gauge{namespace="bench"})'
            ranged = 'max by (service) (bench_gauge{namespace="bench",tier="range"})'
            start = end - (min(2_880, int(args.days * 86_400 / STEP)) - 1) * STEP
            times = [start + k * STEP for k in range(int((end - start) / STEP) + 1)]
            rows = []
            lib_s, lib_answer = timed(lambda: library.custom_query(instant, params={"time": end}), args.repeats)
            conv_s, _ = timed(
                lambda: vector_result(library.custom_query(instant, params={"time": end}), ["service"]), args.repeats
            )
            own_s, own_answer = timed(lambda: source.instant(instant, ["service"], end), args.repeats)
            if len(lib_answer) != len(own_answer.values) or own_answer.error:
                raise SystemExit(f"bench: instant answers differ: {len(lib_answer)} vs {own_answer}")
            rows.append(("instant", f"{args.instant_targets:,} series", lib_s, conv_s, own_s))

            def library_range() -> Any:
                return library.custom_query_range(
                    ranged, start_time=_datetime(start), end_time=_datetime(end), step=f"{STEP:.0f}"
                )

            lib_s, lib_answer = timed(library_range, args.repeats)
            conv_s, _ = timed(lambda: matrix_grid(library_range(), ["service"], times, STEP), args.repeats)
            own_s, own_grid = timed(lambda: source.range_grid(ranged, ["service"], times, STEP), args.repeats)
            points = sum(len(series["values"]) for series in lib_answer)
            if own_grid.error or len(own_grid.targets) != len(lib_answer):
                raise SystemExit(f"bench: range answers differ: {len(lib_answer)} vs {own_grid.error}")
            shape = f"{len(lib_answer):,} x {points // max(1, len(lib_answer)):,} points"
            rows.append(("range", shape, lib_s, conv_s, own_s))
            source.close()
            library.close()
    print(f"medians of {args.repeats}; the same request each way, answers checked equal in size")
    print("library: its method's answer (json-decoded dicts); + conversion: then tailguard's own conversion of it")
    print("(vector_result / matrix_grid: what the cycle and the backtest need); tailguard: PrometheusSource")
    print(
        f"{'query':<8} | {'answer':>22} | {'library s':>9} | {'+ conversion s':>14} | {'tailguard s':>11} | "
        f"{'library+conv / tailguard':>24}"
    )
    for kind, answer, lib_s, conv_s, own_s in rows:
        print(f"{kind:<8} | {answer:>22} | {lib_s:>9.4f} | {conv_s:>14.4f} | {own_s:>11.4f} | {conv_s / own_s:>24.2f}")
    return 0


def _datetime(timestamp: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(timestamp, tz=UTC)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
