"""A publisher held back by flow control (an alarm, no credit) cannot deliver its
heartbeat: the broker must not forget its producer channel meanwhile, or transaction
check-backs find no producer of its group until the hold ends. Real sockets on
127.0.0.1; the expiry scan gets its clock as an argument."""

from __future__ import annotations

import asyncio

from hamq.broker.clients import CHANNEL_EXPIRED_TIMEOUT_MS, ClientManager, Heartbeat
from hamq.broker.flow import PublisherFlow
from hamq.net.connection import Connection, connect, response_pieces
from hamq.net.server import Server
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame
from helpers import free_port

GROUP = "held-producers"


class Publishers:
    """A broker's front as the expiry sees it: a SEND_MESSAGE makes the connection a
    publisher (flow control may hold it back), a HEART_BEAT registers its producer group
    at the clock the test sets."""

    def __init__(self, flow: PublisherFlow) -> None:
        self.flow = flow
        self.clients = ClientManager()
        self.now_ms = 0

    def handle(self, conn: Connection, frame: Frame) -> list | None:
        if frame.code == RequestCode.SEND_MESSAGE and not conn.publishes:
            self.flow.publisher(conn)
        elif frame.code == RequestCode.HEART_BEAT:
            self.clients.heart_beat(conn, Heartbeat("p-1", [GROUP], []), self.now_ms)
        return response_pieces(frame)

    def after_batch(self) -> None:
        pass


def test_a_held_back_publisher_keeps_its_producer_channel_past_the_expiry():
    async def scenario() -> None:
        flow = PublisherFlow(64 << 20)
        front = Publishers(flow)
        server = Server(front)
        server.on_connection_closed.append(flow.closed)
        address = f"127.0.0.1:{free_port()}"
        await server.start(address)
        client = await connect(address)
        try:
            await client.request(RequestCode.HEART_BEAT, timeout_s=10)
            await client.request(RequestCode.SEND_MESSAGE, body=b"m", timeout_s=10)
            (channel,) = front.clients.producer_channels(GROUP)
            flow.block(("disk", "free space below the limit"))  # holds every publisher
            held_for = 3 * CHANNEL_EXPIRED_TIMEOUT_MS  # its heartbeats wait unread meanwhile
            for now_ms in range(0, held_for + 1, CHANNEL_EXPIRED_TIMEOUT_MS // 4):
                front.clients.scan_expired(now_ms)
            assert front.clients.producer_channels(GROUP) == [channel]
            flow.block(None)
            # released: a full expiry period from the end of the hold to heartbeat again
            front.clients.scan_expired(held_for + CHANNEL_EXPIRED_TIMEOUT_MS)
            assert front.clients.producer_channels(GROUP) == [channel]
            # a publisher that stays silent once released is forgotten as before
            front.clients.scan_expired(held_for + CHANNEL_EXPIRED_TIMEOUT_MS + 1)
            assert front.clients.producer_channels(GROUP) == []
        finally:
            client.close()
            await server.close()

    asyncio.run(scenario())
