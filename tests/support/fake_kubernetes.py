"""A spec-validating fake Kubernetes API server for tests (loopback, stdlib ThreadingHTTPServer).

The official `kubernetes` client talks to it through `fake.configuration()`. It keeps objects in memory
for the kinds tailguard reads and writes (autoscaling/v2 HorizontalPodAutoscaler, apps/v1 Deployment and
ReplicaSet, gateway.networking.k8s.io/v1 HTTPRoute, networking.istio.io/v1 VirtualService,
coordination.k8s.io/v1 Lease, core v1 Event, core v1 Secret (seeded by tests, read by the Helm detection) and
answers like the real API server:

- GET (one object) / GET (list) / POST / PUT / PATCH (JSON patch, merge patch; a strategic merge patch is
  applied as a merge patch, which is what it is for the maps tailguard patches) / DELETE;
- `metadata.resourceVersion` on every write; a PUT carrying a stale one gets 409 Conflict, a POST of an
  existing name 409 AlreadyExists, an unknown object 404 NotFound, all as `Status` objects;
- EVERY object written is validated before it is stored: core kinds with `kubernetes_validate` (strict:
  unknown fields rejected), the CRDs with their JSON Schemas from tests/support/specs/; an invalid object
  gets 422 Invalid with the field path, as the real server answers an admission failure;
- TailguardPolicy and TailguardIncident (tailguard.io/v1alpha1) custom resources, validated against the
  openAPIV3Schema of deploy/crds/tailguardpolicy.yaml and tailguardincident.yaml (unknown fields rejected, as
  `kubectl apply`'s strict field validation does),
  with the `status` subresource as the real server serves it for a CRD: a write to the object keeps the stored
  status and bumps `metadata.generation` when the spec changed; a write to `/status` changes only the status
  (a stale resourceVersion: 409 Conflict);
- watch (`?watch=true`): the events after the given resourceVersion as JSON lines, streamed until
  `timeoutSeconds`; a resourceVersion older than the kept history (`compact()`) gets an ERROR event with a
  410 Gone Status, as the real server answers "too old resource version";
- failures are injectable (`inject`): a status code (500, 503, ...), a delay (to make a client time out),
  a hook run before the request (e.g. a concurrent writer bumping the resourceVersion), or a mutation of
  the stored object after a write (e.g. another controller overriding a weight);
- every request is recorded as (verb, apiGroup, resource, namespace) so tests can compare against RBAC;
- lists honour an equality `labelSelector` (`a=b,c=d`);
- with `deployment_controller=True`, a small deployment controller: a Deployment written with a new pod template
  gets the ReplicaSet of that template (found by its `pod-template-hash`, else created, owned by the Deployment)
  bumped to the next `deployment.kubernetes.io/revision`, the Deployment's annotations copied onto it except
  those the real controller skips, and the Deployment's revision annotation set, as kube-controller-manager does
  after `kubectl rollout undo` or a new rollout;
- the service proxy (`/api/v1/namespaces/NS/services/[SCHEME:]NAME[:PORT]/proxy/PATH`, what `kubectl tailguard` and
  `kubectl proxy` use): the Service's port (by name or number; the only one when none is named) is looked up in
  the Endpoints of the same name (the subset port of that name, else the Service's numeric targetPort) and the
  request goes to the first address, as the API server does: the `Authorization` header is removed first
  (kube-apiserver drops the user's credential after authenticating it), 404 for an unknown Service, 503
  `no endpoints available for service` without an address, 503 `error trying to reach service` when the backend
  refuses; recorded as the RBAC verb on `services/proxy` (GET get, POST create, PUT update, PATCH patch, DELETE
  delete) and injectable like any resource (`inject("get", "services/proxy", status=403)`);
- pod logs (`GET .../pods/NAME/log`, text): what `set_pod_log` seeded, recorded as `get` on `pods/log`.
"""

from __future__ import annotations

import base64
import copy
import datetime
import gzip
import hashlib
import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

import jsonschema
import kubernetes
import kubernetes_validate
import yaml
from kubernetes_validate.utils import latest_version

SPECS = Path(__file__).parent / "specs"
CRDS = Path(__file__).resolve().parent.parent.parent / "deploy" / "crds"
KUBERNETES_VERSION = latest_version()


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    resource: str  # plural, as in the URL and in RBAC rules
    kind: str
    schema_file: str | None = None  # a CRD: validated with this JSON Schema instead of kubernetes_validate
    crd_file: str | None = None  # a CRD of ours: validated with the openAPIV3Schema of deploy/crds/<file>

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCE_TYPES = (
    ResourceType("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler"),
    ResourceType("apps", "v1", "deployments", "Deployment"),
    ResourceType("apps", "v1", "replicasets", "ReplicaSet"),
    ResourceType(
        "gateway.networking.k8s.io",
        "v1",
        "httproutes",
        "HTTPRoute",
        "jsonschema-gateway.networking.k8s.io_httproute_v1.json",
    ),
    ResourceType(
        "networking.istio.io",
        "v1",
        "virtualservices",
        "VirtualService",
        "jsonschema-networking.istio.io_virtualservice_v1.json",
    ),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
    ResourceType("", "v1", "events", "Event"),
    ResourceType("", "v1", "secrets", "Secret"),
    # Pods (seeded by tests; the rotation controller patches their metadata and, through the `status`
    # subresource, recorded as `pods/status` for RBAC, their readiness-gate conditions).
    ResourceType("", "v1", "pods", "Pod"),
    # The controller's Service and its Endpoints (seeded by tests): the service proxy below routes through them.
    ResourceType("", "v1", "services", "Service"),
    ResourceType("", "v1", "endpoints", "Endpoints"),
    ResourceType("tailguard.io", "v1alpha1", "tailguardpolicies", "TailguardPolicy", crd_file="tailguardpolicy.yaml"),
    ResourceType(
        "tailguard.io", "v1alpha1", "tailguardincidents", "TailguardIncident", crd_file="tailguardincident.yaml"
    ),
)
# Subresources served on the parent object's storage: (group, version, resource, subresource).
_SUBRESOURCES = frozenset(
    {
        ("", "v1", "pods", "status"),
        ("tailguard.io", "v1alpha1", "tailguardpolicies", "status"),
        ("tailguard.io", "v1alpha1", "tailguardincidents", "status"),
    }
)
# Kinds whose status is a subresource of a CRD: the object's writes keep the status, /status writes only it.
_STATUS_SUBRESOURCE = frozenset({("tailguard.io", "tailguardpolicies"), ("tailguard.io", "tailguardincidents")})
# The annotations the deployment controller never copies from a Deployment onto its ReplicaSets.
_CONTROLLER_SKIPPED = frozenset(
    {
        "kubectl.kubernetes.io/last-applied-configuration",
        "deployment.kubernetes.io/revision",
        "deployment.kubernetes.io/revision-history",
        "deployment.kubernetes.io/desired-replicas",
        "deployment.kubernetes.io/max-replicas",
        "deprecated.deployment.rollback.to",
    }
)
_BY_PATH = {(t.group, t.version, t.resource): t for t in RESOURCE_TYPES}
_BY_KIND = {(t.api_version, t.kind): t for t in RESOURCE_TYPES}


@dataclass(frozen=True)
class RecordedRequest:
    verb: str  # RBAC verb: get, list, create, update, patch, delete
    api_group: str
    resource: str
    namespace: str
    name: str | None = None
    body: Any = field(
        default=None, compare=False
    )  # the JSON body as sent (None: none or not JSON), e.g. the weights of each route write
    status: int | None = field(default=None, compare=False)  # the answer's code (None: not answered yet)


@dataclass
class Injection:
    verb: str
    resource: str
    status: int | None = None
    delay: float = 0.0
    hook: Callable[[], None] | None = None
    mutate: Callable[[dict[str, Any]], None] | None = None
    times: int = 1
    delay_after: float = 0.0


class InvalidObject(ValueError):
    pass


@dataclass
class _Store:
    objects: dict[tuple[str, str, str, str], dict[str, Any]] = field(default_factory=dict)
    revision: int = 1000
    # Watch events: (resourceVersion, type, (group, resource, namespace), object); `compact()` drops them.
    events: list[tuple[int, str, tuple[str, str, str], dict[str, Any]]] = field(default_factory=list)
    compacted: int = 0  # a watch from a resourceVersion below this is 410 Gone


class FakeKubernetes:
    """Start with `with FakeKubernetes() as fake:` (or start()/stop()); `fake.configuration()` for the client."""

    def __init__(self, *, deployment_controller: bool = False, now: Callable[[], float] | None = None) -> None:
        self.deployment_controller = deployment_controller
        self.now = now or (lambda: 1767225600.0)  # 2026-01-01T00:00:00Z: the creation time of simulated objects
        self.requests: list[RecordedRequest] = []
        self._store = _Store()
        self._injections: list[Injection] = []
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._pod_logs: dict[tuple[str, str], str] = {}

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> FakeKubernetes:
        handler = _handler_for(self)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-kubernetes", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes handlers sleeping on an injected delay
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the fake first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def configuration(self) -> kubernetes.client.Configuration:
        config = kubernetes.client.Configuration()
        config.host = self.url
        # No retries inside urllib3: the actuators retry themselves, boundedly, and tests count requests.
        config.retries = 0
        return config

    def api_client(self) -> kubernetes.client.ApiClient:
        return kubernetes.client.ApiClient(self.configuration())

    # -- test controls ------------------------------------------------------------------------------

    def inject(
        self,
        verb: str,
        resource: str,
        *,
        status: int | None = None,
        delay: float = 0.0,
        hook: Callable[[], None] | None = None,
        mutate: Callable[[dict[str, Any]], None] | None = None,
        times: int = 1,
        delay_after: float = 0.0,
    ) -> None:
        """The next `times` requests with this RBAC verb on this resource: run `hook` first, wait `delay`,
        then answer `status` (a Status error) instead of handling them, or handle them, apply `mutate`
        to the stored object and wait `delay_after` before answering (a write that lands, answered late)."""
        with self._lock:
            self._injections.append(Injection(verb, resource, status, delay, hook, mutate, times, delay_after))

    def put_object(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Seed an object (validated like any write); returns it as stored."""
        body = copy.deepcopy(dict(obj))
        rtype = _BY_KIND[(str(body.get("apiVersion")), str(body.get("kind")))]
        namespace = str(body.get("metadata", {}).get("namespace", "default"))
        with self._lock:
            return self._write(rtype, namespace, body, create=True)

    def set_pod_log(self, namespace: str, name: str, text: str) -> None:
        """What `GET .../pods/NAME/log` answers (the pod's container log)."""
        with self._lock:
            self._pod_logs[(namespace, name)] = text

    def get_object(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        rtype = next(t for t in RESOURCE_TYPES if t.resource == resource)
        with self._lock:
            found = self._store.objects.get((rtype.group, resource, namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def objects(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [
                copy.deepcopy(obj)
                for (_, res, ns, _), obj in sorted(self._store.objects.items())
                if res == resource and (namespace is None or ns == namespace)
            ]

    def touch(self, resource: str, namespace: str, name: str) -> None:
        """A concurrent writer: bump the object's resourceVersion (and an annotation) without other changes."""
        rtype = next(t for t in RESOURCE_TYPES if t.resource == resource)
        with self._lock:
            obj = self._store.objects[(rtype.group, resource, namespace, name)]
            obj["metadata"].setdefault("annotations", {})["example.com/touched"] = str(self._store.revision)
            self._store.revision += 1
            obj["metadata"]["resourceVersion"] = str(self._store.revision)

    def compact(self) -> None:
        """Forget the watch history (like etcd compaction): a watch from an older resourceVersion gets 410."""
        with self._lock:
            self._store.events.clear()
            self._store.compacted = self._store.revision + 1

    def delete_object(self, resource: str, namespace: str, name: str) -> None:
        rtype = next(t for t in RESOURCE_TYPES if t.resource == resource)
        with self._lock:
            removed = self._store.objects.pop((rtype.group, resource, namespace, name))
            self._record_event("DELETED", rtype, namespace, removed)

    def _record_event(self, kind: str, rtype: ResourceType, namespace: str, obj: dict[str, Any]) -> None:
        """(under the lock) a watch event; a DELETED one gets a new resourceVersion, as in the real server."""
        if kind == "DELETED":
            self._store.revision += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self._store.revision)
        self._store.events.append(
            (
                int(obj["metadata"]["resourceVersion"]),
                kind,
                (rtype.group, rtype.resource, namespace),
                copy.deepcopy(obj),
            )
        )
        self._changed.notify_all()

    def watch_events(self, rtype: ResourceType, namespace: str, since: int, timeout: float) -> Iterator[dict[str, Any]]:
        """The watch stream: events after `since` in this namespace, until `timeout` seconds or the fake stops."""
        deadline = threading.Event()
        timer = threading.Timer(timeout, deadline.set)
        timer.daemon = True
        timer.start()
        try:
            with self._lock:
                if since and since < self._store.compacted:
                    yield {
                        "type": "ERROR",
                        "object": _status(410, "Expired", f"too old resource version: {since}")[1],
                    }
                    return
            sent = since
            while not deadline.is_set() and not self._stopping.is_set():
                with self._lock:
                    ready = [
                        (rv, kind, obj)
                        for rv, kind, where, obj in self._store.events
                        if rv > sent and where == (rtype.group, rtype.resource, namespace)
                    ]
                    if not ready:
                        self._changed.wait(0.05)
                        continue
                for rv, kind, obj in ready:
                    sent = max(sent, rv)
                    yield {"type": kind, "object": obj}
        finally:
            timer.cancel()

    def calls(self, verb: str | None = None, resource: str | None = None) -> list[RecordedRequest]:
        with self._lock:
            return [
                r
                for r in self.requests
                if (verb is None or r.verb == verb) and (resource is None or r.resource == resource)
            ]

    # -- request handling (called from the handler threads) ----------------------------------------

    def _injection_for(self, verb: str, resource: str) -> Injection | None:
        with self._lock:
            for injection in self._injections:
                if injection.verb == verb and injection.resource == resource and injection.times > 0:
                    injection.times -= 1
                    if injection.times == 0:
                        self._injections.remove(injection)
                    return injection
        return None

    def handle(self, method: str, raw_path: str, content_type: str, body: bytes) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(raw_path)
        route = _parse_path(parts.path)
        if route is None:
            return _status(404, "NotFound", f"the server could not find the requested resource ({parts.path})")
        rtype, namespace, name = route
        verb = _verb(method, name)
        if verb is None:
            return _status(405, "MethodNotAllowed", f"{method} is not supported on {parts.path}")
        try:
            sent = json.loads(body) if body else None
        except ValueError:
            sent = None
        on_status = parts.path.rstrip("/").endswith("/status")
        recorded = rtype.resource + ("/status" if on_status else "")
        query = parse_qs(parts.query)
        if verb == "list" and query.get("watch", [""])[0] in ("true", "1"):
            verb = "watch"
        record = RecordedRequest(verb, rtype.group, recorded, namespace, name, sent)
        with self._lock:
            self.requests.append(record)
        injection = self._injection_for(verb, rtype.resource)
        if injection is not None:
            if injection.hook is not None:
                injection.hook()
            if injection.delay > 0 and self._stopping.wait(injection.delay):
                return _status(503, "ServiceUnavailable", "the fake is stopping")
            if injection.status is not None:
                object.__setattr__(record, "status", injection.status)  # frozen: set once, when answered
                return _status(injection.status, _REASONS.get(injection.status, "InternalError"), "injected failure")
        try:
            payload = json.loads(body) if body else None
        except ValueError:
            return _status(400, "BadRequest", "the request body is not valid JSON")
        with self._lock:
            code, answer = self._dispatch(verb, rtype, namespace, name, content_type, payload, query, on_status)
            object.__setattr__(record, "status", code)  # frozen: set once, when answered
            if injection is not None and injection.mutate is not None and code < 300 and name is not None:
                stored = self._store.objects.get((rtype.group, rtype.resource, namespace, name))
                if stored is not None:
                    injection.mutate(stored)
        if injection is not None and injection.delay_after > 0:
            self._stopping.wait(injection.delay_after)
        return code, answer

    def proxy(
        self, method: str, raw_path: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes] | None:
        """A service-proxy or pod-log request: (status, headers, body); None when `raw_path` is neither."""
        parts = urlsplit(raw_path)
        segments = parts.path.split("/")
        # "", "api", "v1", "namespaces", NS, "services", SERVICE, "proxy", rest... | ... "pods", NAME, "log"
        if segments[1:4] == ["api", "v1", "namespaces"] and len(segments) == 8 and segments[5:8:2] == ["pods", "log"]:
            return self._pod_log(segments[4], segments[6])
        if not (segments[1:4] == ["api", "v1", "namespaces"] and len(segments) >= 8 and segments[5] == "services"
                and segments[7] == "proxy"):  # fmt: skip
            return None
        namespace, reference, rest = segments[4], segments[6], "/" + "/".join(segments[8:])
        fields = reference.split(":")
        name, port = (fields[1], fields[2]) if len(fields) == 3 else (fields[0], fields[1] if len(fields) > 1 else "")
        verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
        record = RecordedRequest(verb, "", "services/proxy", namespace, name)
        with self._lock:
            self.requests.append(record)
        injection = self._injection_for(verb, "services/proxy")
        if injection is not None and injection.status is not None:
            return _raw(_status(injection.status, _REASONS.get(injection.status, "InternalError"), "injected failure"))
        with self._lock:
            backend = self._backend(namespace, name, port)
        if isinstance(backend, tuple):
            return _raw(backend)
        forwarded = {k: v for k, v in headers.items() if k.lower() not in _NOT_PROXIED}
        target = backend + rest + (f"?{parts.query}" if parts.query else "")
        request = urllib.request.Request(target, data=body or None, headers=forwarded, method=method)
        try:
            with _NO_REDIRECTS.open(request, timeout=10) as answer:  # loopback backends only
                return answer.status, _passed(answer.headers), answer.read()
        except urllib.error.HTTPError as refused:
            return refused.code, _passed(refused.headers), refused.read()
        except OSError as unreachable:
            return _raw(_status(503, "ServiceUnavailable", f"error trying to reach service: {unreachable}"))

    def _backend(self, namespace: str, name: str, port: str) -> str | tuple[int, dict[str, Any]]:
        service = self._store.objects.get(("", "services", namespace, name))
        if service is None:
            return _status(404, "NotFound", f'services "{name}" not found')
        ports = service["spec"].get("ports", [])
        chosen = [p for p in ports if port in (str(p.get("name", "")), str(p.get("port")))] if port else ports[:1]
        if not chosen or (not port and len(ports) > 1):
            return _status(503, "ServiceUnavailable", f'no service port "{port}" found for service "{name}"')
        endpoints = self._store.objects.get(("", "endpoints", namespace, name)) or {}
        wanted = (chosen[0].get("name"), chosen[0].get("targetPort"))
        for subset in endpoints.get("subsets", []):
            for address in subset.get("addresses", []):
                for endpoint_port in subset.get("ports", []):
                    if endpoint_port.get("name") == wanted[0] or endpoint_port.get("port") == wanted[1]:
                        return f"http://{address['ip']}:{endpoint_port['port']}"
        return _status(503, "ServiceUnavailable", f'no endpoints available for service "{name}"')

    def _pod_log(self, namespace: str, name: str) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            self.requests.append(RecordedRequest("get", "", "pods/log", namespace, name))
            injection = self._injection_for("get", "pods/log")
            text = self._pod_logs.get((namespace, name))
        if injection is not None and injection.status is not None:
            return _raw(_status(injection.status, _REASONS.get(injection.status, "InternalError"), "injected failure"))
        if text is None:
            return _raw(_status(404, "NotFound", f'pods "{name}" not found'))
        return 200, {"Content-Type": "text/plain"}, text.encode()

    def _dispatch(
        self,
        verb: str,
        rtype: ResourceType,
        namespace: str,
        name: str | None,
        content_type: str,
        payload: Any,
        query: Mapping[str, list[str]],
        on_status: bool = False,
    ) -> tuple[int, dict[str, Any]]:
        key = (rtype.group, rtype.resource, namespace, name or "")
        current = self._store.objects.get(key)
        if verb == "watch":
            return 200, {"watch": True}  # streamed by the handler (watch_events)
        if verb == "list":
            wanted = _label_selector(query.get("labelSelector", [""])[0])
            items = [
                item
                for item in self.objects(rtype.resource, namespace)
                if all(((item.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in wanted.items())
            ]
            return 200, {
                "apiVersion": rtype.api_version,
                "kind": f"{rtype.kind}List",
                "metadata": {"resourceVersion": str(self._store.revision)},
                "items": items,
            }
        if verb == "create":
            if not isinstance(payload, dict):
                return _status(400, "BadRequest", "expected an object")
            payload.setdefault("metadata", {}).setdefault("namespace", namespace)
            wanted = payload["metadata"].get("name")
            if (rtype.group, rtype.resource, namespace, wanted) in self._store.objects:
                return _status(409, "AlreadyExists", f'{rtype.resource} "{wanted}" already exists')
            return self._written(rtype, namespace, payload, create=True)
        assert name is not None
        if current is None:
            return _status(404, "NotFound", f'{rtype.resource}.{rtype.group} "{name}" not found'.replace(". ", " "))
        if verb == "get":
            return 200, copy.deepcopy(current)
        if verb == "delete":
            del self._store.objects[key]
            self._record_event("DELETED", rtype, namespace, current)
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}
        if verb == "update":
            if not isinstance(payload, dict):
                return _status(400, "BadRequest", "expected an object")
            sent_version = payload.get("metadata", {}).get("resourceVersion")
            if sent_version and sent_version != current["metadata"]["resourceVersion"]:
                return _conflict(rtype, name)
            if payload.get("metadata", {}).get("name") != name:
                return _status(400, "BadRequest", "the name of the object does not match the name in the URL")
            payload["metadata"]["uid"] = current["metadata"]["uid"]
            payload["metadata"]["creationTimestamp"] = current["metadata"]["creationTimestamp"]
            return self._written(rtype, namespace, self._subresource(rtype, current, payload, on_status), create=False)
        # patch
        media = content_type.split(";")[0].strip()
        if media == "application/json-patch+json":
            if not isinstance(payload, list):
                return _status(400, "BadRequest", "a JSON patch is a list of operations")
            try:
                patched = _json_patch(current, payload)
            except (KeyError, IndexError, ValueError) as exc:
                return _status(422, "Invalid", f"the JSON patch cannot be applied: {exc}")
        elif media in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(payload, dict):
                return _status(400, "BadRequest", "a merge patch is an object")
            sent_version = payload.get("metadata", {}).get("resourceVersion")
            if sent_version and sent_version != current["metadata"]["resourceVersion"]:
                return _conflict(rtype, name)
            patched = _merge_patch(current, payload)
        else:
            return _status(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {media}")
        return self._written(rtype, namespace, self._subresource(rtype, current, patched, on_status), create=False)

    def _subresource(
        self, rtype: ResourceType, current: dict[str, Any], new: dict[str, Any], on_status: bool
    ) -> dict[str, Any]:
        """A CRD with the status subresource: /status changes only the status, the object everything but it;
        `metadata.generation` counts the spec's changes."""
        if (rtype.group, rtype.resource) not in _STATUS_SUBRESOURCE:
            return new
        if on_status:
            result = copy.deepcopy(current)
            if "status" in new:
                result["status"] = copy.deepcopy(new["status"])
            else:
                result.pop("status", None)
            return result
        result = copy.deepcopy(new)
        if "status" in current:
            result["status"] = copy.deepcopy(current["status"])
        else:
            result.pop("status", None)
        generation = int(current["metadata"].get("generation", 1))
        result["metadata"]["generation"] = generation + (1 if new.get("spec") != current.get("spec") else 0)
        return result

    def _written(
        self, rtype: ResourceType, namespace: str, obj: dict[str, Any], *, create: bool
    ) -> tuple[int, dict[str, Any]]:
        # Like the real server: a body without apiVersion/kind takes them from the URL (the typed client
        # omits them); a body naming another kind is rejected in _validate.
        obj.setdefault("apiVersion", rtype.api_version)
        obj.setdefault("kind", rtype.kind)
        try:
            stored = self._write(rtype, namespace, obj, create=create)
        except InvalidObject as invalid:
            return _status(422, "Invalid", str(invalid))
        return (201 if create else 200), stored

    def _write(self, rtype: ResourceType, namespace: str, obj: dict[str, Any], *, create: bool) -> dict[str, Any]:
        metadata = obj.setdefault("metadata", {})
        metadata["namespace"] = namespace
        if create:
            metadata["uid"] = str(uuid.uuid4())
            metadata["creationTimestamp"] = "2026-01-01T00:00:00Z"
            if (rtype.group, rtype.resource) in _STATUS_SUBRESOURCE:
                metadata["generation"] = 1
                obj.pop("status", None)  # a create never sets the status of a kind with the subresource
        self._validate(rtype, obj)
        self._store.revision += 1
        metadata["resourceVersion"] = str(self._store.revision)
        key = (rtype.group, rtype.resource, namespace, str(metadata.get("name")))
        self._store.objects[key] = obj
        self._record_event("ADDED" if create else "MODIFIED", rtype, namespace, obj)
        if self.deployment_controller and rtype.kind == "Deployment":
            self._roll_out(namespace, obj)
        return copy.deepcopy(obj)

    def _roll_out(self, namespace: str, deployment: dict[str, Any]) -> None:
        """The deployment controller's part (under the lock): the template's ReplicaSet becomes the newest."""
        template = copy.deepcopy(deployment["spec"]["template"])
        template.setdefault("metadata", {}).setdefault("labels", {}).pop("pod-template-hash", None)
        digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        name, uid = deployment["metadata"]["name"], deployment["metadata"]["uid"]
        owned = [
            obj
            for (group, resource, ns, _), obj in self._store.objects.items()
            if (group, resource, ns) == ("apps", "replicasets", namespace)
            and any(o.get("uid") == uid for o in obj["metadata"].get("ownerReferences") or [])
        ]
        numbers = [
            int(rs["metadata"].get("annotations", {}).get("deployment.kubernetes.io/revision", 0)) for rs in owned
        ]
        newest = max(numbers, default=0)
        mine = next((rs for rs in owned if rs["metadata"]["labels"].get("pod-template-hash") == digest), None)
        revision = (
            str(newest)
            if mine is not None
            and int(mine["metadata"]["annotations"].get("deployment.kubernetes.io/revision", 0)) == newest
            else str(newest + 1)
        )
        copied = {
            k: v for k, v in (deployment["metadata"].get("annotations") or {}).items() if k not in _CONTROLLER_SKIPPED
        }
        if mine is None:
            template["metadata"]["labels"]["pod-template-hash"] = digest
            created = datetime.datetime.fromtimestamp(self.now(), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            selector = copy.deepcopy(deployment["spec"]["selector"])
            selector.setdefault("matchLabels", {})["pod-template-hash"] = digest
            mine = {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": f"{name}-{digest}",
                    "namespace": namespace,
                    "labels": dict(template["metadata"]["labels"]),
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "Deployment",
                            "name": name,
                            "uid": uid,
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": {"replicas": deployment["spec"].get("replicas", 1), "selector": selector, "template": template},
            }
            self._write(_BY_PATH[("apps", "v1", "replicasets")], namespace, mine, create=True)
            self._store.objects[("apps", "replicasets", namespace, mine["metadata"]["name"])]["metadata"][
                "creationTimestamp"
            ] = created
            mine = self._store.objects[("apps", "replicasets", namespace, mine["metadata"]["name"])]
        previous = mine["metadata"].get("annotations", {}).get("deployment.kubernetes.io/revision")
        annotations = {**copied, "deployment.kubernetes.io/revision": revision}
        if previous is not None and previous != revision:
            annotations["deployment.kubernetes.io/revision-history"] = previous
        mine["metadata"]["annotations"] = annotations
        deployment["metadata"].setdefault("annotations", {})["deployment.kubernetes.io/revision"] = revision

    def _validate(self, rtype: ResourceType, obj: dict[str, Any]) -> None:
        if obj.get("apiVersion") != rtype.api_version or obj.get("kind") != rtype.kind:
            raise InvalidObject(
                f"expected apiVersion {rtype.api_version!r} and kind {rtype.kind!r}, "
                f"got {obj.get('apiVersion')!r} and {obj.get('kind')!r}"
            )
        if not obj["metadata"].get("name"):
            raise InvalidObject("metadata.name: Required value: name is required")
        if rtype.crd_file is not None:
            validator = self._validators.get(rtype.crd_file)
            if validator is None:
                crd = yaml.safe_load((CRDS / rtype.crd_file).read_text(encoding="utf-8"))
                schema = _openapi_to_json_schema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
                validator = jsonschema.Draft4Validator(schema)
                self._validators[rtype.crd_file] = validator
            errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.path))
            if errors:
                first = errors[0]
                where = ".".join(str(p) for p in first.path) or "(root)"
                raise InvalidObject(
                    f"{rtype.kind}.{rtype.group} {obj['metadata']['name']!r} is invalid: {where}: {first.message}"
                )
            return
        if rtype.schema_file is None:
            try:
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as invalid:
                where = ".".join(str(p) for p in invalid.path) or "(root)"
                raise InvalidObject(f"{rtype.kind} {where}: {invalid.message}") from None
            return
        validator = self._validators.get(rtype.schema_file)
        if validator is None:
            schema = json.loads((SPECS / rtype.schema_file).read_text(encoding="utf-8"))
            validator_class = jsonschema.validators.validator_for(schema)
            validator = validator_class(schema)
            self._validators[rtype.schema_file] = validator
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.path))
        if errors:
            first = errors[0]
            where = ".".join(str(p) for p in first.path) or "(root)"
            raise InvalidObject(f"{rtype.kind} {where}: {first.message}")


_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def _openapi_to_json_schema(node: Any, *, top: bool = True) -> Any:
    """A CRD's structural openAPIV3Schema as a Draft 4 JSON Schema the way the API server applies it:
    `nullable` allows null, `x-kubernetes-int-or-string` an integer or a string, and an object with
    `properties` refuses unknown fields (server-side strict field validation; metadata is the server's)."""
    if isinstance(node, list):
        return [_openapi_to_json_schema(item, top=False) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _openapi_to_json_schema(value, top=False) for key, value in node.items() if key != "properties"}
    if "properties" in node:
        out["properties"] = {
            name: (schema if name == "metadata" and top else _openapi_to_json_schema(schema, top=False))
            for name, schema in node["properties"].items()
        }
        out.setdefault("additionalProperties", False)
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        out["type"] = [*(out["type"] if isinstance(out["type"], list) else [out["type"]]), "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


def _status(code: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
    return code, {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _conflict(rtype: ResourceType, name: str) -> tuple[int, dict[str, Any]]:
    group = f".{rtype.group}" if rtype.group else ""
    return _status(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {rtype.resource}{group} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
    )


def _parse_path(path: str) -> tuple[ResourceType, str, str | None] | None:
    segments = [s for s in path.split("/") if s]
    if segments[:1] == ["api"]:
        group, rest = "", segments[1:]
    elif segments[:1] == ["apis"] and len(segments) > 2:
        group, rest = segments[1], segments[2:]
    else:
        return None
    # rest: version, "namespaces", ns, resource[, name[, subresource]]
    if len(rest) == 6 and (group, rest[0], rest[3], rest[5]) in _SUBRESOURCES:
        rest = rest[:5]
    if len(rest) not in (4, 5) or rest[1] != "namespaces":
        return None
    rtype = _BY_PATH.get((group, rest[0], rest[3]))
    if rtype is None:
        return None
    return rtype, rest[2], rest[4] if len(rest) == 5 else None


def _label_selector(text: str) -> dict[str, str]:
    """An equality label selector (`a=b,c=d`; `==` too) as a dict."""
    wanted: dict[str, str] = {}
    for term in filter(None, (t.strip() for t in text.split(","))):
        key, _, value = term.replace("==", "=").partition("=")
        wanted[key.strip()] = value.strip()
    return wanted


def _verb(method: str, name: str | None) -> str | None:
    if name is None:
        return {"GET": "list", "POST": "create"}.get(method)
    return {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError(f"bad JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json_patch(document: Any, operations: list[Any]) -> Any:
    """RFC 6902: add, remove, replace, test (what clients send to the API server)."""
    result = copy.deepcopy(document)
    for operation in operations:
        op, tokens = operation["op"], _pointer(operation["path"])
        parent: Any = result
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last = tokens[-1]
        if op == "test":
            actual = parent[int(last)] if isinstance(parent, list) else parent[last]
            if actual != operation["value"]:
                raise ValueError(f"test failed at {operation['path']}")
        elif op in ("add", "replace"):
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if op == "add":
                    parent.insert(index, operation["value"])
                else:
                    parent[index] = operation["value"]
            else:
                if op == "replace" and last not in parent:
                    raise KeyError(f"no value at {operation['path']}")
                parent[last] = operation["value"]
        elif op == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                del parent[last]
        else:
            raise ValueError(f"unsupported JSON patch op {op!r}")
    return result


# Headers the service proxy does not pass on: the user's credential (kube-apiserver removes it once it has
# authenticated the request) and the hop-by-hop ones.
_NOT_PROXIED = frozenset({"authorization", "host", "connection", "content-length", "transfer-encoding", "keep-alive"})


class _KeepRedirects(urllib.request.HTTPRedirectHandler):
    """The proxy passes a backend's redirect on to the client (as the API server does), never follows it."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_NO_REDIRECTS = urllib.request.build_opener(_KeepRedirects)


def _raw(answer: tuple[int, dict[str, Any]]) -> tuple[int, dict[str, str], bytes]:
    return answer[0], {"Content-Type": "application/json"}, json.dumps(answer[1]).encode()


def _passed(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _NOT_PROXIED}


def _handler_for(fake: FakeKubernetes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            proxied = fake.proxy(self.command, self.path, dict(self.headers.items()), body)
            if proxied is not None:
                status, headers, data = proxied
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass
                return
            code, answer = fake.handle(self.command, self.path, self.headers.get("Content-Type", ""), body)
            if code == 200 and answer.get("watch") is True:
                self._stream_watch()
                return
            data = json.dumps(answer).encode()
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the client gave up (an injected delay made it time out)

        def _stream_watch(self) -> None:
            """JSON lines until the watch's timeout, each event in its own HTTP chunk (as the API server streams a
            watch: `Transfer-Encoding: chunked`; a client reading a close-delimited body whole would see nothing until
            the timeout); the connection closes at the end, as the server's does."""
            parts = urlsplit(self.path)
            route = _parse_path(parts.path)
            assert route is not None
            query = parse_qs(parts.query)
            since = int(query.get("resourceVersion", ["0"])[0] or 0)
            timeout = float(query.get("timeoutSeconds", ["30"])[0])
            self.close_connection = True
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Connection", "close")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                for event in fake.watch_events(route[0], route[1], since, timeout):
                    line = json.dumps(event).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass  # the client closed the watch

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def running_fake() -> Iterator[FakeKubernetes]:
    fake = FakeKubernetes().start()
    try:
        yield fake
    finally:
        fake.stop()


def hpa(name: str, namespace: str = "llm", *, min_replicas: int = 2, max_replicas: int = 10) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "vllm:num_requests_waiting"},
                        "target": {"type": "AverageValue", "averageValue": "5"},
                    },
                }
            ],
        },
        "status": {"currentReplicas": min_replicas, "desiredReplicas": min_replicas},
    }


def http_route(
    name: str, namespace: str = "llm", backends: Mapping[str, int] | None = None, *, port: int = 8000
) -> dict[str, Any]:
    weights = dict(backends or {f"{name}-r1": 90, f"{name}-r2": 10})
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "parentRefs": [{"name": "llm-gateway"}],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                    "backendRefs": [
                        {"name": backend, "port": port, "weight": weight} for backend, weight in weights.items()
                    ],
                }
            ],
        },
    }


def virtual_service(
    name: str, namespace: str = "llm", subsets: Mapping[str, int] | None = None, *, host: str | None = None
) -> dict[str, Any]:
    weights = dict(subsets or {"r1": 90, "r2": 10})
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "hosts": [host or name],
            "http": [
                {
                    "route": [
                        {"destination": {"host": host or name, "subset": subset}, "weight": weight}
                        for subset, weight in weights.items()
                    ]
                }
            ],
        },
    }


def deployment(
    name: str, namespace: str = "llm", *, replicas: int = 2, image: str = "vllm/vllm-openai:v0.32.0"
) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "vllm", "image": image}]},
            },
        },
    }


def helm_release_secret(
    release: str, version: int, status: str, manifest: str, namespace: str = "llm"
) -> dict[str, Any]:
    """A Helm 3 release record as Helm stores it: Secret `sh.helm.release.v1.<release>.v<N>`, type
    `helm.sh/release.v1`, labels owner/name/status/version, `data.release` = base64(base64(gzip(release JSON)))."""
    body = {
        "name": release,
        "version": version,
        "namespace": namespace,
        "info": {"status": status},
        "manifest": manifest,
    }
    encoded = base64.b64encode(gzip.compress(json.dumps(body).encode())).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "helm.sh/release.v1",
        "metadata": {
            "name": f"sh.helm.release.v1.{release}.v{version}",
            "namespace": namespace,
            "labels": {"owner": "helm", "name": release, "status": status, "version": str(version)},
        },
        "data": {"release": base64.b64encode(encoded.encode()).decode()},
    }
