"""One request-multiplexing connection class used by clients and servers.

Frames are handled synchronously as they are read (``buffer_updated``): a handler returns the response
pieces at once, or ``None`` and answers later through ``reply``. Responses produced while
handling one read are written together after the handler's ``after_batch`` hook (the broker
appends every send of that read in one write there), so a pipelined client gets group
writes for free and no coroutine or future is created per request on the server.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

from hamq.errors import BadFrame, ConnectionLost, HamqError, RequestTimeout
from hamq.protocol.codes import Flag, ResponseCode
from hamq.protocol.frame import Frame, FrameDecoder, encode_frame

log = logging.getLogger(__name__)

ResponseCallback = Callable[[Frame | None, HamqError | None], None]
# Pending requests are swept for timeouts at this period instead of one timer per request.
TIMEOUT_SWEEP_INTERVAL_S = 0.05


class RequestHandler(Protocol):
    def handle(self, conn: "Connection", frame: Frame) -> list | None:
        """Return response pieces now, or None when answering later (or never, if oneway)."""

    def after_batch(self) -> None:
        """Called once after all frames of one read were handled, before replies go out."""


def response_pieces(request: Frame, code: int = ResponseCode.SUCCESS, ext: dict | None = None,
                    remark: str = "", body: bytes | memoryview = b"") -> list:
    return encode_frame(code, request.opaque, Flag.RESPONSE, ext, remark, body)


def error_pieces(request: Frame, err: HamqError) -> list:
    return response_pieces(request, err.code, remark=err.message)


class Connection(asyncio.BufferedProtocol):
    def __init__(self, handler: RequestHandler | None = None,
                 on_close: Callable[["Connection"], None] | None = None) -> None:
        self.handler = handler
        self.on_close = on_close
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.closed = asyncio.get_running_loop().create_future()
        self._decoder = FrameDecoder()
        self._next_opaque = 1
        # opaque -> (deadline, callback); dicts keep insertion order, so the oldest first.
        self._pending: dict[int, tuple[float, ResponseCallback]] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._paused = False
        self._drain_waiters: list[asyncio.Future] = []
        # Requests written in one event-loop turn leave in one system call.
        self._outbox: list = []

    # -- asyncio.BufferedProtocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self._decoder.buffer_updated(nbytes)
        except BadFrame as err:
            self._reject(err)
            return
        out: list = []
        handler = self.handler
        pending = self._pending
        for frame in frames:
            if frame.flags & Flag.RESPONSE:
                entry = pending.pop(frame.opaque, None)
                if entry is not None:
                    entry[1](frame, None)
            elif handler is None:
                out += error_pieces(frame, HamqError("this endpoint serves no requests"))
            else:
                try:
                    pieces = handler.handle(self, frame)
                except HamqError as err:
                    pieces = None if frame.flags & Flag.ONEWAY else error_pieces(frame, err)
                except Exception as exc:  # a bug must not take the connection down
                    log.exception("handler failed on %r", frame)
                    pieces = error_pieces(frame, HamqError(f"internal error: {exc!r}"))
                if pieces:
                    out += pieces
        if handler is not None and frames:
            try:
                handler.after_batch()
            except HamqError as err:
                # The appends of this read were undone; answering them would lie, so the
                # client sees a lost connection and retries.
                log.error("closing connection from %s: %s", self.peer, err.message)
                self.transport.close()
                return
        if out and self.transport is not None:
            self.transport.writelines(out)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        pending, self._pending = self._pending, {}
        err = ConnectionLost(f"connection to {self.peer} lost" + (f": {exc}" if exc else ""))
        for _, callback in pending.values():
            callback(None, err)
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        if not self.closed.done():
            self.closed.set_result(None)
        if self.on_close is not None:
            self.on_close(self)

    def pause_writing(self) -> None:
        # A peer that does not read its responses stops being read from: bounded memory.
        self._paused = True
        if self.handler is not None and self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self.handler is not None and self.transport is not None:
            self.transport.resume_reading()
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- sending ----------------------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def reply(self, pieces: list) -> None:
        if not self.is_closed:
            self.transport.writelines(pieces)

    async def drain(self) -> None:
        if self._paused and not self.is_closed:
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def request_cb(self, code: int, callback: ResponseCallback, ext: dict[str, Any] | None = None,
                   body: bytes | memoryview = b"", timeout_s: float = 3.0) -> None:
        """Send a request; ``callback(frame, error)`` runs exactly once."""
        if self.is_closed:
            callback(None, ConnectionLost(f"connection to {self.peer} is closed"))
            return
        opaque = self._next_opaque
        self._next_opaque = opaque + 1 if opaque < 0x7FFFFFFF else 1
        self._pending[opaque] = (time.monotonic() + timeout_s, callback)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(
                TIMEOUT_SWEEP_INTERVAL_S, self._sweep)
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush_outbox)
        self._outbox += encode_frame(code, opaque, 0, ext, "", body)

    def _flush_outbox(self) -> None:
        outbox, self._outbox = self._outbox, []
        if not self.is_closed:
            self.transport.writelines(outbox)

    def request(self, code: int, ext: dict[str, Any] | None = None, body: bytes | memoryview = b"",
                timeout_s: float = 3.0) -> asyncio.Future[Frame]:
        future = asyncio.get_running_loop().create_future()

        def done(frame: Frame | None, err: HamqError | None) -> None:
            if not future.done():
                if err is not None:
                    future.set_exception(err)
                else:
                    future.set_result(frame)

        self.request_cb(code, done, ext, body, timeout_s)
        return future

    def oneway(self, code: int, ext: dict[str, Any] | None = None, body: bytes = b"") -> None:
        if not self.is_closed:
            self.transport.writelines(encode_frame(code, 0, Flag.ONEWAY, ext, "", body))

    def oneway_many(self, code: int, bodies: list[bytes | list]) -> None:
        """Several one-way frames in one write (a Raft member's messages to one peer)."""
        if not self.is_closed:
            pieces: list = []
            for body in bodies:
                pieces += encode_frame(code, 0, Flag.ONEWAY, None, "", body)
            self.transport.writelines(pieces)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- internals --------------------------------------------------------------------
    def _sweep(self) -> None:
        self._sweeper = None
        now = time.monotonic()
        expired = [op for op, (deadline, _) in self._pending.items() if deadline <= now]
        for opaque in expired:
            _, callback = self._pending.pop(opaque)
            callback(None, RequestTimeout(f"no response from {self.peer} in time"))
        if self._pending and not self.is_closed:
            self._sweeper = asyncio.get_running_loop().call_later(
                TIMEOUT_SWEEP_INTERVAL_S, self._sweep)

    def _reject(self, err: BadFrame) -> None:
        log.warning("closing connection from %s: %s", self.peer, err.message)
        if self.transport is not None:
            opaque = self._decoder.last_opaque or 0
            self.transport.writelines(encode_frame(err.code, opaque, Flag.RESPONSE, None,
                                                   err.message))
            self.transport.close()


async def connect(address: str, handler: RequestHandler | None = None,
                  timeout_s: float = 3.0) -> Connection:
    host, port = split_address(address)
    loop = asyncio.get_running_loop()
    try:
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: Connection(handler), host, port), timeout_s)
    except (OSError, asyncio.TimeoutError) as exc:
        raise ConnectionLost(f"cannot connect to {address}: {exc or 'timed out'}") from None
    return conn


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address must be HOST:PORT, got {address!r}")
    return host, int(port)
