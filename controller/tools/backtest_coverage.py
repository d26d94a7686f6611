"""What a backtest saw: the targets each policy's signals answered for in the window (a series with at least one
sample on the evaluation grid), per policy and per condition.

A policy whose queries matched no series at all reports "0 incidents" exactly like a policy that watched healthy
targets for the whole window; this says which one it was. `blind_warnings` names each policy (and condition) that
saw no target, with what to check; `tailguard backtest --strict` fails on them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tailguard.controller.adapters.metrics.grid import RangeGrid
from tailguard.controller.core.model import TargetKey
from tailguard.controller.core.policy import Policy


class TargetsSeen:
    """Targets with data, by policy and signal, gathered chunk by chunk as the replay reads its grids."""

    def __init__(self) -> None:
        self._by_signal: dict[str, dict[str, set[TargetKey]]] = {}

    def record(self, policy: Policy, grids: Mapping[str, RangeGrid]) -> None:
        signals = self._by_signal.setdefault(policy.name, {})
        for name, grid in grids.items():
            seen = signals.setdefault(name, set())
            if grid.error is not None or not grid.targets or grid.present.size == 0:
                continue
            seen.update(target for j, target in enumerate(grid.targets) if bool(grid.present[:, j].any()))

    def per_condition(self, policies: Sequence[Policy]) -> dict[str, dict[str, int]]:
        """{policy: {condition: targets seen by its signal}}; a policy's own line is `*`: any of its signals."""
        out: dict[str, dict[str, int]] = {}
        for policy in policies:
            signals = self._by_signal.get(policy.name, {})
            counts = {c.name: len(signals.get(c.signal, ())) for c in policy.conditions}
            everything: set[TargetKey] = set().union(*signals.values()) if signals else set()
            out[policy.name] = {"*": len(everything), **counts}
        return out

    def blind_warnings(self, policies: Sequence[Policy]) -> list[str]:
        warnings: list[str] = []
        for policy in policies:
            counts = self.per_condition([policy])[policy.name]
            if counts["*"] == 0:
                warnings.append(
                    f"{policy.name}: matched no series in the window (0 targets ever seen): its '0 incidents' "
                    "means it saw nothing; check its queries' metric names and targets.match labels against "
                    "this Prometheus, and the window"
                )
                continue
            for condition in policy.conditions:
                if counts[condition.name] == 0:
                    warnings.append(
                        f"{policy.name}/{condition.name}: its signal {condition.signal!r} matched no series in the "
                        "window (0 targets ever seen)"
                    )
        return warnings
