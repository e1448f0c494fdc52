"""TCP servers and the event loop: uvloop when it is installed, asyncio otherwise."""
from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from hamq.net.connection import Connection, RequestHandler, split_address

log = logging.getLogger(__name__)


class Server:
    """Accepts connections for one handler and remembers them so ``close`` ends them all."""

    def __init__(self, handler: RequestHandler) -> None:
        self.handler = handler
        self.connections: set[Connection] = set()
        # Called when a connection closes (client registries forget what it registered).
        self.on_connection_closed: list[Callable[[Connection], None]] = []
        self._server: asyncio.base_events.Server | None = None

    async def start(self, address: str) -> None:
        host, port = split_address(address)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._new_connection, host, port,
                                                reuse_address=True, backlog=1024)

    def _new_connection(self) -> Connection:
        conn = Connection(self.handler, on_close=self._closed)
        self.connections.add(conn)
        return conn

    def _closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        for callback in self.on_connection_closed:
            callback(conn)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()


def install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def run_until_signalled(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``main(stop_event)``; SIGTERM and SIGINT set the event for a clean shutdown."""
    install_uvloop()

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    asyncio.run(runner())
