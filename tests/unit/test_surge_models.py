"""tailguard.serving.lab.surge_models' pure parts: when a rule acts on a calm trace, and the comparison against the best
reactive controller on the same runs."""

from __future__ import annotations

from typing import Any

import numpy as np

from tailguard.serving.lab.surge_models import (
    alarm_times,
    baseline_records,
    comparison,
    open_loop_calm,
    score_calm_trace,
)


def test_alarm_times_need_the_hold_and_respect_the_cooldown() -> None:
    times = [15.0 * k for k in range(14)]
    firing = [False, True, False, True, True, True, True, False, True, True, True, True, True, True]
    # Two consecutive evaluations at 60 s; every later streak is inside the 120 s cooldown until 180 s.
    assert alarm_times(times, firing, 2, 120.0) == [60.0, 180.0]
    assert alarm_times(times, firing, 1, 15.0) == [t for t, fires in zip(times, firing, strict=True) if fires]
    assert alarm_times(times, [False] * 14, 1, 0.0) == []


class _Model:
    """A model whose probability is the first feature (predict_proba's contract)."""

    def predict_proba(self, X: Any) -> Any:
        return np.column_stack([1 - X[:, 0], X[:, 0]])


def test_a_target_missing_most_features_gets_no_alarm_and_nan_engine_counts_are_not_load() -> None:
    from tailguard.predictors.artifact import ModelArtifact
    from tailguard.predictors.features import feature_hash, feature_names

    names = feature_names()
    artifact = ModelArtifact(
        models={"cpu": _Model()},
        feature_names=names,
        feature_hash=feature_hash(),
        horizon_s=90.0,
        thresholds={"cpu": 1.0},
        decision_thresholds={"cpu": 0.5},
        sklearn_version="1.9",
        trained_window=(0.0, 1.0),
        created_at=0.0,
    )
    X = np.full((4, len(names)), 0.9)
    X[2:, 1:] = np.nan  # the last two evaluations miss nearly every feature: no prediction, not a 0.9
    peaks: dict[str, float] = {}
    alarms = score_calm_trace(X, [0.0, 15.0, 30.0, 45.0], [10.0, np.nan, 60.0, np.nan], {"m": (artifact, 0.5)}, peaks)
    assert alarms["predictive-m"] == [15.0]
    assert alarms["concurrency-rule"] == [30.0] and alarms["hpa-concurrency-48"] == [30.0]
    assert peaks["in_engine_per_replica"] == 60.0


def _run(controller: str, seed: int, shape: str, violation: float, replicas: float, scale_outs: int = 1) -> Any:
    trace = "calm" if shape == "calm" else "surge"
    summary = {
        "controller": controller,
        "seed": seed,
        "trace": trace,
        "shape": shape,
        "minutes": 10.0,
        "slo_violation_minutes": violation,
        "replica_minutes": replicas,
        "scale_outs": scale_outs if trace == "surge" else 0,
        "scale_outs_before_onset": 0,
    }
    lead = (
        None if trace == "calm" else {"seed": seed, "shape": shape, "first_action_s": 10.0, "first_violation_s": 60.0}
    )
    return {"summary": summary, "lead": lead, "protocol": True}


def test_targets_compare_with_the_best_reactive_controller_on_the_same_runs() -> None:
    records = [
        _run("hpa-a", 1, "sudden", 2.0, 20.0),
        _run("hpa-a", 2, "sudden", 4.0, 20.0),
        _run("hpa-b", 1, "sudden", 1.0, 30.0),
        _run("hpa-b", 2, "sudden", 1.0, 30.0),
        _run("predictive-x", 1, "sudden", 0.5, 31.0),  # only seed 1 so far
        _run("predictive-x", 1, "sudden", 9.0, 99.0),  # a repeated run: the first one counts
    ]
    calm = [{"seed": 1001, "minutes": 60.0, "alarms_s": {"predictive-x": [30.0], "hpa-b": []}, "peaks": {}}]
    figures = comparison(records, {"x": 0.7}, open_loop_calm(calm))
    assert figures["best_reactive"] == "hpa-b"
    entry = figures["targets"]["predictive-x"]
    assert entry["paired_runs"] == 1
    assert entry["best_reactive_on_these_runs"] == {"violation_minutes": 1.0, "replica_minutes": 30.0}
    assert entry["violation_reduction"] == 0.5
    assert entry["extra_replica_minutes"] == round(31.0 / 30.0 - 1.0, 3)
    assert entry["false_scale_outs_per_calm_hour"] == 1.0  # one alarm in the one open-loop calm hour
    assert entry["median_lead_to_violation_s"] == 50.0
    assert entry["met"] == {"violations": True, "replica_minutes": True, "false_alarms": False, "lead": True}
    assert entry["meets_all"] is False


def test_an_earlier_surge_report_becomes_run_records_without_its_model() -> None:
    report = {
        "runs": [
            _run("hpa-a", 1, "sudden", 2.0, 20.0)["summary"],
            _run("predictive", 1, "sudden", 3.0, 9.0)["summary"],
        ],
        "leads": {
            "hpa-a": [{"seed": 1, "shape": "sudden", "first_action_s": 5.0, "first_violation_s": 20.0, "outcome": "x"}]
        },
    }
    records = baseline_records(report)
    assert [r["summary"]["controller"] for r in records] == ["hpa-a"]
    assert records[0]["lead"] == {"seed": 1, "shape": "sudden", "first_action_s": 5.0, "first_violation_s": 20.0}
