"""What all connections of one server hold for their peers, bounded as a whole.

Each connection bounds itself (``max_pending_response_bytes``, a read buffer that grows
only with what arrives), but a bound per connection times thousands of connections is no
bound: 16 connections each holding a 15 MiB unfinished frame, or 16 MiB of unread
answers, cost 270 MiB. So a server adds up the bytes of unfinished frames and of unread
answers of all its connections; past ``max_held_bytes`` a connection holding more than
``FAIR_SHARE_BYTES`` is not read further (its frame waits, or its requests wait for it to
read), and connections holding less are served as before, so small requests stay fast.
"""

from __future__ import annotations

from typing import Protocol

# What one connection may still hold while the server is over its bound. Above the write
# buffer's high-water mark (64 KiB), so a connection over its share is always one its
# transport paused and ``resume_writing`` brings back.
FAIR_SHARE_BYTES = 256 * 1024


class Starved(Protocol):
    def unstarve(self) -> None:
        """The server is back under its bound: read this connection again."""


class HeldBytes:
    """The running total of a server's held bytes and the connections waiting for it to
    fall back under ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self.waiting: set[Starved] = set()

    @property
    def pressure(self) -> bool:
        return self.total > self.limit

    def change(self, delta: int) -> None:
        self.total += delta
        if delta < 0 and self.waiting and self.total <= self.limit:
            waiting, self.waiting = self.waiting, set()
            for conn in waiting:
                conn.unstarve()
