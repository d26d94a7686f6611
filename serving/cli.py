"""The installed `tailguard` command (pyproject.toml [project.scripts]): the controller's commands
(controller/cli.py) plus the serving lab's `demo` and `load`. The controller never imports the lab, so the lab
adds its commands here, by imports the layer contracts see, instead of the controller naming them in strings."""

from __future__ import annotations

from collections.abc import Sequence

from tailguard.controller.cli import Command
from tailguard.controller.cli import main as controller_main
from tailguard.serving.lab import demo, load

LAB_COMMANDS = {
    "load": Command(load.main, "generate load against the serving tier"),
    "demo": Command(demo.main, "run the end-to-end demo"),
}


def main(argv: Sequence[str] | None = None) -> int:
    return controller_main(argv, commands=LAB_COMMANDS)
