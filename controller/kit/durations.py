"""Durations as policy authors write them ("15s", "5m", "1h30m") and as the engine uses them (seconds)."""

from __future__ import annotations

import re

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Parse a Prometheus-style duration into seconds.

    Raises ValueError with a message meant for a policy author.
    """
    stripped = text.strip()
    if not stripped:
        raise ValueError("expected a duration such as '15s', '5m' or '1h30m', got an empty string")
    position = 0
    total = 0.0
    for match in _PART.finditer(stripped):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if position != len(stripped):
        raise ValueError(f"expected a duration such as '15s', '5m' or '1h30m', got {text!r}")
    return total


def format_duration(seconds: float) -> str:
    """Render seconds compactly for PromQL (step, range) and logs."""
    if seconds >= 1 and float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000)}ms"
