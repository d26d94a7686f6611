"""A real Controller (fake source and dispatcher) serving its API on loopback, reached the way an operator reaches it:
directly, or through the spec-validating fake Kubernetes API's service proxy (tests/support/fake_kubernetes.py)
with a kubeconfig. Shared by the `kubectl tailguard` tests and the first-hour install test."""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.core.model import SignalResult
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDispatcher, FakeSource
from tests.support.controller_process import write_kubeconfig
from tests.support.fake_kubernetes import FakeKubernetes

TOKEN = "operator-s3cret"
USER_TOKEN = "kube-user-token"  # the kubeconfig's credential for the API server (never the controller's)


@dataclass
class Operated:
    controller: Controller
    api: ControllerAPI
    dispatcher: FakeDispatcher
    clock: ManualClock
    kube: FakeKubernetes
    kubeconfig: Path


def service(namespace: str, port: int = 9464) -> dict[str, Any]:
    """deploy/base/service.yaml's Service in `namespace`."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "tailguard", "namespace": namespace},
        "spec": {
            "selector": {"app.kubernetes.io/name": "tailguard", "app.kubernetes.io/component": "controller"},
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def endpoints(namespace: str, port: int, name: str = "tailguard") -> dict[str, Any]:
    """What the endpoints controller writes for a ready controller pod listening on `port` (loopback here)."""
    return {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": name, "namespace": namespace},
        "subsets": [
            {
                "addresses": [
                    {"ip": "127.0.0.1", "targetRef": {"kind": "Pod", "name": "tailguard-0", "namespace": namespace}}
                ],
                "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            }
        ],
    }


def token_secret(namespace: str, token: str = TOKEN) -> dict[str, Any]:
    """The Secret tailguard-alertmanager (docs/deploy.md, Install: the controller's bearer token)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "tailguard-alertmanager", "namespace": namespace},
        "type": "Opaque",
        "data": {"token": base64.b64encode(token.encode()).decode()},
    }


@contextmanager
def operated_controller(
    tmp: Path,
    policies: Mapping[str, str],
    *,
    namespace: str = "tailguard",
    value: float = 0.95,
    service_doc: Mapping[str, Any] | None = None,
) -> Iterator[Operated]:
    """The controller with `policies` (file name -> YAML), its Service and Endpoints and token Secret in the fake
    API, and a kubeconfig for that API."""
    rules = tmp / "rules"
    rules.mkdir(parents=True, exist_ok=True)
    for name, text in policies.items():
        (rules / name).write_text(text, encoding="utf-8")
    journal = Journal(tmp / "journal.db")
    dispatcher = FakeDispatcher()
    clock = ManualClock(1_767_225_600.0)
    controller = Controller(
        policy_paths=[rules],
        source=FakeSource(default=SignalResult({(("service", "chat"),): value})),
        journal=journal,
        dispatcher=dispatcher,
        clock=clock,
        schedule=False,
        controls_store=journal,
    )
    controller.start()  # loads the policies (schedule=False: evaluations only when a test asks)
    api = ControllerAPI(controller, "127.0.0.1", 0, webhook_token=TOKEN)
    api.start()
    kube = FakeKubernetes().start()
    try:
        kube.put_object(dict(service_doc) if service_doc is not None else service(namespace))
        kube.put_object(endpoints(namespace, api.port))
        kube.put_object(token_secret(namespace))
        kubeconfig = write_kubeconfig(tmp / "kubeconfig", kube.url, USER_TOKEN)
        yield Operated(controller, api, dispatcher, clock, kube, kubeconfig)
    finally:
        kube.stop()
        api.stop()
        controller.stop()
