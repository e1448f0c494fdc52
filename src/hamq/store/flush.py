"""The store's background services on the event loop: commit-log flush (async, or
group-commit sync), consume-queue checkpoints, retention, disk checks, offset persistence.

Sync flush is group commit: waiters sit in one deque ordered by offset; each fsync (run in a
worker thread) wakes every waiter it covers, however many sends arrived meanwhile. Like
RocketMQ's GroupCommitService it also flushes on a short period when nobody waits, so
writes no send waits for (a slave's replicated bytes, a DLedger member's applied entries)
are fsynced under sync flush too.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from time import monotonic_ns

from hamq.clock import monotonic_s
from hamq.errors import BrokerSystemError
from hamq.net.counts import LATENCY_US_BOUNDS, Histogram
from hamq.net.tasks import PeriodicTask, cancel_all
from hamq.store.message_store import MessageStore

log = logging.getLogger(__name__)

FlushCallback = Callable[[bool], None]  # True: durable; False: timed out
DISK_CHECK_INTERVAL_S = 1.0
OFFSET_PERSIST_INTERVAL_S = 5.0  # RocketMQ flushConsumerOffsetInterval
_TIMEOUT_SWEEP_S = 0.05
SYNC_FLUSH_INTERVAL_S = 0.01  # RocketMQ GroupCommitService waits 10 ms between flushes


class FlushService:
    def __init__(self, store: MessageStore, reads_wait_for_fsync: bool = True) -> None:
        """Under sync flush readers stop at the fsynced end, so a power loss takes no
        record a consumer saw; ``reads_wait_for_fsync=False`` where another fsynced log is
        the record (DLedger's Raft log: a restart re-applies to the store whatever its
        unfsynced tail lost, byte for byte, and a send is answered before this fsync)."""
        self.store = store
        cfg = store.config
        self.sync = cfg.flush_disk_type == "sync"
        self.caps_reads = self.sync and reads_wait_for_fsync
        self.timeout_s = cfg.sync_flush_timeout_ms / 1000
        self._waiters: deque[tuple[int, float, FlushCallback]] = deque()
        self._wake = asyncio.Event()
        self._sync_flush: asyncio.Task | None = None  # group commit (sync flush)
        self._duties: list[PeriodicTask] = []
        store.after_cut.append(self._release_cut)
        # commit-log fsyncs (in a worker thread), the hop there and back included
        self.fsync_us = Histogram(LATENCY_US_BOUNDS)

    def wait_flushed(self, offset: int, callback: FlushCallback) -> None:
        """Call ``callback(True)`` once the log is durable up to ``offset`` (sync flush)."""
        if offset <= self.store.commitlog.flushed_offset:
            callback(True)
            return
        self._waiters.append((offset, monotonic_s() + self.timeout_s, callback))
        self._wake.set()

    def _release_cut(self) -> None:
        """A slave's log was cut (it attached to a master that lacks its tail), or a failed
        write was undone: waiters past the new end wait for bytes that are gone, and would
        hold every later waiter behind them until they time out. They end as not durable."""
        end = self.store.commitlog.max_offset
        if self.caps_reads:  # bytes written where the cut ones were are not yet fsynced
            self.store.set_durable_cap(min(self.store.durable_cap, self.store.durable_offset))
        waiters = self._waiters
        while waiters and waiters[-1][0] > end:
            waiters.pop()[2](False)

    def start(self) -> None:
        cfg = self.store.config
        self._duties = [
            PeriodicTask(
                "consume queue checkpoint",
                cfg.flush_interval_consume_queue_ms / 1000,
                self._checkpoint,
            ),
            PeriodicTask("retention", cfg.clean_resource_interval_ms / 1000, self._delete_expired),
            PeriodicTask("disk check", DISK_CHECK_INTERVAL_S, self._check_disk),
            PeriodicTask(
                "consumer offset persist", OFFSET_PERSIST_INTERVAL_S, self._persist_offsets
            ),
        ]
        if self.sync:
            if self.caps_reads:
                self.store.set_durable_cap(self.store.commitlog.flushed_offset)
            self._sync_flush = asyncio.create_task(self._sync_flush_loop())
            self._duties.append(
                PeriodicTask("sync flush timeout sweep", _TIMEOUT_SWEEP_S, self._expire_waiters)
            )
        else:
            self._duties.append(
                PeriodicTask(
                    "commit log flush",
                    cfg.flush_interval_commitlog_ms / 1000,
                    self._flush_commitlog,
                )
            )
        for duty in self._duties:
            duty.start()

    async def stop(self) -> None:
        await asyncio.gather(
            cancel_all([self._sync_flush]), *(duty.stop() for duty in self._duties)
        )
        for _, _, callback in self._waiters:
            callback(False)
        self._waiters.clear()

    # -- loops ----------------------------------------------------------------------------
    async def _sync_flush_loop(self) -> None:
        commitlog = self.store.commitlog
        while not commitlog.fsync_error:  # after a failed fsync waiters only time out
            if not self._waiters:
                try:
                    await asyncio.wait_for(self._wake.wait(), SYNC_FLUSH_INTERVAL_S)
                except TimeoutError:
                    pass
            self._wake.clear()
            commitlog.write_pending()
            # A write that failed (ENOSPC) was undone: its waiter waits past the log's end,
            # and left queued it would make this loop spin without awaiting.
            self._release_cut()
            try:
                flushed = await self._fsync() if commitlog.unflushed else commitlog.flushed_offset
            except BrokerSystemError:
                self.store.check_disk()  # refuses writes: none could become durable
                return
            # a cut while the fsync ran lowered the log's durable end below the job's
            flushed = min(flushed, commitlog.flushed_offset)
            if self.caps_reads:
                self.store.set_durable_cap(flushed)
            waiters = self._waiters
            while waiters and waiters[0][0] <= flushed:
                waiters.popleft()[2](True)
            if waiters:
                self._wake.set()

    async def _flush_commitlog(self) -> None:
        if self.store.commitlog.fsync_error:
            return
        if not self.store.commitlog.unflushed:
            return
        try:
            await self._fsync()
        except BrokerSystemError:
            self.store.check_disk()  # refuses writes: none could become durable

    async def _fsync(self) -> int:
        """Fsync the commit log in a worker thread; returns the durable offset."""
        started = monotonic_ns()
        flushed = await asyncio.to_thread(self.store.commitlog.detach_flush())
        self.fsync_us.observe((monotonic_ns() - started) // 1000)
        return flushed

    async def _checkpoint(self) -> None:
        if self.store.fsync_error:  # none is written again: recovery rebuilds from the last
            return
        paths = self.store.write_consume_queues()
        await asyncio.to_thread(self.store.sync_files, paths)
        await asyncio.to_thread(self.store.write_checkpoint)

    def _delete_expired(self) -> None:
        self.store.delete_expired()

    def _check_disk(self) -> None:
        self.store.check_disk()

    async def _persist_offsets(self) -> None:
        snapshot = self.store.offsets.snapshot()
        if snapshot is not None:
            await asyncio.to_thread(self.store.offsets.write, snapshot)

    def _expire_waiters(self) -> None:
        # Deadlines grow with offsets (one timeout for all), so expired waiters are a prefix.
        now = monotonic_s()
        waiters = self._waiters
        while waiters and waiters[0][1] <= now:
            waiters.popleft()[2](False)
