"""OpenMetrics text for backfilling Prometheus with promtool.

Timestamps are in seconds (milliseconds would land in year 58,900), samples of a
series ascend in time (promtool drops out-of-order samples silently), `le` is
written the way client_python writes it ("0.3", "1.0", "+Inf"), and the text ends
with `# EOF`. `sample_count` is what promtool must report back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tailguard.serving.tier.vllm_metrics import LATENCY_BUCKETS

# vllm:e2e_request_latency_seconds bucket boundaries: the simulator's, which a test checks against a real
# vLLM 0.32 /metrics page (tests/fixtures/vllm-0.32-cpu-metrics.txt).
VLLM_E2E_BUCKETS: tuple[float, ...] = tuple(LATENCY_BUCKETS)
VLLM_E2E = "vllm:e2e_request_latency_seconds"


def format_le(bound: float) -> str:
    """client_python's floatToGoString for bucket bounds: 0.3 -> "0.3", 1 -> "1.0", inf -> "+Inf"."""
    if math.isinf(bound):
        return "+Inf" if bound > 0 else "-Inf"
    return repr(float(bound))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Mapping[str, str], extra: tuple[str, str] | None = None) -> str:
    items = sorted(labels.items())
    if extra is not None:
        items.append(extra)
    if not items:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in items) + "}"


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _time(timestamp: float) -> str:
    if timestamp > 1e11:
        raise ValueError(f"timestamp {timestamp} looks like milliseconds; OpenMetrics wants seconds")
    return f"{timestamp:.3f}".rstrip("0").rstrip(".")


@dataclass
class HistogramPoint:
    timestamp: float
    bucket_counts: Sequence[float]  # cumulative, one per finite bound (+Inf is `count`)
    count: float
    sum: float


@dataclass
class _Family:
    name: str
    kind: str
    series: dict[tuple[tuple[str, str], ...], list[str]] = field(default_factory=dict)
    samples: int = 0


class OpenMetricsWriter:
    """Collects families of histogram and gauge series, then renders one OpenMetrics document."""

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}

    def _family(self, name: str, kind: str) -> _Family:
        family = self._families.setdefault(name, _Family(name, kind))
        if family.kind != kind:
            raise ValueError(f"{name} is already a {family.kind}, not a {kind}")
        return family

    def gauge(self, name: str, labels: Mapping[str, str], points: Iterable[tuple[float, float]]) -> None:
        self._series(name, "gauge", name, labels, points)

    def counter(self, name: str, labels: Mapping[str, str], points: Iterable[tuple[float, float]]) -> None:
        """A counter family `name`: its samples are `name_total` (OpenMetrics)."""
        self._series(name, "counter", f"{name}_total", labels, points)

    def _series(
        self, name: str, kind: str, sample: str, labels: Mapping[str, str], points: Iterable[tuple[float, float]]
    ) -> None:
        """One series of family `name` (`kind`), its samples named `sample`, in ascending time."""
        family = self._family(name, kind)
        lines = family.series.setdefault(tuple(sorted(labels.items())), [])
        last = -math.inf
        for timestamp, value in points:
            if timestamp <= last:
                raise ValueError(f"{name}{_labels(labels)}: timestamps must ascend ({timestamp} after {last})")
            last = timestamp
            lines.append(f"{sample}{_labels(labels)} {_number(value)} {_time(timestamp)}")
            family.samples += 1

    def histogram(
        self, name: str, labels: Mapping[str, str], bounds: Sequence[float], points: Iterable[HistogramPoint]
    ) -> None:
        family = self._family(name, "histogram")
        lines = family.series.setdefault(tuple(sorted(labels.items())), [])
        last = -math.inf
        for point in points:
            if point.timestamp <= last:
                raise ValueError(f"{name}{_labels(labels)}: timestamps must ascend")
            last = point.timestamp
            if len(point.bucket_counts) != len(bounds):
                raise ValueError(f"{len(point.bucket_counts)} bucket counts for {len(bounds)} bounds")
            at = _time(point.timestamp)
            for bound, count in zip(bounds, point.bucket_counts, strict=True):
                lines.append(f"{name}_bucket{_labels(labels, ('le', format_le(bound)))} {_number(count)} {at}")
            lines.append(f"{name}_bucket{_labels(labels, ('le', '+Inf'))} {_number(point.count)} {at}")
            lines.append(f"{name}_count{_labels(labels)} {_number(point.count)} {at}")
            lines.append(f"{name}_sum{_labels(labels)} {_number(point.sum)} {at}")
            family.samples += len(bounds) + 3

    @property
    def sample_count(self) -> int:
        return sum(family.samples for family in self._families.values())

    def render(self) -> str:
        out: list[str] = []
        for family in self._families.values():
            out.append(f"# TYPE {family.name} {family.kind}")
            for lines in family.series.values():
                out.extend(lines)
        out.append("# EOF")
        return "\n".join(out) + "\n"


def latency_histogram_points(
    timestamps: Sequence[float],
    requests_per_step: Callable[[float], float],
    latency_at: Callable[[float], float],
    bounds: Sequence[float] = VLLM_E2E_BUCKETS,
) -> list[HistogramPoint]:
    """Cumulative histogram points where every request in a step takes `latency_at(t)` seconds.

    A step with `requests_per_step(t) == 0` adds nothing (rate() is then 0 and histogram_quantile NaN).
    """
    counts = [0.0] * len(bounds)
    total = 0.0
    latency_sum = 0.0
    points: list[HistogramPoint] = []
    for timestamp in timestamps:
        added = requests_per_step(timestamp)
        latency = latency_at(timestamp)
        if added:
            for index, bound in enumerate(bounds):
                if latency <= bound:
                    counts[index] += added
            total += added
            latency_sum += added * latency
        points.append(HistogramPoint(timestamp, list(counts), total, latency_sum))
    return points
