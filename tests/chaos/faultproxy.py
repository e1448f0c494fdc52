"""A fault-injecting TCP proxy for chaos tests: forwards one link until told to cut it.

Cut means a partition as TCP users see it: open connections are reset and new ones are
closed at once, until the link is restored (dropping bytes inside a stream instead would
corrupt framing, which no real network does to TCP). Stall is a partition as a blackhole
leaves it behind after healing: the open connections stay open and carry nothing more, in
either direction (TCP retransmission backoff, seconds to minutes), new ones work."""

from __future__ import annotations

import asyncio
import threading

from helpers import free_port


class FaultProxy:
    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.blocked = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._stalled: set[asyncio.StreamWriter] = set()  # open, but nothing written to them
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(5)

    def block(self) -> None:
        self.blocked = True
        self._loop.call_soon_threadsafe(self._reset_all)

    def unblock(self) -> None:
        self.blocked = False

    def stall(self) -> None:
        """Open links go silent and stay open (even if one side closes); new links work."""

        def stall_all() -> None:
            self._stalled |= self._writers
            self._writers.clear()

        self._loop.call_soon_threadsafe(stall_all)

    def stop(self) -> None:
        async def shutdown() -> None:
            self.blocked = True
            self._server.close()
            self._reset_all()
            links = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in links:
                task.cancel()
            await asyncio.gather(*links, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()  # else its descriptors stay open for the rest of the session

    def _reset_all(self) -> None:
        for writer in list(self._writers | self._stalled):
            writer.transport.abort()
        self._writers.clear()
        self._stalled.clear()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._link, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.blocked:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if writer not in self._stalled:
                    writer.write(data)
                    await writer.drain()
        finally:
            self._writers.discard(writer)
            if writer not in self._stalled:
                writer.transport.abort()
