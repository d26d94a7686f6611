"""Where a request to the controller's API carries its bearer token.

`Authorization: Bearer <token>` (Alertmanager, scripts, `tailguard status --url`), or `X-Tailguard-Token: <token>`:
the Kubernetes API server's service proxy (`kubectl tailguard`, `kubectl proxy`) authenticates the user with the
Authorization header and then removes it before it forwards the request to the Service (kube-apiserver's
authentication filter deletes it so a user's cluster credential never reaches a workload), so through the proxy the
controller's own token travels in its own header. (A browser signs in to the status page by a form and a session
cookie: controller/app/status_login.py; a token in a URL is never read.)
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger("tailguard.api")

TOKEN_HEADER = "X-Tailguard-Token"


def presented_authorization(headers: Mapping[str, str]) -> str | None:
    """The `Authorization` value to check: the header itself, else `Bearer <X-Tailguard-Token>`; None without."""
    authorization = headers.get("Authorization")
    if authorization is not None:
        return authorization
    token = headers.get(TOKEN_HEADER)
    if token is not None and token.strip():
        return f"Bearer {token.strip()}"
    return None


class BearerCheck:
    """The bearer-token check of every non-health endpoint, against `token` (None: no token configured, every
    request passes here; the API then answers loopback only). A refusal is counted through `on_rejected(what,
    code)` and logged without the token."""

    def __init__(self, token: bytes | None, on_rejected: Callable[[str, int], None]) -> None:
        self._token = token
        self._on_rejected = on_rejected

    def check(self, authorization: str | None, what: str) -> tuple[int, dict[str, Any]] | None:
        """None when the request may go on, else the refusal (401 no bearer token, 403 a wrong one); `what` names
        the endpoint in the log. Compared in constant time: the answer time does not leak how much of a guess
        was right."""
        if self._token is None:
            return None
        scheme, _, presented = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            logger.warning("rejected %s: no bearer token (401)", what)
            self._on_rejected(what, 401)
            return 401, {"error": "authentication required: send Authorization: Bearer <token>"}
        if not hmac.compare_digest(presented.strip().encode(), self._token):
            logger.warning("rejected %s: wrong bearer token (403)", what)  # never the token itself
            self._on_rejected(what, 403)
            return 403, {"error": "the bearer token is not the one configured for this webhook"}
        return None
