"""The external ports: every interface between the pure core and the outside world, one module per port family.

    metrics      MetricsSource, RangeResult                      (Prometheus; recorded history)
    predictions  PredictionPort, HistoricalPredictionPort        (the SLA model, wired by the app)
    outcomes     ActionOutcome, OutcomeStatus, AbortSignal       (what every action port answers)
    rollback     RollbackPort, RollbackRequest, RollbackPlan     (Argo CD, a Deployment, the local tier)
    scale        ScalePort, ScaleRequest, ScaleLimits(Port)      (an HPA, the local tier)
    traffic      TrafficRouter, TrafficRequest                   (HTTPRoute, VirtualService, the local tier)
    annotations  Annotation, Annotator                           (JSONL, Grafana)
    notify       Notifier, NotifyRequest, NotifyPayload          (webhooks)
    stores       JournalPort, ActionJournalPort, IncidentStorePort, RecentDecisions
    dispatch     DispatcherPort                                  (the dispatcher, as the evaluation sees it)
    changes      ChangeSource, ChangeTrackerPort, TierReader     (rollouts)
    leadership   LeaderPort, ShardedLeaderPort, HandoverPort, ... (the Lease)

Each port has real implementations (controller/adapters/, one folder per port), a "not configured" one
(controller/core/unconfigured.py) where the controller runs without it, and a public fake (controller/testing).
Implementations never raise for expected failures: they return data (SignalResult with an error, ActionOutcome
with status "failed"). The loop's own seams live in controller/loop/ports.py, the API's in controller/app/ports.py.
The core imports no HTTP and no array type (the import-linter contract `core-without-io-types`).

This package's index names every port of its modules (and the kit's Clock, which the kit's HTTP call waits
through), so `from tailguard.controller.core.ports import RollbackPort` reads the same as from its family module.
"""

from __future__ import annotations

from tailguard.controller.core.ports.annotations import Annotation, Annotator
from tailguard.controller.core.ports.changes import ChangeSource, ChangeTrackerPort, TierReader
from tailguard.controller.core.ports.dispatch import DispatcherPort
from tailguard.controller.core.ports.leadership import (
    ControlsHandoverPort,
    HandoverPort,
    LeaderPort,
    PeerCheckPort,
    PendingHandoverPort,
    ShardedLeaderPort,
)
from tailguard.controller.core.ports.metrics import MetricsSource, RangeResult
from tailguard.controller.core.ports.notify import NoticePayload, Notifier, NotifyPayload, NotifyRequest
from tailguard.controller.core.ports.outcomes import AbortSignal, ActionOutcome, OutcomeStatus
from tailguard.controller.core.ports.predictions import HistoricalPredictionPort, PredictionPort
from tailguard.controller.core.ports.rollback import RollbackPlan, RollbackPort, RollbackRequest
from tailguard.controller.core.ports.scale import ScaleLimits, ScaleLimitsPort, ScalePort, ScaleRequest, ScaleState
from tailguard.controller.core.ports.stores import ActionJournalPort, IncidentStorePort, JournalPort, RecentDecisions
from tailguard.controller.core.ports.traffic import TrafficRequest, TrafficRouter
from tailguard.controller.kit.clock import Clock

__all__ = [
    "AbortSignal",
    "ActionJournalPort",
    "ActionOutcome",
    "Annotation",
    "Annotator",
    "ChangeSource",
    "ChangeTrackerPort",
    "Clock",
    "ControlsHandoverPort",
    "DispatcherPort",
    "HandoverPort",
    "HistoricalPredictionPort",
    "IncidentStorePort",
    "JournalPort",
    "LeaderPort",
    "MetricsSource",
    "NoticePayload",
    "Notifier",
    "NotifyPayload",
    "NotifyRequest",
    "OutcomeStatus",
    "PeerCheckPort",
    "PendingHandoverPort",
    "PredictionPort",
    "RangeResult",
    "RecentDecisions",
    "RollbackPlan",
    "RollbackPort",
    "RollbackRequest",
    "ScaleLimits",
    "ScaleLimitsPort",
    "ScalePort",
    "ScaleRequest",
    "ScaleState",
    "ShardedLeaderPort",
    "TierReader",
    "TrafficRequest",
    "TrafficRouter",
]
