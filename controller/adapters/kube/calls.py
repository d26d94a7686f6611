"""Calling the Kubernetes API (official client) with errors as data, shared by every Kubernetes adapter.

`kube_call` retries transient failures (5xx, 429, timeouts, refused connections) with the kit's backoff through
the injected clock and returns a `KubeError` instead of raising; `classify` names a failure without any URL or
credential. `KubernetesActuatorError` is raised only where a port returns a plain value.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s

from tailguard.controller.core.ports import ActionOutcome, Clock, OutcomeStatus
from tailguard.controller.kit.errors import ActuatorError
from tailguard.controller.kit.http import RetryPolicy, retrying

T = TypeVar("T")

TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class KubeError:
    """A failed API call as data: what was attempted, the HTTP status (None: no answer) and whether it may pass."""

    message: str
    status: int | None
    transient: bool

    def outcome(self, detail: Mapping[str, Any] | None = None) -> ActionOutcome:
        return ActionOutcome(OutcomeStatus.FAILED, dict(detail or {}), self.message, self.transient)


class KubernetesActuatorError(ActuatorError):
    """Raised only where a protocol returns a plain value (ScalePort.replicas); `transient` tells the dispatcher."""

    def __init__(self, error: KubeError) -> None:
        super().__init__(error.message, transient=error.transient)
        self.status = error.status


def _server_message(exc: k8s.ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return str(exc.reason or "")
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return str(exc.reason or "")


def classify(exc: BaseException, what: str) -> KubeError:
    if isinstance(exc, k8s.ApiException):
        status = int(exc.status) if exc.status else None
        return KubeError(f"{what}: HTTP {status}: {_server_message(exc)}", status, status in TRANSIENT_STATUSES)
    if isinstance(exc, (urllib3.exceptions.HTTPError, OSError, TimeoutError)):
        # Timeouts and refused connections: no answer at all. The text names no URL or credential.
        return KubeError(f"{what}: no answer from the Kubernetes API ({type(exc).__name__})", None, True)
    return KubeError(f"{what}: {type(exc).__name__}: {exc}", None, False)


def kube_call(fn: Callable[[], T], *, what: str, clock: Clock, retry: RetryPolicy) -> T | KubeError:
    """Call the API, retrying transient failures with the kit's backoff (through the clock); errors come back as
    data. Reads pass the adapter's RetryPolicy; writes pass RetryPolicy(attempts=1) (one attempt)."""

    def once(_attempt: int) -> T | KubeError:
        try:
            return fn()
        except (k8s.ApiException, urllib3.exceptions.HTTPError, OSError, TimeoutError) as exc:
            return classify(exc, what)

    return retrying(
        once,
        retry=retry,
        clock=clock,
        failure=lambda answer: answer.message if isinstance(answer, KubeError) else None,
        transient=lambda answer: isinstance(answer, KubeError) and answer.transient,
        what=what,
    )
