"""What may be shown of a credential-bearing value: logs, the journal and the API show a URL as scheme+host only.

A receiver URL's secret may be anywhere in it: user:password@, a token in the query, or the path itself (a
Slack-style incoming webhook, https://hooks.slack.com/services/T000/B000/XXXX, IS its path). So a receiver URL is
shown as `url_origin(url)`: scheme://host[:port], nothing else. `redact_value` applies the rule to a JSON-like
value (decisions, action parameters and results): every http(s) URL in a string is cut to its origin, and the
value of a key that names a credential (token, secret, password, authorization, apiKey, credential, signature)
is replaced whole.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

REDACTED = "[redacted]"
_URL = re.compile(r"""https?://[^\s"'<>]*[^\s"'<>.,;:)\]]""", re.IGNORECASE)  # no trailing punctuation
_SECRET_KEY = re.compile(r"token|secret|password|passwd|authorization|api[_-]?key|credential|signature", re.IGNORECASE)


def url_origin(url: str) -> str:
    """scheme://host[:port] of `url` (no user info, path, query or fragment); a value that is not a URL: REDACTED."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
        port = parts.port
    except ValueError:
        return REDACTED
    if not parts.scheme or not host:
        return REDACTED
    shown = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{shown}" + (f":{port}" if port is not None else "")


def redact_text(text: str) -> str:
    """`text` with every http(s) URL in it cut to its origin."""
    return _URL.sub(lambda found: url_origin(found.group(0)), text)


def redact_value(value: Any) -> Any:
    """A copy of a JSON-like value with URLs cut to their origin and credential-named keys' values replaced."""
    if isinstance(value, str):
        return redact_text(value) if "://" in value else value
    if isinstance(value, Mapping):
        return {
            key: REDACTED if isinstance(key, str) and _SECRET_KEY.search(key) and item else redact_value(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact_value(item) for item in value]
    return value
