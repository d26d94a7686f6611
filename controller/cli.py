"""The `tailguard` console script's entry point (`controller.cli:main`, the name installed wheels and images have
always carried). The command itself lives in the app layer, controller/app/cli.py."""

from controller.app.cli import main

__all__ = ["main"]
