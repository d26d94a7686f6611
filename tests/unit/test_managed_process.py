"""ManagedProcess: a log reused by a second run never shows the first run's lines as this run's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tailguard.serving.lab.promstack import ManagedProcess, ProcessNotReady


def _announcer(port: int, then_sleep: bool = True) -> list[str]:
    code = f"import json, time; print(json.dumps({{'event': 'ready', 'port': {port}}}), flush=True)"
    if then_sleep:
        code += "; time.sleep(60)"
    return [sys.executable, "-c", code]


def test_a_second_run_on_the_same_log_reads_its_own_ready_line(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    first = ManagedProcess("server", _announcer(1111, then_sleep=False), log)
    first.start()
    try:
        assert first.wait_ready(30)["port"] == 1111
    finally:
        first.stop()
    second = ManagedProcess("server", _announcer(2222), log)
    second.start()
    try:
        assert second.log_offset > 0
        assert second.wait_ready(30)["port"] == 2222  # not the stale 1111 above it in the file
        assert "1111" not in second.log_text() and "1111" in log.read_text()
    finally:
        second.stop()


def test_a_process_that_exits_without_ready_is_reported_with_its_output(tmp_path: Path) -> None:
    process = ManagedProcess("broken", [sys.executable, "-c", "print('bad config: port')"], tmp_path / "b.log")
    process.start()
    try:
        with pytest.raises(ProcessNotReady, match=r"broken exited with 0: bad config: port"):
            process.wait_ready(30)
    finally:
        process.stop()
