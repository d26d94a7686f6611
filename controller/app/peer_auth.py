"""Replica-to-replica trust: how a standby proves a forwarded request is its own, and a leader its answer.

A standby never forwards a client's credential (no `Authorization` leaves it). It signs what it forwards with the
replicas' own key, and the leader signs its answer with the same key:

    request:  X-Tailguard-Peer-Timestamp: <unix seconds>
              X-Tailguard-Peer-Nonce: <32 hex, random>
              X-Tailguard-Peer-Signature: v1=<hex HMAC-SHA256(key, "request\\n{ts}\\n{nonce}\\n{from}\\n{to}\\n
                                             {METHOD}\\n{path?query}\\n{content-length}")>
    answer:   X-Tailguard-Peer-Signature: v1=<hex HMAC-SHA256(key, "answer\\n{nonce}\\n{leader}\\n{status}\\n
                                             {sha256(body)}")>

The leader accepts a signed request in place of the bearer token only when the signature is right, it names this
replica as the receiver, its timestamp is within `window` seconds (default 30) and its nonce is unseen (a nonce is
remembered for the window: a captured request cannot be replayed). It signs its answer only while it leads. The
standby relays an answer only when that signature is right for the Lease holder it asked and the nonce it sent:
an answer from anything else (a server a Lease names, a replica that lost the Lease in between) is never passed on
as the controller's.

The key: `leaderElection.peerSecretFile` / `peerSecretEnv` (the replicas' own secret), else derived from the
webhook token as HMAC-SHA256(token, "tailguard replica-to-replica v1"): every replica holds the token already, the
derived key is not the token, and a signature reveals neither. Without either, a standby forwards nothing (503).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from tailguard.controller.kit.signing import hmac_sha256_hex, same_digest, timestamp_fresh, to_bytes

TIMESTAMP_HEADER = "X-Tailguard-Peer-Timestamp"
NONCE_HEADER = "X-Tailguard-Peer-Nonce"
SIGNATURE_HEADER = "X-Tailguard-Peer-Signature"
PEER_HEADERS = (TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER)
PEER_WINDOW_SECONDS = 30.0  # a forward takes at most forwardTimeout (5 s); pods' clocks are NTP-synchronised
MAX_REMEMBERED_NONCES = 100_000  # bounded: at the cap the oldest are forgotten (they are outside the window soon)
DERIVATION_LABEL = b"tailguard replica-to-replica v1"


class PeerKey:
    """Signs and checks replica-to-replica requests and answers (thread-safe: the nonce memory is locked)."""

    def __init__(
        self, secret: bytes, *, now: Callable[[], float] = time.time, window: float = PEER_WINDOW_SECONDS
    ) -> None:
        if len(secret) < 16:
            raise ValueError("the replica-to-replica secret must be at least 16 bytes")
        self._key = secret
        self._now = now
        self.window = window
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def derived_from_token(
        cls, token: str, *, now: Callable[[], float] = time.time, window: float = PEER_WINDOW_SECONDS
    ) -> PeerKey:
        """The key derived from the webhook token (never the token itself)."""
        return cls(hmac_sha256_hex(token, DERIVATION_LABEL).encode("ascii"), now=now, window=window)

    # -- the standby's side ------------------------------------------------------------------------------

    def sign_request(
        self, *, sender: str, receiver: str, method: str, path_qs: str, content_length: int
    ) -> dict[str, str]:
        timestamp = str(int(self._now()))
        nonce = secrets.token_hex(16)
        message = _request_message(timestamp, nonce, sender, receiver, method, path_qs, content_length)
        return {
            TIMESTAMP_HEADER: timestamp,
            NONCE_HEADER: nonce,
            SIGNATURE_HEADER: "v1=" + hmac_sha256_hex(self._key, message),
        }

    def answer_is_signed(self, signature: str | None, *, nonce: str, leader: str, status: int, body: bytes) -> bool:
        if not signature:
            return False
        return same_digest(self.sign_answer(nonce=nonce, leader=leader, status=status, body=body), signature)

    # -- the leader's side --------------------------------------------------------------------------------

    def check_request(
        self,
        headers: Mapping[str, str],
        *,
        sender: str,
        receiver: str,
        method: str,
        path_qs: str,
        content_length: int,
    ) -> str | None:
        """None when the request is a replica's (and its nonce is now spent), else why not (no secret in it)."""
        timestamp, nonce, signature = (headers.get(name, "") for name in PEER_HEADERS)
        if not (timestamp and nonce and signature and sender):
            return "incomplete replica signature"
        now = self._now()
        if not timestamp_fresh(timestamp, now, self.window):
            return f"replica signature timestamp outside {self.window:g} s"
        message = _request_message(timestamp, nonce, sender, receiver, method, path_qs, content_length)
        if not same_digest("v1=" + hmac_sha256_hex(self._key, message), signature):
            return "wrong replica signature"
        with self._lock:
            while self._seen and (
                len(self._seen) >= MAX_REMEMBERED_NONCES or next(iter(self._seen.values())) < now - self.window
            ):
                self._seen.popitem(last=False)
            if nonce in self._seen:
                return "replayed replica signature (nonce already used)"
            self._seen[nonce] = now
        return None

    def sign_answer(self, *, nonce: str, leader: str, status: int, body: bytes) -> str:
        digest = hashlib.sha256(body).hexdigest()
        return "v1=" + hmac_sha256_hex(self._key, f"answer\n{nonce}\n{leader}\n{status}\n{digest}")


def _request_message(
    timestamp: str, nonce: str, sender: str, receiver: str, method: str, path_qs: str, content_length: int
) -> bytes:
    return to_bytes(
        f"request\n{timestamp}\n{nonce}\n{sender}\n{receiver}\n{method.upper()}\n{path_qs}\n{content_length}"
    )
