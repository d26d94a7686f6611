"""Incidents in the cluster: `TailguardIncident` custom resources (deploy/crds/tailguardincident.yaml).

IncidentStorePort on the Kubernetes API. One object per incident, named by its id (`chat-1700000030`), labelled
with its service; the spec says what it is about (service, scope, opening time) and never changes; the status
holds the whole incident and the service's revision ledger, written through the status subresource with the
resourceVersion that was read: a stale one is 409 Conflict, which is `IncidentConflict` (the keeper reads again
and re-decides). Any replica that owns the service reads the same objects, so a successor or a restart knows the
revisions an incident rolled back, the rollback already made, and the escalation stage.

A create is two requests (the object, then its status: a create never sets the status of a kind with the
subresource); an object whose status was never written reads as a fresh open incident of its spec.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any, cast

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from tailguard.controller.core.incidents import Incident, IncidentConflict, Ledger
from tailguard.controller.core.incidents import scope_key as key_of_scope
from tailguard.controller.kit.errors import StoreError

log = logging.getLogger(__name__)

GROUP = "tailguard.io"
VERSION = "v1alpha1"
PLURAL = "tailguardincidents"
KIND = "TailguardIncident"
SERVICE_LABEL = "tailguard.io/service"
REQUEST_TIMEOUT = (5.0, 10.0)  # connect, read: every call of the store


TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


class IncidentStoreError(StoreError):
    """The API server did not answer a read or write of the incidents. `transient`: worth retrying (a 5xx, 429, a
    connection or timeout error): a rollback that cannot check its incident fails transiently and is retried by the
    dispatcher, never run unchecked."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def _unreachable(doing: str, failed: Exception) -> IncidentStoreError:
    if isinstance(failed, ApiException):
        return IncidentStoreError(
            f"{doing}: {failed.status} {failed.reason}", transient=failed.status in TRANSIENT_STATUSES
        )
    return IncidentStoreError(f"{doing}: {type(failed).__name__}: {failed}", transient=True)


class KubernetesIncidentStore:
    def __init__(self, api: k8s.CustomObjectsApi, namespace: str) -> None:
        self._api = api
        self._namespace = namespace

    # -- reads ---------------------------------------------------------------------------------------------

    def _list(self, service: str | None = None) -> list[tuple[Incident, Ledger]]:
        selector = f"{SERVICE_LABEL}={_label_value(service)}" if service is not None else None
        try:
            listed = cast(
                dict[str, Any],
                self._api.list_namespaced_custom_object(
                    GROUP, VERSION, self._namespace, PLURAL, label_selector=selector, _request_timeout=REQUEST_TIMEOUT
                ),
            )
        except (ApiException, HTTPError, OSError) as failed:
            raise _unreachable(f"listing {PLURAL} in {self._namespace}", failed) from failed
        found = [_read(item) for item in listed.get("items") or []]
        if service is not None:
            found = [(incident, ledger) for incident, ledger in found if incident.service == service]
        return sorted(found, key=lambda pair: (pair[0].opened_at, pair[0].id), reverse=True)

    def current(self, scope_key: str) -> tuple[Incident, Ledger] | None:
        service = dict(part.split("=", 1) for part in scope_key.split(",") if "=" in part).get("service")
        for incident, ledger in self._list(service):
            if incident.open and key_of_scope(incident.scope) == scope_key:
                return incident, ledger
        return None

    def ledger(self, service: str) -> Ledger:
        found = self._list(service)
        return found[0][1] if found else Ledger(service)

    def latest(self, service: str, *, open_only: bool) -> Incident | None:
        return next((incident for incident, _ in self._list(service) if incident.open or not open_only), None)

    def incidents(self, *, open_only: bool = True, limit: int = 50) -> list[Incident]:
        return [incident for incident, _ in self._list() if incident.open or not open_only][:limit]

    # -- the one write: compare-and-set ---------------------------------------------------------------------

    def save(self, incident: Incident, ledger: Ledger) -> Incident:
        version = incident.version
        if version == "":
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "metadata": {"name": incident.id, "labels": {SERVICE_LABEL: _label_value(incident.service)}},
                "spec": {"service": incident.service, "scope": dict(incident.scope), "openedAt": incident.opened_at},
            }
            try:
                created = cast(
                    dict[str, Any],
                    self._api.create_namespaced_custom_object(
                        GROUP, VERSION, self._namespace, PLURAL, body, _request_timeout=REQUEST_TIMEOUT
                    ),
                )
            except (ApiException, HTTPError, OSError) as failed:
                if isinstance(failed, ApiException) and failed.status == 409:
                    raise IncidentConflict(f"{KIND} {incident.id} exists already") from failed
                raise _unreachable(f"creating {KIND} {incident.id}", failed) from failed
            version = str(created["metadata"]["resourceVersion"])
        status_body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": {"name": incident.id, "resourceVersion": version},
            "spec": {"service": incident.service, "scope": dict(incident.scope), "openedAt": incident.opened_at},
            "status": _status(incident, ledger),
        }
        try:
            written = cast(
                dict[str, Any],
                self._api.replace_namespaced_custom_object_status(
                    GROUP, VERSION, self._namespace, PLURAL, incident.id, status_body, _request_timeout=REQUEST_TIMEOUT
                ),
            )
        except (ApiException, HTTPError, OSError) as failed:
            if isinstance(failed, ApiException) and failed.status == 409:
                raise IncidentConflict(f"{KIND} {incident.id} changed since resourceVersion {version}") from failed
            raise _unreachable(f"writing the status of {KIND} {incident.id}", failed) from failed
        return Incident.from_json(incident.to_json(), str(written["metadata"]["resourceVersion"]))


def _status(incident: Incident, ledger: Ledger) -> dict[str, Any]:
    summary = incident.summary()
    return {
        "phase": incident.phase.value,
        "cause": summary["cause"],
        "action": summary["action"],
        "stage": incident.stage,
        "nextStep": incident.next_step,
        "incident": incident.to_json(),
        "ledger": ledger.to_json(),
    }


def _read(item: Mapping[str, Any]) -> tuple[Incident, Ledger]:
    version = str(item["metadata"]["resourceVersion"])
    spec = item.get("spec") or {}
    status = item.get("status") or {}
    body = status.get("incident")
    if isinstance(body, Mapping):
        incident = Incident.from_json(body, version)
    else:  # created, its status not yet written: a fresh open incident of its spec
        incident = Incident(
            id=str(item["metadata"]["name"]),
            scope={str(k): str(v) for k, v in dict(spec.get("scope") or {}).items()},
            opened_at=float(spec.get("openedAt") or 0.0),
            version=version,
        )
    stored = status.get("ledger")
    ledger = Ledger.from_json(stored, version) if isinstance(stored, Mapping) else Ledger(incident.service)
    return incident, ledger


def _label_value(value: str) -> str:
    """A label value (63 characters of [A-Za-z0-9._-], alphanumeric at both ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", value)[:63].strip("-._")
    return cleaned or "none"
