"""A spec-validating fake Grafana on loopback (stdlib only).

Loads the Swagger 2.0 copies in tests/support/specs/ and rejects (HTTP 400,
recorded in `rejections`) any request whose path, method, query parameters or
JSON body the spec does not allow: $refs are resolved, required properties and
types are checked, and properties the schema does not declare are refused (so
a typo in a field name fails the test instead of being silently ignored).

It answers like Grafana: `{"message": "Annotation added", "id": N}`, 401 without
the right bearer token, `{"message": ...}` errors. Test controls: `fail_next`
(e.g. 500s), `delay_next` (answer late, after storing: an ambiguous timeout),
`down()`/`up()` (the port refuses connections, then listens again).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

SPECS = Path(__file__).parent / "specs"
SPEC_FILES = ("grafana-annotations-swagger.json", "grafana-dashboards-swagger.json")


class SpecViolation(Exception):
    pass


@dataclass
class Operation:
    method: str
    template: str
    pattern: re.Pattern[str]
    parameters: list[dict[str, Any]]
    spec: dict[str, Any]


def _load_operations() -> list[Operation]:
    operations: list[Operation] = []
    for name in SPEC_FILES:
        spec = json.loads((SPECS / name).read_text(encoding="utf-8"))
        base = spec.get("basePath", "")
        for template, methods in spec["paths"].items():
            regex = re.sub(r"\\\{[^}]+\\\}", "([^/]+)", re.escape(base + template))
            for method, operation in methods.items():
                operations.append(
                    Operation(
                        method.upper(), base + template, re.compile(f"^{regex}$"), operation.get("parameters", []), spec
                    )
                )
    # Literal paths before templated ones: /annotations/tags must not match /annotations/{annotation_id}.
    operations.sort(key=lambda op: op.template.count("{"))
    return operations


def _resolve(spec: Mapping[str, Any], schema: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in schema:
        ref = str(schema["$ref"])
        if not ref.startswith("#/"):
            raise SpecViolation(f"unsupported $ref {ref}")
        node: Any = spec
        for part in ref[2:].split("/"):
            node = node[part]
        schema = node
    return schema


def validate(spec: Mapping[str, Any], schema: Mapping[str, Any], value: Any, where: str) -> None:
    """A strict Swagger 2.0 schema check: types, required, enums, no undeclared properties."""
    schema = _resolve(spec, schema)
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        if not isinstance(value, dict):
            raise SpecViolation(f"{where}: expected an object, got {type(value).__name__}")
        properties = schema.get("properties")
        for required in schema.get("required", []):
            if required not in value:
                raise SpecViolation(f"{where}: missing required property {required!r}")
        if properties is None:
            return  # a free-form object (Grafana's Json)
        for key, item in value.items():
            if key not in properties:
                raise SpecViolation(f"{where}: property {key!r} is not declared by the spec")
            validate(spec, properties[key], item, f"{where}.{key}")
        return
    if kind == "array":
        if not isinstance(value, list):
            raise SpecViolation(f"{where}: expected an array, got {type(value).__name__}")
        for index, item in enumerate(value):
            validate(spec, schema.get("items", {}), item, f"{where}[{index}]")
        return
    checks: dict[str, Any] = {
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
    }
    if kind in checks and not checks[kind](value):
        raise SpecViolation(f"{where}: expected {kind}, got {json.dumps(value)[:60]}")
    if "enum" in schema and value not in schema["enum"]:
        raise SpecViolation(f"{where}: {value!r} is not one of {schema['enum']}")


def _query_value(kind: str, raw: str, where: str) -> Any:
    if kind == "integer":
        if not re.fullmatch(r"-?\d+", raw):
            raise SpecViolation(f"{where}: expected an integer, got {raw!r}")
        return int(raw)
    if kind == "boolean":
        if raw not in ("true", "false"):
            raise SpecViolation(f"{where}: expected true or false, got {raw!r}")
        return raw == "true"
    return raw


def check_request(
    operations: list[Operation], method: str, path: str, query: str, body: Any
) -> tuple[Operation, dict[str, Any], list[str]]:
    """The matched operation, its query parameters (typed) and path parameters; SpecViolation otherwise."""
    for operation in operations:
        match = operation.pattern.match(path)
        if match is None or operation.method != method:
            continue
        declared = {p["name"]: p for p in operation.parameters if p.get("in") == "query"}
        params: dict[str, Any] = {}
        for name, values in parse_qs(query, keep_blank_values=True).items():
            if name not in declared:
                raise SpecViolation(f"{method} {operation.template}: query parameter {name!r} is not declared")
            parameter = declared[name]
            if parameter.get("type") == "array":
                item_kind = parameter.get("items", {}).get("type", "string")
                params[name] = [_query_value(item_kind, v, f"query {name}") for v in values]
            else:
                if len(values) > 1:
                    raise SpecViolation(f"query parameter {name!r} given {len(values)} times")
                params[name] = _query_value(parameter.get("type", "string"), values[0], f"query {name}")
                if "enum" in parameter and params[name] not in parameter["enum"]:
                    raise SpecViolation(f"query {name}: {params[name]!r} is not one of {parameter['enum']}")
        body_params = [p for p in operation.parameters if p.get("in") == "body"]
        if body_params:
            if body is None and body_params[0].get("required"):
                raise SpecViolation(f"{method} {operation.template}: a JSON body is required")
            if body is not None:
                validate(operation.spec, body_params[0]["schema"], body, "body")
        elif body is not None:
            raise SpecViolation(f"{method} {operation.template}: takes no body")
        return operation, params, list(match.groups())
    known = sorted({op.template for op in operations if op.pattern.match(path)})
    if known:
        raise SpecViolation(f"{method} is not allowed on {path} (spec: {', '.join(known)})")
    raise SpecViolation(f"{method} {path}: no such path in the Grafana spec")


@dataclass
class Recorded:
    method: str
    path: str
    query: str
    body: Any
    status: int


@dataclass
class FakeGrafanaState:
    token: str
    annotations: dict[int, dict[str, Any]] = field(default_factory=dict)
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)  # statuses to answer next, one per request
    delays: list[float] = field(default_factory=list)  # answer late (after acting), one per request
    next_id: int = 1


class FakeGrafana:
    """`with FakeGrafana(token="t") as grafana:`; `grafana.url` is http://127.0.0.1:PORT."""

    def __init__(self, token: str = "test-token") -> None:
        self.state = FakeGrafanaState(token=token)
        self.lock = threading.Lock()
        self.operations = _load_operations()
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- controls ---------------------------------------------------------------------------------------

    def up(self) -> None:
        if self._server is not None:
            return
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        server.daemon_threads = True
        server.block_on_close = False
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def down(self) -> None:
        """Stop listening: connections are refused until up()."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(5)

    def fail_next(self, *statuses: int) -> None:
        with self.lock:
            self.state.failures.extend(statuses)

    def delay_next(self, *seconds: float) -> None:
        with self.lock:
            self.state.delays.extend(seconds)

    def annotations(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(a) for a in sorted(self.state.annotations.values(), key=lambda a: a["id"])]

    def requests(self, method: str | None = None) -> list[Recorded]:
        with self.lock:
            return [r for r in self.state.requests if method is None or r.method == method]

    def close(self) -> None:
        self.down()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- behaviour ---------------------------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, headers: Mapping[str, str], raw_body: bytes) -> tuple[int, Any]:
        parts = urlsplit(raw_path)
        body: Any = None
        if raw_body:
            try:
                body = json.loads(raw_body)
            except ValueError:
                return 400, {"message": "bad request data"}
        with self.lock:
            failure = self.state.failures.pop(0) if self.state.failures else None
        if headers.get("Authorization") != f"Bearer {self.state.token}":
            return 401, {"message": "Unauthorized"}
        if failure is not None:
            return failure, {"message": "Internal Server Error" if failure >= 500 else "injected failure"}
        try:
            operation, params, path_params = check_request(self.operations, method, parts.path, parts.query, body)
        except SpecViolation as violation:
            with self.lock:
                self.state.rejections.append(str(violation))
            return 400, {"message": f"request does not match the Grafana spec: {violation}"}
        with self.lock:
            return self._act(operation.template, method, params, path_params, body)

    def _act(
        self, template: str, method: str, params: dict[str, Any], path_params: list[str], body: Any
    ) -> tuple[int, Any]:
        state = self.state
        now_ms = int(time.time() * 1000)
        if template == "/api/annotations" and method == "POST":
            annotation_id = state.next_id
            state.next_id += 1
            stored = {"id": annotation_id, "tags": [], "created": now_ms, "updated": now_ms, **body}
            stored.setdefault("time", now_ms)
            stored.setdefault("timeEnd", stored["time"])
            state.annotations[annotation_id] = stored
            return 200, {"message": "Annotation added", "id": annotation_id}
        if template == "/api/annotations" and method == "GET":
            found = list(state.annotations.values())
            tags = params.get("tags") or []
            if tags:
                match_any = params.get("matchAny", False)
                test = any if match_any else all
                found = [a for a in found if test(tag in a.get("tags", []) for tag in tags)]
            if "from" in params:
                found = [a for a in found if a.get("timeEnd", a["time"]) >= params["from"]]
            if "to" in params:
                found = [a for a in found if a["time"] <= params["to"]]
            if "dashboardUID" in params:
                found = [a for a in found if a.get("dashboardUID") == params["dashboardUID"]]
            found.sort(key=lambda a: a["time"], reverse=True)
            return 200, found[: params.get("limit", 100)]
        if template == "/api/annotations/{annotation_id}":
            try:
                annotation_id = int(path_params[0])
            except ValueError:
                return 400, {"message": "annotationId is invalid"}
            existing = state.annotations.get(annotation_id)
            if existing is None:
                return 404, {"message": "Annotation not found"}
            if method == "GET":
                return 200, existing
            if method == "PATCH":
                for key in ("text", "tags", "time", "timeEnd", "data"):
                    if key in body:
                        existing[key] = body[key]
                existing["updated"] = now_ms
                return 200, {"message": "Annotation patched"}
            if method == "DELETE":
                del state.annotations[annotation_id]
                return 200, {"message": "Annotation deleted"}
            return 501, {"message": "not implemented in the fake"}
        if template == "/api/dashboards/db" and method == "POST":
            dashboard = body.get("dashboard") or {}
            uid = dashboard.get("uid")
            if not isinstance(uid, str) or not uid:
                return 400, {"message": "the fake needs dashboard.uid"}
            if uid in state.dashboards and not body.get("overwrite"):
                return 412, {"message": "A dashboard with the same uid already exists", "status": "name-exists"}
            version = int(state.dashboards.get(uid, {}).get("version", 0)) + 1
            state.dashboards[uid] = {"dashboard": dashboard, "folderUid": body.get("folderUid"), "version": version}
            return 200, {
                "id": len(state.dashboards),
                "uid": uid,
                "url": f"/d/{uid}/{dashboard.get('title', uid).lower().replace(' ', '-')}",
                "status": "success",
                "version": version,
                "title": dashboard.get("title", uid),
            }
        if template == "/api/dashboards/uid/{uid}" and method == "GET":
            entry = state.dashboards.get(path_params[0])
            if entry is None:
                return 404, {"message": "Dashboard not found"}
            return 200, {"dashboard": entry["dashboard"], "meta": {"folderUid": entry["folderUid"] or ""}}
        return 501, {"message": f"{method} {template} is valid but not implemented in the fake"}


def _handler(fake: FakeGrafana) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            status, answer = fake.handle(self.command, self.path, dict(self.headers.items()), raw)
            try:
                parsed: Any = json.loads(raw) if raw else None
            except ValueError:
                parsed = raw.decode("utf-8", "replace")
            parts = urlsplit(self.path)
            with fake.lock:
                fake.state.requests.append(Recorded(self.command, parts.path, parts.query, parsed, status))
                delay = fake.state.delays.pop(0) if fake.state.delays else 0.0
            if delay:
                time.sleep(delay)  # acted already: the client times out not knowing that it landed
            data = json.dumps(answer).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the client gave up (timeout): nothing to tell it

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
