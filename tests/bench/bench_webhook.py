"""Webhook throughput of the controller's API (issue 16, item 4): Alertmanager payloads posted on loopback with
keep-alive, as fast as the server answers, the old hand-written http.server next to the new aiohttp server.

The server runs in a child process (the load generator is not sharing its interpreter): a real Controller (fake
source and dispatcher, a journal in a temporary directory, no schedule) behind `ControllerAPI`; each accepted post
triggers the policy's evaluation (coalesced while one is queued), as in production. The load generator (aiohttp
client, `--connections` kept-alive connections) posts the fixture tests/fixtures/alertmanager/firing.json, its
alert repeated `--alerts-per-post` times with distinct instances, for `--seconds` per round, two rounds.

Printed per server and payload size: alerts/s overall and the lowest 1-second window after the first (held),
p50/p99 latency, and the server's RSS before the load, after round 1 and after round 2 (bounded memory: round 2
adds nothing). "old" is controller/app/api.py as of fe59cca~1 (stdlib ThreadingHTTPServer), read with `git show`
into a temporary module; without git only "new" runs. Target: >= 1,000 alerts/s held. Printed, not asserted.

    python tests/bench/bench_webhook.py [--seconds 5] [--connections 16] [--alerts-per-post 1,10] [--json out.json]

Through a real Alertmanager (issue 24 item 7), `--alertmanager 1000[,2000]`: that many alert groups flushed at once
(tests/support/alert_storm.py) into the API as of 7710821 and the current one, side by side, each with
`--max-connections` (default: the API's 1,000). Printed per server and storm: groups delivered, notification
attempts and failed attempts (retried by Alertmanager), resets (RST), closed kept-alive connections, tracebacks in
the controller's log, and the seconds until the last delivery.

    python tests/bench/bench_webhook.py --alertmanager 1000,2000 [--max-connections 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "alertmanager" / "firing.json"
OLD_REVISION = "fe59cca~1"  # the last commit with the stdlib http.server API
STORM_REVISION = "7710821"  # before issue 24: connections past the cap were reset
POLICY = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: checkout-p99
targets:
  groupBy: [service]
  match: {service: checkout}
signals:
  - name: p99
    query: max by ({{ by }}) (lat{ {{ selector }} })
conditions:
  - name: p99-high
    signal: p99
    when: {op: ">", value: 0.8}
    for: 3
    noData: hold
    actions:
      - type: annotate
        text: "p99 {{ value }}"
"""


# ----- the server (child process) ---------------------------------------------------------------------------


def old_api_class(scratch: Path, revision: str = OLD_REVISION) -> Any:
    """ControllerAPI of the stdlib server (or of `revision`), or None when git cannot show it."""
    try:
        source = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{revision}:controller/app/api.py"],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    if revision == OLD_REVISION and "ThreadingHTTPServer" not in source:
        return None
    path = scratch / "tailguard_old_api.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("tailguard_old_api", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the payload models' annotations through it
    try:
        spec.loader.exec_module(module)
    except ImportError:
        # The old file imports today's modules by name; once a name it needs moved (issue 26 split the ports and
        # renamed the packages), it no longer loads: then only the new server is measured, and the run says so.
        del sys.modules[spec.name]
        return None
    return module.ControllerAPI


def serve(kind: str, max_connections: int | None = None) -> None:
    sys.path.insert(0, str(REPO))
    import logging

    from prometheus_client import CollectorRegistry

    from tailguard.controller.adapters.stores.journal import Journal
    from tailguard.controller.app.api import ControllerAPI
    from tailguard.controller.core.model import SignalResult, target_key
    from tailguard.controller.kit.clock import ManualClock
    from tailguard.controller.loop.metrics import ControllerMetrics
    from tailguard.controller.loop.runtime import Controller
    from tailguard.controller.testing import FakeDispatcher, FakeSource

    logging.basicConfig(level=logging.WARNING)  # the per-post info line is not what is measured
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        api_class = (
            ControllerAPI
            if kind == "new"
            else old_api_class(scratch, STORM_REVISION if kind == STORM_REVISION else OLD_REVISION)
        )
        rules = scratch / "rules"
        rules.mkdir()
        (rules / "checkout.yaml").write_text(POLICY, encoding="utf-8")
        controller = Controller(
            policy_paths=[rules],
            source=FakeSource(default=SignalResult({target_key({"service": "checkout"}): 0.95})),
            journal=Journal(scratch / "journal.db"),
            dispatcher=FakeDispatcher(),
            clock=ManualClock(),
            metrics=ControllerMetrics(CollectorRegistry()),
            schedule=False,
        )
        limits = {"max_connections": max_connections} if max_connections is not None else {}
        api = api_class(controller, "127.0.0.1", 0, **limits)
        api.start()
        controller.start()
        print(api.port, flush=True)
        sys.stdin.read()  # until the parent closes our stdin
        api.stop()
        controller.stop()


# ----- the load generator (parent) --------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def payload(alerts: int) -> bytes:
    body = json.loads(FIXTURE.read_text())
    (alert,) = body["alerts"]
    body["alerts"] = []
    for n in range(alerts):
        one = copy.deepcopy(alert)
        one["labels"]["instance"] = f"10.0.{n // 250}.{n % 250}:8000"
        one["fingerprint"] = f"{n:016x}"
        body["alerts"].append(one)
    return json.dumps(body).encode()


async def load(url: str, body: bytes, connections: int, seconds: float) -> tuple[list[float], list[int], int]:
    import aiohttp

    latencies: list[float] = []
    per_second: dict[int, int] = {}
    failures = 0
    started = time.perf_counter()
    end = started + seconds
    connector = aiohttp.TCPConnector(limit=connections, force_close=False)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal failures
            while (now := time.perf_counter()) < end:
                async with session.post(url, data=body, headers=headers) as answer:
                    await answer.read()
                    done = time.perf_counter()
                    if answer.status != 202:
                        failures += 1
                        continue
                latencies.append(done - now)
                second = int(done - started)
                per_second[second] = per_second.get(second, 0) + 1

        await asyncio.gather(*(worker() for _ in range(connections)))
    windows = [per_second.get(second, 0) for second in range(int(seconds))]
    return latencies, windows, failures


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def bench(kind: str, sizes: list[int], connections: int, seconds: float) -> list[dict[str, Any]]:
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    results = []
    try:
        port = int(child.stdout.readline())
        url = f"http://127.0.0.1:{port}/api/v1/alerts"
        asyncio.run(load(url, payload(1), 2, 0.5))  # warm up
        for size in sizes:
            body = payload(size)
            rss = [rss_mib(child.pid)]
            rounds = []
            for _ in range(2):
                rounds.append(asyncio.run(load(url, body, connections, seconds)))
                rss.append(rss_mib(child.pid))
            latencies = rounds[0][0] + rounds[1][0]
            windows = rounds[0][1][1:] + rounds[1][1][1:]  # each round's first second is its ramp-up
            posts = len(latencies)
            results.append(
                {
                    "server": kind,
                    "alerts_per_post": size,
                    "posts": posts,
                    "failures": rounds[0][2] + rounds[1][2],
                    "alerts_per_s": posts * size / (2 * seconds),
                    "alerts_per_s_held": min(windows) * size if windows else 0,
                    "p50_ms": percentile(latencies, 0.50) * 1000,
                    "p99_ms": percentile(latencies, 0.99) * 1000,
                    "rss_mib": [round(value, 1) for value in rss],
                    "threads_after": len(os.listdir(f"/proc/{child.pid}/task")),
                }
            )
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
    return results


def storm(kind: str, groups: int, max_connections: int | None) -> dict[str, Any]:
    """One storm of `groups` through a real Alertmanager into the API `kind` serves (a child process)."""
    sys.path.insert(0, str(REPO))
    from tests.support.alert_storm import run_storm

    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        log = scratch / "controller.log"
        limits = ["--max-connections", str(max_connections)] if max_connections is not None else []
        with log.open("w") as stderr:
            child = subprocess.Popen(
                [sys.executable, __file__, "--serve", kind, *limits],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
            assert child.stdin is not None and child.stdout is not None
            try:
                port = int(child.stdout.readline())
                result = run_storm(f"http://127.0.0.1:{port}/api/v1/alerts", groups, scratch / "storm")
            finally:
                child.stdin.close()
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
        text = log.read_text(encoding="utf-8", errors="replace")
    return {"server": kind, **result.to_json(), "tracebacks": text.count("Traceback (most recent call last)")}


def storms(groups: list[int], max_connections: int | None) -> list[dict[str, Any]]:
    cap = max_connections if max_connections is not None else "default (1000)"
    print(f"alert storms through a real Alertmanager: every group flushed at once; API connection cap {cap}")
    print(
        f"{'server':<8} {'groups':>6} {'delivered':>9} {'gave up':>7} {'attempts':>8} {'failed':>6} "
        f"{'resets':>6} {'closed':>6} {'tracebacks':>10} {'seconds':>7}"
    )
    rows = []
    for size in groups:
        for kind in (STORM_REVISION, "new"):
            row = storm(kind, size, max_connections)
            rows.append(row)
            print(
                f"{row['server']:<8} {row['groups']:>6} {row['delivered']:>9} {row['failed_notifications']:>7} "
                f"{row['requests']:>8} {row['failed_requests']:>6} {row['resets']:>6} {row['closed']:>6} "
                f"{row['tracebacks']:>10} {row['seconds']:>7.1f}",
                flush=True,
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", choices=["old", "new", STORM_REVISION], help=argparse.SUPPRESS)
    parser.add_argument("--max-connections", type=int, default=None, help="the API's connection cap (storms)")
    parser.add_argument("--alertmanager", default=None, help="storms through a real Alertmanager: group counts")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each of the two rounds")
    parser.add_argument("--connections", type=int, default=16, help="kept-alive client connections")
    parser.add_argument("--alerts-per-post", default="1,10", help="comma-separated payload sizes")
    parser.add_argument("--servers", default="old,new", help="which servers: old, new or both")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds): that it runs, figures meaningless")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.connections, args.alerts_per_post, args.servers = 0.5, 2, "1", "new"
    if args.serve:
        serve(args.serve, args.max_connections)
        return 0
    if args.alertmanager:
        rows = storms([int(size) for size in args.alertmanager.split(",")], args.max_connections)
        if args.json is not None:
            args.json.write_text(json.dumps(rows, indent=2), encoding="utf-8")
        return 0
    sizes = [int(size) for size in args.alerts_per_post.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        have_old = old_api_class(Path(scratch)) is not None
    servers = [kind for kind in args.servers.split(",") if kind == "new" or have_old]
    print(
        f"webhook throughput: {args.connections} kept-alive connections, 2 rounds of {args.seconds:g} s, "
        f"payload {FIXTURE.relative_to(REPO)} x alerts per post; target >= 1,000 alerts/s held"
    )
    if not have_old:
        print(
            f"(the old server could not be read from git ({OLD_REVISION}) or no longer loads against today's "
            "modules: only the new one)"
        )
    header = (
        f"{'server':<6} {'alerts/post':>11} {'posts':>7} {'fail':>4} {'alerts/s':>9} {'held':>8} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'RSS MiB before/r1/r2':>22} {'threads':>7}"
    )
    print(header)
    results = []
    for kind in servers:
        for row in bench(kind, sizes, args.connections, args.seconds):
            results.append(row)
            rss = "/".join(f"{value:.0f}" for value in row["rss_mib"])
            print(
                f"{row['server']:<6} {row['alerts_per_post']:>11} {row['posts']:>7} {row['failures']:>4} "
                f"{row['alerts_per_s']:>9.0f} {row['alerts_per_s_held']:>8.0f} {row['p50_ms']:>7.2f} "
                f"{row['p99_ms']:>7.2f} {rss:>22} {row['threads_after']:>7}",
                flush=True,
            )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
