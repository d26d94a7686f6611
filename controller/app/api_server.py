"""The API's server: a bound socket, one thread with its own event loop, aiohttp's low-level server behind the
connection cap (controller/app/capped_server.py), and the worker pool that answers what asks the controller.

What a request gets is not this module's: it calls the `handler` it is given (controller/app/api.py)."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiohttp import web

from tailguard.controller.app.capped_server import CappedServer

logger = logging.getLogger("tailguard.api")

LISTEN_BACKLOG = 1024
MAX_LINE_BYTES = 8190  # request line and each header (aiohttp's defaults, stated)
MAX_HEADERS = 64
SHUTDOWN_SECONDS = 2.0

R = TypeVar("R")
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class ApiServer:
    """Serves `handler` on `host:port` (port 0: a free port, see `.port`); the socket is bound in the constructor,
    so a port in use fails here (an OSError) and `.port` is known before `start`. `on_open` / `on_close` run on
    the server's event loop when it starts and stops (the leader forwarder's session)."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: Handler,
        *,
        max_connections: int,
        idle_timeout: float,
        workers: int,
        on_open: Callable[[], Coroutine[Any, Any, None]] | None = None,
        on_close: Callable[[], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        self._handler = handler
        self._max_connections = max_connections
        self._idle_timeout = idle_timeout
        self._on_open = on_open
        self._on_close = on_close
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
        self._host, self._port = self._socket.getsockname()[:2]
        self._workers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tailguard-api-worker")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.ServerRunner | None = None
        self._server: CappedServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._host)

    @property
    def port(self) -> int:
        return int(self._port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def call(self, function: Callable[..., R], *args: Any) -> R:
        """A controller call on the worker pool: the event loop (and /healthz) never waits on the controller."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._workers, function, *args)

    def start(self) -> None:
        started = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve())
            except Exception as error:  # noqa: BLE001 - handed to start(), which raises it
                failure.append(error)
                started.set()
                loop.close()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=serve, name="tailguard-api", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        logger.info("API listening on %s", self.url)

    async def _serve(self) -> None:
        self._server = CappedServer(
            self._handler,
            max_connections=self._max_connections,
            max_waiting=LISTEN_BACKLOG,  # past the cap, new connections wait for a slot
            keepalive_timeout=self._idle_timeout,  # also bounds an incomplete request head: see CappedServer
            lingering_time=0,  # an unread body is never drained: the connection is closed instead
            max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_LINE_BYTES,
            max_headers=MAX_HEADERS,
            access_log=None,
            logger=logging.getLogger("tailguard.api.http"),
        )
        self._runner = web.ServerRunner(self._server, shutdown_timeout=SHUTDOWN_SECONDS)
        await self._runner.setup()
        if self._on_open is not None:
            await self._on_open()
        site = web.SockSite(self._runner, self._socket, backlog=LISTEN_BACKLOG)
        await site.start()

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and self._runner is not None:
            runner = self._runner
            try:
                asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=SHUTDOWN_SECONDS + 5)
                if self._on_close is not None:
                    asyncio.run_coroutine_threadsafe(self._on_close(), loop).result(timeout=5)
            except Exception:  # stopping must go on: the loop is stopped below either way
                logger.warning("the API did not shut down cleanly", exc_info=True)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
        self._thread = None
        self._loop = None
        self._runner = None
        self._workers.shutdown(wait=False, cancel_futures=True)
        self._socket.close()

    def open_connections(self) -> int:
        """Connections admitted right now (at most `max_connections`; more may wait for a slot)."""
        server = self._server
        return server.admitted if server is not None else 0

    def connection_sockets(self) -> list[socket.socket]:
        """The sockets of the open connections (for checks of their options, e.g. TCP_NODELAY)."""
        server = self._server
        if server is None:
            return []
        found = []
        for handler in server.connections:
            transport = handler.transport
            sock = transport.get_extra_info("socket") if transport is not None else None
            if sock is not None:
                found.append(sock)
        return found
