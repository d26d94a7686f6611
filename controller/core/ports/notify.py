"""The notification port: a decision sent to a receiver (signed webhooks)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from controller.core.ports.outcomes import ActionOutcome


class Notifier(Protocol):
    def notify(self, receiver: str, payload: Mapping[str, Any], *, idempotency_key: str) -> ActionOutcome: ...
