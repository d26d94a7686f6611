"""Wiring of the incident layer (controller/loop/incidents.py) around the ports `build` made: the composition
root's one place that knows which ports the incident keeper wraps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from controller.core.ports import ChangeTrackerPort, DispatcherPort
from controller.loop.dispatcher import Actuators
from controller.loop.incidents import (
    IncidentChanges,
    IncidentDispatcher,
    IncidentKeeper,
    IncidentRollback,
    IncidentScale,
)


@dataclass(frozen=True)
class IncidentLayer:
    """The ports as the controller gets them: rollbacks and scales through their incident, the change feed without
    the rollouts an incident undid, and `dispatcher(inner)` wrapping the dispatcher."""

    keeper: IncidentKeeper
    actuators: Actuators
    change_tracker: ChangeTrackerPort | None
    dispatcher: Callable[[DispatcherPort], DispatcherPort]


def incident_layer(
    keeper: IncidentKeeper, actuators: Actuators, change_tracker: ChangeTrackerPort | None
) -> IncidentLayer:
    wrapped = replace(
        actuators,
        rollback=IncidentRollback(actuators.rollback, keeper),
        scale=IncidentScale(actuators.scale, keeper),
    )
    tracker = IncidentChanges(change_tracker, keeper) if change_tracker is not None else None

    def dispatcher(inner: DispatcherPort) -> DispatcherPort:
        return IncidentDispatcher(inner, keeper)

    return IncidentLayer(keeper, wrapped, tracker, dispatcher)
