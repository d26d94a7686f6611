"""One view across replicas: a standby hands the requests only the leader can answer to the leader's API.

With leader election only the leader evaluates, so only its journal holds the current state and only it may act.
A standby that receives a status or decisions read, an operator control or an Alertmanager alert authenticates it
itself (the same bearer token: a request the leader would refuse never leaves the standby), then forwards it to
the Lease holder's API and answers with the leader's answer: status, body and the headers that matter,
`X-Tailguard-Answered-By` naming the leader and `X-Tailguard-Via` the standby that passed it on.

Replica-to-replica trust (controller/app/peer_auth.py, controller/adapters/lease/peers.py): the URL the holder
published in its Lease (annotation `tailguard.io/api-url`) is written by whoever may write Leases, so it is checked
before anything is sent: its host must be the IP of the pod the Lease names, a pod of this controller's own
Deployment, on the API's port (`PeerCheckPort`). The client's credential never leaves the standby: no
`Authorization` header is forwarded; the standby signs the request with the replicas' own key instead, and relays
the answer only when the leader signed it (the Lease holder it asked, the nonce it sent, while leading). Anything
else is the standby's own 503: a server a Lease names receives nothing, and an answer it could give is never
passed on as the controller's.

Bounds: one timeout for the whole exchange (`timeout`), the leader's body read up to `max_response_bytes` (a
larger one is a 502, never buffered whole), no redirects followed, no proxy from the environment. A request that
already carries `X-Tailguard-Forwarded-By` is never forwarded again: if it reaches a replica that is not the
leader (the Lease changed hands in between), that replica answers 503 itself, so two standbys can never pass a
request back and forth. No leader known, the leader unreachable or not verified: 503 with `Retry-After` and a JSON
reason, which Alertmanager retries (5xx) and a person or `tailguard status` sees as "retry".
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from tailguard.controller.app.peer_auth import NONCE_HEADER, SIGNATURE_HEADER, PeerKey
from tailguard.controller.app.ports import LeaderDirectoryPort
from tailguard.controller.core.ports import PeerCheckPort

logger = logging.getLogger("tailguard.api.forwarding")

FORWARDED_HEADER = "X-Tailguard-Forwarded-By"  # hop marker: set by the standby that forwards; never forwarded twice
ANSWERED_BY_HEADER = "X-Tailguard-Answered-By"  # the replica whose controller answered
VIA_HEADER = "X-Tailguard-Via"  # the standby that passed the leader's answer on
FORWARD_TIMEOUT_SECONDS = 5.0
MAX_FORWARDED_RESPONSE_BYTES = 16 << 20  # 1,000 decisions with evidence fit several times over
REQUEST_HEADERS = ("Content-Type", "Accept")  # never Authorization: the client's credential stays here
RESPONSE_HEADERS = ("Content-Type", "Cache-Control", "Retry-After", "WWW-Authenticate", ANSWERED_BY_HEADER)
# Paths whose answer is the leader's: the operator reads and controls, and the alert webhook. Probes and /metrics
# stay per replica (each pod's own health and counters).
FORWARDED_PREFIXES = ("/api/v1/",)
FORWARDED_PATHS = ("/status",)


def forwarded_path(path: str) -> bool:
    """Whether a standby gives the leader's answer for `path` (else it answers itself)."""
    return path in FORWARDED_PATHS or path.startswith(FORWARDED_PREFIXES)


@dataclass(frozen=True)
class Forwarded:
    """The leader's answer, or the standby's own 5xx when there was none."""

    status: int
    body: bytes
    headers: dict[str, str]


class LeaderForwarder:
    """Forwards one request to the leader's API over a shared aiohttp session (opened on the API's event loop)."""

    def __init__(
        self,
        directory: LeaderDirectoryPort,
        *,
        key: PeerKey | None,
        peers: PeerCheckPort | None,
        timeout: float = FORWARD_TIMEOUT_SECONDS,
        max_response_bytes: int = MAX_FORWARDED_RESPONSE_BYTES,
        retry_after: int = 2,
    ) -> None:
        if timeout <= 0 or max_response_bytes < 1:
            raise ValueError("timeout must be > 0 and max_response_bytes >= 1")
        self.directory = directory
        self.key = key
        self.peers = peers
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        self.retry_after = max(1, int(retry_after))
        self._session: aiohttp.ClientSession | None = None

    @property
    def identity(self) -> str:
        return self.directory.identity

    async def open(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(limit=32),
                trust_env=False,  # the leader is a pod address: never through an HTTP proxy of the environment
                auto_decompress=False,
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def unavailable(self, reason: str) -> Forwarded:
        """The standby's own 503: Alertmanager and clients retry (through the Service, or after the Lease settled)."""
        body = {"error": f"this replica is the standby and cannot reach the leader: {reason}; retry", "standby": True}
        return Forwarded(
            503,
            _json_bytes({**body, "reason": reason}),
            {"Content-Type": "application/json", "Retry-After": str(self.retry_after)},
        )

    async def forward(
        self, method: str, path_and_query: str, headers: dict[str, str], body: bytes, *, hop: str | None
    ) -> Forwarded:
        """The leader's answer to `method path_and_query` (`headers` as received: only REQUEST_HEADERS go on)."""
        if hop is not None:
            # Forwarded once already and still not at the leader: the Lease moved in between. Never a second hop.
            return self.unavailable(f"the request was forwarded by {hop!r} to a replica that is not the leader")
        if self.key is None or self.peers is None:
            return self.unavailable(
                "replica-to-replica authentication is not configured (a webhook token or leaderElection.peerSecret"
                "File/peerSecretEnv, and the pod check), so nothing is forwarded"
            )
        endpoint = self.directory.leader_endpoint()
        if endpoint is None:
            return self.unavailable("no leader is known (the Lease is free, expired or names no API URL)")
        holder, leader_url = endpoint
        where = _host(leader_url)
        refusal = await asyncio.get_running_loop().run_in_executor(None, self.peers.check, holder, leader_url)
        if refusal is not None:
            return self.unavailable(f"the Lease holder {holder!r} is not verified as a replica ({refusal})")
        if self._session is None:
            await self.open()
        assert self._session is not None
        target = URL(leader_url.rstrip("/") + path_and_query, encoded=True)  # the path as received, not requoted
        outgoing = {name: headers[name] for name in REQUEST_HEADERS if name in headers}
        outgoing[FORWARDED_HEADER] = self.identity
        signed = self.key.sign_request(
            sender=self.identity, receiver=holder, method=method, path_qs=path_and_query, content_length=len(body)
        )
        outgoing.update(signed)
        try:
            async with self._session.request(
                method, target, data=body if body else None, headers=outgoing, allow_redirects=False
            ) as answer:
                declared = answer.content_length
                if declared is not None and declared > self.max_response_bytes:
                    return _too_large(where, self.max_response_bytes)
                content = await answer.content.read(self.max_response_bytes + 1)
                if len(content) > self.max_response_bytes:
                    return _too_large(where, self.max_response_bytes)
                if not self.key.answer_is_signed(
                    answer.headers.get(SIGNATURE_HEADER),
                    nonce=signed[NONCE_HEADER],
                    leader=holder,
                    status=answer.status,
                    body=content,
                ):
                    # Not the leader's answer (another server, or a replica that no longer leads): never relayed.
                    logger.warning("forwarding %s %s to the Lease holder %r at %s: the answer (HTTP %d) is not "
                                   "signed by the leader; not relayed", method, path_and_query.split("?")[0],
                                   holder, where, answer.status)  # fmt: skip
                    return self.unavailable(f"the replica at {where} did not answer as the leader {holder!r}")
                passed = {name: answer.headers[name] for name in RESPONSE_HEADERS if name in answer.headers}
                passed[ANSWERED_BY_HEADER] = holder
                passed[VIA_HEADER] = self.identity
                return Forwarded(answer.status, content, passed)
        except TimeoutError:
            logger.warning("forwarding %s %s to the leader at %s: no answer within %g s", method,
                           path_and_query.split("?")[0], where, self.timeout)  # fmt: skip
            return self.unavailable(f"the leader at {where} did not answer within {self.timeout:g} s")
        except (aiohttp.ClientError, OSError, asyncio.IncompleteReadError) as failed:
            logger.warning("forwarding %s %s to the leader at %s failed: %s", method,
                           path_and_query.split("?")[0], where, type(failed).__name__)  # fmt: skip
            return self.unavailable(f"the leader at {where} is unreachable ({type(failed).__name__})")


def _host(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc or url


def _too_large(where: str, limit: int) -> Forwarded:
    message = {"error": f"the leader's answer from {where} exceeds {limit} bytes", "standby": True}
    return Forwarded(502, _json_bytes(message), {"Content-Type": "application/json"})


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value) + "\n").encode()
