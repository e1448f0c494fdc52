"""One cached connection per address, reopened on demand."""

from __future__ import annotations

import asyncio

from hamq.net.connection import Connection, RequestHandler, connect


class ConnectionPool:
    """``handler`` serves requests the peers send back on these connections (a name
    server notifying a broker)."""

    def __init__(
        self, connect_timeout_s: float = 3.0, handler: RequestHandler | None = None
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.handler = handler
        self._conns: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Future[Connection]] = {}

    def get_ready(self, address: str) -> Connection | None:
        """The open connection to ``address`` if there is one (no awaiting on hot paths)."""
        conn = self._conns.get(address)
        return conn if conn is not None and not conn.is_closed else None

    async def get(self, address: str) -> Connection:
        conn = self.get_ready(address)
        if conn is not None:
            return conn
        pending = self._connecting.get(address)
        if pending is None:  # one connect per address, however many callers wait for it
            pending = asyncio.ensure_future(connect(address, self.handler, self.connect_timeout_s))
            self._connecting[address] = pending
            try:
                conn = await pending
                self._conns[address] = conn
                return conn
            finally:
                del self._connecting[address]
        return await asyncio.shield(pending)

    async def close(self) -> None:
        conns = list(self._conns.values())
        self._conns.clear()
        for conn in conns:
            conn.close()
        for conn in conns:
            try:
                await asyncio.wait_for(asyncio.shield(conn.closed), 1.0)
            except TimeoutError:
                pass
