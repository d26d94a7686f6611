"""The shortened demo, end to end: real tier process, real Prometheus, `tailguard run`, trace replay.

Asserts the closed loop closed: the bad revision was rolled back by the controller
(not by the test), exactly once, and P99 came back under the threshold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.serving.lab.demo import THRESHOLD_SECONDS, DemoTimings, run_demo

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, parent_text = stat.rsplit(")", 1)[1].split()[:2]
        parent = int(parent_text)
        # A zombie has ended (not running): one another test of this pytest-xdist worker has not reaped yet.
        if parent == pid and state != "Z":
            found.append(int(entry.name))
            found.extend(_descendants(int(entry.name)))
    return found


def test_shortened_demo_rolls_back_and_recovers(tmp_path: Path) -> None:
    timings = DemoTimings(warmup_s=12.0, detect_timeout_s=60.0, recover_timeout_s=60.0, settle_s=2.0)
    pages: list[tuple[str, int, str]] = []

    def hold(status_page: str) -> None:
        """What a person sees at the printed address while the demo holds (before Enter): the incident, resolved."""
        answer = requests.get(status_page, timeout=10)
        pages.append((status_page, answer.status_code, answer.text))

    # Processes this xdist worker already runs for other tests (a module's Prometheus) are not the demo's.
    running_before = set(_descendants(os.getpid()))
    summary = run_demo(tmp_path, timings, hold=hold)
    ((address, code, page),) = pages
    assert address == summary["status_page"] and code == 200
    assert 'data-kind="resolve"' in page and "rollback" in page and 'id="no-incidents"' in page

    assert summary["revisions"][1]["bad"] is True, "the bad revision r2 must be recorded as bad"
    assert summary["active_revision"] == 1, "the controller must have rolled back to r1"
    assert summary["rollback_to"] == "r1"
    assert summary["fired_at"] > summary["rollout_at"]
    assert summary["peak_p99_seconds"] > THRESHOLD_SECONDS, "the bad profile must produce a real regression"
    assert summary["recovered_at"] is not None and summary["recovered_at"] > summary["rollback_at"]
    assert summary["resolved_at"] is not None

    document = json.loads((tmp_path / "incident.json").read_text())
    after = [value for at, value in document["series"] if at > summary["resolved_at"]]
    assert after and max(after) <= THRESHOLD_SECONDS, "P99 must stay under the threshold after resolution"
    assert (tmp_path / "incident.png").stat().st_size > 10_000
    assert "rollout of r2" in (tmp_path / "incident.md").read_text()

    with Journal(tmp_path / "journal.db") as journal:
        rollbacks = [record for record in journal.all_actions() if record.type.value == "rollback"]
    assert len(rollbacks) == 1 and rollbacks[0].status.value == "succeeded"

    annotations = [json.loads(line) for line in (tmp_path / "annotations.jsonl").read_text().splitlines()]
    assert any("rolling back" in note["text"] for note in annotations)

    left = sorted(set(_descendants(os.getpid())) - running_before)
    assert left == [], "the demo must leave no process running"


def test_demo_command_fails_cleanly_when_prometheus_is_missing(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": "/nonexistent"}
    completed = subprocess.run(
        [sys.executable, "-m", "tailguard.serving", "demo", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert completed.returncode != 0
    assert "Traceback" not in completed.stderr
    assert "prometheus" in (completed.stdout + completed.stderr).lower()
