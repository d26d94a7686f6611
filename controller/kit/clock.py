"""The injected clock: real time in production, a manual clock in tests.

Every wait of the controller (retry backoff, an Argo CD sync poll, a traffic ramp's hold) goes through
`sleep`, so shutdown can cut them short: after `interrupt()`, a sleep raises ShutdownInterrupt instead
of waiting. An action cut short this way is left "started" in the journal and resumed, with the same
idempotency key, by the next process: a SIGTERM never has to wait out a 60 s ramp hold, and nothing
is lost or done twice.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

# How often a real-time wait that another thread may cut short (an operator's abort; `sleep_unless`, the
# WakeableClock of controller/loop/ports.py) looks at its event and at shutdown: the longest an abort waits during a
# ramp's hold or a sync poll.
WAKE_CHECK_SECONDS = 0.2


class Clock(Protocol):
    """The clock every wait goes through (kept here, in the kit, because the kit's HTTP call waits too;
    tailguard.controller.core.ports re-exports it with the other ports)."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None:
        """Wait; raises ShutdownInterrupt once interrupt() was called."""

    def interrupt(self) -> None:
        """Shutdown: cut every current and later sleep short."""


class ShutdownInterrupt(BaseException):
    """A wait was cut short because the controller is stopping.

    A BaseException, like KeyboardInterrupt: the broad `except Exception` that turns an actuator's
    failure into a FAILED outcome must not catch it, or the action would be journaled as failed
    instead of being left for the next process to finish.
    """


class SystemClock:
    def __init__(self) -> None:
        self._stopping = threading.Event()

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if self._stopping.wait(max(0.0, seconds)):  # True at once when already interrupted
            raise ShutdownInterrupt("the controller is stopping")

    def sleep_unless(self, seconds: float, wake: threading.Event) -> bool:
        deadline = time.monotonic() + max(0.0, seconds)
        while not wake.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.sleep(min(left, WAKE_CHECK_SECONDS))  # raises at once on shutdown
        return wake.is_set()

    def interrupt(self) -> None:
        """Wake every current sleep and make every later one raise ShutdownInterrupt at once."""
        self._stopping.set()


class ManualClock:
    """Time moves only when a test says so; sleep() advances it instead of waiting."""

    def __init__(self, start: float = 1_700_000_000.0):
        self._now = start
        self._lock = threading.Lock()
        self._stopping = False

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def sleep(self, seconds: float) -> None:
        if self._stopping:
            raise ShutdownInterrupt("the controller is stopping")
        self.advance(max(0.0, seconds))

    def sleep_unless(self, seconds: float, wake: threading.Event) -> bool:
        """One sleep() (time moves by `seconds`) unless `wake` is already set; a test sets it from a sleep()
        override to stand for an abort that arrives during the wait."""
        if wake.is_set():
            return True
        self.sleep(seconds)
        return wake.is_set()

    def interrupt(self) -> None:
        self._stopping = True
