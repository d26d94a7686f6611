"""A pytest plugin that switches the incident layer off, for showing that tests/scenarios/test_incidents.py fails
on 7710821's behaviour (no incidents: the dispatcher, rollback, scale and change ports unwrapped, the recovery
annotation as the policy wrote it):

    PYTHONPATH=$PWD .venv/bin/pytest -p tests.support.without_incidents tests/scenarios/test_incidents.py

Every scenario there must FAIL under it, each on its own wrong (or missing) write; never used by the suite.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tests.scenarios.test_incidents as scenarios
from tailguard.controller.core.model import Decision
from tailguard.controller.core.ports import ChangeTrackerPort, DispatcherPort
from tailguard.controller.loop import incident_ports, restore
from tailguard.controller.loop.dispatcher import Actuators
from tailguard.controller.loop.incident_ports import IncidentLayer
from tailguard.controller.loop.incidents import IncidentKeeper


class _Unwrapped(IncidentLayer):
    def dispatcher(self, inner: DispatcherPort) -> Any:
        return inner


def _unwrapped(
    keeper: IncidentKeeper,
    actuators: Actuators,
    change_tracker: ChangeTrackerPort | None,
    on_escalation: Callable[[Decision], None] | None = None,
) -> IncidentLayer:
    return _Unwrapped(keeper, actuators, change_tracker)


incident_ports.incident_layer = _unwrapped
scenarios.incident_layer = _unwrapped  # type: ignore[assignment]
restore.truthful_annotation = lambda actions, record, text: text
