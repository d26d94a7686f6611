"""The dataset generator is reproducible from its seed and writes what the real tier exposes."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tailguard.serving.lab.dataset import DatasetError, Segment, generate, main, make_scenario
from tailguard.serving.tier.profiles import EngineArgs, EngineProfile, Hardware

# A deliberately slow engine keeps the simulation to a few thousand steps.
SLOW = EngineProfile(
    name="slow",
    model="m",
    engineArgs=EngineArgs(max_num_seqs=8),
    hardware=Hardware(decode_step_base_s=0.05, decode_per_seq_s=0.01),
)


def _small(seed: int) -> str:
    segments = [Segment(0.0, 60.0, "slow", 2, 0.05, 0.3, 1.0, 2.0, 0.005, 0.3, 0.05)]
    return generate(seed, 60.0, segments=segments, scrape_interval_s=5.0, profiles={"slow": SLOW}).openmetrics


def test_same_seed_same_bytes_other_seed_other_bytes() -> None:
    first = _small(11)
    assert first == _small(11)
    assert first != _small(12)
    assert first.endswith("# EOF\n")


def test_exposes_the_metrics_the_features_read_with_tier_labels() -> None:
    text = _small(11)
    for name in (
        "vllm:request_queue_time_seconds_bucket",
        "vllm:request_inference_time_seconds_bucket",
        "vllm:num_requests_waiting",
        "DCGM_FI_DEV_FB_USED",
        "process_cpu_seconds_total",
        "tailguard_router_request_duration_seconds_bucket",
        "tailguard_router_proxy_overhead_seconds_count",
        "tailguard_serving_engine_arg",
    ):
        assert f"\n{name}{{" in text, name
    assert 'namespace="llm"' in text and 'service="chat"' in text and 'replica="chat-r1-1"' in text
    assert "_created" not in text


def test_scenario_is_seeded_and_covers_the_duration() -> None:
    scenario = make_scenario(7, 3600.0)
    assert scenario == make_scenario(7, 3600.0)
    assert scenario[0].start == 0.0 and scenario[-1].end == 3600.0
    assert all(a.end == b.start for a, b in itertools.pairwise(scenario))
    assert {s.profile for s in make_scenario(7, 6 * 3600.0)} > {"stable"}  # some bad rollouts


def test_profile_change_sets_how_often_the_scenario_rolls_out() -> None:
    def rollouts(segments: list[Segment]) -> int:
        return sum(1 for a, b in itertools.pairwise(segments) if a.profile != b.profile)

    assert rollouts(make_scenario(7, 6 * 3600.0, profile_change=0.0)) == 0
    assert rollouts(make_scenario(7, 6 * 3600.0, profile_change=1.0)) > rollouts(make_scenario(7, 6 * 3600.0))
    assert make_scenario(7, 3600.0, profile_change=0.3) == make_scenario(7, 3600.0)  # the default
    with pytest.raises(DatasetError, match=r"profile change probability must be in \[0, 1\], got 1.5"):
        generate(1, 60.0, profile_change=1.5)


def test_bad_duration_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(DatasetError, match="at least one scrape interval"):
        generate(1, 5.0)
    assert main(["generate", "--seed", "1", "--hours", "0", "--out", str(tmp_path)]) == 2
    assert "--hours must be positive" in capsys.readouterr().err


def test_several_services_are_independent_targets() -> None:
    segments = [Segment(0.0, 30.0, "slow", 1, 0.05, 0.2, 1.0, 1.0, 0.005, 0.005, 0.002)]
    text = generate(3, 30.0, segments=segments, scrape_interval_s=5.0, profiles={"slow": SLOW}, services=2).openmetrics
    assert 'service="chat"' in text and 'service="chat-1"' in text
    with pytest.raises(DatasetError, match="services must be at least 1"):
        generate(3, 30.0, services=0)


def _series(text: str, name: str, replica: str) -> list[tuple[float, float]]:
    """(timestamp, value) of one replica's samples of `name`, summed over its other labels, in time order."""
    summed: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and f'replica="{replica}"' in line:
            _, value, stamp = line.rsplit(" ", 2)
            summed[float(stamp)] = summed.get(float(stamp), 0.0) + float(value)
    return sorted(summed.items())


def test_a_rollout_starts_and_warms_up_before_it_takes_traffic_as_the_tier_does() -> None:
    slow2 = SLOW.model_copy(update={"name": "slow2"})
    segments = [
        Segment(0.0, 60.0, "slow", 1, 0.3, 0.3, 1.0, 1.0, 0.005, 0.005, 0.002),
        Segment(60.0, 180.0, "slow2", 1, 0.3, 0.3, 1.0, 1.0, 0.005, 0.005, 0.002),
    ]
    dataset = generate(5, 180.0, segments=segments, scrape_interval_s=5.0, profiles={"slow": SLOW, "slow2": slow2})
    text = dataset.openmetrics
    start = dataset.start
    # Deployed before the recording: up and exporting from the first scrape.
    old_up = _series(text, "up", "chat-r1-1")
    assert old_up[0][1] == 1.0 and old_up[0][0] <= start + 5.0
    # The new version's target is listed at the rollout but not scrapable for 17-48 s (up 0) ...
    new_up = _series(text, "up", "chat-r2-2")
    starting = [t for t, v in new_up if v == 0.0]
    up_from = min(t for t, v in new_up if v == 1.0)
    assert starting and min(starting) >= start + 60.0 and max(starting) < up_from
    assert 17.0 - 5.0 <= up_from - min(starting) <= 48.0 + 5.0
    # The router lists its engine args from the first listing on, as the tier's router does (summed over args,
    # so compare with the old replica's: same profile arguments here).
    limits = _series(text, "tailguard_serving_engine_arg", "chat-r2-2")
    assert limits[0][0] == min(starting)
    assert {v for _, v in limits} == {v for _, v in _series(text, "tailguard_serving_engine_arg", "chat-r1-1")}
    # ... and exports vLLM metrics only once up.
    assert min(t for t, _ in _series(text, "vllm:num_requests_running", "chat-r2-2")) == up_from
    # Meanwhile the old version keeps serving: it still finishes requests after the rollout.
    finished = dict(_series(text, "vllm:request_success_total", "chat-r1-1"))
    assert max(finished.values()) > finished[start + 65.0]
    assert "no_healthy_replica" not in text
