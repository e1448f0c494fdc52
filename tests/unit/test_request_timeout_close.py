"""A request that times out on a connection that has read nothing since it was written
closes the connection (RocketMQ's clientCloseSocketIfTimeout): a blackholed socket would
otherwise carry the next requests into TCP's retransmission backoff. Its other requests
fail at once as lost; a peer that is slow but still answering keeps its connection."""

from __future__ import annotations

import asyncio
import time

import pytest

from hamq.errors import ConnectionLost, RequestTimeout
from hamq.net.connection import connect, response_pieces
from hamq.protocol.codes import RequestCode
from helpers import until
from holding_server import holding_server


def test_a_timeout_with_nothing_read_closes_and_fails_the_rest_at_once():
    async def scenario() -> None:
        _, server, address = await holding_server()  # never answers: a silent peer
        client = await connect(address)
        try:
            short = client.request(RequestCode.SEND_MESSAGE, timeout_s=0.2)
            long = client.request(RequestCode.SEND_MESSAGE, timeout_s=60)
            with pytest.raises(RequestTimeout):
                await asyncio.wait_for(short, 10)
            started = time.monotonic()
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(long, 10)
            assert time.monotonic() - started < 1.0
            assert client.is_closed
        finally:
            client.close()
            await server.close()

    asyncio.run(scenario())


def test_a_slow_peer_still_answering_keeps_its_connection():
    async def scenario() -> None:
        handler, server, address = await holding_server()
        client = await connect(address)
        try:
            slow = client.request(RequestCode.SEND_MESSAGE, body=b"slow", timeout_s=0.3)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:  # other answers keep arriving meanwhile
                quick = client.request(RequestCode.SEND_MESSAGE, timeout_s=10)
                await until(lambda: len(handler.held) == 2, 10, "the quick request read")
                conn, frame = handler.held.pop()  # the slow one stays held
                conn.reply(response_pieces(frame))
                await asyncio.wait_for(quick, 10)
            with pytest.raises(RequestTimeout):
                await asyncio.wait_for(slow, 10)
            assert not client.is_closed
        finally:
            client.close()
            await server.close()

    asyncio.run(scenario())
