"""Raft traffic between peers: a Ready's messages as one-way frames on pooled connections.

The DLedger commit log (DLEDGER_MESSAGE) and the controller peers (CONTROLLER_RAFT_MESSAGE)
move Raft messages the same way and differ only in the request code. Sending never waits:
a peer without an open connection is connected to in the background and the messages to it
are dropped meanwhile, as Raft resends whatever was lost.
"""

from __future__ import annotations

from collections.abc import Mapping

from hamq.broker.dledger.wire import encode_message
from hamq.errors import HamqError
from hamq.net.pool import ConnectionPool
from hamq.net.tasks import spawn
from hamq.raft import Message


class RaftTransport:
    """Sends to ``peers`` ({peer id: address}) with request ``code``."""

    def __init__(self, peers: Mapping[int, str], code: int) -> None:
        self.peers = peers
        self.code = code
        self.pool = ConnectionPool()

    def send(self, messages: list[Message]) -> None:
        """One write per peer for all of a Ready's messages to it."""
        by_peer: dict[int, list[bytes | list]] = {}
        for msg in messages:
            by_peer.setdefault(msg.to_id, []).append(encode_message(msg))
        for peer, bodies in by_peer.items():
            addr = self.peers[peer]
            conn = self.pool.get_ready(addr)
            if conn is not None:
                conn.oneway_many(self.code, bodies)
            else:
                spawn(self._connect(addr))

    async def _connect(self, addr: str) -> None:
        try:
            await self.pool.get(addr)
        except HamqError:
            pass  # the next Ready to this peer tries again

    async def close(self) -> None:
        await self.pool.close()
