"""`tailguard run` as a real process: serves its API, evaluates, stops cleanly on SIGTERM, leaves no children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tailguard.serving.lab.promstack import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
POLICY = (REPO / "rules" / "examples" / "p99-rollback.yaml").read_text().replace("interval: 15s", "interval: 1s")


def children_of(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread exited while we looked: it has no children to report
        found.extend(int(child) for child in text)
    return found


def wait_for(url: str, status: int, deadline: float, process: subprocess.Popen[bytes]) -> requests.Response:
    while True:
        assert process.poll() is None, f"tailguard exited early with {process.returncode}"
        try:
            answer = requests.get(url, timeout=2)
            if answer.status_code == status:
                return answer
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, f"{url} never answered {status}"
        time.sleep(0.1)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_tailguard_run_serves_and_stops_cleanly(tmp_path: Path, stop_signal: signal.Signals) -> None:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "p99.yaml").write_text(POLICY)
    port = free_port()
    # Prometheus on a closed port: every query is a source error (data), never a crash or a breach.
    (tmp_path / "controller.yaml").write_text(
        f"prometheus: {{url: 'http://127.0.0.1:{free_port()}', timeout: 1, retries: 0}}\n"
        f"policies: [rules]\njournal: journal.db\nlisten: 127.0.0.1:{port}\nreloadInterval: 1s\n"
        "logFormat: json\n"
        # The policy rolls back, so a rollback actuator must be configured (the start refuses otherwise): a local
        # tier on a closed port, never called since no query answers.
        f"tier: {{url: 'http://127.0.0.1:{free_port()}'}}\n"
    )
    log = (tmp_path / "controller.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tailguard.controller", "run", "--config", str(tmp_path / "controller.yaml")],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + 60
        wait_for(f"http://127.0.0.1:{port}/healthz", 200, deadline, process)
        ready = wait_for(f"http://127.0.0.1:{port}/readyz", 200, deadline, process).json()
        assert ready["ready"] is True and list(ready["policies"]) == ["p99-rollback"]
        # Ready means "serves its API" (issue 24), possibly before the first evaluation ended: wait for it.
        errors = 'tailguard_source_errors_total{policy="p99-rollback",signal="p99-e2e-latency"}'
        while errors not in (metrics := requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text):
            assert time.monotonic() < deadline and process.poll() is None, metrics[-2000:]
            time.sleep(0.1)
        assert children_of(process.pid) == []

        process.send_signal(stop_signal)
        assert process.wait(timeout=30) == 0
        with pytest.raises(ProcessLookupError):  # nothing of its process group outlived it
            os.killpg(process.pid, 0)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        log.close()
    output = (tmp_path / "controller.log").read_text()
    assert '"msg": "controller stopped"' in output
    assert "Traceback" not in output
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
