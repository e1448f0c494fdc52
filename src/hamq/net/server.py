"""TCP servers and the event loop: uvloop when it is installed, asyncio otherwise."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections import Counter
from collections.abc import Awaitable, Callable

from hamq.clock import monotonic_s
from hamq.config import ServerConfig
from hamq.errors import SystemBusy
from hamq.net.connection import Connection, RequestHandler, split_address
from hamq.net.counts import COUNTS
from hamq.net.held import HeldBytes
from hamq.net.tasks import PeriodicTask
from hamq.protocol.codes import Flag
from hamq.protocol.frame import encode_frame

log = logging.getLogger(__name__)

# The timeout sweep runs this often (and at least four times per shortest timeout).
SWEEP_INTERVAL_MAX_S = 1.0


class Server:
    """Accepts connections for one handler within ``limits`` (connection caps, idle and
    frame timeouts, pending answer bytes, bytes held for all connections together) and
    remembers them so ``close`` ends them all."""

    def __init__(self, handler: RequestHandler, limits: ServerConfig = ServerConfig()) -> None:
        self.handler = handler
        self.limits = limits
        self.connections: set[Connection] = set()
        self._per_host: Counter[str] = Counter()
        self.held = HeldBytes(limits.max_held_bytes)
        # Called when a connection closes (client registries forget what it registered).
        self.on_connection_closed: list[Callable[[Connection], None]] = []
        self._server: asyncio.base_events.Server | None = None
        self._sweep: PeriodicTask | None = None

    async def start(self, address: str) -> None:
        host, port = split_address(address)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._new_connection, host, port, reuse_address=True, backlog=1024
        )
        limits = self.limits
        shortest_s = min(limits.connection_idle_timeout_ms, limits.frame_read_timeout_ms) / 1000
        self._sweep = PeriodicTask(
            "connection timeout sweep",
            min(SWEEP_INTERVAL_MAX_S, shortest_s / 4),
            self._sweep_timeouts,
        )
        self._sweep.start()

    def _new_connection(self) -> Connection:
        return Connection(
            self.handler,
            on_close=self._closed,
            on_open=self._admit,
            max_pending_bytes=self.limits.max_pending_response_bytes,
            held_bytes=self.held,
        )

    def _admit(self, conn: Connection) -> bool:
        limits = self.limits
        if len(self.connections) >= limits.max_connections:
            reason = (
                f"this server already has {limits.max_connections} connections (max_connections)"
            )
        elif self._per_host[conn.peer_host] >= limits.max_connections_per_address:
            reason = (
                f"{conn.peer_host} already has {limits.max_connections_per_address} "
                "connections to this server (max_connections_per_address)"
            )
        else:
            self.connections.add(conn)
            self._per_host[conn.peer_host] += 1
            return True
        COUNTS.connections_refused += 1
        log.warning("refusing connection from %s: %s", conn.peer, reason)
        conn.transport.writelines(encode_frame(SystemBusy.code, 0, Flag.RESPONSE, None, reason))
        conn.transport.close()
        return False

    def _closed(self, conn: Connection) -> None:
        if conn not in self.connections:
            return  # refused at admission
        self.connections.discard(conn)
        self._per_host[conn.peer_host] -= 1
        if not self._per_host[conn.peer_host]:
            del self._per_host[conn.peer_host]
        for callback in self.on_connection_closed:
            callback(conn)

    def _sweep_timeouts(self) -> None:
        """Close connections that are idle, or that began a frame and stopped sending it
        (slowloris); aborting drops whatever the peer did not read."""
        now = monotonic_s()
        idle_s = self.limits.connection_idle_timeout_ms / 1000
        frame_s = self.limits.frame_read_timeout_ms / 1000
        for conn in list(self.connections):
            reason = conn.timed_out(now, idle_s, frame_s)
            if reason and conn.transport is not None:
                COUNTS.connections_timed_out += 1
                log.warning("closing connection from %s: %s", conn.peer, reason)
                conn.transport.abort()

    async def close(self) -> None:
        if self._sweep is not None:
            await self._sweep.stop()
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
