"""Housekeeping: the controller's periodic maintenance (journal retention, outbox purge), on its own thread.

Each task is `(name, task(now) -> report)`; a pass runs them one after another, logs each report (one line, and
a JSON `fields` record) and survives any exception (logged; the next pass tries again). The first pass runs
`first_delay` seconds after `start()` (not at start: startup and the probes never wait on a purge), then every
`interval` seconds. The waits are real time (an Event), the `now` the tasks get is the injected clock's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tailguard.controller.core.ports import Clock

logger = logging.getLogger(__name__)

Task = tuple[str, Callable[[float], Mapping[str, Any]]]


class Housekeeper:
    def __init__(
        self, tasks: Sequence[Task], clock: Clock, *, interval: float = 3600.0, first_delay: float = 60.0
    ) -> None:
        self.tasks = list(tasks)
        self.clock = clock
        self.interval = interval
        self.first_delay = first_delay
        self.passes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tailguard-housekeeping", daemon=True)

    def start(self) -> None:
        if self.tasks:
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def run_once(self) -> dict[str, Mapping[str, Any] | str]:
        """One pass: each task's report, or the error that stopped it."""
        reports: dict[str, Mapping[str, Any] | str] = {}
        for name, task in self.tasks:
            try:
                report = task(self.clock.now())
            except Exception as exc:  # maintenance must never stop the controller (logged with its traceback)
                logger.exception("housekeeping %s failed; retried at the next pass", name)
                reports[name] = f"{type(exc).__name__}: {exc}"
                continue
            reports[name] = report
            logger.info(
                "housekeeping %s: %s",
                name,
                ", ".join(f"{key}={value}" for key, value in report.items()),
                extra={"fields": {"event": "housekeeping", "task": name, **report}},
            )
        self.passes += 1
        return reports

    def _run(self) -> None:
        wait = self.first_delay
        while not self._stop.wait(wait):
            self.run_once()
            wait = self.interval
