"""A real server on 127.0.0.1 whose handler holds every request until told to answer, and
waits on what a client has written: for tests of the requests a client keeps in flight."""

from __future__ import annotations

import array
import fcntl
import termios

from hamq.net.connection import Connection, response_pieces
from hamq.net.server import Server
from hamq.protocol.frame import Frame
from helpers import free_port


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


def unread_bytes(conn: Connection) -> int:
    """Bytes the kernel holds for this connection that it has not read yet."""
    out = array.array("i", [0])
    fcntl.ioctl(conn.transport.get_extra_info("socket").fileno(), termios.FIONREAD, out)
    return out[0]


def all_read(client: Connection, server: Server) -> bool:
    """Everything the client has written so far has been read and handled by the server
    (on loopback a written byte is in the peer's receive queue once the write returns)."""
    if client._outbox or client.transport.get_write_buffer_size():
        return False
    return all(
        unread_bytes(conn) == 0 and conn._decoder.pending_bytes == 0 for conn in server.connections
    )


async def holding_server() -> tuple[HoldingHandler, Server, str]:
    handler = HoldingHandler()
    server = Server(handler)
    address = f"127.0.0.1:{free_port()}"
    await server.start(address)
    return handler, server, address
