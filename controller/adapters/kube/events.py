"""A core/v1 Event per action (best effort: it never blocks or fails the action it describes)."""

from __future__ import annotations

import datetime
import hashlib
import logging
from dataclasses import dataclass

from kubernetes import client as k8s

from tailguard.controller.adapters.kube.calls import classify
from tailguard.controller.core.ports import Clock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    namespace: str
    name: str


class EventRecorder:
    """Records a core/v1 Event per action. Best effort: one short try, every failure logged and swallowed."""

    def __init__(self, api: k8s.CoreV1Api, clock: Clock, *, component: str = "tailguard", timeout: float = 2.0) -> None:
        self.api = api
        self.clock = clock
        self.component = component
        self.timeout = timeout

    def record(self, involved: ObjectRef, reason: str, message: str, *, key: str, warning: bool = False) -> bool:
        # A name derived from the idempotency key: a replayed action yields AlreadyExists, not a second Event.
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        now = datetime.datetime.fromtimestamp(self.clock.now(), datetime.UTC)
        event = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(name=f"{involved.name}.tailguard.{digest}", namespace=involved.namespace),
            involved_object=k8s.V1ObjectReference(
                api_version=involved.api_version, kind=involved.kind, name=involved.name, namespace=involved.namespace
            ),
            reason=reason,
            message=message[:1024],
            type="Warning" if warning else "Normal",
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=k8s.V1EventSource(component=self.component),
            reporting_component=self.component,
        )
        try:
            self.api.create_namespaced_event(involved.namespace, event, _request_timeout=self.timeout)
        except k8s.ApiException as exc:
            if exc.status == 409:
                return True  # already recorded for this key
            log.warning("could not record an Event for %s/%s: %s", involved.kind, involved.name, classify(exc, "event"))
            return False
        except Exception as exc:  # noqa: BLE001 - an Event must never fail or block the action it describes
            log.warning("could not record an Event for %s/%s: %s", involved.kind, involved.name, type(exc).__name__)
            return False
        return True
