"""tailguard.serving.lab.recording without servers: the scenario file's checks, the replay schedule, the export's naming
and slicing, and tailguard.serving.lab.transfer's pure parts (the oracle cut, an SLI swapped in with its labels
recomputed)."""

from __future__ import annotations

import json
import lzma
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tailguard.predictors.data import Rows
from tailguard.predictors.modeling import fit_calibrated_cv, gbm_estimator
from tailguard.serving.lab.recording import (
    RecordingError,
    _family,
    load_scenario,
    planned_requests,
    reap_replica_groups,
    sliced_openmetrics,
    write_export,
)
from tailguard.serving.lab.transfer import concat_rows, oracle_cut, with_sli

RECORDING = Path(__file__).resolve().parents[2] / "serving" / "lab" / "recordings" / "vllm-cpu-2026-12-01"


def _scenario(tmp_path: Path, **changes: object) -> Path:
    document: dict[str, object] = {
        "duration_s": 120,
        "phases": [
            {"start_s": 0, "end_s": 60, "rate_from": 1, "rate_to": 1},
            {"start_s": 60, "end_s": 120, "rate_from": 1, "rate_to": 4},
        ],
        "actions": [
            {"at_s": 30, "action": "rollout", "profile": "bad-max-num-seqs", "engine_args": {"max_num_seqs": 1}}
        ],
    }
    document.update(changes)
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_the_committed_scenario_loads_and_has_surges_and_a_rollout_and_rollback() -> None:
    scenario = load_scenario(RECORDING / "scenario.json")
    assert scenario.duration_s >= 30 * 60
    assert scenario.replicas == 2
    assert [a.action for a in scenario.actions] == ["rollout", "rollback"]
    assert max(p.rate_to for p in scenario.phases) >= 2 * min(p.rate_from for p in scenario.phases)


def test_phases_must_cover_the_duration_without_gaps(tmp_path: Path) -> None:
    gap = [
        {"start_s": 0, "end_s": 50, "rate_from": 1, "rate_to": 1},
        {"start_s": 60, "end_s": 120, "rate_from": 1, "rate_to": 1},
    ]
    with pytest.raises(RecordingError, match="contiguous"):
        load_scenario(_scenario(tmp_path, phases=gap))
    short = [{"start_s": 0, "end_s": 100, "rate_from": 1, "rate_to": 1}]
    with pytest.raises(RecordingError, match="cover"):
        load_scenario(_scenario(tmp_path, phases=short))


def test_a_rollout_needs_a_profile_and_unknown_fields_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match="needs a profile"):
        load_scenario(_scenario(tmp_path, actions=[{"at_s": 5, "action": "rollout"}]))
    with pytest.raises(RecordingError, match="invalid scenario"):
        load_scenario(_scenario(tmp_path, replica=3))


def test_the_schedule_follows_the_phase_rates_and_fits_the_context(tmp_path: Path) -> None:
    scenario = load_scenario(_scenario(tmp_path, max_model_len=64))
    planned = planned_requests(scenario)
    first = sum(1 for p in planned if p.at < 60)
    second = sum(1 for p in planned if p.at >= 60)
    # 1x then a ramp 1x -> 4x (mean 2.5x) of the same trace rate
    assert 1.8 < second / first < 4.5
    assert all(p.prompt_tokens + p.max_tokens <= 64 - 8 for p in planned)
    assert planned == sorted(planned, key=lambda p: p.at) and planned[-1].at < 120


def test_export_families_follow_the_stored_names() -> None:
    names = {"vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum", "up"}
    assert _family("vllm:e2e_request_latency_seconds_sum", names) == ("vllm:e2e_request_latency_seconds", "histogram")
    assert _family("vllm:request_success_total", names) == ("vllm:request_success", "counter")
    # a _count without a _bucket family is not a histogram
    assert _family("foo_count", names) == ("foo_count", "gauge")
    assert _family("up", names) == ("up", "gauge")


def test_slicing_keeps_the_metadata_and_only_the_samples_in_the_window(tmp_path: Path) -> None:
    lines = ["# TYPE up gauge", 'up{job="a"} 1.0 100', 'up{job="a"} 1.0 105', 'up{job="a"} 0.0 110', "# EOF"]
    path = tmp_path / "h.om.xz"
    assert write_export(iter(lines), path) == 3
    with lzma.open(path, "rt") as handle:
        assert handle.read().splitlines() == lines
    assert list(sliced_openmetrics(path, 104, 110)) == ["# TYPE up gauge", *lines[2:4], "# EOF"]


def _rows(sli: list[float], horizon_steps: int = 2) -> Rows:
    n = len(sli)
    series = np.asarray(sli, dtype=np.float64)
    nan = np.full(n, np.nan)
    return Rows(
        np.arange(n, dtype=np.float64) * 5.0,
        np.zeros(n, dtype=np.int64),
        [(("service", "chat"),)],
        np.zeros((n, 1)),
        {"cpu": series, "gpu": nan, "network": nan},
        {"cpu": nan.copy(), "gpu": nan, "network": nan},
        {"cpu": nan.copy(), "gpu": nan, "network": nan},
        5.0,
        5.0 * horizon_steps,
        {"cpu": 1.0, "gpu": 20.0, "network": 0.5},
    )


def test_an_sli_swapped_in_gets_its_own_labels_and_persistence() -> None:
    rows = _rows([0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
    e2e = np.asarray([1.0, 2.0, 12.0, 3.0, 1.0, 1.0])
    swapped = with_sli(rows, "cpu", e2e, 10.0)
    assert swapped.thresholds["cpu"] == 10.0
    # breach at index 2: rows 0 and 1 see it within the next 2 steps; the last 2 rows have no full horizon
    assert swapped.labels["cpu"].tolist()[:4] == [1.0, 1.0, 0.0, 0.0]
    assert np.isnan(swapped.labels["cpu"][4:]).all()
    assert swapped.persistence["cpu"].tolist()[1:4] == [0.0, 1.0, 1.0]


def test_the_oracle_cut_is_the_lowest_cut_reaching_the_precision() -> None:
    probability = np.asarray([0.1, 0.2, 0.3, 0.6, 0.7, 0.8, 0.9])
    labels = np.asarray([0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    # at 0.7 all 3 alarms are breaches; at 0.6 precision is 3/4; at 0.3 it is 4/5
    assert oracle_cut(probability, labels) == 0.7
    assert oracle_cut(probability, labels, precision=0.8) == 0.3
    assert oracle_cut(probability, np.zeros(7)) is None


def test_rows_of_several_windows_keep_their_targets_apart() -> None:
    both = concat_rows([_rows([0.1, 2.0]), _rows([0.3, 0.4, 0.5])])
    assert len(both) == 5 and len(both.targets) == 2
    assert both.target_index.tolist() == [0, 0, 1, 1, 1]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"


def test_what_a_dead_replica_left_in_its_process_group_is_killed() -> None:
    # A replica's leader gone, its child (like vLLM's EngineCore) still running in the leader's group.
    leader = subprocess.run(
        ["sh", "-c", "sleep 120 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
        start_new_session=True,  # its own group, as the supervisor starts each replica
    )
    child = int(leader.stdout.strip())
    group = int(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[2])
    assert group != os.getpgid(0)  # never this test's own group
    log = (
        f"INFO replica chat-r1-0 started (pid {group}, port 1234)\n"
        "INFO replica chat-r1-1 started (pid 4194000, port 1)\n"  # long gone: skipped
    )
    assert not _gone(child)

    assert reap_replica_groups(log) == [group]

    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child)


def test_a_feature_with_no_value_at_all_does_not_stop_training() -> None:
    # A CPU host has no DCGM series: those feature columns are NaN in every row of a real recording.
    rng = np.random.default_rng(3)
    n = 120
    times = np.arange(n, dtype=np.float64) * 5.0
    load = np.sin(times / 80.0) + rng.normal(0, 0.1, n)
    X = np.column_stack([load, np.full(n, np.nan), rng.normal(size=n)])
    y = (load > 0.5).astype(np.int64)
    model, probabilities = fit_calibrated_cv(gbm_estimator(0, n), X, y, times, 20.0, 3)
    assert np.isfinite(probabilities).all()
    assert model.predict_proba(X)[:, 1][y == 1].mean() > model.predict_proba(X)[:, 1][y == 0].mean()
