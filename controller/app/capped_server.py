"""aiohttp's low-level server with a connection cap that degrades gracefully under an alert storm.

aiohttp's `keepalive_timeout` runs from the connection's start and from each answer, and closes the connection if
no complete request head arrived by then: it is the idle AND the header timeout.

At the cap (`max_connections` admitted connections), a new connection is never reset while a slot can be made:

1. the connection idle the longest (least recently used: no request in progress, idle at least
   `evict_idle_after` seconds) is closed to make room. Least recently used, because an HTTP client reuses its
   most recently used idle connection (Go's net/http, Alertmanager's client, does): the longest-idle one is the
   one least likely to carry a request at that very moment, and one idle a second or more is not in a reuse race;
2. with no such connection, the new one waits, unread (`pause_reading`), in a bounded queue (`max_waiting`) and is
   admitted as soon as a connection closes or one has been idle long enough (checked every `admit_every`
   seconds). Its request is answered late, never refused: Alertmanager's 1,000 groups flushing at once queue
   here instead of being reset (issue 24 item 7). A waiting connection is still closed at the idle timeout;
3. past the queue (a flood of connections), the longest-idle connection makes room whatever its age, and only
   with every admitted connection busy is a new one closed at once (reset).

A probe never waits longer than `evict_idle_after` (+ `admit_every`) behind a flood of idle connections.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

EVICT_IDLE_AFTER_SECONDS = 1.0
ADMIT_EVERY_SECONDS = 0.25


class CappedServer(web.Server):
    def __init__(
        self,
        handler: Any,
        *,
        max_connections: int,
        max_waiting: int,
        evict_idle_after: float = EVICT_IDLE_AFTER_SECONDS,
        admit_every: float = ADMIT_EVERY_SECONDS,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, **kwargs)
        self._max_connections = max_connections
        self._max_waiting = max_waiting
        self._evict_idle_after = evict_idle_after
        self._admit_every = admit_every
        self._admitted: dict[RequestHandler, float] = {}  # handler -> when it was last active (loop time)
        self._busy: set[Any] = set()
        self._waiting: deque[tuple[RequestHandler, asyncio.Transport]] = deque()
        self._admit_timer: asyncio.TimerHandle | None = None
        self.request_handler = self._tracked(handler)
        self.evicted = 0  # idle connections closed to make room
        self.waited = 0  # connections that waited for a slot
        self.refused = 0  # connections closed at once (the queue was full)

    @property
    def admitted(self) -> int:
        return len(self._admitted)

    def _tracked(self, handler: Any) -> Any:
        busy, admitted = self._busy, self._admitted

        async def tracked(request: web.BaseRequest) -> web.StreamResponse:
            protocol = request.protocol
            busy.add(protocol)
            try:
                response: web.StreamResponse = await handler(request)
                return response
            finally:
                busy.discard(protocol)
                if protocol in admitted:
                    admitted[protocol] = asyncio.get_running_loop().time()

        return tracked

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # aiohttp sets it too; never Nagle
        if len(self._admitted) < self._max_connections or self._evict_one():
            self._admit(handler, transport)
            return
        if len(self._waiting) >= self._max_waiting:
            # The queue is full (a flood of connections): the longest-idle one makes room whatever its age, and
            # only with every slot busy is the new one refused.
            if self._evict_one(any_age=True):
                self._admit(handler, transport)
                return
            self.refused += 1
            transport.abort()
            return
        transport.pause_reading()  # its request waits in the socket until a slot frees
        self._waiting.append((handler, transport))
        self.waited += 1
        self._schedule_admission()

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self._busy.discard(handler)
        if self._admitted.pop(handler, None) is None:
            self._waiting = deque(entry for entry in self._waiting if entry[0] is not handler)
        super().connection_lost(handler, exc)
        self._admit_waiting(evict=False)

    def _admit(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        self._admitted[handler] = asyncio.get_running_loop().time()
        super().connection_made(handler, transport)

    def _evict_one(self, *, any_age: bool = False) -> bool:
        """Close the least recently used idle connection, if one has been idle long enough (or at all)."""
        now = asyncio.get_running_loop().time()
        candidates = [(used, id(h), h) for h, used in self._admitted.items() if h not in self._busy]
        if not candidates:
            return False
        used, _, idle = min(candidates)
        if not any_age and now - used < self._evict_idle_after:
            return False
        del self._admitted[idle]
        self._connections.pop(idle, None)
        idle.force_close()
        self.evicted += 1
        return True

    def _admit_waiting(self, *, evict: bool) -> None:
        while self._waiting and (len(self._admitted) < self._max_connections or (evict and self._evict_one())):
            handler, transport = self._waiting.popleft()
            if transport.is_closing():
                continue
            self._admit(handler, transport)
            transport.resume_reading()
        if self._waiting:
            self._schedule_admission()

    def _schedule_admission(self) -> None:
        if self._admit_timer is None:

            def admit() -> None:
                self._admit_timer = None
                self._admit_waiting(evict=True)

            self._admit_timer = asyncio.get_running_loop().call_later(self._admit_every, admit)

    async def shutdown(self, timeout: float | None = None) -> None:
        if self._admit_timer is not None:
            self._admit_timer.cancel()
            self._admit_timer = None
        for _handler, transport in self._waiting:
            transport.close()
        self._waiting.clear()
        await super().shutdown(timeout)
