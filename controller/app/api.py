"""The controller's HTTP API: health, readiness, metrics, the Alertmanager webhook, recent decisions.

Served by aiohttp's low-level server on its own thread and event loop (`ApiServer`, controller/app/api_server.py):
idle/header and body timeouts, a connection cap, body and JSON-nesting limits, TCP_NODELAY; `ControllerAPI` states
each limit. `ControllerAPI` routes each request (authentication, the standby's forwarding, the webhook); the
operator endpoints are controller/app/api_operator.py, the status page's sign-in controller/app/api_signin.py.

Alertmanager webhooks (payload version "4") are a second, push trigger next to
the schedule. Matching rule, alert -> policies (controller/core/alerts.py `policies_for_alert`, shared with the
backtest):

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

Authentication: control is never anonymous. Without a token (no `webhook:` section) alerts, pause/resume, abort,
decisions and status answer requests from loopback only (403 to any other peer), and the controller refuses to
start with a `listen` address that is not loopback (settings `anonymous_control_error`). With a webhook token
(settings `webhook:`), `POST /api/v1/alerts` needs `Authorization: Bearer <token>` (or `X-Tailguard-Token: <token>`,
what passes the Kubernetes API's service proxy: controller/app/api_auth.py): 401 without it, 403 with
another token (compared in constant time, so the answer time does not leak how much of a guess
was right). The token is never logged or echoed. The same token guards every
non-health endpoint: `GET /api/v1/decisions` (decisions carry evidence and action
parameters) answers 401/403 the same way. /healthz, /readyz and /metrics stay
open: probes and Prometheus have no token, they expose nothing that acts, and
/metrics carries counts and policy names only (no URLs, parameters or evidence);
the NetworkPolicy in deploy/base admits the API port from Prometheus and
Alertmanager only. Receiver URLs and credential-bearing values in decisions are
cut to scheme+host (`tailguard.controller.kit.redact`).

Standby: with leader election, only the leader evaluates. One view across replicas: when the elector knows
where the leader's API answers (the Lease annotation `tailguard.io/api-url`), a standby authenticates every
`/api/v1/*` and `/status` request itself and answers with the leader's answer (controller/app/forwarding.py:
timeout, bounded size, one hop at most; only to the Lease holder's pod of this Deployment, signed with the replicas'
key instead of the client's token, and only an answer the leader signed is relayed); alerts too, so an alert that
reaches the standby is evaluated by the
leader. With no leader known or reachable (or without a published URL), a standby answers those requests with
503, a `Retry-After` header and `{"standby": true, ...}` instead of accepting an alert it would drop: Alertmanager
retries a 5xx (notify/util.go `Retrier.Check`: 5xx are retried, 4xx are not), and a retry reaches the leader.
Nothing is evaluated on the standby, so nothing acts twice. With leader election every answer names the replica
whose controller gave it (`X-Tailguard-Answered-By`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from tailguard.controller.app.api_answers import json_answer as _json
from tailguard.controller.app.api_answers import refusal as _refusal
from tailguard.controller.app.api_answers import refuse_body as _refuse_body
from tailguard.controller.app.api_answers import response as _response
from tailguard.controller.app.api_auth import BearerCheck, presented_authorization
from tailguard.controller.app.api_operator import OperatorEndpoints, abort_of, control_of
from tailguard.controller.app.api_server import ApiServer
from tailguard.controller.app.api_signin import StatusSignIn
from tailguard.controller.app.forwarding import (
    ANSWERED_BY_HEADER,
    FORWARD_TIMEOUT_SECONDS,
    FORWARDED_HEADER,
    LeaderForwarder,
    forwarded_path,
)
from tailguard.controller.app.peer_auth import PeerKey
from tailguard.controller.app.ports import ControllerPort, LeaderDirectoryPort
from tailguard.controller.app.replica_gate import ReplicaGate
from tailguard.controller.app.status_login import LOGIN_PATH
from tailguard.controller.app.status_page import render_status_page
from tailguard.controller.core.alerts import (
    AlertmanagerPayload,
    PayloadError,
    alert_scopes,
    alertmanager_payload,
)
from tailguard.controller.core.ports import LeaderPort, PeerCheckPort
from tailguard.controller.kit.net import is_loopback_host
from tailguard.controller.kit.redact import redact_value
from tailguard.controller.loop.metrics import EXPOSITION_CONTENT_TYPE, ControllerMetrics
from tailguard.controller.loop.ports import TRIGGER_ALERT

logger = logging.getLogger("tailguard.api")

MAX_BODY_BYTES = 1 << 20  # Alertmanager batches alerts per group; a megabyte is thousands of them
POLICY_LABEL = "tailguard_policy"
STANDBY_RETRY_AFTER_SECONDS = 2  # about one leader-election retry period: the Lease is settled by then
MAX_JSON_DEPTH = 32  # an Alertmanager payload is 4 levels deep (payload > alerts > alert > labels)
MAX_CONNECTIONS = 1000  # open connections; past the cap new ones wait for a slot (controller/app/capped_server.py)
IDLE_TIMEOUT_SECONDS = 30.0  # a connection with no complete request head (new or kept alive) is closed then
BODY_TIMEOUT_SECONDS = 10.0  # the whole body of a POST within this (else 408)
WORKER_THREADS = 4  # threads answering what asks the controller (readiness, metrics, decisions, alerts)
DRAIN_LIMIT_BYTES = 64 * 1024  # a refused POST's body up to this is read (the connection stays usable)
MAX_CONTROL_BYTES = 4096  # {"by": ..., "reason": ...}


def parse_alertmanager_payload(body: bytes) -> AlertmanagerPayload:
    """The webhook body as an Alertmanager v4 payload, nesting bounded (MAX_JSON_DEPTH) before it is validated."""
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as bad:
        raise PayloadError(f"body is not valid JSON: {bad}") from None
    except RecursionError:  # the C scanner's own bound, far deeper than ours
        raise PayloadError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    if _depth_exceeds(raw, MAX_JSON_DEPTH):
        raise PayloadError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return alertmanager_payload(raw)


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether `value` nests containers deeper than `limit` (iterative: no recursion on hostile input)."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


class ControllerAPI:
    """Serves the controller on `host:port` (port 0: a free port, see `.port`) from one thread with its own event
    loop (aiohttp's low-level server). The socket is bound in the constructor, so a port in use fails here (an
    OSError) and `.port` is known before `start`.

    Limits (module constants, overridable per instance): at most `max_connections` open connections (at the cap the
    least recently used connection idle for a second or more is closed for the new one, so a flood of idle
    connections never locks a probe out; with none, the new one waits unread for a slot, up to LISTEN_BACKLOG of
    them, and is answered late rather than reset: controller/app/capped_server.py), an idle/header timeout
    (`idle_timeout`: a connection that sends no complete request head within it is closed, a kept-alive one
    between requests too), a body timeout (`body_timeout`: 408),
    request-line/header size limits (aiohttp: 400/431), bodies over `max_body_bytes` refused unread (413, the
    connection closed), JSON nested deeper than `MAX_JSON_DEPTH` refused (400). Answers that ask the controller
    (readiness, metrics, decisions, alerts) run on a small worker pool (`workers` threads), so a slow one never
    holds `/healthz`; the thread count does not grow with connections. TCP_NODELAY is set on every connection and
    each answer goes out in one write (no Nagle delay on kept-alive connections)."""

    def __init__(
        self,
        controller: ControllerPort,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int = MAX_BODY_BYTES,
        webhook_token: str | None = None,
        leader: LeaderPort | None = None,
        standby_retry_after: int = STANDBY_RETRY_AFTER_SECONDS,
        *,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout: float = IDLE_TIMEOUT_SECONDS,
        body_timeout: float = BODY_TIMEOUT_SECONDS,
        workers: int = WORKER_THREADS,
        status_links: Mapping[str, str] | None = None,
        forward_timeout: float = FORWARD_TIMEOUT_SECONDS,
        peer_key: PeerKey | None = None,
        peers: PeerCheckPort | None = None,
    ) -> None:
        if webhook_token is not None and not webhook_token:
            raise ValueError("webhook_token must not be empty (None leaves the webhook open)")
        if max_connections < 1 or workers < 1 or idle_timeout <= 0 or body_timeout <= 0:
            raise ValueError("max_connections and workers must be >= 1, the timeouts > 0")
        self.controller = controller
        self.max_body_bytes = max_body_bytes
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.body_timeout = body_timeout
        self._webhook_token = webhook_token.encode() if webhook_token is not None else None
        # With leader election: a standby refuses alerts with 503 so that Alertmanager retries on the leader.
        self._leader = leader
        self.standby_retry_after = max(1, int(standby_retry_after))
        # Replica-to-replica trust (controller/app/peer_auth.py): the replicas' own key, else one derived from the
        # token (never the token itself); `peers` says which URL is a replica's (controller/adapters/lease/peers.py).
        if peer_key is None and webhook_token is not None:
            peer_key = PeerKey.derived_from_token(webhook_token)
        # One view across replicas: a standby forwards to the leader's published API (an elector that says where).
        self._forwarder = (
            LeaderForwarder(
                leader, key=peer_key, peers=peers, timeout=forward_timeout, retry_after=self.standby_retry_after
            )
            if isinstance(leader, LeaderDirectoryPort)
            else None
        )
        # The leader's side: a replica-signed request instead of the token, and the signed answer.
        self._replicas = ReplicaGate(
            peer_key,
            self._forwarder.identity if self._forwarder is not None else None,
            leader.is_leader if leader is not None else (lambda: True),
        )
        self.status_links = dict(status_links or {})  # Grafana links on the status page
        self.wall_clock: Callable[[], float] = time.time  # the status page's session expiry (tests replace it)
        self._bearer = BearerCheck(self._webhook_token, self._rejected)
        self._sign_in = StatusSignIn(self._webhook_token, lambda: self.wall_clock(), body_timeout)
        self._operator = OperatorEndpoints(
            controller,
            self.refuse_if_standby,
            token_configured=self._webhook_token is not None,
            status_links=self.status_links,
        )
        forwarder = self._forwarder
        self._server = ApiServer(
            host,
            port,
            self._handle,
            max_connections=max_connections,
            idle_timeout=idle_timeout,
            workers=workers,
            on_open=forwarder.open if forwarder is not None else None,
            on_close=forwarder.close if forwarder is not None else None,
        )

    # ----- the server (controller/app/api_server.py) -------------------------------------------------------

    @property
    def host(self) -> str:
        return self._server.host

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()

    def open_connections(self) -> int:
        """Connections admitted right now (at most `max_connections`; more may wait for a slot)."""
        return self._server.open_connections()

    def connection_sockets(self) -> list[socket.socket]:
        """The sockets of the open connections (for checks of their options, e.g. TCP_NODELAY)."""
        return self._server.connection_sockets()

    # ----- endpoints: (status, content type, body) --------------------------------------------------

    def healthz(self) -> tuple[int, dict[str, Any]]:
        return 200, {"status": "ok"}

    def readyz(self) -> tuple[int, dict[str, Any]]:
        readiness = self.controller.readiness()
        # Open to anyone (probes carry no token): a URL in a reason or warning is shown as scheme+host only.
        return (200 if readiness.ready else 503), redact_value(readiness.to_json())

    def decisions(self, query: str) -> tuple[int, dict[str, Any] | list[Any]]:
        return self._operator.decisions(query)

    def authorize(self, authorization: str | None, what: str) -> tuple[int, dict[str, Any]] | None:
        """The bearer-token check of every non-health endpoint (`what` names it in the log): None, or the refusal."""
        return self._bearer.check(authorization, what)

    def _rejected(self, what: str, code: int) -> None:
        """tailguard_requests_rejected_total{endpoint, code} (the TailguardWebhookRejects alert)."""
        metrics = getattr(self.controller, "metrics", None)
        if isinstance(metrics, ControllerMetrics):
            metrics.record_rejected(what.removesuffix(" request").replace(" ", "-").lower(), code)

    def refuse_if_standby(self, what: str = "alert") -> tuple[int, dict[str, Any], dict[str, str]] | None:
        """None on the leader (or without leader election); on a standby the 503 that makes Alertmanager retry
        (and a status read or a control go to the leader: one view across replicas)."""
        if self._leader is None or self._leader.is_leader():
            return None
        if what == "alert":
            logger.info("Alertmanager webhook refused on the standby (503): the leader evaluates alerts")
            error = (
                "this replica is the standby: only the leader evaluates alerts; retry (the Service routes retries "
                "to the leader)"
            )
        else:
            error = f"this replica is the standby: ask the leader for {what} (retry: the Service routes to it)"
        return 503, {"error": error, "standby": True}, {"Retry-After": str(self.standby_retry_after)}

    def alerts(self, body: bytes) -> tuple[int, dict[str, Any]]:
        try:
            payload = parse_alertmanager_payload(body)
        except PayloadError as bad:
            logger.warning("rejected Alertmanager webhook: %s", bad)
            self._rejected("Alertmanager webhook", 400)
            return 400, {"error": str(bad)}
        named = alert_scopes(self.controller.policies(), (alert.labels for alert in payload.alerts))
        triggered = self.controller.trigger(sorted(named), TRIGGER_ALERT, targets=named) if named else []
        logger.info(
            "Alertmanager webhook (%s, %d alerts, group %s): triggered %s",
            payload.status,
            len(payload.alerts),
            payload.groupKey or "-",
            ", ".join(triggered) or "no policy",
        )
        return 202, {"triggered": triggered, "alerts": len(payload.alerts)}

    # ----- the HTTP side (on the event loop) ---------------------------------------------------------

    async def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        """A controller call on the worker pool: the event loop (and /healthz) never waits on the controller."""
        return await self._server.call(function, *args)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self._replicas.begin()
        response = await self._answer(request)
        if self._forwarder is not None:
            # Which replica's controller answered (a forwarded answer already names the leader).
            response.headers.setdefault(ANSWERED_BY_HEADER, self._forwarder.identity)
            self._replicas.sign(response)
        return response

    def _authorized(self, presented: str | None, what: str) -> tuple[int, dict[str, Any]] | None:
        """The bearer-token check, or a replica's signature accepted already (controller/app/replica_gate.py)."""
        if self._replicas.accepted():
            return None
        return self.authorize(presented, what)

    async def _answer(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        try:
            if self._webhook_token is None and forwarded_path(path) and not is_loopback_host(request.remote):
                # No token configured: alerts, controls, decisions and status are this machine's only.
                logger.warning("refused %s %s from %s: no token is configured, so it answers loopback only (403)",
                               request.method, path, request.remote)  # fmt: skip
                error = (
                    "no token is configured on this controller: this endpoint answers requests from its own host only"
                )
                return await self._answer_unread(request, _json(403, {"error": error}))
            refused = self._replicas.refusal(request)
            if refused is not None:
                not_a_replica = {"error": f"not accepted as a replica's request: {refused}"}
                return await self._answer_unread(request, _json(403, not_a_replica))
            if (
                self._forwarder is not None
                and request.method in ("GET", "POST")
                and forwarded_path(path)
                and self._leader is not None
                and not self._leader.is_leader()
            ):
                return await self._forward(request)
            if request.method == "GET":
                return await self._get(request, path)
            if request.method == "POST":
                return await self._post(request, path)
            return _refuse_body(_json(405, {"error": f"method {request.method} is not allowed"}), request)
        except ConnectionError as gone:  # the client closed or reset its connection mid-request: nothing to answer
            logger.debug("%s %s: the client went away (%s)", request.method, path, type(gone).__name__)
            return _refuse_body(_json(400, {"error": "the connection was lost"}), request)
        except Exception:  # a bug in one request must not take the server down; details go to the log
            logger.exception("%s %s failed", request.method, path)
            return _refuse_body(_json(500, {"error": "internal error (see the controller log)"}), request)

    async def _get(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        if path == "/healthz":
            return _json(*self.healthz())
        if path == "/readyz":
            return _json(*await self._call(self.readyz))
        if path == "/metrics":
            body = await self._call(self.controller.metrics.exposition)
            return _response(200, body, EXPOSITION_CONTENT_TYPE)
        if path == "/api/v1/decisions":
            refusal = self._authorized(presented_authorization(request.headers), "decisions request")
            if refusal is not None:
                return _refusal(*refusal)
            return _json(*await self._call(self.decisions, request.query_string))
        if path in ("/api/v1/status", "/status"):
            presented = presented_authorization(request.headers)
            if path == "/status" and presented is None and not self._replicas.accepted():
                # a browser: its session cookie, else the sign-in form
                if not self._sign_in.signed_in(request):
                    return self._sign_in.form(request)
                refusal = None
            else:
                refusal = self._authorized(presented, "status request")
            if refusal is not None:
                return _refusal(*refusal)
            status, document, headers = await self._call(self.status)
            if path == "/api/v1/status" or status != 200:
                return _json(status, document, headers)
            page = render_status_page(document)
            return _response(200, page.encode(), "text/html; charset=utf-8", {"Cache-Control": "no-store"})
        if path == "/api/v1/alerts":
            return _json(405, {"error": "use POST with an Alertmanager webhook payload"})
        return _json(404, {"error": f"no such endpoint: {path}"})

    async def _post(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        if control_of(path) is not None or abort_of(path) is not None:
            return await self._post_control(request, path)
        if path == LOGIN_PATH:
            return await self._sign_in.login(request)
        if path != "/api/v1/alerts":
            status = 404 if path not in ("/healthz", "/readyz", "/metrics", "/api/v1/decisions") else 405
            return await self._answer_unread(request, _json(status, {"error": f"no POST endpoint at {path}"}))
        refusal = self._authorized(presented_authorization(request.headers), "Alertmanager webhook")
        if refusal is not None:
            return await self._answer_unread(request, _refusal(*refusal))
        standby = self.refuse_if_standby()
        if standby is not None:
            return await self._answer_unread(request, _json(*standby))
        length = request.content_length
        if length is None:
            return _refuse_body(_json(411, {"error": "Content-Length is required"}), request)
        if length > self.max_body_bytes:
            # Refused unread: the connection is closed, so the body is never parsed as a next request.
            limit = self.max_body_bytes
            return _refuse_body(_json(413, {"error": f"body of {length} bytes exceeds the limit of {limit}"}), request)
        try:
            body = await asyncio.wait_for(request.content.readexactly(length), self.body_timeout)
        except TimeoutError:
            return _refuse_body(
                _json(408, {"error": f"the body did not arrive within {self.body_timeout:g} s"}), request
            )
        except asyncio.IncompleteReadError:
            return _refuse_body(_json(400, {"error": "the body ended before Content-Length bytes"}), request)
        return _json(*await self._call(self.alerts, body))

    async def _post_control(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        refusal = self._authorized(presented_authorization(request.headers), "control request")
        if refusal is not None:
            return await self._answer_unread(request, _refusal(*refusal))
        standby = self.refuse_if_standby("control")
        if standby is not None:
            return await self._answer_unread(request, _json(*standby))
        length = request.content_length or 0
        if length > MAX_CONTROL_BYTES:
            return _refuse_body(_json(413, {"error": f"a control body is at most {MAX_CONTROL_BYTES} bytes"}), request)
        try:
            body = await asyncio.wait_for(request.content.readexactly(length), self.body_timeout) if length else b""
        except (TimeoutError, asyncio.IncompleteReadError):
            return _refuse_body(_json(400, {"error": "the body did not arrive whole"}), request)
        return _json(*await self._call(self.abort if abort_of(path) is not None else self.control, path, body))

    async def _forward(self, request: web.BaseRequest) -> web.StreamResponse:
        """On a standby: authenticate here, then the leader's answer (controller/app/forwarding.py)."""
        assert self._forwarder is not None
        if request.path == "/status" and presented_authorization(request.headers) is None:
            # Signed in by cookie: checked here; the leader trusts this replica's signature, never a credential.
            if not self._sign_in.signed_in(request):
                return self._sign_in.form(request)
        else:
            refusal = self.authorize(
                presented_authorization(request.headers), f"{request.method} {request.path} on the standby"
            )
            if refusal is not None:
                return await self._answer_unread(request, _refusal(*refusal))
        body = b""
        if request.method == "POST":
            length = request.content_length
            if length is None and request.body_exists:
                return _refuse_body(_json(411, {"error": "Content-Length is required"}), request)
            if length is not None and length > self.max_body_bytes:
                limit = self.max_body_bytes
                return _refuse_body(
                    _json(413, {"error": f"body of {length} bytes exceeds the limit of {limit}"}), request
                )
            try:
                body = await asyncio.wait_for(request.content.readexactly(length or 0), self.body_timeout)
            except (TimeoutError, asyncio.IncompleteReadError):
                return _refuse_body(_json(400, {"error": "the body did not arrive whole"}), request)
        answer = await self._forwarder.forward(
            request.method,
            _without_link_token(request),
            dict(request.headers),
            body,
            hop=request.headers.get(FORWARDED_HEADER),
        )
        headers = dict(answer.headers)
        content_type = headers.pop("Content-Type", "application/octet-stream")
        return _response(answer.status, answer.body, content_type, headers)

    # ----- operator endpoints (controller/app/api_operator.py) ----------------------------------------------

    def status(self) -> tuple[int, dict[str, Any], dict[str, str]]:
        return self._operator.status()

    def control(self, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        return self._operator.control(path, body)

    def abort(self, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        return self._operator.abort(path, body)

    async def _answer_unread(self, request: web.BaseRequest, answer: web.Response) -> web.Response:
        """A refusal before the body: a small body is read (the kept-alive connection stays usable, as
        Alertmanager's retries reuse it), a large or unannounced one is not (the connection is closed)."""
        length = request.content_length
        if length is not None and 0 < length <= min(self.max_body_bytes, DRAIN_LIMIT_BYTES):
            try:
                await asyncio.wait_for(request.content.readexactly(length), self.body_timeout)
                return answer
            except (TimeoutError, asyncio.IncompleteReadError):
                pass
        elif length == 0 or (length is None and not request.body_exists):
            return answer
        return _refuse_body(answer, request)


def _without_link_token(request: web.BaseRequest) -> str:
    """The path and query to forward: a `?token=` a client put in the URL (a credential, never read as one) never
    leaves the standby."""
    if "token" not in request.query:
        return request.raw_path
    kept = [(name, value) for name, value in request.query.items() if name != "token"]
    return str(request.rel_url.with_query(kept))
