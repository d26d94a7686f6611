"""The backfilled history the integration tests and examples replay.

One hour of 15 s scrapes of `vllm:e2e_request_latency_seconds` (vLLM's bucket
boundaries) for three services in namespace "llm", plus gauge series whose label
values contain a quote and a backslash (PromQL escaping).

* regress: 0.2 s requests, 1.2 s from T0+1200 through T0+1800, then 0.2 s again.
* noisy:   every step mixes 0.1/0.4/0.7 s requests and < 1 % slow (1.2 s) ones, with some
           idle steps (NaN quantiles): a jumpy P99 that never exceeds 0.8 s.
* gap:     like regress from T0+1200, then no samples at all from T0+1515 to T0+1755,
           then 0.2 s requests again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tests.support.openmetrics import VLLM_E2E, VLLM_E2E_BUCKETS, HistogramPoint, OpenMetricsWriter

T0 = 1_700_000_000.0
STEP = 15.0
DURATION = 3600.0
NAMESPACE = "llm"
REQUESTS_PER_STEP = 200.0

REGRESSION_START = T0 + 1200  # first step whose requests are slow
REGRESSION_END = T0 + 1800  # last slow step
GAP_FIRST_MISSING = T0 + 1515
GAP_LAST_MISSING = T0 + 1755
GAP_SLOW_UNTIL = T0 + 1500

ESCAPE_METRIC = "tailguard_escape_probe"
# label value -> gauge value; the first one holds a quote and a backslash.
ESCAPE_SERIES = {'a"b\\c': 1.0, 'a"b': 2.0, "a\\c": 3.0, 'a\\"b\\c': 4.0, "abc": 5.0}


@dataclass(frozen=True)
class History:
    text: str
    samples: int
    start: float
    end: float


def _timestamps() -> list[float]:
    count = int(DURATION / STEP)
    return [T0 + index * STEP for index in range(count + 1)]


def _cumulative(steps: list[tuple[float, dict[float, float]]]) -> list[HistogramPoint]:
    """Turn per-step {latency: requests} into cumulative bucket points."""
    counts = [0.0] * len(VLLM_E2E_BUCKETS)
    total = 0.0
    latency_sum = 0.0
    points: list[HistogramPoint] = []
    for timestamp, requests in steps:
        for latency, added in requests.items():
            for index, bound in enumerate(VLLM_E2E_BUCKETS):
                if latency <= bound:
                    counts[index] += added
            total += added
            latency_sum += latency * added
        points.append(HistogramPoint(timestamp, list(counts), total, latency_sum))
    return points


def regress_steps() -> list[tuple[float, dict[float, float]]]:
    return [(t, {1.2 if REGRESSION_START <= t <= REGRESSION_END else 0.2: REQUESTS_PER_STEP}) for t in _timestamps()]


def gap_steps() -> list[tuple[float, dict[float, float]]]:
    steps: list[tuple[float, dict[float, float]]] = []
    for t in _timestamps():
        if GAP_FIRST_MISSING <= t <= GAP_LAST_MISSING:
            continue
        steps.append((t, {1.2 if REGRESSION_START <= t <= GAP_SLOW_UNTIL else 0.2: REQUESTS_PER_STEP}))
    return steps


def noisy_steps(seed: int = 7) -> list[tuple[float, dict[float, float]]]:
    rng = random.Random(seed)
    steps: list[tuple[float, dict[float, float]]] = []
    for index, t in enumerate(_timestamps()):
        if index > 4 and rng.random() < 0.06:
            steps.append((t, {}))  # idle step
            continue
        fast = [rng.choice((0.1, 0.4, 0.7)) for _ in range(4)]
        mix = {latency: 0.0 for latency in fast}
        for latency in fast:
            mix[latency] += REQUESTS_PER_STEP / 4
        # At most 0.5 % slow: the P99 of any window stays in the (0.5, 0.8] bucket.
        mix[1.2] = float(rng.choice((0, 0, 1)))
        steps.append((t, mix))
    return steps


def build_history() -> History:
    writer = OpenMetricsWriter()
    for service, steps in (("regress", regress_steps()), ("noisy", noisy_steps()), ("gap", gap_steps())):
        labels = {"namespace": NAMESPACE, "service": service, "model_name": "tiny", "engine": "0"}
        writer.histogram(VLLM_E2E, labels, VLLM_E2E_BUCKETS, _cumulative(steps))
    for value_label, value in ESCAPE_SERIES.items():
        writer.gauge(
            ESCAPE_METRIC,
            {"service": value_label, "namespace": NAMESPACE},
            [(t, value) for t in _timestamps()],
        )
    return History(writer.render(), writer.sample_count, T0, T0 + DURATION)
