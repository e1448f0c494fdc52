"""One request-multiplexing connection class used by clients and servers.

Frames are handled synchronously as they are read (``buffer_updated``): a handler returns the
response pieces at once, or ``None`` and answers later through ``reply``. Responses produced while
handling one read are written together after the handler's ``after_batch`` hook (the broker
appends every send of that read in one write there), so a pipelined client gets group
writes for free and no coroutine or future is created per request on the server.

A server connection bounds what its peer has not read yet (``max_pending_bytes``): once
the answers waiting in the transport reach it, the rest of a read's requests wait and the
socket is not read until the peer catches up, so a client that never reads costs at most
the bound plus one answer (held requests answered later wait the same way, see
``reply_when_drained``). What all connections of a server hold together is bounded too
(``net/held.py``).

A client keeps at most ``MAX_INFLIGHT_REQUESTS`` requests unanswered on one connection; more
wait here, unwritten and in order, until answers (or timeouts) make room — the caller is not
told, as RocketMQ's async semaphore would, only its request leaves later. The hot path pays
one length check for it.

A server may also hold a connection back (``hold_back``): flow control stops reading a
publisher while its sends waiting for acks use up the broker's credit, or while a resource
alarm is on (``broker/flow.py``). Nothing is refused: its requests wait in the socket.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from hamq.clock import monotonic_s
from hamq.errors import BadFrame, ConnectionLost, HamqError, RequestTimeout
from hamq.net.counts import COUNTS
from hamq.net.held import FAIR_SHARE_BYTES, HeldBytes
from hamq.protocol.codes import Flag, ResponseCode
from hamq.protocol.frame import Frame, FrameDecoder, encode_frame
from hamq.protocol.limits import MAX_INFLIGHT_REQUESTS

log = logging.getLogger(__name__)

ResponseCallback = Callable[[Frame | None, HamqError | None], None]
# A request not written yet: (deadline, code, callback, ext, body).
WaitingRequest = tuple[float, int, ResponseCallback, dict[str, Any] | None, bytes | memoryview]
# Pending requests are swept for timeouts at this period instead of one timer per request.
TIMEOUT_SWEEP_INTERVAL_S = 0.05


class RequestHandler(Protocol):
    def handle(self, conn: Connection, frame: Frame) -> list | None:
        """Return response pieces now, or None when answering later (or never, if oneway)."""

    def after_batch(self) -> None:
        """Called once after all frames of one read were handled, before replies go out."""


def response_pieces(
    request: Frame,
    code: int = ResponseCode.SUCCESS,
    ext: dict | None = None,
    remark: str = "",
    body: bytes | memoryview = b"",
) -> list:
    return encode_frame(code, request.opaque, Flag.RESPONSE, ext, remark, body)


def error_pieces(request: Frame, err: HamqError) -> list:
    return response_pieces(request, err.code, remark=err.message)


class Connection(asyncio.BufferedProtocol):
    def __init__(
        self,
        handler: RequestHandler | None = None,
        on_close: Callable[[Connection], None] | None = None,
        on_open: Callable[[Connection], bool] | None = None,
        max_pending_bytes: int | None = None,
        held_bytes: HeldBytes | None = None,
    ) -> None:
        self.handler = handler
        self.on_close = on_close
        self.on_open = on_open  # a server's admission check; False: refused and closed
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.peer_host = ""
        self.closed = asyncio.get_running_loop().create_future()
        self._decoder = FrameDecoder()
        self._next_opaque = 1
        # opaque -> (deadline, callback, reads when written); dicts keep insertion order, so
        # the oldest first.
        self._pending: dict[int, tuple[float, ResponseCallback, int]] = {}
        # Requests beyond MAX_INFLIGHT_REQUESTS, oldest first. Room in _pending goes to them
        # before anything else runs, so while one waits _pending is full (and a new request
        # queues behind it).
        self._waiting: deque[WaitingRequest] = deque()
        # Callbacks of waiting requests whose caller gave up (cancelled its future): they are
        # never written, and leave _waiting when reached or at the next sweep.
        self._abandoned: set[ResponseCallback] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._paused = False
        self._drain_waiters: list[asyncio.Future] = []
        # Requests written in one event-loop turn leave in one system call.
        self._outbox: list = []
        # Back-pressure on a peer that does not read (server side; None: unbounded).
        self._max_pending_bytes = max_pending_bytes
        self._deferred: list[Frame] = []  # requests read but not handled yet
        self._late: list[Callable[[], list]] = []  # held answers waiting for the peer
        self._reading_paused = False
        self._drain_scheduled = False
        self._held_back = False  # flow control (server side): not read until released
        self.publishes = False  # it sent SEND_MESSAGE (flow control holds publishers only)
        # The server's total of unfinished frames and unread answers (None: not counted);
        # _held is this connection's part of it, _starved: not read until it falls.
        self._held_bytes = held_bytes
        self._held = 0
        self._starved = False
        # Activity seen by the server's timeout sweep (see timed_out).
        self.reads = 0
        self.frames_in = 0
        self._activity: tuple[int, int] = (-1, -1)
        self._active_at = 0.0
        self._frames_mark = -1
        self._frame_started_at = 0.0

    # -- asyncio.BufferedProtocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.peer_host = peer[0] if peer else "?"
        if self.on_open is not None and not self.on_open(self):
            return
        self._active_at = self._frame_started_at = monotonic_s()
        if self._max_pending_bytes is not None:
            # Writing pauses (and resume_writing serves what waited) before the bound is
            # reached, so a connection over its bound is always one the transport paused.
            low, high = transport.get_write_buffer_limits()
            high = min(high, self._max_pending_bytes // 2)
            transport.set_write_buffer_limits(high=high, low=min(low, high // 4))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.reads += 1
        try:
            frames = self._decoder.buffer_updated(nbytes)
        except BadFrame as err:
            self._reject(err)
            return
        if frames:
            self.frames_in += len(frames)
            self._serve(frames)
        if self._held_bytes is not None:
            self._account()
            if (
                self._held_bytes.pressure
                and self._decoder.pending_bytes > FAIR_SHARE_BYTES
                and not self._starved
            ):
                # The server holds too much: this unfinished frame waits for room.
                self._starved = True
                self._held_bytes.waiting.add(self)
                self._update_reading()

    def _serve(self, frames: list[Frame]) -> None:
        out: list = []
        handler = self.handler
        pending = self._pending
        budget = self._budget()
        for frame in frames:
            if frame.flags & Flag.RESPONSE:
                entry = pending.pop(frame.opaque, None)
                if entry is not None:
                    if self._waiting:
                        self._write_waiting()
                    entry[1](frame, None)
            elif handler is None:
                out += error_pieces(frame, HamqError("this endpoint serves no requests"))
            elif budget is not None and budget <= 0:
                # The peer has not read what it was sent: the rest waits for it to catch up.
                self._deferred = frames[frames.index(frame) :]
                self._update_reading()
                break
            else:
                try:
                    pieces = handler.handle(self, frame)
                except HamqError as err:
                    pieces = None if frame.flags & Flag.ONEWAY else error_pieces(frame, err)
                except Exception as exc:  # a bug must not take the connection down
                    COUNTS.internal_errors += 1
                    log.exception("handler failed on %r", frame)
                    pieces = error_pieces(frame, HamqError(f"internal error: {exc!r}"))
                if pieces:
                    out += pieces
                    if budget is not None:  # the body (or a bodiless answer's header)
                        budget -= len(pieces[-1])
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
        if self._deferred:
            self._schedule_drained()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        pending, self._pending = self._pending, {}
        waiting, self._waiting = self._waiting, deque()
        self._abandoned.clear()
        err = ConnectionLost(f"connection to {self.peer} lost" + (f": {exc}" if exc else ""))
        for _, callback, _ in pending.values():
            callback(None, err)
        for _, _, callback, _, _ in waiting:
            callback(None, err)
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        if not self.closed.done():
            self.closed.set_result(None)
        if self._held_bytes is not None:
            self._held_bytes.waiting.discard(self)
            self._held_bytes.change(-self._held)
            self._held = 0
        if self.on_close is not None:
            self.on_close(self)

    def pause_writing(self) -> None:
        # A peer that does not read its responses stops being read from: bounded memory.
        self._paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._paused = False
        self._account()
        if self._deferred or self._late:
            self._schedule_drained()
        else:
            self._update_reading()
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- back-pressure (server side) ------------------------------------------------------
    def _budget(self) -> int | None:
        """Bytes of answers that may still be queued before the peer must read some (its
        fair share only, while the server as a whole holds too much)."""
        if self._max_pending_bytes is None or self.transport is None:
            return None
        bound = self._max_pending_bytes
        if self._held_bytes is not None and self._held_bytes.pressure:
            bound = min(bound, FAIR_SHARE_BYTES)
        return bound - self.transport.get_write_buffer_size()

    def _account(self) -> None:
        """Bring this connection's part of the server's held bytes up to date (after each
        read and write, and at the server's sweep: a write buffer drains unseen)."""
        if self._held_bytes is None or self.transport is None:
            return
        held = self._decoder.pending_bytes + self.transport.get_write_buffer_size()
        if held != self._held:
            delta, self._held = held - self._held, held
            self._held_bytes.change(delta)

    def unstarve(self) -> None:
        self._starved = False
        self._update_reading()

    def hold_back(self, held: bool) -> None:
        """Stop reading this connection (``held``), or read it again: flow control."""
        self._held_back = held
        self._update_reading()

    @property
    def held_back(self) -> bool:
        """Flow control holds it back: nothing it sends (a heartbeat too) is read."""
        return self._held_back

    def _update_reading(self) -> None:
        """Read the socket unless the peer is behind on its answers or flow control holds
        it back (server side only)."""
        if self.handler is None or self.is_closed:
            return
        paused = (
            self._paused
            or self._starved
            or self._held_back
            or bool(self._deferred)
            or bool(self._late)
        )
        if paused != self._reading_paused:
            self._reading_paused = paused
            if paused:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def _schedule_drained(self) -> None:
        if not self._drain_scheduled and not self.is_closed:
            self._drain_scheduled = True
            asyncio.get_running_loop().call_soon(self._drained)

    def _drained(self) -> None:
        """The peer read some answers: serve what waited for it, oldest first."""
        self._drain_scheduled = False
        if self._paused or self.is_closed:
            return  # resume_writing comes back here
        while self._late and self._budget() > 0:
            self.reply(self._late.pop(0)())
        if self._deferred and not self._late and self._budget() > 0:
            frames, self._deferred = self._deferred, []
            self._serve(frames)  # may defer again, and schedules the next round then
        self._account()
        self._update_reading()
        if (self._late or self._deferred) and not self._paused:
            self._schedule_drained()

    def reply_when_drained(self, make_pieces: Callable[[], list]) -> None:
        """Answer a held request (a long-polling pull) now, or — when its peer has not read
        ``max_pending_bytes`` of earlier answers — once it has: ``make_pieces`` runs then,
        so the answer is not built while it would only wait in memory."""
        if self.is_closed:
            return
        if self._late or (self._max_pending_bytes is not None and self._budget() <= 0):
            self._late.append(make_pieces)
            self._update_reading()
            if not self._paused:
                self._schedule_drained()
        else:
            self.reply(make_pieces())

    def timed_out(self, now: float, idle_s: float, frame_s: float) -> str:
        """Why the server should close this connection now, "" if it should not: nothing
        read or written for ``idle_s``, or a frame begun ``frame_s`` ago still unfinished
        while the connection was being read (the server's sweep calls this)."""
        activity = (self.reads, self.transport.get_write_buffer_size() if self.transport else 0)
        if activity != self._activity or self._held_back:  # held back: we do not read it
            self._activity, self._active_at = activity, now
        elif now - self._active_at > idle_s:
            return f"idle for {idle_s:g} s"
        self._account()
        if not self._decoder.pending_bytes or (self._reading_paused and not self._starved):
            self._frames_mark = -1
        elif self._frames_mark != self.frames_in:
            self._frames_mark, self._frame_started_at = self.frames_in, now
        elif now - self._frame_started_at > frame_s:
            return f"a frame begun {frame_s:g} s ago is still unfinished"
        return ""

    # -- sending ----------------------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def reply(self, pieces: list) -> None:
        if not self.is_closed:
            self.transport.writelines(pieces)
            self._account()

    async def drain(self) -> None:
        if self._paused and not self.is_closed:
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def request_cb(
        self,
        code: int,
        callback: ResponseCallback,
        ext: dict[str, Any] | None = None,
        body: bytes | memoryview = b"",
        timeout_s: float = 3.0,
    ) -> None:
        """Send a request; ``callback(frame, error)`` runs exactly once. ``timeout_s`` counts
        from now, time spent waiting for room among the requests in flight included."""
        if self.is_closed:
            callback(None, ConnectionLost(f"connection to {self.peer} is closed"))
            return
        deadline = monotonic_s() + timeout_s
        if len(self._pending) >= MAX_INFLIGHT_REQUESTS:  # always so while any request waits
            self._waiting.append((deadline, code, callback, ext, body))
        else:
            self._write_request(deadline, code, callback, ext, body)

    def _write_request(
        self,
        deadline: float,
        code: int,
        callback: ResponseCallback,
        ext: dict[str, Any] | None,
        body: bytes | memoryview,
    ) -> None:
        opaque = self._next_opaque
        self._next_opaque = opaque + 1 if opaque < 0x7FFFFFFF else 1
        self._pending[opaque] = (deadline, callback, self.reads)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(
                TIMEOUT_SWEEP_INTERVAL_S, self._sweep
            )
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush_outbox)
        self._outbox += encode_frame(code, opaque, 0, ext, "", body)

    def _flush_outbox(self) -> None:
        outbox, self._outbox = self._outbox, []
        if not self.is_closed:
            self.transport.writelines(outbox)

    def request(
        self,
        code: int,
        ext: dict[str, Any] | None = None,
        body: bytes | memoryview = b"",
        timeout_s: float = 3.0,
    ) -> asyncio.Future[Frame]:
        future = asyncio.get_running_loop().create_future()

        def done(frame: Frame | None, err: HamqError | None) -> None:
            if not future.done():
                if err is not None:
                    future.set_exception(err)
                else:
                    future.set_result(frame)

        self.request_cb(code, done, ext, body, timeout_s)
        if self._waiting and self._waiting[-1][2] is done:
            # A caller that gives up on a request not written yet (a cancel, wait_for running
            # out) may send it again: written as well, it would go out twice.
            def abandon(future: asyncio.Future) -> None:
                if future.cancelled():
                    self._abandoned.add(done)

            future.add_done_callback(abandon)
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
    def _write_waiting(self) -> None:
        """Write waiting requests, oldest first, while fewer than MAX_INFLIGHT_REQUESTS are
        unanswered. One past its deadline times out unwritten (room can come before the
        sweep does): its caller is told it timed out, so a retry must not find it sent."""
        waiting, pending, abandoned = self._waiting, self._pending, self._abandoned
        now = monotonic_s()
        late: list[ResponseCallback] = []
        while waiting and len(pending) < MAX_INFLIGHT_REQUESTS:
            request = waiting.popleft()
            callback = request[2]
            if callback in abandoned:
                abandoned.discard(callback)
            elif request[0] <= now:
                late.append(callback)
            else:
                self._write_request(*request)
        for callback in late:
            callback(None, RequestTimeout(f"no response from {self.peer} in time"))

    def _sweep(self) -> None:
        self._sweeper = None
        now = monotonic_s()
        expired = [op for op, (deadline, _, _) in self._pending.items() if deadline <= now]
        unheard = False  # nothing read since one of them was written
        callbacks = []
        for opaque in expired:
            _, callback, reads = self._pending.pop(opaque)
            callbacks.append(callback)
            unheard = unheard or reads == self.reads
        if self._waiting:
            # Waiting requests time out too, without ever being written.
            abandoned = self._abandoned
            callbacks += [w[2] for w in self._waiting if w[0] <= now and w[2] not in abandoned]
            self._waiting = deque(w for w in self._waiting if w[0] > now and w[2] not in abandoned)
            self._write_waiting()
        self._abandoned.clear()  # none of them is waiting any more
        if unheard and not self.is_closed:
            # Nothing arrived since a request that timed out was written: the peer or the
            # path is gone (a partition blackholes the socket, and TCP would only notice
            # after its retransmission backoff). RocketMQ's clientCloseSocketIfTimeout:
            # close now (before the callbacks, so a retry reconnects), the rest fail as
            # lost at once. A slow but live peer keeps its connection: frames still arrive.
            log.warning("closing connection to %s: a request timed out, nothing read", self.peer)
            self.transport.abort()
        for callback in callbacks:
            callback(None, RequestTimeout(f"no response from {self.peer} in time"))
        if self._pending and not self.is_closed:
            self._sweeper = asyncio.get_running_loop().call_later(
                TIMEOUT_SWEEP_INTERVAL_S, self._sweep
            )

    def _reject(self, err: BadFrame) -> None:
        log.warning("closing connection from %s: %s", self.peer, err.message)
        if self.transport is not None:
            opaque = self._decoder.last_opaque or 0
            self.transport.writelines(
                encode_frame(err.code, opaque, Flag.RESPONSE, None, err.message)
            )
            self.transport.close()


async def connect(
    address: str, handler: RequestHandler | None = None, timeout_s: float = 3.0
) -> Connection:
    host, port = split_address(address)
    loop = asyncio.get_running_loop()
    try:
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: Connection(handler), host, port), timeout_s
        )
    except (TimeoutError, OSError) as exc:
        raise ConnectionLost(f"cannot connect to {address}: {exc or 'timed out'}") from None
    return conn


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address must be HOST:PORT, got {address!r}")
    return host, int(port)
