"""The serving package's own error: a branch of the controller's error tree (`TailguardError`), so a caller that
catches every tailguard failure still catches the lab's."""

from __future__ import annotations

from tailguard.controller import TailguardError


class LabError(TailguardError):
    """The serving lab failed: a process did not start, a tool is missing, the simulated engine stopped."""
