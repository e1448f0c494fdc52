"""Connections the web server keeps, bounded: it shares a process, its file descriptors and
its event loop with a name server (``web_listen``). uvicorn waits for a request's head and
body as long as the client likes and accepts every connection, so a client that opens
connections and sends a header line now and then (slowloris) held thousands of them, each a
descriptor of the name server's process, until none was left for brokers and clients.

Here a request must arrive whole (head and body) within ``REQUEST_TIMEOUT_S`` of the
connection or of the previous answer, and a connection beyond ``MAX_CONNECTIONS`` is
closed at once. A request that has arrived is never cut: its route is
bounded by the admin clients' own timeouts."""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256  # a console uses a handful (a browser opens at most 6 per host)
REQUEST_TIMEOUT_S = 10.0

LOG_EVERY_S = 60.0  # an attack's thousands of refusals are one line a minute


class GuardedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a connection cap and a deadline for each request."""

    _deadline: asyncio.TimerHandle | None = None
    _logged_at = -LOG_EVERY_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > MAX_CONNECTIONS:
            transport.close()
            if self.loop.time() - GuardedH11Protocol._logged_at >= LOG_EVERY_S:
                GuardedH11Protocol._logged_at = self.loop.time()
                log.warning("web: closing connections beyond %d open ones", MAX_CONNECTIONS)
            return
        self._arm_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)

    def _arm_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(REQUEST_TIMEOUT_S, self._on_deadline)

    def _on_deadline(self) -> None:
        self._deadline = None
        # DONE: the whole request is in and its route answers it (then the next deadline)
        if self.conn.their_state is not h11.DONE and not self.transport.is_closing():
            self.transport.close()
