"""The status page's sign-in on the API (controller/app/status_login.py has the sessions and the form): a browser
signs in with the token by form and keeps a session cookie; a token in a URL is never read."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable
from urllib.parse import parse_qs

from aiohttp import web

from tailguard.controller.app.api_answers import json_answer, refuse_body, response
from tailguard.controller.app.status_login import (
    AFTER_LOGIN,
    cookie_value,
    issue_session,
    login_page,
    session_cookie_header,
    session_valid,
)

logger = logging.getLogger("tailguard.api")

MAX_SIGNIN_BYTES = 4096


class StatusSignIn:
    """Sessions for the status page under `token` (None: no token configured, every browser is signed in)."""

    def __init__(self, token: bytes | None, wall_clock: Callable[[], float], body_timeout: float) -> None:
        self._token = token
        self._wall_clock = wall_clock  # the session expiry
        self._body_timeout = body_timeout

    def signed_in(self, request: web.BaseRequest) -> bool:
        """A browser reading the page without a token header: a valid session cookie. A token in the URL is not
        read: URLs end up in history and logs."""
        if self._token is None:
            return True
        return session_valid(cookie_value(request.cookies), self._token, self._wall_clock())

    def form(self, request: web.BaseRequest) -> web.Response:
        """The sign-in form (401), saying so when the session had expired."""
        expired = cookie_value(request.cookies) is not None
        message = "your session is not valid any more (sessions last 15 minutes): sign in again" if expired else ""
        return response(401, login_page(message).encode(), "text/html; charset=utf-8", {"Cache-Control": "no-store"})

    async def login(self, request: web.BaseRequest) -> web.StreamResponse:
        """POST /status/login (form: token=...): a session cookie and 303 to /status, or the form again (403)."""
        length = request.content_length or 0
        if length > MAX_SIGNIN_BYTES:
            return refuse_body(json_answer(413, {"error": f"a sign-in is at most {MAX_SIGNIN_BYTES} bytes"}), request)
        try:
            body = await asyncio.wait_for(request.content.readexactly(length), self._body_timeout) if length else b""
        except (TimeoutError, asyncio.IncompleteReadError):
            return refuse_body(json_answer(400, {"error": "the body did not arrive whole"}), request)
        token = parse_qs(body.decode("utf-8", "replace")).get("token", [""])[-1].strip()
        headers = {"Location": AFTER_LOGIN, "Cache-Control": "no-store"}
        if self._token is None:
            return response(303, b"", "text/plain", headers)
        if not token or not hmac.compare_digest(token.encode(), self._token):
            logger.warning("rejected status page sign-in: wrong token (403)")  # never the token itself
            page = login_page("that is not the controller's token").encode()
            return response(403, page, "text/html; charset=utf-8", {"Cache-Control": "no-store"})
        session = issue_session(self._token, self._wall_clock())
        return response(303, b"", "text/plain", {**headers, "Set-Cookie": session_cookie_header(session)})
