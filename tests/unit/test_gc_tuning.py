"""`tailguard run` raises the garbage collector's first-generation threshold (controller/kit/gc_tuning.py), and
never lowers one that is already higher."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tailguard.controller.kit.gc_tuning import YOUNG_THRESHOLD, tune_for_long_running


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_the_first_generation_threshold_is_raised_and_the_others_kept(thresholds: tuple[int, int, int]) -> None:
    gc.set_threshold(700, 10, 10)
    assert tune_for_long_running() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)


def test_a_higher_threshold_is_never_lowered(thresholds: tuple[int, int, int]) -> None:
    gc.set_threshold(YOUNG_THRESHOLD * 2, 20, 5)
    assert tune_for_long_running() == (YOUNG_THRESHOLD * 2, 20, 5)
