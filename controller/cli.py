"""The controller's command line (`python -m tailguard.controller`): `main(argv, commands=...)` and `Command`, the face
a program adding its own commands uses (serving/cli.py, whose `main` is the installed `tailguard` console script:
the controller's commands plus the serving lab's `demo` and `load`). The command itself lives in the app layer,
controller/app/cli.py."""

from tailguard.controller.app.cli import Command, main

__all__ = ["Command", "main"]
