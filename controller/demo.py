"""`tailguard demo`: the whole closed loop on this machine, on the embedded local default.

    serving tier (simulated vLLM, 2 replicas of `chat`) <-- Azure conv trace replay
         ^  scrape 1 s (HTTP SD)                 |
    real Prometheus  <---- PromQL ----  tailguard run (subprocess, real config)
                                                 |
               rollback through the tier's control API, annotation in JSONL

The demo rolls out a bad engine profile (max_num_seqs: 2) as a new revision,
lets the controller detect the P99 regression and roll back on its own, waits
for the decision to resolve, then writes the incident report (PNG, JSON,
Markdown). Every process it starts is in its own process group and is stopped
on the way out, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

from controller.incident_report import IncidentTimeline, write_report
from controller.journal import Journal
from serving.promstack import (
    ManagedProcess,
    PrometheusServer,
    PromStackError,
    free_port,
    http_sd_scrape_config,
    static_scrape_config,
    write_prometheus_config,
)

SERVICE = "chat"
NAMESPACE = "llm"
MODEL = "llama-3-8b-instruct"
THRESHOLD_SECONDS = 0.8
POLICY_NAME = "p99-rollback-demo"
CONDITION_NAME = "p99-above-800ms"
# A short rate window keeps the demo under three minutes; production policies use [1m] or more.
P99_QUERY = (
    "histogram_quantile(0.99, sum by (le, service) "
    f'(rate(vllm:e2e_request_latency_seconds_bucket{{namespace="{NAMESPACE}"}}[{{window}}])))'
)
HTTP_TIMEOUT = 5.0


@dataclass(frozen=True)
class DemoTimings:
    """How long each phase may take. The end-to-end test uses a shorter set."""

    evaluation_interval_s: float = 4.0
    rate_window: str = "15s"
    warmup_s: float = 25.0
    detect_timeout_s: float = 60.0
    recover_timeout_s: float = 60.0
    settle_s: float = 5.0
    load_rate_scale: float = 1.0
    load_speedup: float = 10.0
    # Output and prompt lengths of the trace are scaled down so the stable profile keeps its P99 well
    # under the threshold (the histogram's 0.5-0.8 s bucket would otherwise sit right at it).
    load_token_scale: float = 0.05


class DemoError(RuntimeError):
    pass


def _log(start: float, message: str) -> None:
    print(f"[{time.monotonic() - start:6.1f}s] {message}", flush=True)


def _read_ready_line(process: ManagedProcess, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        failure = process.exited()
        if failure is not None:
            raise DemoError(failure)
        try:
            lines = process.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
        for line in lines:
            if line.startswith("{") and '"ready"' in line:
                event: dict[str, Any] = json.loads(line)
                return event
        time.sleep(0.1)
    raise DemoError(f"{process.name} did not become ready within {timeout:.0f}s: {process.log_tail()}")


@contextmanager
def _managed(process: ManagedProcess) -> Iterator[ManagedProcess]:
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _wait(predicate: Callable[[], bool], timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def _write_policy(path: Path, timings: DemoTimings) -> None:
    policy = {
        "apiVersion": "tailguard.io/v1alpha1",
        "kind": "Policy",
        "name": POLICY_NAME,
        "description": "The seed rule (P99 e2e > 800 ms for 3 evaluations -> annotate and roll back), "
        "with a short interval and rate window so the demo fits in three minutes.",
        "interval": f"{timings.evaluation_interval_s:g}s",
        "targets": {"groupBy": ["service"], "match": {"namespace": NAMESPACE}},
        "signals": [
            {
                "name": "p99-e2e-latency",
                "query": P99_QUERY.replace("{window}", timings.rate_window).replace(
                    f'namespace="{NAMESPACE}"', "{{ selector }}"
                ),
            }
        ],
        "conditions": [
            {
                "name": CONDITION_NAME,
                "signal": "p99-e2e-latency",
                "when": {"op": ">", "value": THRESHOLD_SECONDS},
                "for": 3,
                "noData": "hold",
                "staleAfter": "1m",
                "actions": [
                    {
                        "type": "annotate",
                        "text": "P99 e2e latency {{ value }}s > {{ threshold }}s on {{ service }}: rolling back",
                        "tags": ["regression", "p99"],
                    },
                    {"type": "rollback", "service": "{{ service }}"},
                ],
                "recovery": {
                    "when": {"op": "<=", "value": THRESHOLD_SECONDS},
                    "for": 2,
                    "actions": [
                        {
                            "type": "annotate",
                            "text": "P99 e2e latency back to {{ value }}s on {{ service }}",
                            "tags": ["recovered"],
                        }
                    ],
                },
            }
        ],
        "limits": {"cooldown": "10m", "maxActionsPerHour": 3},
    }
    path.write_text(yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")


def _p99_series(prometheus_url: str, start: float, end: float, window: str) -> list[tuple[float, float]]:
    query = P99_QUERY.replace("{window}", window)
    params: dict[str, str | float] = {"query": query, "start": start, "end": end, "step": "1s"}
    response = requests.get(f"{prometheus_url}/api/v1/query_range", params=params, timeout=HTTP_TIMEOUT)
    response.raise_for_status()
    points: list[tuple[float, float]] = []
    for series in response.json()["data"]["result"]:
        if series["metric"].get("service") != SERVICE:
            continue
        for at, value in series["values"]:
            number = float(value)
            if not math.isnan(number):  # NaN: no traffic in the window
                points.append((float(at), number))
    return sorted(points)


def _rollback_record(journal_path: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The fire decision of the demo policy and its rollback action record, if they exist yet."""
    if not journal_path.exists():
        return None, None
    journal = Journal(journal_path)
    try:
        for decision in journal.recent_decisions(200):
            if decision["policy"] == POLICY_NAME and decision["kind"] == "fire":
                for record in decision["action_records"]:
                    if record["type"] == "rollback":
                        return decision, record
                return decision, None
    finally:
        journal.close()
    return None, None


def _resolve_record(journal_path: Path, decision_id: str) -> dict[str, Any] | None:
    journal = Journal(journal_path)
    try:
        for decision in journal.recent_decisions(200):
            if decision["id"] == decision_id and decision["kind"] == "resolve":
                return decision
    finally:
        journal.close()
    return None


def run_demo(out_dir: Path, timings: DemoTimings = DemoTimings(), *, python: str = sys.executable) -> dict[str, Any]:
    """Run the scenario; returns the incident summary. Raises DemoError when the loop did not close."""
    start = time.monotonic()
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("journal.db", "journal.db-wal", "journal.db-shm", "annotations.jsonl"):
        (out_dir / stale).unlink(missing_ok=True)

    tier_config = out_dir / "tier.yaml"
    tier_config.write_text(
        yaml.safe_dump(
            {
                "ports": {"control": 0, "router": 0},
                "services": [
                    {
                        "name": SERVICE,
                        "namespace": NAMESPACE,
                        "model": MODEL,
                        "profile": "stable",
                        "replicas": 2,
                    }
                ],
            },
            sort_keys=False,
        ),
        encoding="utf-8",
    )
    policy_dir = out_dir / "policies"
    policy_dir.mkdir(exist_ok=True)
    _write_policy(policy_dir / "p99-rollback-demo.yaml", timings)

    with ExitStack() as stack:
        tier = stack.enter_context(
            _managed(
                ManagedProcess(
                    "tier",
                    [
                        python,
                        "-m",
                        "serving.tier",
                        "--config",
                        str(tier_config),
                        "--state-dir",
                        str(out_dir / "tier-state"),
                    ],
                    out_dir / "tier.log",
                )
            )
        )
        ready = _read_ready_line(tier, 30.0)
        control_url, router_url = ready["control_url"], ready["router_url"]
        _log(start, f"serving tier up: {SERVICE} r1 (profile stable, 2 replicas), router {router_url}")

        controller_port = free_port()
        prometheus_config = write_prometheus_config(
            out_dir / "prometheus.yml",
            scrape_interval="1s",
            evaluation_interval="1s",
            scrape_configs=[
                http_sd_scrape_config("vllm", f"{control_url}/api/v1/sd", refresh_interval="1s"),
                static_scrape_config("router", [router_url.removeprefix("http://")]),
                static_scrape_config("tailguard", [f"127.0.0.1:{controller_port}"]),
            ],
        )
        prometheus = stack.enter_context(
            PrometheusServer(prometheus_config, out_dir / "prometheus-data", workdir=out_dir / "prometheus").start()
        )
        _log(start, f"prometheus up: {prometheus.url} (scrape 1s)")

        controller_config = out_dir / "controller.yaml"
        controller_config.write_text(
            yaml.safe_dump(
                {
                    "prometheus": {"url": prometheus.url, "timeout": 5, "retries": 2},
                    "policies": [str(policy_dir)],
                    "journal": str(out_dir / "journal.db"),
                    "stateDir": str(out_dir / "controller-state"),
                    "listen": f"127.0.0.1:{controller_port}",
                    "tier": {"url": control_url, "timeout": 5},
                    "annotations": {"path": str(out_dir / "annotations.jsonl")},
                    "limits": {"cooldown": "10m", "maxActionsPerHour": 3},
                    "reloadInterval": "5s",
                },
                sort_keys=False,
            ),
            encoding="utf-8",
        )

        load_seconds = timings.warmup_s + timings.detect_timeout_s + timings.recover_timeout_s + 30.0
        load = stack.enter_context(
            _managed(
                ManagedProcess(
                    "load",
                    [
                        python,
                        "-m",
                        "serving.load",
                        "--url",
                        router_url,
                        "--model",
                        MODEL,
                        "--trace",
                        "conv",
                        "--speedup",
                        f"{timings.load_speedup:g}",
                        "--rate-scale",
                        f"{timings.load_rate_scale:g}",
                        "--token-scale",
                        f"{timings.load_token_scale:g}",
                        "--duration",
                        f"{load_seconds:.0f}",
                        "--no-progress",
                        "--summary-json",
                        str(out_dir / "load-summary.json"),
                    ],
                    out_dir / "load.log",
                )
            )
        )
        _log(start, f"replaying the Azure conv trace at {timings.load_speedup:g}x through the router")

        controller = stack.enter_context(
            _managed(
                ManagedProcess(
                    "controller",
                    [python, "-m", "controller", "run", "--config", str(controller_config)],
                    out_dir / "controller.log",
                )
            )
        )
        relay = _LogRelay(controller.log_path, start)

        def healthy() -> bool:
            relay.pump()
            try:
                return requests.get(f"http://127.0.0.1:{controller_port}/healthz", timeout=1).status_code == 200
            except requests.RequestException:
                return False

        if not _wait(healthy, 30.0):
            raise DemoError(f"controller did not start: {controller.log_tail()}")

        deadline = time.monotonic() + timings.warmup_s
        while time.monotonic() < deadline:
            relay.pump()
            if load.exited() is not None:
                raise DemoError(f"load replay stopped early: {load.log_tail()}")
            time.sleep(0.5)

        rollout = requests.post(
            f"{control_url}/api/v1/services/{SERVICE}/rollout",
            json={"profile_name": "bad-max-num-seqs", "idempotency_key": "demo-rollout-r2"},
            timeout=HTTP_TIMEOUT,
        )
        rollout.raise_for_status()
        rollout_at = time.time()
        bad_version = rollout.json()["version"]
        _log(start, f"ROLLOUT {SERVICE} {bad_version}: profile bad-max-num-seqs (max_num_seqs 64 -> 2)")

        fired: dict[str, Any] = {}

        def rolled_back() -> bool:
            relay.pump()
            decision, record = _rollback_record(out_dir / "journal.db")
            if decision is not None and record is not None and record["status"] in ("succeeded", "failed"):
                fired.update(decision=decision, record=record)
                return True
            return False

        if not _wait(rolled_back, timings.detect_timeout_s):
            raise DemoError(
                "the controller did not roll back within "
                f"{timings.detect_timeout_s:.0f}s of the rollout; see {controller.log_path}"
            )
        record = fired["record"]
        if record["status"] != "succeeded":
            raise DemoError(f"the rollback failed: {record.get('error')}")
        _log(start, f"ROLLBACK done: {json.dumps(record.get('result'))}")

        resolved: dict[str, Any] = {}

        def recovered() -> bool:
            relay.pump()
            decision = _resolve_record(out_dir / "journal.db", fired["decision"]["id"])
            if decision is not None:
                resolved.update(decision)
                return True
            return False

        if not _wait(recovered, timings.recover_timeout_s):
            raise DemoError(f"P99 did not recover within {timings.recover_timeout_s:.0f}s of the rollback")
        _log(start, "RESOLVED: P99 back under the threshold")
        time.sleep(timings.settle_s)
        relay.pump()
        end = time.time()
        series = _p99_series(prometheus.url, rollout_at - timings.warmup_s, end, timings.rate_window)

        revisions = requests.get(f"{control_url}/api/v1/services/{SERVICE}/revisions", timeout=HTTP_TIMEOUT).json()
        service_state = requests.get(f"{control_url}/api/v1/services/{SERVICE}", timeout=HTTP_TIMEOUT).json()

    decision = fired["decision"]
    result = record.get("result") or {}
    detail = result.get("detail", result)
    timeline = IncidentTimeline(
        policy=POLICY_NAME,
        condition=CONDITION_NAME,
        service=SERVICE,
        threshold_seconds=THRESHOLD_SECONDS,
        series=series,
        rollout_at=rollout_at,
        rollout_revision=bad_version,
        onset_at=decision["onset"],
        fired_at=decision["fired_at"],
        rollback_at=record.get("finished_at"),
        rollback_to=f"r{detail['to_revision']}" if "to_revision" in detail else None,
        resolved_at=resolved.get("resolved_at"),
        decision_id=decision["id"],
        notes=(
            "revisions after the incident: "
            + ", ".join(
                f"{r['version']}{' (bad: ' + str(r.get('reason')) + ')' if r.get('bad') else ''}" for r in revisions
            ),
            f"active revision now: r{service_state['active_revision']}",
            f"evidence (t, P99 s) at fire: {decision['evidence']}",
        ),
    )
    paths = write_report(timeline, out_dir)
    summary = timeline.summary()
    summary["report"] = {kind: str(path) for kind, path in paths.items()}
    summary["active_revision"] = service_state["active_revision"]
    summary["revisions"] = revisions
    return summary


class _LogRelay:
    """Prints the controller's evaluation and decision lines as they appear (the demo's live view)."""

    def __init__(self, path: Path, start: float):
        self.path = path
        self.start = start
        self.offset = 0

    def pump(self) -> None:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except OSError:
            return
        complete = chunk.rfind(b"\n") + 1
        self.offset += complete
        for raw in chunk[:complete].decode("utf-8", errors="replace").splitlines():
            if "tailguard.controller:" in raw or "Traceback" in raw or " ERROR " in raw:
                _log(self.start, "controller | " + raw.split(": ", 1)[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tailguard demo", description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("--out", default="demo-output", help="directory for logs, journal and the incident report")
    parser.add_argument("--warmup", type=float, default=DemoTimings.warmup_s, help="seconds of load before the rollout")
    args = parser.parse_args(argv)
    timings = DemoTimings(warmup_s=args.warmup)
    try:
        summary = run_demo(Path(args.out), timings)
    except (DemoError, PromStackError, requests.RequestException, OSError) as failed:
        print(f"demo failed: {failed}", file=sys.stderr)
        return 1
    print()
    print(
        f"rollout -> detection: {summary['seconds_rollout_to_detection']} s, "
        f"-> rollback: {summary['seconds_rollout_to_rollback']} s, "
        f"-> P99 under threshold: {summary['seconds_rollout_to_recovery']} s, "
        f"-> resolved: {summary['seconds_rollout_to_resolution']} s"
    )
    print(f"incident report: {summary['report']['markdown']}, {summary['report']['png']}, {summary['report']['json']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
