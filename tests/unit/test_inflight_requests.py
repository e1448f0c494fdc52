"""A client keeps at most MAX_INFLIGHT_REQUESTS requests unanswered on one connection: the
rest wait, unwritten and without an error, and leave in order as answers make room. Real
sockets on 127.0.0.1, a real server whose handler holds every request until told."""

from __future__ import annotations

import array
import asyncio
import fcntl
import termios
import time

import pytest

from hamq.errors import ConnectionLost, RequestTimeout
from hamq.net.connection import Connection, connect, response_pieces
from hamq.net.server import Server
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame
from hamq.protocol.limits import MAX_INFLIGHT_REQUESTS
from helpers import free_port

BEYOND = 100  # requests sent past the limit


class HoldingHandler:
    """Answers nothing until ``answer_all``: every request it reads stays in flight."""

    def __init__(self) -> None:
        self.held: list[tuple[Connection, Frame]] = []
        self.seen: list[bytes] = []  # every request's body, in the order read

    def handle(self, conn: Connection, frame: Frame) -> None:
        self.held.append((conn, frame))
        self.seen.append(bytes(frame.body))
        return None

    def after_batch(self) -> None:
        pass

    def answer_all(self) -> None:
        held, self.held = self.held, []
        for conn, frame in held:
            conn.reply(response_pieces(frame))


def _unread_bytes(conn: Connection) -> int:
    """Bytes the kernel holds for this connection that it has not read yet."""
    out = array.array("i", [0])
    fcntl.ioctl(conn.transport.get_extra_info("socket").fileno(), termios.FIONREAD, out)
    return out[0]


def _all_read(client: Connection, server: Server) -> bool:
    """Everything the client has written so far has been read and handled by the server
    (on loopback a written byte is in the peer's receive queue once the write returns)."""
    if client._outbox or client.transport.get_write_buffer_size():
        return False
    return all(
        _unread_bytes(conn) == 0 and conn._decoder.pending_bytes == 0 for conn in server.connections
    )


async def _until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)


async def _holding_server() -> tuple[HoldingHandler, Server, str]:
    handler = HoldingHandler()
    server = Server(handler)
    address = f"127.0.0.1:{free_port()}"
    await server.start(address)
    return handler, server, address


def test_requests_past_the_limit_wait_unwritten_and_all_finish_in_order():
    async def scenario() -> None:
        handler, server, address = await _holding_server()
        client = await connect(address)
        try:
            total = MAX_INFLIGHT_REQUESTS + BEYOND
            futures = [
                client.request(RequestCode.SEND_MESSAGE, body=b"%d" % i, timeout_s=60)
                for i in range(total)
            ]
            await _until(
                lambda: len(handler.seen) >= MAX_INFLIGHT_REQUESTS and _all_read(client, server),
                30,
                "the first requests read",
            )
            assert len(handler.seen) == MAX_INFLIGHT_REQUESTS  # exactly the limit on the wire
            assert not any(f.done() for f in futures)  # the rest wait, no error
            handler.answer_all()
            await _until(
                lambda: len(handler.seen) == total and _all_read(client, server),
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
        handler, server, address = await _holding_server()
        client = await connect(address)
        try:
            held = [
                client.request(RequestCode.SEND_MESSAGE, timeout_s=60)
                for _ in range(MAX_INFLIGHT_REQUESTS)
            ]
            waiting = client.request(
                RequestCode.SEND_MESSAGE, timeout_s=0.2 if end == "timeout" else 60
            )
            await _until(
                lambda: len(handler.seen) == MAX_INFLIGHT_REQUESTS and _all_read(client, server),
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
