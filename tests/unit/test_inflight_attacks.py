"""Requests waiting for room among the MAX_INFLIGHT_REQUESTS in flight, attacked: one whose
deadline passed, or whose caller gave up (cancelled, or an ``asyncio.wait_for`` around it
ran out), must never be written afterwards — the caller was told it failed, so a retry
would send it twice. Real sockets on 127.0.0.1, a real server holding every request."""

from __future__ import annotations

import asyncio
import time

import pytest

from hamq.errors import RequestTimeout
from hamq.net.connection import connect
from hamq.protocol.codes import RequestCode
from hamq.protocol.limits import MAX_INFLIGHT_REQUESTS
from helpers import until
from holding_server import all_read, holding_server


def _run(scenario) -> None:
    # The stock selector loop, whatever policy another test installed: it handles what a
    # poll read before the timers that are due, so an answer read after a waiting
    # request's deadline reaches the connection before its timeout sweep does (the race a
    # busy loop hits by chance).
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        runner.run(scenario())


async def _fill(client, handler, server) -> list[asyncio.Future]:
    held = [
        client.request(RequestCode.SEND_MESSAGE, body=b"held", timeout_s=60)
        for _ in range(MAX_INFLIGHT_REQUESTS)
    ]
    await until(
        lambda: len(handler.seen) == MAX_INFLIGHT_REQUESTS and all_read(client, server),
        30,
        "the first requests read",
    )
    return held


def test_a_waiting_request_past_its_deadline_is_not_written_when_room_comes():
    async def scenario() -> None:
        handler, server, address = await holding_server()
        client = await connect(address)
        try:
            held = await _fill(client, handler, server)
            waiting = client.request(RequestCode.SEND_MESSAGE, body=b"late", timeout_s=0.05)
            time.sleep(0.2)  # noqa: ASYNC251 (the loop busy past the deadline is the point)
            handler.answer_all()  # room comes in the same turn as the timeout sweep
            await asyncio.wait_for(asyncio.gather(*held), 30)
            with pytest.raises(RequestTimeout):
                await asyncio.wait_for(waiting, 10)
            await until(lambda: all_read(client, server), 30, "everything written read")
            assert b"late" not in handler.seen  # told it timed out: it must not go out
        finally:
            client.close()
            await server.close()

    _run(scenario)


@pytest.mark.parametrize("give_up", ["cancel", "wait_for"])
def test_a_waiting_request_its_caller_gave_up_on_is_not_written(give_up):
    async def scenario() -> None:
        handler, server, address = await holding_server()
        client = await connect(address)
        try:
            held = await _fill(client, handler, server)
            waiting = client.request(RequestCode.SEND_MESSAGE, body=b"gone", timeout_s=60)
            if give_up == "cancel":
                waiting.cancel()
            else:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(waiting, 0.1)
            after = client.request(RequestCode.SEND_MESSAGE, body=b"after", timeout_s=60)
            handler.answer_all()
            await asyncio.wait_for(asyncio.gather(*held), 30)
            await until(lambda: b"after" in handler.seen, 30, "the next request read")
            assert b"gone" not in handler.seen
            assert len(client._pending) == 1  # no slot kept for the abandoned request
            handler.answer_all()
            await asyncio.wait_for(after, 10)
        finally:
            client.close()
            await server.close()

    _run(scenario)
