"""The API's answers: one aiohttp Response per answer (head and body in one write), JSON bodies, refusals."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web


def response(status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> web.Response:
    # One buffer for head and body: aiohttp writes a Response with a known body in one send.
    answer = web.Response(status=status, body=body, headers={"Content-Type": content_type, **(headers or {})})
    answer.headers["Server"] = "tailguard"
    return answer


def json_answer(status: int, value: Any, headers: Mapping[str, str] | None = None) -> web.Response:
    return response(status, (json.dumps(value, default=str) + "\n").encode(), "application/json", headers)


def refusal(status: int, error: dict[str, Any]) -> web.Response:
    return json_answer(status, error, {"WWW-Authenticate": 'Bearer realm="tailguard"'} if status == 401 else None)


def refuse_body(answer: web.Response, request: web.BaseRequest) -> web.Response:
    """Close the connection after this answer unless the request had no body left unread."""
    if request.body_exists and not request.content.is_eof():
        answer.force_close()
    return answer
