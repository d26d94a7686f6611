"""Benchmark: 20,000 targets over 4 sharded replica processes against a real Prometheus (backfilled data).

The targets are split into --policies policies (each matching its own `part` label: a big fleet is cut into
policies by a label, docs/deploy.md "Sharding"), four signals each (P99 from vLLM's histogram buckets, a queue
gauge, an error ratio, an HBM ratio). --replicas worker processes each run the sharded Lease election
(controller/adapters/lease/shards.py, `shards` = replicas) against the fake Kubernetes API in this process;
once every shard has its own holder, each worker evaluates the policies of the shards it holds (concurrently,
as the scheduler's threads do), medians of --repeats cycles:

  alone      one replica's cycle while the others wait (one replica per node, as deployed)
  together   all replicas' cycles at the same moment (all on this machine's cores)
  one proc   the same policies in one process without sharding (all targets, one cycle): the baseline

and the extrapolation to --extrapolate targets (default 50,000): a replica's cycle grows with its targets, so
at 50,000 over the same replica count each cycle is (50,000 / 20,000) x the slowest measured one, and the
replicas needed for a cycle <= 2 s follow from the slowest replica's time per target. Figures only.

    python tests/bench/bench_sharding.py [--targets 20000] [--replicas 4] [--policies 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.sharding import shard_of
from tailguard.controller.core.signals import query_signals
from tailguard.controller.kit.clock import SystemClock
from tailguard.controller.kit.gc_tuning import tune_for_long_running
from tailguard.controller.loop.evaluation import EvaluationPorts, UnconfiguredPredictions, evaluate
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.testing import FakeDispatcher
from tests.support.openmetrics import VLLM_E2E, VLLM_E2E_BUCKETS, OpenMetricsWriter, latency_histogram_points

T0 = 1_700_000_000.0
STEP = 15.0
POINTS = 6  # 75 s of 15 s scrapes: five points in the rate(...[1m]) window at AT, a third fewer samples to backfill
AT = T0 + (POINTS - 1) * STEP
NAMESPACE = "benchshard"
LEASE_NAMESPACE = "tailguard"
LEASE_BASE = "bench-leader"
SIGNALS = {
    "p99": "histogram_quantile(0.99, sum by (le, {{ by }}) "
    "(rate(vllm:e2e_request_latency_seconds_bucket{ {{ selector }} }[1m])))",
    "queue": "max by ({{ by }}) (vllm:num_requests_waiting{ {{ selector }} })",
    "errors": "max by ({{ by }}) (bench_error_ratio{ {{ selector }} })",
    "hbm": "max by ({{ by }}) (bench_hbm_ratio{ {{ selector }} })",
}
THRESHOLDS = {"p99": 5.0, "queue": 1000.0, "errors": 0.5, "hbm": 0.99}  # healthy targets: nothing fires
CYCLE_TARGET_SECONDS = 2.0


def policy_names(count: int, shards: int) -> list[str]:
    """`count` policy names spread evenly over the shards (count/shards each): rendezvous hashing balances many
    policies statistically; a benchmark with a few picks names that land evenly, so each replica gets its share."""
    per_shard = math.ceil(count / shards)
    names: list[str] = []
    taken = [0] * shards
    candidate = 0
    while len(names) < count:
        name = f"part-{candidate:03d}"
        candidate += 1
        index = shard_of(name, shards)
        if taken[index] < per_shard:
            taken[index] += 1
            names.append(name)
    return names


def policy(name: str) -> Policy:
    return Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": name,
            "targets": {"groupBy": ["service"], "match": {"namespace": NAMESPACE, "part": name}},
            "signals": [{"name": signal, "query": query} for signal, query in SIGNALS.items()],
            "conditions": [
                {
                    "name": f"{signal}-high",
                    "signal": signal,
                    "when": {"op": ">", "value": THRESHOLDS[signal]},
                    "for": 3,
                    "noData": "hold",
                    "actions": [{"type": "annotate", "text": "{{ value }}"}],
                }
                for signal in SIGNALS
            ],
        }
    )


def history(targets: int, names: list[str]) -> tuple[str, int]:
    writer = OpenMetricsWriter()
    times = [T0 + i * STEP for i in range(POINTS)]
    for index in range(targets):
        labels = {"namespace": NAMESPACE, "part": names[index % len(names)], "service": f"svc-{index:05d}"}
        latency = 0.2 + (index % 10) * 0.05

        def constant(timestamp: float, value: float = latency) -> float:
            return value

        writer.histogram(VLLM_E2E, labels, VLLM_E2E_BUCKETS, latency_histogram_points(times, lambda t: 50.0, constant))
        writer.gauge("vllm:num_requests_waiting", labels, [(t, float(index % 7)) for t in times])
        writer.gauge("bench_error_ratio", labels, [(t, 0.001 * (index % 5)) for t in times])
        writer.gauge("bench_hbm_ratio", labels, [(t, 0.5 + 0.01 * (index % 30)) for t in times])
    return writer.render(), writer.sample_count


class Evaluator:
    """The cycles of some policies in this process: each policy's evaluate() (its 4 queries, the engine, the
    SQLite journal commit), all policies concurrently as the scheduler's threads run them."""

    def __init__(self, url: str, names: list[str], journal_path: Path) -> None:
        self.policies = [policy(name) for name in names]
        self.source = PrometheusSource(PrometheusSettings(url=url, timeout=120), SystemClock())
        self.journal = Journal(journal_path)
        self.ports = EvaluationPorts(
            source=self.source,
            journal=self.journal,
            dispatcher=FakeDispatcher(),
            clock=SystemClock(),
            metrics=ControllerMetrics(CollectorRegistry()),
            predictions=UnconfiguredPredictions(),
            query_signals=lambda src, pol, _at: query_signals(src, pol, AT),  # the backfilled instant
        )
        self.states = {p.name: PolicyState() for p in self.policies}
        self.tick = 0
        self.pool = ThreadPoolExecutor(max_workers=max(1, len(self.policies)))
        self.cycle()  # warm: every target has state
        self.targets = sum(len(state.conditions) for state in self.states.values()) // len(SIGNALS)
        if self.targets * len(SIGNALS) != sum(len(state.conditions) for state in self.states.values()):
            raise SystemExit("bench: the policies' targets do not all have state after the warm cycle")

    def cycle(self) -> float:
        self.tick += 1
        started = time.perf_counter()

        def one(the_policy: Policy) -> None:
            self.states[the_policy.name] = evaluate(
                the_policy, self.states[the_policy.name], AT + self.tick, self.ports
            ).state

        list(self.pool.map(one, self.policies))
        return time.perf_counter() - started

    def close(self) -> None:
        self.pool.shutdown()
        self.source.close()
        self.journal.close()


def worker(args: argparse.Namespace) -> int:
    """One replica: hold shards through the Leases, then answer `go` with its cycle times (JSON lines)."""
    from kubernetes import client as k8s

    from tailguard.controller.adapters.lease.shards import ShardedElector

    configuration = k8s.Configuration()
    configuration.host = args.kube
    configuration.retries = 0
    names: list[str] = json.loads(args.names)
    elector = ShardedElector(
        k8s.CoordinationV1Api(k8s.ApiClient(configuration)),
        LEASE_BASE,
        LEASE_NAMESPACE,
        args.identity,
        args.shards,
        args.lease,
        SystemClock(),
    )
    elector.run_once()
    elector.start(args.lease / 5)
    evaluator: Evaluator | None = None
    try:
        for line in sys.stdin:
            command = line.strip()
            if command == "quit":
                break
            if command != "go":
                continue
            if evaluator is None:
                owned = [name for name in names if elector.leads(name)]
                evaluator = Evaluator(args.prometheus, owned, Path(args.work) / f"{args.identity}.db")
            cycles = [evaluator.cycle() for _ in range(args.repeats)]
            print(json.dumps({
                "identity": args.identity,
                "shards": elector.held_shards(),
                "policies": len(evaluator.policies),
                "targets": evaluator.targets,
                "cycle_s": statistics.median(cycles),
                "still_leading": all(elector.leads(p.name) for p in evaluator.policies),
            }), flush=True)  # fmt: skip
    finally:
        if evaluator is not None:
            evaluator.close()
        elector.stop()
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--targets", type=int, default=20_000)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--policies", type=int, default=8, help="the targets split evenly into this many policies")
    parser.add_argument("--repeats", type=int, default=3, help="cycles per measurement; medians are reported")
    parser.add_argument("--extrapolate", type=int, default=50_000)
    parser.add_argument("--no-baseline", action="store_true", help="skip the one-process cycle over all targets")
    parser.add_argument(
        "--lease",
        type=float,
        default=30.0,
        help="leaseDuration of the shard Leases (s): long, so that replicas busy "
        "evaluating on a loaded machine keep their shards while they are measured",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--identity", "--prometheus", "--kube", "--names", "--work"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--shards", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds): that it runs, figures meaningless")
    args = parser.parse_args(argv)
    if args.smoke:
        args.targets, args.replicas, args.policies, args.repeats, args.extrapolate = 40, 2, 2, 1, 80
    logging.disable(logging.INFO)  # the evaluation's log line is formatted, not printed
    tune_for_long_running()  # as `tailguard run` does (controller/kit/gc_tuning.py)
    if args.worker:
        return worker(args)

    from tailguard.serving.lab.promstack import PrometheusServer, PromStackError, backfill_openmetrics
    from tests.support.fake_kubernetes import FakeKubernetes

    names = policy_names(args.policies, args.replicas)
    with tempfile.TemporaryDirectory(prefix="tailguard-bench-sharding-") as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        text, samples = history(args.targets, names)
        backfill_openmetrics(text, work / "data", expected_samples=samples, timeout=1800)
        del text
        print(f"backfilled {args.targets:,} targets ({samples:,} samples) in {time.perf_counter() - started:.1f} s",
              flush=True)  # fmt: skip
        try:
            server = PrometheusServer(data_dir=work / "data", workdir=work / "run").start()
        except PromStackError as failed:
            print(f"bench: {failed}", file=sys.stderr)
            return 2
        with server, FakeKubernetes() as kube:
            rows, baseline = run_replicas(args, names, server.url, kube, work)
    report(args, names, rows, baseline)
    return 0


def run_replicas(
    args: argparse.Namespace, names: list[str], url: str, kube: Any, work: Path
) -> tuple[list[dict[str, Any]], float | None]:
    from tailguard.controller.adapters.lease.shards import shard_lease_name

    def holders() -> list[str]:
        found = [
            kube.get_object("leases", LEASE_NAMESPACE, shard_lease_name(LEASE_BASE, i)) for i in range(args.replicas)
        ]
        return [str((lease or {}).get("spec", {}).get("holderIdentity") or "") for lease in found]

    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--prometheus", url, "--kube", kube.url,
               "--names", json.dumps(names), "--work", str(work), "--shards", str(args.replicas),
               "--repeats", str(args.repeats), "--lease", str(args.lease)]  # fmt: skip
    workers = [
        subprocess.Popen(
            [*command, "--identity", f"replica-{n}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for n in range(args.replicas)
    ]
    try:
        deadline = time.monotonic() + 120
        while len(set(holders()) - {""}) != args.replicas:
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: the shards never spread over the replicas: {holders()}")
            time.sleep(0.2)
        print(f"shard holders: {holders()}", flush=True)

        def ask(process: subprocess.Popen[str]) -> None:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()

        def answer(process: subprocess.Popen[str]) -> dict[str, Any]:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line:
                raise SystemExit(f"bench: a worker exited ({process.wait()})")
            result: dict[str, Any] = json.loads(line)
            return result

        rows: list[dict[str, Any]] = []
        for process in workers:  # alone: one replica at a time (also builds and warms each worker's state)
            ask(process)
            rows.append(answer(process))
        for process in workers:  # a second time alone, now warm
            ask(process)
            rows[workers.index(process)] = answer(process)
        for process in workers:  # together
            ask(process)
        for index, process in enumerate(workers):
            rows[index]["together_s"] = answer(process)["cycle_s"]
    finally:
        for process in workers:
            if process.poll() is None and process.stdin is not None:
                process.stdin.write("quit\n")
                process.stdin.close()
        for process in workers:
            process.wait(timeout=60)
    baseline = None
    if not args.no_baseline:
        evaluator = Evaluator(url, names, work / "baseline.db")
        baseline = statistics.median(evaluator.cycle() for _ in range(args.repeats))
        evaluator.close()
    return rows, baseline


def report(args: argparse.Namespace, names: list[str], rows: list[dict[str, Any]], baseline: float | None) -> None:
    print(f"\n{args.targets:,} targets in {len(names)} policies, {args.replicas} shards over {args.replicas} replica "
          f"processes (medians of {args.repeats} cycles; 4 signals per policy)")  # fmt: skip
    print(f"{'replica':>10} | {'shards':>6} | {'policies':>8} | {'targets':>7} | {'alone s':>8} | {'together s':>10}")
    for row in rows:
        print(f"{row['identity']:>10} | {','.join(map(str, row['shards'])):>6} | {row['policies']:>8} | "
              f"{row['targets']:>7,} | {row['cycle_s']:>8.3f} | {row['together_s']:>10.3f}"
              + ("" if row["still_leading"] else "  (lost a shard while measuring)"))  # fmt: skip
    measured = [row for row in rows if row["targets"]] or rows
    slowest = max(measured, key=lambda row: row["cycle_s"])
    if baseline is not None:
        print(f"one process, all {args.targets:,} targets (no sharding): {baseline:.3f} s "
              f"({baseline / slowest['cycle_s']:.2f}x the slowest replica alone)")  # fmt: skip
    per_target = slowest["cycle_s"] / max(1, slowest["targets"])
    scaled = slowest["cycle_s"] * args.extrapolate / args.targets
    needed = math.ceil(args.extrapolate * per_target / CYCLE_TARGET_SECONDS)
    print(f"extrapolated to {args.extrapolate:,} targets over {args.replicas} replicas "
          f"({args.extrapolate // args.replicas:,} each): slowest replica cycle ~{scaled:.2f} s "
          f"(target <= {CYCLE_TARGET_SECONDS:g} s); replicas needed for <= {CYCLE_TARGET_SECONDS:g} s at "
          f"{per_target * 1e6:.0f} us/target: {needed}")  # fmt: skip
    replicas = max(needed, args.replicas)
    each = math.ceil(args.extrapolate / replicas)
    print(f"extrapolated to {args.extrapolate:,} targets over {replicas} replicas "
          f"({each:,} each): each cycle ~{per_target * each:.2f} s "
          f"(the queries' backend must serve {replicas} replicas at once: docs/deploy.md, \"Prometheus-compatible "
          f"backends at scale\")")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
