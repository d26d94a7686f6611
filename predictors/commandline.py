"""What `tailguard train` and `tailguard evaluate` parse alike: their arguments and the time window."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

EXIT_USAGE = 2


def parse_command(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace | int:
    """The parsed arguments, or the exit code argparse chose (help: 0, bad arguments: 2)."""
    try:
        return parser.parse_args(list(argv))
    except SystemExit as exited:
        return int(exited.code) if isinstance(exited.code, int) else EXIT_USAGE


def time_window(args: argparse.Namespace) -> tuple[float, float]:
    """--start and --end as epoch seconds; UsageError when unreadable or not in order."""
    from controller.tools.backtest import UsageError, parse_time

    start, end = parse_time(args.start, "--start"), parse_time(args.end, "--end")
    if end <= start:
        raise UsageError(f"--end ({args.end}) must be after --start ({args.start})")
    return start, end
