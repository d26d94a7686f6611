"""RangeGrid (adapters/metrics/grid.py): Prometheus' matrix parsed onto the evaluation grid in bulk is exactly the
dict path (on_grid(matrix_result(...), times)), sample for sample, NaN, +Inf, off-grid and missing samples included; the
same errors; at(i) is RangeResult.at(times[i])."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tailguard.controller.adapters.metrics.grid import on_grid
from tailguard.controller.adapters.metrics.prometheus import matrix_grid, matrix_result
from tailguard.controller.core.model import target_key
from tailguard.controller.core.policy import Threshold

TIMES = tuple(round(1_700_000_000.5 + i * 15.0, 3) for i in range(8))
DATA: list[dict[str, Any]] = [
    {
        "metric": {"service": "a", "pod": "x"},
        "values": [
            [1_700_000_000.5, "0.25"],
            [1_700_000_015.5, "NaN"],
            [1_700_000_030.5, "+Inf"],
            [1_700_000_045.5, "7"],
        ],
    },
    {
        # off the grid (a different step), before it and after it: ignored, as RangeResult.at ignores them
        "metric": {"service": "b"},
        "values": [[1_700_000_000.0, "1"], [1_700_000_060.5, "-Inf"], [1_700_000_075.5, "0.5"], [1_700_009_999, "3"]],
    },
    {"metric": {"service": "c"}, "values": []},
]


def _same(left: Any, right: Any) -> bool:
    return all(
        (math.isnan(a) and math.isnan(b)) if isinstance(a, float) and math.isnan(a) else a == b
        for a, b in zip(left, right, strict=True)
    )


def test_bulk_parse_is_the_dict_path_on_the_grid() -> None:
    fast = matrix_grid(DATA, ["service"], TIMES, 15.0)
    slow = on_grid(matrix_result(DATA, ["service"]), TIMES)
    assert fast.targets == slow.targets == tuple(target_key({"service": s}) for s in "abc")
    assert (fast.present == slow.present).all()
    assert np.array_equal(fast.values, slow.values, equal_nan=True)
    assert fast.present.sum() == 6  # a: 4 on the grid; b: 60.5 and 75.5
    result = matrix_result(DATA, ["service"])
    for i, at in enumerate(TIMES):
        expected = result.at(at).values
        got = fast.at(i).values
        assert list(got) == list(expected)
        assert _same(list(got.values()), list(expected.values()))
    a = target_key({"service": "a"})
    assert math.isnan(fast.at(2).values[a])  # +Inf is no-data, as in instant queries
    healthy = fast.healthy(Threshold.model_validate({"op": ">", "value": 5}))
    assert healthy[:, 0].tolist() == [True, False, False, False, False, False, False, False]  # NaN, Inf, 7 > 5


def test_bulk_parse_errors_are_the_dict_paths() -> None:
    duplicate = [{"metric": {"service": "a", "pod": str(n)}, "values": [[TIMES[0], "1"]]} for n in range(2)]
    missing = [{"metric": {"pod": "x"}, "values": [[TIMES[0], "1"]]}]
    malformed = [{"metric": {"service": "a"}, "values": [[TIMES[0]]]}]
    for data in (duplicate, missing, malformed, "scalar"):
        fast = matrix_grid(data, ["service"], TIMES, 15.0)
        slow = matrix_result(data, ["service"])
        assert fast.error is not None and slow.error is not None
        if data is not malformed:
            assert fast.error == slow.error
        assert fast.at(0).error == fast.error
