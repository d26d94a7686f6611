"""CLI argument helpers shared by the commands (`tailguard backtest`, `train`, `evaluate`): parsing, times, windows.

`UsageError` is a ConfigError of the error tree (controller/kit/errors.py) and a ValueError; every command catches
it and exits 2 with its message.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import datetime

from tailguard.controller.kit.errors import ConfigError

EXIT_USAGE = 2


class UsageError(ConfigError, ValueError):
    """A command line argument is unusable; the message is one sentence naming the option."""


def parse_command(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace | int:
    """The parsed arguments, or the exit code argparse chose (help: 0, bad arguments: 2)."""
    try:
        return parser.parse_args(list(argv))
    except SystemExit as exited:  # argparse already printed the usage error
        return int(exited.code) if isinstance(exited.code, int) else EXIT_USAGE


def parse_time(text: str, what: str) -> float:
    """Epoch seconds ("1700000000", "1700000000.5") or RFC3339 ("2024-05-01T12:00:00Z")."""
    raw = text.strip()
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        raise UsageError(
            f"{what}: expected epoch seconds or an RFC3339 time such as 2024-05-01T12:00:00Z, got {text!r}"
        ) from None
    if parsed.tzinfo is None:
        raise UsageError(f"{what}: RFC3339 time {text!r} needs a timezone (Z or +HH:MM)")
    return parsed.timestamp()


def time_window(args: argparse.Namespace) -> tuple[float, float]:
    """--start and --end as epoch seconds; UsageError when unreadable or not in order."""
    start, end = parse_time(args.start, "--start"), parse_time(args.end, "--end")
    if end <= start:
        raise UsageError(f"--end ({args.end}) must be after --start ({args.start})")
    return start, end
