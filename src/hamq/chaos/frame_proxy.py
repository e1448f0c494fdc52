"""A TCP forwarder that loses, delays and duplicates whole hamq frames.

tc netem cannot be used here (and would drop TCP segments, which TCP retransmits: the
processes would only see delay). What a lossy network does to a request–response protocol
is lose a *request* or a *response*: the sender times out not knowing whether it was
applied. So the proxy parses the wire framing (``u32 length | rest``, see
``hamq.protocol.frame``) and decides per whole frame and per direction: drop it, hold it
``delay_ms``, or write it twice (a retransmitted request). Frames of one connection keep
their order, as TCP's would; a frame is never cut or corrupted.

"up" is what the connecting side sends (requests of a client, a slave's HA frames), "down"
what the target answers. The proxy runs its own asyncio loop on a thread, so the runner's
synchronous code (and tests) drive it with plain calls: ``set_faults``, ``clear``, ``close``.
Decisions come from a ``random.Random`` seeded by ``set_faults``: a run that found a bug is
replayed by its seed (up to how connections interleave).
"""

from __future__ import annotations

import asyncio
import random
import struct
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from hamq.net.connection import split_address
from hamq.protocol.limits import MAX_FRAME_BYTES

DIRECTIONS = ("up", "down")
_LENGTH = struct.Struct(">I")  # the frame's first field: bytes after it
_QUEUE_FRAMES = 256  # frames held per direction (delayed ones) before reading pauses
_START_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Faults:
    """What happens to frames in one direction; each frame is decided on its own."""

    loss: float = 0.0  # fraction dropped
    delay_ms: int = 0  # how long each frame is held
    duplicate: float = 0.0  # fraction written twice

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a fraction in 0..1, got {value!r}")
        if not 0 <= self.delay_ms <= 60_000:
            raise ValueError(f"delay_ms must be in 0..60000, got {self.delay_ms!r}")


@dataclass
class FrameCounts:
    """Frames seen in one direction, and what was done to them."""

    forwarded: int = 0  # written at least once
    dropped: int = 0
    duplicated: int = 0
    delayed: int = 0


@dataclass
class _Direction:
    faults: Faults = field(default_factory=Faults)
    rng: random.Random = field(default_factory=random.Random)
    counts: FrameCounts = field(default_factory=FrameCounts)


class FrameProxy:
    """Forwards every connection made to ``listen`` (``HOST:PORT``, port 0 = any) to
    ``target``; ``address`` is where it listens."""

    def __init__(self, listen: str, target: str) -> None:
        host, port = split_address(listen)
        self.target = split_address(target)
        self._directions = {name: _Direction() for name in DIRECTIONS}
        self._links: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._closed = False
        started: Future[asyncio.Server] = Future()
        self._thread = threading.Thread(
            target=self._run,
            args=(host, port, started),
            name=f"frame-proxy {listen}",
            daemon=True,  # a proxy never closed must not keep the process alive
        )
        self._thread.start()
        try:
            server = self._server = started.result(_START_TIMEOUT_S)
        except BaseException:
            self._stop_loop()
            raise
        bound_host, bound_port = server.sockets[0].getsockname()[:2]
        self.address = f"{bound_host}:{bound_port}"

    def set_faults(
        self,
        loss: float = 0.0,
        delay_ms: int = 0,
        duplicate: float = 0.0,
        seed: int = 0,
        direction: str = "both",
    ) -> None:
        """Apply these faults from now on to ``direction`` ("up", "down" or "both")."""
        if direction not in (*DIRECTIONS, "both"):
            raise ValueError(f"direction must be 'up', 'down' or 'both', got {direction!r}")
        faults = Faults(loss, delay_ms, duplicate)
        for name in DIRECTIONS if direction == "both" else (direction,):
            state = self._directions[name]
            # Replaced whole: the loop thread sees either the old faults or the new ones.
            state.rng, state.faults = random.Random(f"{seed}/{name}"), faults

    def clear(self) -> None:
        """No faults any more (the counts stay)."""
        for state in self._directions.values():
            state.faults = Faults()

    def faults(self, direction: str) -> Faults:
        return self._directions[direction].faults

    def counts(self, direction: str) -> FrameCounts:
        return self._directions[direction].counts

    def __enter__(self) -> FrameProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening, cut every link, stop the thread; idempotent."""
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            self._server.close()
            for task in list(self._links):
                task.cancel()
            await asyncio.gather(*self._links, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(_START_TIMEOUT_S)
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_START_TIMEOUT_S)
        self._loop.close()

    def _run(self, host: str, port: int, started: Future[asyncio.Server]) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            server = self._loop.run_until_complete(asyncio.start_server(self._accept, host, port))
        except OSError as exc:
            started.set_exception(exc)
            return
        started.set_result(server)
        self._loop.run_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._links.add(task)
        try:
            target_reader, target_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()  # the target is down: so is the link, as without us
            self._links.discard(task)
            return
        try:
            async with asyncio.TaskGroup() as link:
                for source, sink, name in (
                    (reader, target_writer, "up"),
                    (target_reader, writer, "down"),
                ):
                    # Bounded: a held frame delays those behind it (TCP order) while reading
                    # goes on, up to this many frames.
                    queue: _Queue = asyncio.Queue(_QUEUE_FRAMES)
                    link.create_task(_read(source, queue, self._directions[name]))
                    link.create_task(_write(queue, sink))
        except* (OSError, asyncio.IncompleteReadError, _BrokenFraming):
            pass  # either side went away: the other is cut below, as a real link would be
        finally:
            writer.transport.abort()
            target_writer.transport.abort()
            self._links.discard(task)


_Queue = asyncio.Queue[tuple[float, bytes, int] | None]  # (due, frame, copies); None = EOF


async def _read(reader: asyncio.StreamReader, queue: _Queue, state: _Direction) -> None:
    """Frames from ``reader``, each dropped, held or doubled as ``state`` says."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            prefix = await reader.readexactly(_LENGTH.size)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise
            break  # closed between two frames
        (length,) = _LENGTH.unpack(prefix)
        if length > MAX_FRAME_BYTES:
            raise _BrokenFraming(f"frame declares {length} bytes")
        frame = prefix + await reader.readexactly(length)
        faults, counts = state.faults, state.counts
        if faults.loss and state.rng.random() < faults.loss:
            counts.dropped += 1
            continue
        copies = 2 if faults.duplicate and state.rng.random() < faults.duplicate else 1
        counts.forwarded += 1
        counts.duplicated += copies - 1
        counts.delayed += faults.delay_ms > 0
        await queue.put((loop.time() + faults.delay_ms / 1000, frame, copies))
    await queue.put(None)


async def _write(queue: _Queue, writer: asyncio.StreamWriter) -> None:
    loop = asyncio.get_running_loop()
    while (item := await queue.get()) is not None:
        due, frame, copies = item
        if (wait := due - loop.time()) > 0:
            await asyncio.sleep(wait)
        for _ in range(copies):
            writer.write(frame)
        await writer.drain()
    writer.write_eof()


class _BrokenFraming(Exception):
    """The stream is not hamq frames: the link is cut, as the server would cut it."""
