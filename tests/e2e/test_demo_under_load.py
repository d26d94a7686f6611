"""The demo on a loaded machine: the shortened rollback demo while CPU hogs hold the load average near 8 on 2 cores
(the hogs are bounded: each stops by itself after HOG_SECONDS, and the test stops them at the end anyway). The
rollout must still be what fires (not the stable version slowed by contention), and the loop must close."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailguard.serving.lab.demo import DemoTimings, run_demo

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

HOG_SECONDS = 240  # longer than the shortened demo; each hog ends by itself then
HOGS = max(2, 3 * (os.cpu_count() or 2))  # with the suite's own work: a load average of about 8 on 2 cores


@pytest.fixture
def cpu_hogs() -> Iterator[list[subprocess.Popen[bytes]]]:
    code = f"import time\nend = time.monotonic() + {HOG_SECONDS}\nwhile time.monotonic() < end:\n    pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(HOGS)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.terminate()
        for hog in hogs:
            hog.wait(timeout=10)


def test_the_demo_rolls_back_the_rollout_under_cpu_contention(cpu_hogs: list[object], tmp_path: Path) -> None:
    timings = DemoTimings(warmup_s=12.0, detect_timeout_s=90.0, recover_timeout_s=90.0, settle_s=2.0)
    summary = run_demo(tmp_path, timings)
    assert summary["fired_at"] > summary["rollout_at"], "the stable version must not fire on contention alone"
    assert summary["rollback_to"] == "r1" and summary["active_revision"] == 1
    assert summary["resolved_at"] is not None
