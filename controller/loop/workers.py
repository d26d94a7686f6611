"""Per-lane worker threads for actions: the dispatcher's background mode (controller/loop/dispatcher.py).

A lane is a name (a service, or `policy:<name>` for decisions that change nothing); its jobs run one at a time,
in the order queued, on a thread of its own that exists while the lane has work. Lanes run in parallel, so a
rollback waiting on a sync holds only its own lane. A job carries a key (the action's idempotency key): a key
already queued or running is not queued again (a resume and an evaluation naming the same action run it once).

`close()` stops taking jobs, drops the queued ones (they stay in the journal, planned or started, and the next
process resumes them) and waits for the running ones, whose waits the clock's interrupt cuts short.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from tailguard.controller.kit.clock import ShutdownInterrupt

log = logging.getLogger(__name__)


class ActionLanes:
    def __init__(self, name: str = "tailguard-action") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._queues: dict[str, deque[tuple[str, Callable[[], object]]]] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._keys: set[str] = set()
        self._closed = False

    def submit(self, lane: str, key: str, job: Callable[[], object]) -> bool:
        """Queue `job` on `lane`; False when `key` is already queued or running, or the lanes are closed."""
        with self._cond:
            if self._closed or key in self._keys:
                return False
            self._keys.add(key)
            self._queues.setdefault(lane, deque()).append((key, job))
            if lane not in self._threads:
                thread = threading.Thread(target=self._work, args=(lane,), name=f"{self._name}:{lane}", daemon=True)
                self._threads[lane] = thread
                thread.start()
            return True

    def busy(self) -> set[str]:
        """The keys queued or running."""
        with self._cond:
            return set(self._keys)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no job is queued or running; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._keys, timeout=timeout)

    def close(self, timeout: float = 30.0) -> bool:
        """Take no more jobs, drop the queued ones, wait for the running ones; False when some still run."""
        with self._cond:
            self._closed = True
            for queue in self._queues.values():
                for key, _job in queue:
                    self._keys.discard(key)
                queue.clear()
            threads = list(self._threads.values())
            self._cond.notify_all()
        for thread in threads:
            thread.join(timeout)
        return not any(thread.is_alive() for thread in threads)

    def _work(self, lane: str) -> None:
        while True:
            with self._cond:
                queue = self._queues.get(lane)
                if self._closed or not queue:
                    self._queues.pop(lane, None)
                    self._threads.pop(lane, None)
                    self._cond.notify_all()
                    return
                key, job = queue.popleft()
            try:
                job()
            except ShutdownInterrupt:
                log.info("action %s interrupted by shutdown; it stays in the journal and resumes at the next start",
                         key)  # fmt: skip
            except Exception:  # a failed job must not stop its lane
                log.exception("action %s on lane %s failed", key, lane)
            finally:
                with self._cond:
                    self._keys.discard(key)
                    self._cond.notify_all()
