"""Where a request to the controller's API carries its bearer token.

`Authorization: Bearer <token>` (Alertmanager, scripts, `tailguard status --url`), or `X-Tailguard-Token: <token>`:
the Kubernetes API server's service proxy (`kubectl tailguard`, `kubectl proxy`) authenticates the user with the
Authorization header and then removes it before it forwards the request to the Service (kube-apiserver's
authentication filter deletes it so a user's cluster credential never reaches a workload), so through the proxy the
controller's own token travels in its own header. (A browser signs in to the status page by a form and a session
cookie: controller/app/status_login.py; a token in a URL is never read.)
"""

from __future__ import annotations

from collections.abc import Mapping

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
