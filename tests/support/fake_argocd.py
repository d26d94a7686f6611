"""A loopback Argo CD API server that validates every request against Argo CD's own swagger.

Any request whose path, method, query parameters or body the swagger (tests/support/specs/argocd-swagger.json)
does not allow is answered 400 with `{"error": "spec: ..."}` and recorded in `spec_violations`, so a test that
passes means the real Argo CD would accept the same requests. Bodies are checked with $refs resolved, required
fields, types, and properties the schema does not declare (a typo such as `dry_run` is caught).

It answers like Argo CD: errors are `{"error", "code", "message"}` with the gRPC code (3 InvalidArgument for an
unknown history id, 5 NotFound, 9 FailedPrecondition for a rollback while automated sync is on, 16
Unauthenticated without a token); a rollback starts an operation that reaches Succeeded (and the app Healthy, or
`rollback_health`) after `progress_polls` further GETs, and appends a history entry, as Argo CD does.
Failures are injectable: `fail_next(status, count)`, `delay_next(seconds, count)` (a timeout for the client) and
`answer_late(seconds, count)` (served at once, answered too late: an ambiguous timeout).
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, unquote, urlsplit

SPEC_PATH = Path(__file__).resolve().parent / "specs" / "argocd-swagger.json"

GRPC_HTTP = {3: 400, 5: 404, 9: 400, 16: 401}


class SwaggerValidator:
    """Swagger 2.0 request validation: operations by method and path template, parameters, bodies."""

    def __init__(self, spec: Mapping[str, Any]):
        self.spec = spec
        self.routes: list[tuple[re.Pattern[str], str, list[str]]] = []
        for template in spec["paths"]:
            names = re.findall(r"\{([^}]+)\}", template)
            pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "([^/]+)", re.escape(template)) + "$"
            self.routes.append((re.compile(pattern), template, names))
        # Literal paths first, so /api/v1/applications/{name}/rollback never matches a looser template.
        self.routes.sort(key=lambda route: route[1].count("{"))

    @staticmethod
    def load(path: Path = SPEC_PATH) -> SwaggerValidator:
        return SwaggerValidator(json.loads(path.read_text(encoding="utf-8")))

    def resolve(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        while "$ref" in schema:
            ref = str(schema["$ref"])
            node: Any = self.spec
            for part in ref.removeprefix("#/").split("/"):
                node = node[part]
            schema = node
        return schema

    def match(self, method: str, path: str) -> tuple[str, dict[str, Any], dict[str, str]]:
        """(template, operation, path parameters); ValueError when the spec has no such operation."""
        matched_path = False
        for pattern, template, names in self.routes:
            found = pattern.match(path)
            if found is None:
                continue
            matched_path = True
            operation = self.spec["paths"][template].get(method.lower())
            if operation is not None:
                return template, operation, {n: unquote(v) for n, v in zip(names, found.groups(), strict=True)}
        if matched_path:
            raise ValueError(f"method {method} is not defined for {path}")
        raise ValueError(f"path {path} is not in the Argo CD API")

    def validate_request(self, method: str, raw_path: str, body: Any, has_body: bool) -> tuple[str, dict[str, str]]:
        parts = urlsplit(raw_path)
        template, operation, path_params = self.match(method, parts.path)
        params = operation.get("parameters", [])
        query = parse_qs(parts.query, keep_blank_values=True)
        declared_query = {p["name"]: p for p in params if p["in"] == "query"}
        for name, values in query.items():
            if name not in declared_query:
                raise ValueError(f"query parameter {name!r} is not declared for {method} {template}")
            declared = declared_query[name]
            if declared.get("type") != "array" and len(values) > 1:
                raise ValueError(f"query parameter {name!r} given {len(values)} times")
            for value in values:
                self._check_scalar(
                    declared.get("items", declared) if declared.get("type") == "array" else declared,
                    value,
                    f"query.{name}",
                )
        for param in params:
            if param["in"] == "path":
                self._check_scalar(param, path_params[param["name"]], f"path.{param['name']}")
        body_params = [p for p in params if p["in"] == "body"]
        if body_params:
            if not has_body:
                raise ValueError(f"{method} {template} needs a JSON body")
            self.validate(body, body_params[0]["schema"], "body")
        elif has_body:
            raise ValueError(f"{method} {template} takes no body")
        return template, path_params

    @staticmethod
    def _check_scalar(param: Mapping[str, Any], value: str, where: str) -> None:
        kind = param.get("type", "string")
        if kind == "boolean" and value not in ("true", "false"):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        if kind == "integer" and not re.fullmatch(r"-?\d+", value):
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        if "enum" in param and value not in param["enum"]:
            raise ValueError(f"{where}: expected one of {param['enum']}, got {value!r}")

    def validate(self, value: Any, schema: Mapping[str, Any], where: str) -> None:
        schema = self.resolve(schema)
        kind = schema.get("type")
        if kind is None and "properties" in schema:
            kind = "object"
        if kind == "object":
            if not isinstance(value, dict):
                raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
            properties = schema.get("properties")
            for name in schema.get("required", []):
                if name not in value:
                    raise ValueError(f"{where}.{name}: required")
            extra = schema.get("additionalProperties")
            for name, item in value.items():
                if properties is not None and name in properties:
                    self.validate(item, properties[name], f"{where}.{name}")
                elif isinstance(extra, dict):
                    self.validate(item, extra, f"{where}.{name}")
                elif properties is not None or extra is False:
                    raise ValueError(f"{where}.{name}: property not declared by the schema")
        elif kind == "array":
            if not isinstance(value, list):
                raise ValueError(f"{where}: expected an array, got {type(value).__name__}")
            for index, item in enumerate(value):
                self.validate(item, schema.get("items", {}), f"{where}[{index}]")
        elif kind == "string":
            # grpc-gateway also accepts int64 as a string; a string field never accepts a number.
            if not isinstance(value, str):
                raise ValueError(f"{where}: expected a string, got {type(value).__name__}")
            if "enum" in schema and value not in schema["enum"]:
                raise ValueError(f"{where}: expected one of {schema['enum']}, got {value!r}")
        elif kind == "integer":
            int64_string = schema.get("format") == "int64" and isinstance(value, str) and value.lstrip("-").isdigit()
            if not int64_string and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"{where}: expected an integer, got {json.dumps(value)}")
        elif kind == "number":
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"{where}: expected a number, got {json.dumps(value)}")
        elif kind == "boolean" and not isinstance(value, bool):
            raise ValueError(f"{where}: expected a boolean, got {json.dumps(value)}")


def application(
    name: str,
    history: list[tuple[str, float]],
    *,
    automated: bool = False,
    namespace: str = "argocd",
    project: str = "default",
    helm_parameters: Mapping[str, list[tuple[str, str]]] | None = None,
) -> dict[str, Any]:
    """An Application as Argo CD returns it: `history` is [(revision, deployedAt epoch seconds)], oldest first."""
    entries = []
    for index, (revision, at) in enumerate(history, start=1):
        source: dict[str, Any] = {"repoURL": "https://git.example/llm.git", "path": "serving", "targetRevision": "HEAD"}
        params = (helm_parameters or {}).get(revision)
        if params is not None:
            source["helm"] = {"parameters": [{"name": k, "value": v} for k, v in params]}
        entries.append(
            {
                "id": index,
                "revision": revision,
                "deployedAt": _rfc3339(at),
                "deployStartedAt": _rfc3339(at - 5),
                "source": source,
            }
        )
    current = history[-1][0] if history else ""
    spec: dict[str, Any] = {
        "project": project,
        "source": {"repoURL": "https://git.example/llm.git", "path": "serving", "targetRevision": "HEAD"},
        "destination": {"server": "https://kubernetes.default.svc", "namespace": "llm"},
    }
    if automated:
        spec["syncPolicy"] = {"automated": {"prune": True, "selfHeal": True}}
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
        "status": {
            "history": entries,
            "sync": {"status": "Synced", "revision": current},
            "health": {"status": "Degraded"},
            "operationState": {
                "phase": "Succeeded",
                "message": "successfully synced",
                "operation": {"sync": {"revision": current}},
            },
        },
    }


def _rfc3339(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


@dataclass
class RecordedRequest:
    method: str
    path: str
    body: Any
    status: int


@dataclass
class FakeArgoCDState:
    apps: dict[str, dict[str, Any]] = field(default_factory=dict)
    token: str = "argocd-test-token"
    progress_polls: int = 2
    rollback_health: str = "Healthy"
    rollback_phase: str = "Succeeded"
    requests: list[RecordedRequest] = field(default_factory=list)
    spec_violations: list[str] = field(default_factory=list)
    failures: list[tuple[str | None, int]] = field(default_factory=list)  # (method or any, status) to answer next
    delays: list[tuple[str | None, float]] = field(default_factory=list)  # (method or any, seconds) to stall next
    late: list[tuple[str | None, float]] = field(default_factory=list)  # (method or any, seconds) to answer late
    hidden_ids: set[int] = field(default_factory=set)  # history ids the rollback no longer finds (trimmed history)
    pending: dict[str, int] = field(default_factory=dict)  # app -> GETs left until its operation finishes


class FakeArgoCD:
    def __init__(self, validator: SwaggerValidator | None = None) -> None:
        self.validator = validator or SwaggerValidator.load()
        self.state = FakeArgoCDState()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-argocd", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Self:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- test controls --------------------------------------------------------------------------------

    def add_app(self, app: dict[str, Any]) -> None:
        with self.lock:
            self.state.apps[app["metadata"]["name"]] = copy.deepcopy(app)

    def app(self, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.state.apps[name])

    def fail_next(self, status: int, count: int = 1, method: str | None = None) -> None:
        """Answer the next `count` requests (of `method`, or any) with `status` instead of serving them."""
        with self.lock:
            self.state.failures.extend([(method, status)] * count)

    def delay_next(self, seconds: float, count: int = 1, method: str | None = None) -> None:
        """Stall the next `count` requests (of `method`, or any) before serving them: the client times out, yet
        the request still takes effect, as with a real server behind a slow proxy."""
        with self.lock:
            self.state.delays.extend([(method, seconds)] * count)

    def answer_late(self, seconds: float, count: int = 1, method: str | None = None) -> None:
        """Serve the next `count` requests (of `method`, or any) at once, but answer `seconds` late: the client times
        out after the request took effect (an ambiguous failure; a read meanwhile already sees the effect)."""
        with self.lock:
            self.state.late.extend([(method, seconds)] * count)

    @staticmethod
    def _take(queue: list[tuple[str | None, Any]], method: str) -> Any:
        for index, (wanted, value) in enumerate(queue):
            if wanted is None or wanted == method:
                del queue[index]
                return value
        return None

    def calls(self, method: str, suffix: str = "") -> list[RecordedRequest]:
        with self.lock:
            return [r for r in self.state.requests if r.method == method and r.path.split("?")[0].endswith(suffix)]

    # -- behaviour ------------------------------------------------------------------------------------

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: Any, has_body: bool) -> tuple[int, Any]:
        with self.lock:
            delay = self._take(self.state.delays, method) or 0.0
        if delay:
            time.sleep(delay)
        try:
            template, params = self.validator.validate_request(method, path, body, has_body)
        except ValueError as invalid:
            with self.lock:
                self.state.spec_violations.append(f"{method} {path}: {invalid}")
            return 400, {"error": f"spec: {invalid}", "code": 3, "message": f"spec: {invalid}"}
        if headers.get("authorization") != f"Bearer {self.state.token}":
            return _grpc_error(16, "no session information")
        with self.lock:
            status = self._take(self.state.failures, method)
            if status is not None:
                return status, {"error": "injected failure", "code": 14, "message": "injected failure"}
            return self._route(method, template, params, body)

    def _route(self, method: str, template: str, params: Mapping[str, str], body: Any) -> tuple[int, Any]:
        name = params.get("name") or params.get("application.metadata.name") or ""
        app = self.state.apps.get(name)
        if app is None:
            return _grpc_error(5, f'applications.argoproj.io "{name}" not found')
        if method == "GET" and template == "/api/v1/applications/{name}":
            self._progress(name, app)
            return 200, app
        if method == "POST" and template == "/api/v1/applications/{name}/rollback":
            return self._rollback(name, app, body)
        if method == "PATCH" and template == "/api/v1/applications/{name}":
            if body.get("patchType") != "merge":
                return _grpc_error(3, f"Patch type '{body.get('patchType')}' is not supported")
            patch = json.loads(body.get("patch") or "{}")
            _merge_patch(app, patch)
            return 200, app
        return _grpc_error(12, f"{method} {template} is not implemented by the fake")

    def _rollback(self, name: str, app: dict[str, Any], body: Mapping[str, Any]) -> tuple[int, Any]:
        if body.get("name") not in (None, name):
            return _grpc_error(3, f"application name {body.get('name')!r} does not match {name!r}")
        if app["spec"].get("syncPolicy", {}).get("automated") is not None:
            return _grpc_error(9, "rollback cannot be initiated when auto-sync is enabled")
        if app["status"].get("operationState", {}).get("phase") == "Running":
            return _grpc_error(9, "another operation is already in progress")
        wanted = int(body.get("id", 0))
        entry = next(
            (e for e in app["status"]["history"] if int(e["id"]) == wanted and wanted not in self.state.hidden_ids),
            None,
        )
        if entry is None:
            return _grpc_error(3, f"application {name} does not have deployment id '{wanted}' in history\n")
        if body.get("dryRun"):
            return 200, app
        app["status"]["operationState"] = {
            "phase": "Running",
            "message": "rollback in progress",
            "operation": {"sync": {"revision": entry["revision"]}, "initiatedBy": {"username": "tailguard"}},
        }
        app["status"]["health"] = {"status": "Progressing"}
        self.state.pending[name] = self.state.progress_polls
        return 200, app

    def _progress(self, name: str, app: dict[str, Any]) -> None:
        left = self.state.pending.get(name)
        if left is None:
            return
        if left > 0:
            self.state.pending[name] = left - 1
            return
        del self.state.pending[name]
        operation = app["status"]["operationState"]
        revision = operation["operation"]["sync"]["revision"]
        operation["phase"] = self.state.rollback_phase
        operation["message"] = "successfully synced" if self.state.rollback_phase == "Succeeded" else "sync failed"
        if self.state.rollback_phase == "Succeeded":
            history = app["status"]["history"]
            source: Any = next((e["source"] for e in history if e["revision"] == revision), {})
            history.append(
                {
                    "id": max(int(e["id"]) for e in history) + 1,
                    "revision": revision,
                    "deployedAt": _rfc3339(time.time()),
                    "source": copy.deepcopy(source),
                }
            )
            app["status"]["sync"] = {"status": "OutOfSync", "revision": revision}
            app["status"]["health"] = {"status": self.state.rollback_health}
        else:
            app["status"]["health"] = {"status": "Degraded"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body: Any = None
                status: int
                answer: Any
                if raw:
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        status, answer = 400, {"error": "invalid JSON body", "code": 3, "message": "invalid JSON body"}
                        self._send(method, body, status, answer)
                        return
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, answer = fake.handle(method, self.path, headers, body, bool(raw))
                with fake.lock:
                    late = fake._take(fake.state.late, method) or 0.0
                self._send(method, body, status, answer, late)

            def _send(self, method: str, body: Any, status: int, answer: Any, late: float = 0.0) -> None:
                with fake.lock:
                    fake.state.requests.append(RecordedRequest(method, self.path, body, status))
                if late:
                    time.sleep(late)
                data = json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test): nothing to answer

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_PATCH(self) -> None:
                self._serve("PATCH")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

        return Handler


def _grpc_error(code: int, message: str) -> tuple[int, dict[str, Any]]:
    return GRPC_HTTP.get(code, 500), {"error": message, "code": code, "message": message}


def _merge_patch(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """RFC 7386: null deletes, objects merge, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


@contextmanager
def running_fake_argocd() -> Iterator[FakeArgoCD]:
    fake = FakeArgoCD().start()
    try:
        yield fake
    finally:
        fake.stop()
