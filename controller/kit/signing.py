"""HMAC-SHA256 signatures that carry a timestamp, and the replay window a verifier holds them to.

Two users: the notification webhook (controller/adapters/notify/webhook.py: a receiver checks
`X-Tailguard-Signature` over `{timestamp}.{body}` and refuses a timestamp outside the window, so a captured
notification cannot be posted again later), and replica-to-replica forwarding (controller/app/peer_auth.py:
a standby signs what it forwards, the leader signs its answer). Comparisons are constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import math

DEFAULT_REPLAY_WINDOW_SECONDS = 300.0  # five minutes, as Stripe's and Slack's signed webhooks use


def to_bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


def hmac_sha256_hex(secret: str | bytes, message: str | bytes) -> str:
    return hmac.new(to_bytes(secret), to_bytes(message), hashlib.sha256).hexdigest()


def same_digest(expected: str, presented: str) -> bool:
    """Constant-time equality of two signature strings (a non-ASCII presented value never matches)."""
    return hmac.compare_digest(expected.encode("ascii"), presented.strip().encode("ascii", "replace"))


def timestamp_fresh(timestamp: str, now: float, window: float) -> bool:
    """Whether `timestamp` (unix seconds, as sent) lies within `window` seconds of `now`, either side (the
    sender's clock may be a little ahead). Anything that is not a finite number is not fresh."""
    try:
        sent = float(timestamp.strip())
    except (AttributeError, ValueError):
        return False
    return math.isfinite(sent) and abs(now - sent) <= window
