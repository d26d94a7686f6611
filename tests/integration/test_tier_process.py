"""The tier as a real process on loopback: control API, router, replicas, restart, trace replay."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tailguard.serving.lab.load import main as load_main

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 5.0
CONFIG = """\
services:
  - name: chat
    namespace: llm
    model: llama-test
    profile: stable
    replicas: 2
"""


class TierProcess:
    def __init__(self, config: Path, state_dir: Path):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tailguard.serving.tier",
                "--config",
                str(config),
                "--state-dir",
                str(state_dir),
                "--port",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # the ready line; EOF if the tier died
        if not line:
            self.stop()
            raise AssertionError(f"tier did not start: {self.process.stderr.read() if self.process.stderr else ''}")
        try:
            self.ready = json.loads(line)
            self.control: str = self.ready["control_url"]
            self.router: str = self.ready["router_url"]
        except (ValueError, KeyError):
            self.stop()
            raise

    def post(self, path: str, body: dict[str, Any]) -> requests.Response:
        return requests.post(f"{self.control}/api/v1/services/chat/{path}", json=body, timeout=TIMEOUT)

    def service(self) -> dict[str, Any]:
        answer: dict[str, Any] = requests.get(f"{self.control}/api/v1/services/chat", timeout=TIMEOUT).json()
        return answer

    def complete(self, max_tokens: int = 2) -> requests.Response:
        return requests.post(
            f"{self.router}/v1/completions",
            timeout=TIMEOUT,
            json={"model": "llama-test", "prompt": "a b c", "max_tokens": max_tokens},
        )

    def max_num_seqs(self) -> dict[str, float]:
        """tailguard_serving_engine_arg{arg="max_num_seqs"} on the router's /metrics, by replica."""
        page = requests.get(f"{self.router}/metrics", timeout=TIMEOUT).text
        return {
            s.labels["replica"]: s.value
            for f in text_string_to_metric_families(page)
            for s in f.samples
            if s.name == "tailguard_serving_engine_arg" and s.labels["arg"] == "max_num_seqs"
        }

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return self.process.returncode


@pytest.fixture
def paths(tmp_path: Path) -> tuple[Path, Path]:
    config = tmp_path / "tier.yaml"
    config.write_text(CONFIG)
    return config, tmp_path / "state"


@pytest.fixture
def tier(paths: tuple[Path, Path]) -> Iterator[TierProcess]:
    process = TierProcess(*paths)
    try:
        yield process
    finally:
        process.stop()


def test_service_view_sd_and_metrics(tier: TierProcess) -> None:
    assert requests.get(f"{tier.control}/healthz", timeout=TIMEOUT).json() == {"status": "ok"}
    service = tier.service()
    assert (service["active_revision"], service["replicas"], service["namespace"]) == (1, 2, "llm")
    assert [v["version"] for v in service["versions"]] == ["r1"]
    sd = requests.get(f"{tier.control}/api/v1/sd", timeout=TIMEOUT).json()
    assert [t["labels"] for t in sd] == [
        {"service": "chat", "version": "r1", "replica": f"chat-r1-{i}", "namespace": "llm"} for i in range(2)
    ]
    assert tier.complete().status_code == 200
    pages = [requests.get(f"http://{t['targets'][0]}/metrics", timeout=TIMEOUT).text for t in sd]
    counts = [
        s.value
        for page in pages
        for f in text_string_to_metric_families(page)
        for s in f.samples
        if s.name == "vllm:e2e_request_latency_seconds_count"
    ]
    assert sorted(counts) == [0.0, 1.0]
    router_page = requests.get(f"{tier.router}/metrics", timeout=TIMEOUT).text
    assert (
        'tailguard_router_request_duration_seconds_count{priority="0",service="chat",version="r1"} 1.0' in router_page
    )
    assert requests.get(f"{tier.control}/api/v1/services/nope", timeout=TIMEOUT).status_code == 404


def test_rollout_rollback_scale_weights_and_routing(tier: TierProcess) -> None:
    answer = tier.post(
        "rollout", {"profile_name": "bad-max-num-seqs", "idempotency_key": "k1", "canary_weight": 50}
    ).json()
    assert answer == {"revision": 2, "version": "r2", "replayed": False}
    service = tier.service()
    assert {v["version"]: v["weight"] for v in service["versions"]} == {"r1": 50, "r2": 50}
    seen = collections.Counter(tier.complete().headers["X-Tailguard-Version"] for _ in range(10))
    assert seen == {"r1": 5, "r2": 5}
    # The router exports every listed replica's scheduler limit (vLLM itself does not export max_num_seqs).
    assert tier.max_num_seqs() == {"chat-r1-0": 64, "chat-r1-1": 64, "chat-r2-0": 2}  # a canary: one replica
    sd = requests.get(f"{tier.control}/api/v1/sd", timeout=TIMEOUT).json()
    assert set(tier.max_num_seqs()) == {t["labels"]["replica"] for t in sd}

    assert tier.post("weights", {"version": "r2", "weight": 0, "idempotency_key": "k2"}).json() == {
        "weights": {"r2": 0, "r1": 100},
        "replayed": False,
    }
    assert {tier.complete().headers["X-Tailguard-Version"] for _ in range(4)} == {"r1"}
    assert tier.post("weights", {"version": "r9", "weight": 5, "idempotency_key": "k3"}).status_code == 409

    assert tier.post("scale", {"replicas": 3, "idempotency_key": "k4"}).json() == {
        "from": 2,
        "to": 3,
        "replayed": False,
    }
    assert tier.service()["replicas"] == 3

    rollback = tier.post("rollback", {"idempotency_key": "k5", "reason": "p99 above 0.8 s"}).json()
    assert rollback == {"from_revision": 2, "to_revision": 1, "replayed": False}
    revisions = requests.get(f"{tier.control}/api/v1/services/chat/revisions", timeout=TIMEOUT).json()
    assert [(r["version"], r["bad"], r["reason"]) for r in revisions] == [
        ("r1", False, None),
        ("r2", True, "p99 above 0.8 s"),
    ]
    assert revisions[1]["profile"]["engineArgs"]["max_num_seqs"] == 2
    service = tier.service()
    assert [v["version"] for v in service["versions"]] == ["r1"] and service["replicas"] == 3
    assert tier.max_num_seqs() == {f"chat-r1-{i}": 64 for i in range(3)}  # r2's replicas are no longer listed
    conflict = tier.post("rollback", {"idempotency_key": "k6"})
    assert conflict.status_code == 409 and "no good revision" in conflict.json()["error"]

    bad = tier.post(
        "rollout",
        {"profile": {"name": "x", "model": "m", "engineArgs": {"max_num_seq": 1}}, "idempotency_key": "k7"},
    )
    assert bad.status_code == 400 and "engineArgs.max_num_seq" in bad.json()["error"]


def test_idempotent_replay_survives_a_restart(paths: tuple[Path, Path]) -> None:
    first = TierProcess(*paths)
    try:
        assert first.post("rollout", {"profile_name": "small-kv-cache", "idempotency_key": "d1:fire:0"}).json() == {
            "revision": 2,
            "version": "r2",
            "replayed": False,
        }
        assert first.post("scale", {"replicas": 1, "idempotency_key": "d2:fire:0"}).json()["replayed"] is False
    finally:
        assert first.stop() == 0
    second = TierProcess(*paths)
    try:
        assert second.post("rollout", {"profile_name": "small-kv-cache", "idempotency_key": "d1:fire:0"}).json() == {
            "revision": 2,
            "version": "r2",
            "replayed": True,
        }
        assert second.post("scale", {"replicas": 1, "idempotency_key": "d2:fire:0"}).json() == {
            "from": 2,
            "to": 1,
            "replayed": True,
        }
        service = second.service()
        assert (service["active_revision"], service["replicas"]) == (2, 1)
        assert len(requests.get(f"{second.control}/api/v1/services/chat/revisions", timeout=TIMEOUT).json()) == 2
        assert second.complete().status_code == 200
    finally:
        second.stop()


def test_bad_config_is_reported_without_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "tier.yaml"
    config.write_text("services:\n  - name: chat\n    model: m\n    replica: 2\n")
    result = subprocess.run(
        [sys.executable, "-m", "tailguard.serving.tier", "--config", str(config), "--state-dir", str(tmp_path / "s")],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 2
    assert f"{config}:4: services[0].replica: unknown field" in result.stderr
    assert "Traceback" not in result.stderr


def test_replay_through_the_router(tier: TierProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_csv, out_json = tmp_path / "r.csv", tmp_path / "s.json"
    code = load_main(
        [
            "--url",
            tier.router,
            "--model",
            "llama-test",
            "--trace",
            "conv",
            "--speedup",
            "20",
            "--max-requests",
            "30",
            "--csv",
            str(out_csv),
            "--summary-json",
            str(out_json),
            "--no-progress",
        ]
    )
    assert code == 0
    summary = json.loads(out_json.read_text())
    assert (summary["count"], summary["ok"], summary["errors"]) == (30, 30, 0)
    assert 0 < summary["p50"] <= summary["p99"]
    assert len(out_csv.read_text().splitlines()) == 31
    assert "requests 30  ok 30  errors 0" in capsys.readouterr().out
