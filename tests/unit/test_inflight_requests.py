"""A client keeps at most MAX_INFLIGHT_REQUESTS requests unanswered on one connection: the
rest wait, unwritten and without an error, and leave in order as answers make room. Real
sockets on 127.0.0.1, a real server whose handler holds every request until told."""

from __future__ import annotations

import asyncio

import pytest

from hamq.errors import ConnectionLost, RequestTimeout
from hamq.net.connection import connect
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.limits import MAX_INFLIGHT_REQUESTS
from helpers import until
from holding_server import all_read, holding_server

BEYOND = 100  # requests sent past the limit


def test_requests_past_the_limit_wait_unwritten_and_all_finish_in_order():
    async def scenario() -> None:
        handler, server, address = await holding_server()
        client = await connect(address)
        try:
            total = MAX_INFLIGHT_REQUESTS + BEYOND
            futures = [
                client.request(RequestCode.SEND_MESSAGE, body=b"%d" % i, timeout_s=60)
                for i in range(total)
            ]
            await until(
                lambda: len(handler.seen) >= MAX_INFLIGHT_REQUESTS and all_read(client, server),
                30,
                "the first requests read",
            )
            assert len(handler.seen) == MAX_INFLIGHT_REQUESTS  # exactly the limit on the wire
            assert not any(f.done() for f in futures)  # the rest wait, no error
            handler.answer_all()
            await until(
                lambda: len(handler.seen) == total and all_read(client, server),
                30,
                "the waiting requests read",
            )
            assert all(f.done() for f in futures[:MAX_INFLIGHT_REQUESTS])
            assert not any(f.done() for f in futures[MAX_INFLIGHT_REQUESTS:])
            handler.answer_all()
            frames = await asyncio.wait_for(asyncio.gather(*futures), 30)
            assert {f.code for f in frames} == {ResponseCode.SUCCESS}
            assert handler.seen == [b"%d" % i for i in range(total)]  # in the order sent
        finally:
            client.close()
            await server.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("end", ["timeout", "connection lost"])
def test_a_waiting_request_fails_by_its_deadline_or_with_its_connection(end):
    async def scenario() -> None:
        handler, server, address = await holding_server()
        client = await connect(address)
        try:
            held = [
                client.request(RequestCode.SEND_MESSAGE, timeout_s=60)
                for _ in range(MAX_INFLIGHT_REQUESTS)
            ]
            waiting = client.request(
                RequestCode.SEND_MESSAGE, timeout_s=0.2 if end == "timeout" else 60
            )
            await until(
                lambda: len(handler.seen) == MAX_INFLIGHT_REQUESTS and all_read(client, server),
                30,
                "the first requests read",
            )
            if end == "timeout":
                with pytest.raises(RequestTimeout):
                    await asyncio.wait_for(waiting, 10)
                assert len(handler.seen) == MAX_INFLIGHT_REQUESTS  # never written
            else:
                client.close()
                for future in [*held, waiting]:
                    with pytest.raises(ConnectionLost):
                        await asyncio.wait_for(future, 10)
        finally:
            client.close()
            await server.close()

    asyncio.run(scenario())
