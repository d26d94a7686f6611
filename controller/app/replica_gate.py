"""The leader's side of replica-to-replica trust in the HTTP API (controller/app/peer_auth.py has the signatures).

A request a standby signed is checked once, before routing: a wrong, stale or replayed signature is refused (403);
an accepted one stands in for the bearer token (the standby checked the client's), and its answer is signed, while
this replica leads, for the nonce the standby sent. Each request is answered in its own asyncio task, so the
accepted nonce lives in a context variable: per request, without touching aiohttp's request object.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable

from aiohttp import web

from tailguard.controller.app.forwarding import FORWARDED_HEADER
from tailguard.controller.app.peer_auth import NONCE_HEADER, SIGNATURE_HEADER, PeerKey

logger = logging.getLogger("tailguard.api")

_ACCEPTED_NONCE: contextvars.ContextVar[str | None] = contextvars.ContextVar("tailguard_peer_nonce", default=None)


class ReplicaGate:
    def __init__(self, key: PeerKey | None, identity: str | None, is_leader: Callable[[], bool]) -> None:
        self.key = key
        self.identity = identity  # this replica's (None without leader election: no replica requests)
        self.is_leader = is_leader

    def begin(self) -> None:
        """A new request: nothing accepted yet."""
        _ACCEPTED_NONCE.set(None)

    def accepted(self) -> bool:
        """Whether the request being answered is a replica's, accepted by `refusal`."""
        return _ACCEPTED_NONCE.get() is not None

    def refusal(self, request: web.BaseRequest) -> str | None:
        """Why a replica-signed request is refused (None: unsigned, or accepted and remembered)."""
        if SIGNATURE_HEADER not in request.headers:
            return None
        if self.key is None or self.identity is None:
            reason: str | None = "this replica takes no replica-signed requests (no replica key or no leader election)"
        else:
            reason = self.key.check_request(
                request.headers,
                sender=request.headers.get(FORWARDED_HEADER, ""),
                receiver=self.identity,
                method=request.method,
                path_qs=request.raw_path,
                content_length=request.content_length or 0,
            )
        if reason is None:
            _ACCEPTED_NONCE.set(request.headers[NONCE_HEADER])
            return None
        logger.warning("rejected %s %s from %s: %s (403)", request.method, request.path, request.remote, reason)
        return reason

    def sign(self, response: web.StreamResponse) -> None:
        """Sign the answer to an accepted replica request, while leading: the standby relays nothing else."""
        nonce = _ACCEPTED_NONCE.get()
        if nonce is None or self.key is None or self.identity is None or not isinstance(response, web.Response):
            return
        if not self.is_leader():
            return
        body = bytes(response.body) if isinstance(response.body, (bytes, bytearray)) else b""  # ours are bytes
        response.headers[SIGNATURE_HEADER] = self.key.sign_answer(
            nonce=nonce, leader=self.identity, status=response.status, body=body
        )
