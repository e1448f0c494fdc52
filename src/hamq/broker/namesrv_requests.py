"""Requests a name server sends back on a broker's connection to it (the reverse
notification of a group's new membership, NOTIFY_MIN_BROKER_ID_CHANGE).

One object per connection pool. A broker process has one member, but the members of a
``BrokerContainer`` share one pool, so one connection to each name server: the name server
sends every member's notifications down it (it keeps the connection each member last
registered on), and they are told apart by the group's broker name in the body. Members of
one group in one container get the same notification each (once per member address: the
name server sends one per member, and each is taken by all of them; taking one twice
changes nothing).
"""

from __future__ import annotations

from hamq.broker.ha.member_group import MemberGroup
from hamq.errors import RequestCodeNotSupported
from hamq.net.connection import Connection, response_pieces
from hamq.net.pool import ConnectionPool
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, unpack_body


class NamesrvRequests:
    def __init__(self) -> None:
        self._groups: dict[str, list[MemberGroup]] = {}  # broker name -> its hosted members

    @classmethod
    def of(cls, pool: ConnectionPool) -> NamesrvRequests:
        """The pool's dispatcher, installed on first use (a pool serving anything else is a
        wiring bug: its notifications would go nowhere)."""
        if pool.handler is None:
            pool.handler = cls()
        if not isinstance(pool.handler, cls):
            raise TypeError(f"connection pool already serves {type(pool.handler).__name__}")
        return pool.handler

    def add(self, members: MemberGroup) -> None:
        self._groups.setdefault(members.config.broker_name, []).append(members)

    def remove(self, members: MemberGroup) -> None:
        group = self._groups.get(members.config.broker_name, [])
        if members in group:
            group.remove(members)
        if not group:
            self._groups.pop(members.config.broker_name, None)

    def handle(self, conn: Connection, frame: Frame) -> list | None:
        if frame.code != RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE:
            raise RequestCodeNotSupported(
                f"broker does not take request code {frame.code} from a name server"
            )
        body = unpack_body(frame.body) or {}
        # a member removed meanwhile (or a group this process never hosted): nobody to tell
        for members in list(self._groups.get(str(body.get("broker_name", "")), ())):
            members.handle_notification(conn, frame)
        return None if frame.is_oneway else response_pieces(frame)

    def after_batch(self) -> None:
        pass
