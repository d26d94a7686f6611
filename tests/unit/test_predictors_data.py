"""Labels, baselines, the time split and the scores: pure functions, table tests."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailguard.controller.core.model import target_key
from tailguard.controller.core.policy import Policy
from tailguard.predictors.data import (
    DataError,
    breach_labels,
    false_alarms_per_hour,
    lead_times,
    persistence_forecast,
    policy_thresholds,
    rows_from_series,
    time_split,
)
from tailguard.predictors.features import DEFAULT_SLI_THRESHOLDS, feature_names
from tailguard.predictors.modeling import choose_threshold

NAN = math.nan


@pytest.mark.parametrize(
    ("sli", "expected"),
    [
        # threshold 1.0, horizon 2 steps: label[i] = any(sli[i+1], sli[i+2] > 1)
        ([0, 0, 2, 0, 0, 0], [1, 1, 0, 0, NAN, NAN]),
        ([2, 0, 0, 0, 0], [0, 0, 0, NAN, NAN]),  # the current value never labels its own row
        ([0, NAN, 2, NAN, NAN, 0], [1, 1, NAN, 0, NAN, NAN]),  # a breach counts even among gaps
        ([0, 0, NAN, 0, 0], [0, 0, 0, NAN, NAN]),  # half the horizon present is enough for a 0
        ([0, 1.0, 1.0, 0], [0, 0, NAN, NAN]),  # at the threshold is not a breach (SLI > threshold)
    ],
)
def test_breach_labels_table(sli: list[float], expected: list[float]) -> None:
    got = breach_labels(np.asarray(sli, dtype=np.float64), 1.0, 2)
    np.testing.assert_array_equal(got, np.asarray(expected, dtype=np.float64))


def test_labels_only_look_at_the_next_horizon_and_persistence_only_at_the_past() -> None:
    rng = np.random.default_rng(1)
    sli = rng.uniform(0, 2, size=40)
    labels = breach_labels(sli, 1.0, 4)
    persistence = persistence_forecast(sli, 1.0, 4)
    for t in range(5, 30):
        changed = sli.copy()
        changed[t + 5 :] = 100.0  # beyond (t, t + H]: must not change the label at t
        changed[: t + 1] = -1.0  # the past and present: must not change the label at t either
        assert breach_labels(changed, 1.0, 4)[t] == labels[t]
        future_only = sli.copy()
        future_only[t + 1 :] = 100.0  # the future must never change what persistence predicts at t
        assert persistence_forecast(future_only, 1.0, 4)[t] == persistence[t]


def _rows(n: int = 200, step: float = 15.0, horizon: float = 60.0):  # type: ignore[no-untyped-def]
    target = target_key({"service": "chat"})
    sli = {k: 2.0 if (k // 20) % 2 else 0.5 for k in range(n)}
    fetched = {
        "request_rate": {target: {k: float(k) for k in range(n)}},
        "sli:cpu": {target: sli},
        "sli:gpu": {target: sli},
        "sli:network": {target: sli},
    }
    return rows_from_series(
        fetched,
        feature_names(),
        [target],
        1000.0,
        1000.0 + step * (n - 1),
        step,
        horizon,
        DEFAULT_SLI_THRESHOLDS | {"cpu": 1.0, "gpu": 1.0, "network": 1.0},
    )


def test_rows_put_features_at_their_own_time() -> None:
    rows = _rows()
    column = feature_names().index("request_rate")
    np.testing.assert_array_equal(rows.X[:, column], (rows.times - 1000.0) / 15.0)
    assert np.isnan(rows.X[:, feature_names().index("replicas")]).all()


def test_time_split_has_no_leakage() -> None:
    rows = _rows()
    split = time_split(rows)
    assert len(split.train) and len(split.validation) and len(split.test)
    # strictly ordered in time, and a horizon apart: no training label can see a validation/test SLI
    assert split.train.times.max() + rows.horizon_s <= split.boundaries[0] < split.validation.times.min()
    assert split.validation.times.max() + rows.horizon_s <= split.boundaries[1] < split.test.times.min()
    seen = np.concatenate([split.train.times, split.validation.times, split.test.times])
    assert len(set(seen.tolist())) == seen.shape[0]  # no row in two parts
    # the test part is the last 20% of the time range, untouched
    assert split.test.times.max() == rows.times.max()


def test_lead_times_and_false_alarms() -> None:
    rows = _rows(n=60)
    # breaches at steps 20..39; an alarm from step 17 on gives 3 steps (45 s) of lead time
    alarm = np.zeros(len(rows), dtype=bool)
    alarm[17:40] = True
    leads, misses = lead_times(rows, "cpu", alarm)
    assert leads == [45.0]
    assert misses == 0
    assert false_alarms_per_hour(rows, "cpu", alarm) == 0.0
    # an alarm far from any breach is a false alarm; no alarm before the onset is a miss
    alarm = np.zeros(len(rows), dtype=bool)
    alarm[5] = True
    leads, misses = lead_times(rows, "cpu", alarm)
    assert leads == [] and misses == 1
    hours = len(rows) * 15.0 / 3600.0
    assert false_alarms_per_hour(rows, "cpu", alarm) == pytest.approx(1 / hours)


def test_choose_threshold_prefers_precision() -> None:
    probabilities = np.array([0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9])
    labels = np.array([0, 0, 1, 0, 1, 1, 1, 1])
    cut = choose_threshold(probabilities, labels)
    alarm = probabilities >= cut
    assert (labels[alarm] == 1).mean() >= 0.9
    assert cut == pytest.approx(0.6)


def test_choose_threshold_most_recall_or_most_accuracy_at_the_precision() -> None:
    probabilities = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    labels = np.array([0, 0, 0, 1, 0, 1, 1, 1, 1])
    # 0.3: all 5 breaches at precision 5/7; 0.4: all 5 at 5/6 with one false alarm fewer (accuracy 8/9).
    assert choose_threshold(probabilities, labels, min_precision=0.7) == pytest.approx(0.3)
    assert choose_threshold(probabilities, labels, min_precision=0.7, objective="accuracy") == pytest.approx(0.4)
    with pytest.raises(ValueError, match="objective must be one of recall, accuracy"):
        choose_threshold(probabilities, labels, objective="f1")


def _policy(vars_: dict[str, str]) -> Policy:
    return Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": "sla",
            "targets": {"groupBy": ["service"]},
            "vars": vars_,
            "signals": [{"name": "p", "predict": {"model": "sla", "dimension": "cpu"}}],
            "conditions": [
                {
                    "name": "c",
                    "signal": "p",
                    "when": {"op": ">", "value": 0.8},
                    "for": 2,
                    "noData": "hold",
                    "actions": [{"type": "annotate", "text": "x"}],
                }
            ],
        }
    )


def test_policy_thresholds_from_vars_and_overrides() -> None:
    thresholds = policy_thresholds(_policy({"sla_cpu_seconds": "2.5", "sla_network_seconds": "250ms"}), {"gpu": 9.0})
    assert thresholds == {"cpu": 2.5, "gpu": 9.0, "network": 0.25}
    with pytest.raises(DataError, match="vars.sla_cpu_seconds: expected seconds or a duration"):
        policy_thresholds(_policy({"sla_cpu_seconds": "soon"}))


def test_blocked_folds_partition_the_rows_with_an_embargo() -> None:
    from tailguard.predictors.modeling import blocked_folds

    # two targets share one time grid: a time block holds both targets' rows
    times = np.concatenate([np.arange(100) * 15.0, np.arange(100) * 15.0])
    splits = blocked_folds(times, 60.0, folds=5)
    assert len(splits) == 5
    tested = np.concatenate([test for _, test in splits])
    assert sorted(tested.tolist()) == list(range(200))  # every row tested exactly once
    for train, test in splits:
        first, last = times[test].min(), times[test].max()
        assert not set(train.tolist()) & set(test.tolist())
        # no training row within one horizon of the test block (its label would see the test block)
        near = (times[train] >= first - 60.0) & (times[train] <= last + 60.0)
        assert not near.any()
        # both targets' rows at a time are in the same block
        values, counts = np.unique(times[test], return_counts=True)
        assert (counts == 2).all(), values[counts != 2]


def test_fit_calibrated_cv_scores_every_row_out_of_fold() -> None:
    from tailguard.predictors.artifact import single_threaded
    from tailguard.predictors.modeling import fit_calibrated_cv, gbm_estimator

    rng = np.random.default_rng(3)
    times = np.arange(400) * 15.0
    X = rng.normal(size=(400, 3))
    y = (X[:, 0] + 0.3 * rng.normal(size=400) > 0.3).astype(np.int64)
    with single_threaded():  # OpenMP threads spinning on a busy 2-core machine cost seconds per fit
        model, out_of_fold = fit_calibrated_cv(gbm_estimator(0), X, y, times, 60.0, folds=4)
    assert out_of_fold.shape == (400,)
    assert ((out_of_fold >= 0) & (out_of_fold <= 1)).all()
    # out-of-fold probabilities rank the labels, and the fitted model predicts in [0, 1]
    assert np.mean((out_of_fold >= 0.5) == y) > 0.8
    probabilities = model.predict_proba(X)[:, 1]
    assert ((probabilities >= 0) & (probabilities <= 1)).all()
    # a label column that one fold's training part lacks cannot be cross-validated: a clear error
    only_late = np.zeros(400, dtype=np.int64)
    only_late[390:] = 1
    with pytest.raises(ValueError, match="one class only"), single_threaded():
        fit_calibrated_cv(gbm_estimator(0), X, only_late, times, 60.0, folds=4)


def test_time_split_follows_the_data_across_a_gap() -> None:
    rows = _rows(n=40)
    # a second recorded stretch far later (a gap of hours without data between them)
    late = rows.select(np.ones(len(rows), dtype=bool))
    late.times = late.times + 10 * 3600.0
    both = rows.select(np.ones(len(rows), dtype=bool))
    both.times = np.concatenate([rows.times, late.times])
    both.target_index = np.concatenate([rows.target_index, late.target_index])
    both.X = np.vstack([rows.X, late.X])
    for name in ("sli", "labels", "persistence"):
        setattr(both, name, {d: np.concatenate([getattr(rows, name)[d], getattr(late, name)[d]]) for d in rows.sli})
    split = time_split(both, train=0.8, validation=0.0)
    # by span, 80% would put the whole second stretch in the test part; by data, most of it is trained on
    assert (split.train.times > rows.times.max()).sum() > 0
    assert len(split.test) < len(both) * 0.3


def test_choose_threshold_with_a_confidence_margin_asks_for_more_precision() -> None:
    # 100 rows at p = 0.6 (90 breaches), 50 at p = 0.9 (all breaches), 100 at p = 0.1 (none)
    probabilities = np.concatenate([np.full(100, 0.6), np.full(50, 0.9), np.full(100, 0.1)])
    labels = np.concatenate([np.r_[np.ones(90), np.zeros(10)], np.ones(50), np.zeros(100)]).astype(np.int64)
    assert choose_threshold(probabilities, labels) == pytest.approx(0.6)  # 140/150 = 0.93 >= 0.9
    # the Wilson lower bound of 140/150 at z = 1.645 is about 0.89: the margin moves the cut up
    assert choose_threshold(probabilities, labels, confidence_z=1.645) == pytest.approx(0.9)
