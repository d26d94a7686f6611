"""The loop embedded in a program: the one wiring of journal, incident layer, dispatcher and evaluation ports.

Three programs run the live evaluation: the controller (controller/app/build.py, with its scheduler), the
backtest (controller/tools/backtest.py, over a scratch journal on a simulated clock) and the surge scenario of the
serving lab (serving/lab/surge.py, through the public face `controller`). Each wires the same chain, so it is
written once here:

    actuators --incident layer (optional)--> Dispatcher(journal first, limits) --> EvaluationPorts --> evaluate

`embed_dispatcher` is the chain up to the dispatcher (what the controller hands its scheduler);
`embed_loop` adds the evaluation's ports and is what an embedding program evaluates through.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from prometheus_client import CollectorRegistry

from tailguard.controller.core.actions import ActionRecord
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.model import Decision, TargetKey
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.ports import (
    ActionJournalPort,
    ChangeTrackerPort,
    Clock,
    DispatcherPort,
    MetricsSource,
    PredictionPort,
)
from tailguard.controller.core.signals import query_signals as live_query_signals
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.evaluation import EvaluationOutcome, EvaluationPorts, QuerySignals, evaluate
from tailguard.controller.loop.incident_ports import incident_layer
from tailguard.controller.loop.incidents import IncidentKeeper
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.ports import TRIGGER_SCHEDULE, LoopJournalPort


class DispatcherOptions(TypedDict, total=False):
    """The dispatcher's options a program may set (controller/loop/dispatcher.py `Dispatcher`); the defaults run
    every action inline, unguarded by a Lease."""

    on_action: Callable[[ActionRecord], None]
    links_for: Callable[[Mapping[str, Any]], Mapping[str, str]]
    workers: bool
    may_act: Callable[[], bool] | None
    may_act_for: Callable[[str], bool] | None


@dataclass(frozen=True)
class EmbeddedDispatcher:
    """`dispatcher`: the journal-first Dispatcher itself (its planner, lanes, resume, abort); `port`: what
    evaluations dispatch to (the dispatcher behind the incident layer when there is one); `change_tracker`: the
    rollouts an evaluation attributes to (behind the incident layer likewise)."""

    dispatcher: Dispatcher
    port: DispatcherPort
    change_tracker: ChangeTrackerPort | None


def embed_dispatcher(
    journal: ActionJournalPort,
    actuators: Actuators,
    clock: Clock,
    limits: GlobalLimits | None = None,
    *,
    incidents: IncidentKeeper | None = None,
    change_tracker: ChangeTrackerPort | None = None,
    on_escalation: Callable[[Decision], None] | None = None,
    **options: Unpack[DispatcherOptions],
) -> EmbeddedDispatcher:
    """The dispatcher over `journal` with `actuators`, the global `limits` (default: none) and, with
    `incidents`, the incident layer (controller/loop/incident_ports.py: one incident per service scope, one
    rollback per incident, the escalation ladder; `on_escalation` hears the escalation steps' decisions)."""
    limits = limits if limits is not None else GlobalLimits()
    if incidents is None:
        dispatcher = Dispatcher(journal, actuators, clock, limits, **options)
        return EmbeddedDispatcher(dispatcher, dispatcher, change_tracker)
    layer = incident_layer(incidents, actuators, change_tracker, on_escalation=on_escalation)
    dispatcher = Dispatcher(journal, layer.actuators, clock, limits, **options)
    return EmbeddedDispatcher(dispatcher, layer.dispatcher(dispatcher), layer.change_tracker)


@dataclass(frozen=True)
class EmbeddedLoop:
    """The live evaluation, embedded: `evaluate(policy, state, at)` decides, commits to the journal and acts
    through the dispatcher, exactly as the controller's scheduled evaluation does."""

    dispatcher: Dispatcher
    ports: EvaluationPorts

    def evaluate(
        self,
        policy: Policy,
        state: PolicyState,
        at: float,
        *,
        trigger: str = TRIGGER_SCHEDULE,
        targets: Collection[TargetKey] | None = None,
    ) -> EvaluationOutcome:
        return evaluate(policy, state, at, self.ports, trigger=trigger, targets=targets)


def embed_loop(
    journal: LoopJournalPort,
    actuators: Actuators,
    clock: Clock,
    source: MetricsSource,
    predictions: PredictionPort,
    *,
    limits: GlobalLimits | None = None,
    incidents: IncidentKeeper | None = None,
    change_tracker: ChangeTrackerPort | None = None,
    change_window: float = 0.0,
    on_escalation: Callable[[Decision], None] | None = None,
    query_signals: QuerySignals = live_query_signals,
    metrics: ControllerMetrics | None = None,
) -> EmbeddedLoop:
    """`embed_dispatcher`'s chain plus the evaluation's ports: the metrics `source` (and `query_signals`, how its
    signals are asked), the `predictions` port, the change tracker and its window, the metrics (default: on a
    registry of their own, so an embedding program's metrics never collide with another's)."""
    embedded = embed_dispatcher(
        journal,
        actuators,
        clock,
        limits,
        incidents=incidents,
        change_tracker=change_tracker,
        on_escalation=on_escalation,
    )
    ports = EvaluationPorts(
        source=source,
        journal=journal,
        dispatcher=embedded.port,
        clock=clock,
        metrics=metrics if metrics is not None else ControllerMetrics(CollectorRegistry()),
        predictions=predictions,
        query_signals=query_signals,
        change_tracker=embedded.change_tracker,
        change_window=change_window,
    )
    return EmbeddedLoop(embedded.dispatcher, ports)
