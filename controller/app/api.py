"""The controller's HTTP API: health, readiness, metrics, the Alertmanager webhook, recent decisions.

stdlib ThreadingHTTPServer: a handful of small JSON endpoints need no framework.

Alertmanager webhooks (payload version "4") are a second, push trigger next to
the schedule. Matching rule, alert -> policies (see `policies_for_alert`):

1. if the alert carries a `tailguard_policy` label, only the policy of that name
   is considered (an explicit route wins; it must still pass 2 and 3);
2. every `targets.match` label of the policy is present in the alert's labels
   with exactly the same value (a policy without `match` passes);
3. every `targets.groupBy` label of the policy is present in the alert's labels
   (an alert that cannot name one of the policy's targets is about something
   else: a `service`-level policy is not woken by a node alert).

Firing and resolved alerts both trigger: a resolved alert is news too (the
engine may be about to recover). The evaluation queries the policy's signals
against Prometheus, as a scheduled one would, but applies the observations only
to the targets the alerts name (`alert_target`: the values of the policy's
`groupBy` labels in the alert; alerts of one post naming several targets of a
policy touch each of them): every other target's streak, recovery and error
count stay as they were. The alert only says "look now at this target"; the
observation counts toward `for` like any other, and never shortens it (a
`for: N` streak must span (N-1) x interval, see rules/README.md).

Authentication: with a webhook token (settings `webhook:`), `POST /api/v1/alerts`
needs `Authorization: Bearer <token>`: 401 without it, 403 with another token
(compared in constant time, so the answer time does not leak how much of a guess
was right). The token is never logged or echoed. /healthz, /readyz and /metrics
stay open: probes and Prometheus have no token and expose nothing that acts.

Standby: with leader election, only the leader evaluates. A replica that is not the leader answers
`POST /api/v1/alerts` with 503, a `Retry-After` header and `{"standby": true, ...}` instead of accepting an alert
it would drop: Alertmanager retries a 5xx (notify/util.go `Retrier.Check`: 5xx are retried, 4xx are not), and
through the Service a retry reaches the leader. Nothing is evaluated on the standby, so nothing acts twice.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controller.core.model import TargetKey, target_key
from controller.core.policy import Policy
from controller.core.ports import TRIGGER_ALERT, ControllerPort, LeaderPort
from controller.kit.errors import InputError
from controller.loop.metrics import EXPOSITION_CONTENT_TYPE

logger = logging.getLogger("tailguard.api")

MAX_BODY_BYTES = 1 << 20  # Alertmanager batches alerts per group; a megabyte is thousands of them
POLICY_LABEL = "tailguard_policy"
DEFAULT_DECISIONS = 50
MAX_DECISIONS = 1000
STANDBY_RETRY_AFTER_SECONDS = 2  # about one leader-election retry period: the Lease is settled by then


class _Payload(BaseModel):
    # Alertmanager adds fields over time; unknown ones are ignored, the ones used are checked.
    model_config = ConfigDict(extra="ignore", frozen=True)


class AlertmanagerAlert(_Payload):
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str = ""
    endsAt: str = ""
    generatorURL: str = ""
    fingerprint: str = ""


class AlertmanagerPayload(_Payload):
    """Alertmanager's webhook body, version 4 (the only version Alertmanager has ever sent)."""

    version: Literal["4"]
    status: Literal["firing", "resolved"]
    receiver: str = ""
    groupKey: str = ""
    truncatedAlerts: int = 0
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[AlertmanagerAlert]


class PayloadError(InputError, ValueError):
    """A webhook body that is not an Alertmanager v4 payload; the message says what is wrong, never the body."""


def parse_alertmanager_payload(body: bytes) -> AlertmanagerPayload:
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as bad:
        raise PayloadError(f"body is not valid JSON: {bad}") from None
    if not isinstance(raw, dict):
        raise PayloadError("expected a JSON object (an Alertmanager webhook payload)")
    version = raw.get("version")
    if version != "4":
        got = "missing" if version is None else repr(version)[:20]
        raise PayloadError(f'unsupported payload version {got}: expected "4" (Alertmanager webhook v4)')
    try:
        return AlertmanagerPayload.model_validate(raw)
    except ValidationError as invalid:
        # Field paths and messages only: the offending values may carry secrets (annotations, URLs).
        problems = [
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in invalid.errors()[:10]
        ]
        raise PayloadError("invalid Alertmanager payload: " + "; ".join(problems)) from None


def policy_matches_alert(policy: Policy, labels: Mapping[str, str]) -> bool:
    """Rules 1-3 of the module docstring for one policy and one alert's labels."""
    wanted = labels.get(POLICY_LABEL)
    if wanted is not None and wanted != policy.name:
        return False
    if any(labels.get(name) != value for name, value in policy.targets.match.items()):
        return False
    return all(name in labels for name in policy.targets.groupBy)


def policies_for_alert(policies: Mapping[str, Policy], labels: Mapping[str, str]) -> list[str]:
    return sorted(name for name, policy in policies.items() if policy_matches_alert(policy, labels))


def alert_target(policy: Policy, labels: Mapping[str, str]) -> TargetKey:
    """The one target of `policy` an alert that matches it names: its `targets.groupBy` labels (rule 3). A policy
    without `groupBy` has one target, (), which every matching alert names."""
    return target_key({name: labels[name] for name in policy.targets.groupBy})


class ControllerAPI:
    """Serves the controller on `host:port` (port 0: a free port, see `.port`) from a daemon thread."""

    def __init__(
        self,
        controller: ControllerPort,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = MAX_BODY_BYTES,
        webhook_token: str | None = None,
        leader: LeaderPort | None = None,
        standby_retry_after: int = STANDBY_RETRY_AFTER_SECONDS,
    ) -> None:
        if webhook_token is not None and not webhook_token:
            raise ValueError("webhook_token must not be empty (None leaves the webhook open)")
        self.controller = controller
        self.max_body_bytes = max_body_bytes
        self._webhook_token = webhook_token.encode() if webhook_token is not None else None
        # With leader election: a standby refuses alerts with 503 so that Alertmanager retries on the leader.
        self._leader = leader
        self.standby_retry_after = max(1, int(standby_retry_after))
        self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="tailguard-api",
            daemon=True,
        )
        self._thread.start()
        logger.info("API listening on %s", self.url)

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._server.server_close()

    # ----- endpoints: (status, content type, body) --------------------------------------------------

    def healthz(self) -> tuple[int, dict[str, Any]]:
        return 200, {"status": "ok"}

    def readyz(self) -> tuple[int, dict[str, Any]]:
        readiness = self.controller.readiness()
        return (200 if readiness.ready else 503), readiness.to_json()

    def decisions(self, query: str) -> tuple[int, dict[str, Any] | list[Any]]:
        values = parse_qs(query).get("limit", [str(DEFAULT_DECISIONS)])
        try:
            limit = int(values[-1])
        except ValueError:
            return 400, {"error": f"limit must be an integer between 1 and {MAX_DECISIONS}"}
        if not 1 <= limit <= MAX_DECISIONS:
            return 400, {"error": f"limit must be an integer between 1 and {MAX_DECISIONS}"}
        return 200, self.controller.recent_decisions(limit)

    def authorize_webhook(self, authorization: str | None) -> tuple[int, dict[str, Any]] | None:
        """None when the request may post alerts, else the refusal (401 no bearer token, 403 a wrong one)."""
        if self._webhook_token is None:
            return None
        scheme, _, presented = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            logger.warning("rejected Alertmanager webhook: no bearer token (401)")
            return 401, {"error": "authentication required: send Authorization: Bearer <token>"}
        if not hmac.compare_digest(presented.strip().encode(), self._webhook_token):
            logger.warning("rejected Alertmanager webhook: wrong bearer token (403)")  # never the token itself
            return 403, {"error": "the bearer token is not the one configured for this webhook"}
        return None

    def refuse_if_standby(self) -> tuple[int, dict[str, Any], dict[str, str]] | None:
        """None on the leader (or without leader election); on a standby the 503 that makes Alertmanager retry."""
        if self._leader is None or self._leader.is_leader():
            return None
        logger.info("Alertmanager webhook refused on the standby (503): the leader evaluates alerts")
        return (
            503,
            {
                "error": "this replica is the standby: only the leader evaluates alerts; retry (the Service "
                "routes retries to the leader)",
                "standby": True,
            },
            {"Retry-After": str(self.standby_retry_after)},
        )

    def alerts(self, body: bytes) -> tuple[int, dict[str, Any]]:
        try:
            payload = parse_alertmanager_payload(body)
        except PayloadError as bad:
            logger.warning("rejected Alertmanager webhook: %s", bad)
            return 400, {"error": str(bad)}
        policies = self.controller.policies()
        named: dict[str, set[TargetKey]] = {}
        for alert in payload.alerts:
            for name in policies_for_alert(policies, alert.labels):
                named.setdefault(name, set()).add(alert_target(policies[name], alert.labels))
        triggered = self.controller.trigger(sorted(named), TRIGGER_ALERT, targets=named) if named else []
        logger.info(
            "Alertmanager webhook (%s, %d alerts, group %s): triggered %s",
            payload.status,
            len(payload.alerts),
            payload.groupKey or "-",
            ", ".join(triggered) or "no policy",
        )
        return 202, {"triggered": triggered, "alerts": len(payload.alerts)}


def _handler_for(api: ControllerAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "tailguard"
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("%s %s", self.address_string(), format % args)

        def _send(self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, value: Any, headers: Mapping[str, str] | None = None) -> None:
            self._send(status, (json.dumps(value, default=str) + "\n").encode(), "application/json", headers)

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            try:
                if parts.path == "/healthz":
                    self._json(*api.healthz())
                elif parts.path == "/readyz":
                    self._json(*api.readyz())
                elif parts.path == "/metrics":
                    self._send(200, api.controller.metrics.exposition(), EXPOSITION_CONTENT_TYPE)
                elif parts.path == "/api/v1/decisions":
                    self._json(*api.decisions(parts.query))
                elif parts.path == "/api/v1/alerts":
                    self._json(405, {"error": "use POST with an Alertmanager webhook payload"})
                else:
                    self._json(404, {"error": f"no such endpoint: {parts.path}"})
            except Exception:  # a bug in one request must not take the server down; details go to the log
                logger.exception("GET %s failed", parts.path)
                self._json(500, {"error": "internal error (see the controller log)"})

        def do_POST(self) -> None:
            parts = urlsplit(self.path)
            if parts.path != "/api/v1/alerts":
                self._drain()
                self._json(
                    404 if parts.path not in ("/healthz", "/readyz", "/metrics") else 405,
                    {"error": f"no POST endpoint at {parts.path}"},
                )
                return
            refusal = api.authorize_webhook(self.headers.get("Authorization"))
            if refusal is not None:
                self._drain()  # a small unread body would otherwise be parsed as the next request
                status, error = refusal
                self._json(status, error, {"WWW-Authenticate": 'Bearer realm="tailguard"'} if status == 401 else None)
                return
            standby = api.refuse_if_standby()
            if standby is not None:
                self._drain()
                self._json(*standby)
                return
            length_header = self.headers.get("Content-Length")
            if length_header is None:
                self.close_connection = True
                self._json(411, {"error": "Content-Length is required"})
                return
            try:
                length = int(length_header)
            except ValueError:
                self.close_connection = True
                self._json(400, {"error": "Content-Length is not an integer"})
                return
            if length < 0 or length > api.max_body_bytes:
                self.close_connection = True  # the unread body must not be parsed as the next request
                self._json(413, {"error": f"body of {length} bytes exceeds the limit of {api.max_body_bytes}"})
                return
            body = self.rfile.read(length)
            try:
                self._json(*api.alerts(body))
            except Exception:
                logger.exception("POST %s failed", parts.path)
                self._json(500, {"error": "internal error (see the controller log)"})

        def _drain(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = 0
            if 0 < length <= api.max_body_bytes:
                self.rfile.read(length)
            elif length:
                self.close_connection = True

    return Handler
