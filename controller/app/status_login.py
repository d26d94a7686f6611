"""The status page's login: a form that takes the controller's token once and answers with a short-lived session
cookie, so no token is ever in a URL (browser history, proxy logs and Referer headers keep URLs).

The cookie is `<expiry>.<HMAC-SHA256(token, "tailguard-status:<expiry>")>`: stateless, so every replica (they share
the token) accepts what another issued and a standby can check it before it forwards; it expires after
SESSION_SECONDS and is HttpOnly (no script reads it), SameSite=Lax (sent on a top-level navigation only) and Path=/.
Rotating the token ends every session.
"""

from __future__ import annotations

import hashlib
import hmac
import html
from collections.abc import Mapping

SESSION_COOKIE = "tailguard_session"
SESSION_SECONDS = 900
LOGIN_PATH = "/status/login"
AFTER_LOGIN = "../status"  # relative to /status/login: /status, also behind a path prefix


def _signature(token: bytes, expiry: int) -> str:
    return hmac.new(token, f"tailguard-status:{expiry}".encode(), hashlib.sha256).hexdigest()


def issue_session(token: bytes, now: float, seconds: int = SESSION_SECONDS) -> str:
    expiry = int(now) + seconds
    return f"{expiry}.{_signature(token, expiry)}"


def session_valid(value: str | None, token: bytes, now: float) -> bool:
    """Signed with `token` and not expired."""
    if not value or "." not in value:
        return False
    expiry_text, _, signature = value.partition(".")
    if not expiry_text.isdigit():
        return False
    expiry = int(expiry_text)
    return expiry > now and hmac.compare_digest(signature, _signature(token, expiry))


def session_cookie_header(value: str, seconds: int = SESSION_SECONDS) -> str:
    return f"{SESSION_COOKIE}={value}; Max-Age={seconds}; Path=/; HttpOnly; SameSite=Lax"


def cookie_value(cookies: Mapping[str, str]) -> str | None:
    return cookies.get(SESSION_COOKIE)


def login_page(message: str = "") -> str:
    """The form: the token goes in a POST body, never in the URL."""
    note = f'<p class="error" id="login-error">{html.escape(message)}</p>' if message else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>tailguard status: sign in</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:3rem;color:#1d232a;background:#f6f7f9}"
        "form{background:#fff;padding:1.2rem;max-width:28rem;box-shadow:0 1px 2px #0002}"
        "input{width:100%;padding:.4rem;margin:.4rem 0 .8rem;font-family:ui-monospace,monospace}"
        ".error{color:#9b1c1c;font-weight:600}</style></head><body>"
        "<h1>tailguard status</h1>"
        # Relative, so the form and its redirect work behind a path prefix too (the Kubernetes API's service proxy,
        # `kubectl proxy`): from .../status this posts to .../status/login.
        f"{note}<form method=post action=status/login id=login>"
        "<label for=token>The controller's token (the Secret tailguard-alertmanager, key token):</label>"
        "<input type=password name=token id=token autocomplete=current-password required>"
        "<button type=submit>Sign in</button></form>"
        f"<p>Signed in for {SESSION_SECONDS // 60} minutes. Or, from a terminal: "
        "<code>kubectl tailguard status</code>.</p></body></html>"
    )
