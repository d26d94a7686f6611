"""Per-onset scoring on recorded history (tailguard.predictors.onset_leads) and the harness's protocol checks
(tailguard.serving.lab.recording_onsets): overlapping training and evaluated history is refused before anything is read,
onsets and calm stretches come from a recording's metadata, and each onset's lead is measured from the first alarm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tailguard.predictors.onset_leads import (
    Episode,
    Stretch,
    calm_false_alarms,
    onset_result,
    pool_method_summaries,
    score_alarms,
)
from tailguard.serving.lab import transfer
from tailguard.serving.lab.recording import Recording, load_scenario, sliced_openmetrics, tier_document
from tailguard.serving.lab.recording_onsets import (
    Experiment,
    Segment,
    check_disjoint,
    episodes_and_calm,
    plan_experiments,
    run_experiment,
)
from tailguard.serving.lab.surge_protocol import ProtocolError

HORIZON = 60.0
ROLLOUT = Path(__file__).resolve().parents[2] / "serving" / "lab" / "recordings" / "vllm-cpu-2026-12-01-rollout"


def test_overlapping_training_and_evaluated_history_is_refused() -> None:
    evaluated = [Segment("new", "eval", 1000.0, 2000.0)]
    with pytest.raises(ProtocolError, match="overlap"):
        check_disjoint([Segment("new", "train", 1500.0, 2500.0)], evaluated, HORIZON)
    with pytest.raises(ProtocolError, match="overlap"):
        check_disjoint([Segment("new", "train", 0.0, 3000.0)], evaluated, HORIZON)


def test_training_history_ending_within_a_horizon_before_the_evaluated_one_is_refused() -> None:
    # Its last labels look 60 s ahead, into the evaluated rows.
    evaluated = [Segment("new", "eval", 1000.0, 2000.0)]
    with pytest.raises(ProtocolError, match="horizon"):
        check_disjoint([Segment("new", "train", 0.0, 970.0)], evaluated, HORIZON)
    check_disjoint([Segment("new", "train", 0.0, 940.0)], evaluated, HORIZON)
    check_disjoint([Segment("old", "train", 2000.0 + 1.0, 2600.0)], evaluated, HORIZON)


def test_an_overlapping_experiment_is_refused_before_any_row_is_read_or_model_fitted() -> None:
    experiment = Experiment("leaky", (Segment("new", "train", 0.0, 1500.0),), Segment("new", "eval", 1000.0, 2000.0))
    settings = transfer.Settings({"namespace": "llm"}, ["service"], 5.0, HORIZON, {"cpu": 1.0}, 10.0)
    with pytest.raises(ProtocolError):
        run_experiment(experiment, {}, settings)


def _meta() -> dict[str, object]:
    t0 = 10_000.0
    phases = [
        {"start_at": t0, "end_at": t0 + 100, "rate_from": 3, "rate_to": 3},
        {"start_at": t0 + 100, "end_at": t0 + 150, "rate_from": 7, "rate_to": 7, "onset": "sudden"},
        {"start_at": t0 + 150, "end_at": t0 + 400, "rate_from": 3, "rate_to": 3},
        {"start_at": t0 + 400, "end_at": t0 + 490, "rate_from": 3, "rate_to": 8, "onset": "ramp"},
        {"start_at": t0 + 490, "end_at": t0 + 505, "rate_from": 8, "rate_to": 3},
        {"start_at": t0 + 505, "end_at": t0 + 700, "rate_from": 3, "rate_to": 3},
    ]
    actions = [
        {"action": "rollout", "status": 200, "sent_at": t0 + 5, "answered_at": t0 + 5.1},
        {"action": "promote", "status": 200, "sent_at": t0 + 250, "answered_at": t0 + 251},
        {"action": "rollback", "status": 200, "sent_at": t0 + 341, "answered_at": t0 + 341.2},
        {"action": "promote", "skipped": "the newest version never served", "at_s": 600},
    ]
    return {"started_at": t0, "ended_at": t0 + 700, "phases": phases, "actions": actions}


def test_onsets_rollouts_and_calm_stretches_come_from_the_recordings_metadata() -> None:
    episodes, calm, rollouts = episodes_and_calm(_meta())
    t0 = 10_000.0
    assert [(e.name, e.shape, e.onset - t0, e.end - t0) for e in episodes] == [
        ("surge 1", "sudden", 100.0, 251.0),
        ("bad config 1", "bad-config", 251.0, 400.0),
        ("surge 2", "ramp", 400.0, 700.0),
    ]
    assert rollouts == [{"name": "bad config 1", "promoted_at": t0 + 251, "rolled_back_at": t0 + 341, "note": ""}]
    # Calm: the base-rate phases without an onset, less the bad config's time (to 60 s after its rollback); the
    # ramp's way down (8x -> 3x) is not calm. A skipped promote is no rollout.
    assert [(c.start - t0, c.end - t0) for c in calm] == [(0.0, 100.0), (150.0, 251.0), (505.0, 700.0)]


def _series(times: np.ndarray, over: tuple[float, float]) -> np.ndarray:
    return np.where((times >= over[0]) & (times < over[1]), 5.0, 0.2)


TIMES = np.arange(0.0, 1200.0, 5.0)


def test_lead_is_measured_from_the_first_alarm_to_the_first_violation_and_to_the_onset() -> None:
    sli = _series(TIMES, (300.0, 400.0))
    episode = Episode("surge 1", "surge", "sudden", 280.0, 600.0)
    alarm = (TIMES >= 260.0) & (TIMES < 420.0)
    result = onset_result(TIMES, sli, 1.0, alarm, episode, HORIZON)
    assert (result.outcome, result.violation_s, result.lead_to_violation_s, result.lead_to_onset_s) == (
        "warned",
        20.0,
        40.0,
        20.0,
    )
    late = onset_result(TIMES, sli, 1.0, (TIMES >= 330.0) & (TIMES < 420.0), episode, HORIZON)
    assert (late.outcome, late.lead_to_violation_s, late.lead_to_onset_s) == ("late", -30.0, -50.0)
    missed = onset_result(TIMES, sli, 1.0, np.zeros(TIMES.shape, dtype=bool), episode, HORIZON)
    assert (missed.outcome, missed.lead_to_violation_s) == ("missed", None)


def test_an_alarm_long_before_the_onset_is_not_a_lead_and_a_backlog_at_the_onset_is_no_clean_onset() -> None:
    sli = _series(TIMES, (300.0, 400.0))
    episode = Episode("surge 1", "surge", "sudden", 280.0, 600.0)
    early = (TIMES >= 100.0) & (TIMES < 150.0)  # ended more than a horizon before the onset
    assert onset_result(TIMES, sli, 1.0, early, episode, HORIZON).outcome == "missed"
    stuck = TIMES >= 100.0  # on since long before: counted from the window's start and marked
    result = onset_result(TIMES, sli, 1.0, stuck, episode, HORIZON)
    assert (result.alarm_s, result.alarm_already_on) == (-60.0, True)
    draining = Episode("surge 2", "surge", "ramp", 350.0, 600.0)
    assert onset_result(TIMES, sli, 1.0, stuck, draining, HORIZON).outcome == "breaching at onset"
    # Under the threshold at the onset but over it 20 s before: still no clean onset.
    recovered = Episode("surge 3", "surge", "sudden", 420.0, 600.0)
    assert onset_result(TIMES, sli, 1.0, stuck, recovered, HORIZON).outcome == "breaching at onset"


def test_calm_false_alarms_count_alarm_episodes_in_calm_stretches_not_followed_by_a_violation() -> None:
    sli = _series(TIMES, (700.0, 800.0))
    alarm = np.zeros(TIMES.shape, dtype=bool)
    alarm[(TIMES >= 100.0) & (TIMES < 120.0)] = True  # calm, nothing follows: false
    alarm[(TIMES >= 200.0) & (TIMES < 210.0)] = True  # calm, nothing follows: false
    alarm[(TIMES >= 650.0) & (TIMES < 720.0)] = True  # calm start, the violation follows: true
    alarm[(TIMES >= 1000.0) & (TIMES < 1010.0)] = True  # outside the calm stretches: not counted
    false, hours, share = calm_false_alarms(TIMES, sli, 1.0, alarm, [Stretch(0.0, 690.0)], HORIZON)
    assert (false, hours, share) == (2, 690.0 / 3600.0, 14 / 138)  # 4 + 2 + 8 alarming rows of 138 calm rows
    scored = score_alarms(
        TIMES,
        sli,
        1.0,
        {"rule": alarm},
        [Episode("s", "surge", "sudden", 690.0, 900.0)],
        [Stretch(0.0, 690.0)],
        HORIZON,
    )
    summary = scored["rule"]["summary"]
    assert summary["outcomes"] == {"warned": 1}
    assert summary["lead_to_violation_s"]["p50"] == 50.0  # alarm at 650 s, violation at 700 s
    assert summary["calm_false_alarms_per_hour"] == pytest.approx(2 / (690.0 / 3600.0))


def test_an_alarm_stuck_on_through_a_calm_stretch_is_a_false_alarm_and_shows_in_the_calm_share() -> None:
    sli = _series(TIMES, (900.0, 1000.0))
    stuck = (TIMES >= 0.0) & (TIMES < 600.0)  # on from before the calm stretch, through it
    false, _, share = calm_false_alarms(TIMES, sli, 1.0, stuck, [Stretch(100.0, 500.0)], HORIZON)
    assert (false, share) == (1, 1.0)


def test_a_full_rollout_takes_the_traffic_when_its_version_first_serves_all_of_it() -> None:
    # The 2026-12-01 rollout recording: rolled out at 120 s, its replicas cold-started until 654 s, rolled back
    # at 840 s; the calm stretch before it counts, the time after it (a parked replica draining) does not.
    meta = json.loads((ROLLOUT / "recording.json").read_text(encoding="utf-8"))
    started = meta["started_at"]
    episodes, calm, rollouts = episodes_and_calm(meta)
    assert [(e.shape, round(e.onset - started)) for e in episodes] == [("bad-config", 654)]
    assert [round(r["rolled_back_at"] - started) for r in rollouts] == [840]
    assert [(round(c.start - started), round(c.end - started)) for c in calm] == [(0, 654)]


RECORDINGS = Path(__file__).resolve().parents[2] / "serving" / "lab" / "recordings"
ONSETS = RECORDINGS / "vllm-cpu-2026-12-06-onsets"
ROLLOUTS = RECORDINGS / "vllm-cpu-2026-12-06-rollouts"


@pytest.mark.parametrize("directory", [ONSETS, ROLLOUTS], ids=lambda d: d.name)
def test_a_committed_2026_12_06_recording_loads_with_its_onsets_rollouts_and_load(directory: Path) -> None:
    recording = Recording.load(directory)
    assert recording.history.exists() and recording.history.suffix == ".xz"
    assert recording.history.stat().st_size < 5 * 2**20
    assert (directory / "README.md").exists()
    meta = recording.meta
    assert all(r["rolled_back_at"] > r["took_traffic_at"] for r in meta["rollouts"])
    assert len(meta["load_average"]) >= (recording.end - recording.start) / 60 - 1
    episodes, calm, rollouts = episodes_and_calm(meta)
    assert sum(e.kind == "surge" for e in episodes) == len(meta["onsets"]) and len(rollouts) == len(meta["rollouts"])
    assert all(recording.start <= c.start < c.end <= recording.end for c in calm)
    scenario = load_scenario(directory / "scenario.json")
    assert sum(p.onset is not None for p in scenario.phases) == len(meta["onsets"])
    # The first lines name the families the features read.
    types = [line for line in sliced_openmetrics(recording.history, 0, 0) if line.startswith("# TYPE")]
    assert {"vllm:request_queue_time_seconds", "vllm:num_requests_waiting"} <= {line.split()[2] for line in types}


def test_the_committed_real_vllm_recordings_together_hold_ten_surge_onsets_and_three_bad_config_rollouts() -> None:
    # Issue 27, item 4. The onset recording has 10 surge onsets and 1 bad config that took the traffic (its other two
    # canaries' cold starts outran their slots on the loaded host, its README "What went wrong"); the rollout
    # recording adds bad configs promoted at known seconds, and surges with 4 minutes of calm after each.
    metas = [Recording.load(directory).meta for directory in (ONSETS, ROLLOUTS)]
    onsets = [o for meta in metas for o in meta["onsets"]]
    rollouts = [r for meta in metas for r in meta["rollouts"]]
    assert len(onsets) >= 10 and {o["shape"] for o in onsets} == {"sudden", "ramp", "two-steps"}
    assert len(rollouts) >= 3
    # Each rollout is a promote the tier answered (a known second), rolled back after serving 60-180 s.
    assert all(60 <= r["rolled_back_at"] - r["took_traffic_at"] <= 180 for r in rollouts)


def test_pooled_scores_count_every_onset_and_leads_only_over_clean_ones() -> None:
    def onset(outcome: str, lead: float | None) -> dict[str, object]:
        return {"outcome": outcome, "lead_to_violation_s": lead, "lead_to_onset_s": lead}

    first = {
        "onsets": [onset("warned", 10.0), onset("breaching at onset", 99.0)],
        "summary": {"calm_false_alarms": 1, "calm_hours": 0.5, "calm_alarm_share": 0.2},
    }
    carried = {**onset("warned", 120.0), "alarm_already_on": True}  # on through the calm: no lead
    second = {
        "onsets": [onset("late", -5.0), onset("missed", None), onset("warned", 30.0), carried],
        "summary": {"calm_false_alarms": 0, "calm_hours": 1.5, "calm_alarm_share": 0.0},
    }
    pooled = pool_method_summaries([first, second])
    assert pooled["episodes"] == 6 and pooled["alarm_already_on"] == 1
    assert pooled["outcomes"] == {"warned": 3, "breaching at onset": 1, "late": 1, "missed": 1}
    assert pooled["lead_to_violation_s"]["count"] == 3 and pooled["lead_to_violation_s"]["p50"] == 10.0
    assert pooled["calm_false_alarms_per_hour"] == pytest.approx(0.5)
    assert pooled["calm_alarm_share"] == pytest.approx(0.05)


def _recording(name: str, t0: float) -> Recording:
    """_meta()'s recording moved to start at t0."""
    meta: dict[str, Any] = json.loads(json.dumps(_meta()))
    shift = t0 - meta["started_at"]
    for phase in meta["phases"]:
        phase["start_at"] += shift
        phase["end_at"] += shift
    for action in meta["actions"]:
        for key in ("sent_at", "answered_at"):
            if key in action:
                action[key] += shift
    meta["started_at"], meta["ended_at"] = t0, t0 + 700
    return Recording(Path(name), Path(name) / "history.om.xz", t0, t0 + 700, meta)


def test_each_evaluated_recording_is_also_evaluated_by_a_model_trained_on_the_other_and_none_shares_history() -> None:
    onsets, rollouts = _recording("onsets", 100_000.0), _recording("rollouts", 200_000.0)
    earlier = [_recording("old", 10_000.0), _recording("old-rollout", 20_000.0)]
    experiments = plan_experiments([onsets, rollouts], earlier, [(101, (0.0, 3600.0))])
    for experiment in experiments:
        check_disjoint(experiment.train, [experiment.evaluated], HORIZON)
    crossed = {
        e.evaluated.source: {s.source for s in e.train}
        for e in experiments
        if e.family == "real 2026-12-01 + the other 2026-12-06 recording"
    }
    assert crossed == {"onsets": {"old", "old-rollout", "rollouts"}, "rollouts": {"old", "old-rollout", "onsets"}}
    # Its own first part trains only for its second part, which starts a horizon after that part ends.
    split = [e for e in experiments if e.evaluated.source == "rollouts" and e.evaluated.start > rollouts.start]
    assert len(split) == 1 and max(s.end for s in split[0].train if s.source == "rollouts") < split[0].evaluated.start
    held = [e for e in experiments if e.evaluated.source == "old-rollout"]
    assert len(held) == 1 and {"onsets", "rollouts", "old"} <= {s.source for s in held[0].train}


def test_the_rollout_scenario_gives_each_canary_minutes_to_cold_start_and_the_tier_a_longer_startup_timeout() -> None:
    # The onset recording's canaries outran their slots and the tier's 900 s startup timeout killed one mid-start.
    scenario = load_scenario(ROLLOUTS / "scenario.json")
    assert tier_document(scenario, Path("python"), Path("model"))["vllm"]["startup_timeout_s"] == 1500
    actions = sorted(scenario.actions, key=lambda a: a.at_s)
    promotes = [i for i, a in enumerate(actions) if a.action == "promote"]
    assert len(promotes) == 3
    for index in promotes:
        rollout = max(i for i in range(index) if actions[i].action == "rollout")
        assert actions[rollout].canary_weight == 1 and actions[rollout].engine_args == {"max_num_seqs": 1}
        # Its canary has 145 s or more from its scripted rollout to the promote (which waits 90 s more if needed).
        assert actions[index].at_s - actions[rollout].at_s >= 145
    # Each surge is followed by 4 minutes of calm at the base rate (3 minutes for the last) before anything else.
    phases = sorted(scenario.phases, key=lambda p: p.start_s)
    for i, phase in enumerate(phases):
        if phase.onset is not None:
            calm = next(p for p in phases[i + 1 :] if p.rate_from == p.rate_to == 3)
            assert calm.end_s - calm.start_s >= 200
