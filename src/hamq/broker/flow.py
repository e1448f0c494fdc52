"""Publisher flow control: credit for sends waiting for acks, and blocking by alarms.

RabbitMQ slows publishers by credit (a mirror that falls behind stops granting it and the
publisher's connection stops being read) and blocks them outright while a memory or disk
alarm is on (``connection.blocked``). hamq does both the same way: it stops reading the
publishers' connections (``Connection.hold_back``), so their sends wait in the sockets and
TCP slows the producers; nothing is buffered without limit and nothing is refused.

Credit: the bytes of sends whose answer waits for replica acks, an fsync or a Raft
commit are counted (plain integers, on the send path); at ``max_unconfirmed_bytes`` every
publisher of the member is held back until answers bring the count below half of it. Alarms
(``broker/alarms.py``) hold publishers back too, and tell them: a one-way
CONNECTION_BLOCKED {reason, detail} when an alarm begins, CONNECTION_UNBLOCKED when none is
left. A connection is a publisher once it sent SEND_MESSAGE (a consumer's is never held).
"""

from __future__ import annotations

import logging

from hamq.net.connection import Connection
from hamq.protocol.codes import RequestCode

log = logging.getLogger(__name__)


class PublisherFlow:
    """One member's publishers and what holds them back: its credit, an alarm."""

    def __init__(self, max_unconfirmed_bytes: int) -> None:
        self.max_unconfirmed_bytes = max_unconfirmed_bytes
        # hysteresis: resumed well below the bound, so a full pipe is not paused per ack;
        # at least 1, so that no bytes waiting always resumes (a bound of 1 halves to 0)
        self.resume_below_bytes = max(1, max_unconfirmed_bytes // 2)
        self.unconfirmed_bytes = 0  # bodies of sends whose answer waits for acks
        self.out_of_credit = False
        self.credit_exhausted = 0  # how often credit ran out (runtime info)
        self.blocked: tuple[str, str] | None = None  # an alarm's (reason, detail)
        self.publishers: set[Connection] = set()

    @property
    def holding(self) -> bool:
        return self.out_of_credit or self.blocked is not None

    def publisher(self, conn: Connection) -> None:
        """``conn`` sent its first SEND_MESSAGE: from now on flow control holds it."""
        conn.publishes = True
        self.publishers.add(conn)
        if self.blocked is not None:
            _tell_blocked(conn, *self.blocked)
        if self.holding:
            conn.hold_back(True)

    def closed(self, conn: Connection) -> None:
        self.publishers.discard(conn)

    # -- credit (the send path) ----------------------------------------------------------
    def take(self, size: int) -> None:
        """A send of ``size`` body bytes waits for acks."""
        self.unconfirmed_bytes += size
        if self.unconfirmed_bytes >= self.max_unconfirmed_bytes and not self.out_of_credit:
            self.out_of_credit = True
            self.credit_exhausted += 1
            if self.blocked is None:
                self._hold_all(True)

    def give(self, size: int) -> None:
        """A send that waited for acks was answered."""
        self.unconfirmed_bytes -= size
        if self.out_of_credit and self.unconfirmed_bytes < self.resume_below_bytes:
            self.out_of_credit = False
            if self.blocked is None:
                self._hold_all(False)

    # -- alarms ------------------------------------------------------------------------------
    def block(self, blocked: tuple[str, str] | None) -> None:
        """The alarms' verdict: (reason, detail) to block publishers with, None to let them
        go. Publishers are told when they are blocked, when the reason changes and when
        they are let go."""
        if blocked == self.blocked:
            return
        was, self.blocked = self.blocked, blocked
        for conn in list(self.publishers):
            if blocked is not None:
                if was is None or was[0] != blocked[0]:
                    _tell_blocked(conn, *blocked)
            else:
                conn.oneway(RequestCode.CONNECTION_UNBLOCKED)
        if (was is None) != (blocked is None) and not self.out_of_credit:
            self._hold_all(blocked is not None)

    def status(self) -> dict:
        return {
            "publishers": len(self.publishers),
            "unconfirmed_bytes": self.unconfirmed_bytes,
            "max_unconfirmed_bytes": self.max_unconfirmed_bytes,
            "out_of_credit": self.out_of_credit,
            "credit_exhausted": self.credit_exhausted,
            "blocked": self.blocked[0] if self.blocked else None,
        }

    def _hold_all(self, held: bool) -> None:
        for conn in list(self.publishers):
            conn.hold_back(held)


def _tell_blocked(conn: Connection, reason: str, detail: str) -> None:
    conn.oneway(RequestCode.CONNECTION_BLOCKED, {"reason": reason, "detail": detail})
