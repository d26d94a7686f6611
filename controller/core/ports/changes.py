"""The change ports: the systems that know rollouts, and the tracker that merges them into one feed."""

from __future__ import annotations

from typing import Any, Protocol

from tailguard.controller.core.attribution import ChangeFeed, Rollout


class ChangeSource(Protocol):
    """One system that knows rollouts (Argo CD history, Deployments, the local tier)."""

    name: str

    def rollouts(self, since: float) -> list[Rollout]:
        """Rollouts at or after `since` (epoch seconds), any order. Raises ChangeSourceError when unreadable."""
        ...


class TierReader(Protocol):
    """The local tier's read side, as the tier's change source needs it."""

    def services(self) -> list[dict[str, Any]]: ...

    def revisions(self, service: str) -> list[dict[str, Any]]: ...


class ChangeTrackerPort(Protocol):
    """What the controller needs of tailguard.controller.adapters.changes.tracker.ChangeTracker."""

    def rollouts(self, since: float) -> ChangeFeed: ...
