"""Whether the controller can see (issue 24, item 1): a health model per source (Prometheus, change tracking),
fed by every evaluation, pure data.

Each evaluation of a policy is one reading of each source it used: how many of its queries the source answered and
how many failed as an outage (a query the source refused as bad data is the policy's error, not the source's, and
counts as answered). A source is

- `up`: the last reading of every policy that uses it had no failure;
- `degraded`: some policies' last readings had failures, and not all of them failed everything;
- `blind`: the last reading of every policy that uses it failed every query: the controller sees nothing there.

`since` is when the source entered its current status (a transition starts a new `since`), `lastError` the most
recent failure with its time, `affected` the policies whose last reading failed (blind ones first). A source error
is never a breach: the engine holds its targets (the policy's `noData` / `maxSourceErrors`); this model is what the
status page, `tailguard status`, /metrics and the WARNING log lines say about it.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from tailguard.controller.core.model import SignalResult

PROMETHEUS = "prometheus"
CHANGE_TRACKING = "change-tracking"
SOURCE_TITLES = {PROMETHEUS: "Prometheus", CHANGE_TRACKING: "change tracking"}


class SourceStatus(StrEnum):
    UP = "up"
    DEGRADED = "degraded"
    BLIND = "blind"


@dataclass(frozen=True)
class SourceReading:
    """One evaluation of `policy` at `at`: `queried` requests to the source, `failed` of them failed as an outage
    (`error`: the first failure's message)."""

    source: str
    policy: str
    at: float
    queried: int
    failed: int
    error: str | None = None

    @property
    def blind(self) -> bool:
        return self.queried > 0 and self.failed >= self.queried


@dataclass(frozen=True)
class SourceHealth:
    source: str
    status: SourceStatus = SourceStatus.UP
    since: float | None = None  # None: no reading yet
    last_error: str | None = None
    last_error_at: float | None = None
    last_success_at: float | None = None
    readings: Mapping[str, SourceReading] = field(default_factory=dict)  # the last reading per policy

    @property
    def affected(self) -> tuple[str, ...]:
        """The policies whose last reading failed: the blind ones first, each group by name."""
        failing = [r for r in self.readings.values() if r.failed]
        return tuple(r.policy for r in sorted(failing, key=lambda r: (not r.blind, r.policy)))

    def title(self) -> str:
        return SOURCE_TITLES.get(self.source, self.source)

    def summary(self) -> str:
        """One line: 'BLIND since 14:02:05Z: Prometheus unreachable (3 policies: a, b, c): <last error>'."""
        if self.status is SourceStatus.UP:
            return f"{self.title()} up" + (f" since {_clock(self.since)}" if self.since is not None else "")
        what = "unreachable" if self.status is SourceStatus.BLIND else "failing for some queries"
        affected = self.affected
        policies = f" ({len(affected)} {'policy' if len(affected) == 1 else 'policies'}: {', '.join(affected)})"
        error = f": {self.last_error}" if self.last_error else ""
        return f"{self.status.value.upper()} since {_clock(self.since)}: {self.title()} {what}{policies}{error}"

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "title": self.title(),
            "status": self.status.value,
            "since": self.since,
            "lastError": self.last_error,
            "lastErrorAt": self.last_error_at,
            "lastSuccessAt": self.last_success_at,
            "affected": list(self.affected),
            "blindPolicies": sorted(r.policy for r in self.readings.values() if r.blind),
            "summary": self.summary(),
        }


def status_of(readings: Iterable[SourceReading]) -> SourceStatus:
    listed = [r for r in readings if r.queried > 0]
    if not listed or not any(r.failed for r in listed):
        return SourceStatus.UP
    if all(r.blind for r in listed):
        return SourceStatus.BLIND
    return SourceStatus.DEGRADED


def record(health: SourceHealth, reading: SourceReading) -> SourceHealth:
    """The health after `reading` (a policy's newest evaluation). A reading with no query changes nothing."""
    if reading.queried == 0:
        return health
    readings = {**health.readings, reading.policy: reading}
    status = status_of(readings.values())
    changed = status is not health.status or health.since is None
    return replace(
        health,
        status=status,
        since=reading.at if changed else health.since,
        last_error=reading.error if reading.failed and reading.error else health.last_error,
        last_error_at=reading.at if reading.failed else health.last_error_at,
        last_success_at=reading.at if reading.failed < reading.queried else health.last_success_at,
        readings=readings,
    )


def keep_policies(health: SourceHealth, policies: Iterable[str], now: float) -> SourceHealth:
    """After a reload: the readings of removed policies are dropped (a removed policy is not blind)."""
    kept = set(policies)
    readings = {name: r for name, r in health.readings.items() if name in kept}
    if readings.keys() == health.readings.keys():
        return health
    status = status_of(readings.values())
    return replace(health, readings=readings, status=status, since=health.since if status is health.status else now)


def worst(healths: Iterable[SourceHealth]) -> SourceStatus:
    statuses = {h.status for h in healths}
    for status in (SourceStatus.BLIND, SourceStatus.DEGRADED):
        if status in statuses:
            return status
    return SourceStatus.UP


def _clock(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%H:%M:%SZ")


def health_json(healths: Mapping[str, SourceHealth]) -> dict[str, Any]:
    """The `health` of the status document: the worst status and each source's."""
    return {
        "status": worst(healths.values()).value,
        "sources": [healths[name].to_json() for name in sorted(healths)],
    }


def signal_reading(
    source: str, policy: str, at: float, results: Mapping[str, SignalResult], queried: Iterable[str]
) -> SourceReading:
    """The reading of one evaluation's signal answers (`queried`: the names of the signals the source answers)."""
    names = list(queried)
    failures = [
        result.error
        for name in names
        if (result := results.get(name)) is not None and result.error is not None and not result.policy_error
    ]
    return SourceReading(source, policy, at, len(names), len(failures), failures[0] if failures else None)
