"""The dispatcher as the evaluation and the public fakes see it (controller/loop/dispatcher.py implements it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.model import Decision


class DispatcherPort(Protocol):
    """What the controller needs of tailguard.controller.loop.dispatcher.Dispatcher (and of wrappers around it)."""

    def dispatch(self, decision: Decision) -> Sequence[Any]: ...

    def resume(self) -> Sequence[Any]: ...

    def retry_deferred(self, policy: str, state: PolicyState | None) -> Sequence[Any]:
        """After an evaluation of `policy` committed `state` (None: the policy is gone): run each of its deferred
        actions again (same key) whose condition still holds; end the others suppressed, with why."""
        ...

    def deferred_policies(self) -> set[str]:
        """The policies that have deferred actions in the journal."""
        ...
