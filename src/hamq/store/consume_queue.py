"""Consume queue: per (topic, queue id), fixed-size entries mapping queue offsets to records.

One entry per record (a record holds a whole batch): physical offset, record size, base
queue offset, message count and store time. Entries live in typed arrays (one bisect finds
the record holding a queue offset) and are appended to a file that recovery trusts up to
the checkpoint and rebuilds past it from the commit log.
"""

from __future__ import annotations

import bisect
import struct
from array import array
from pathlib import Path

from hamq.store.disk import OS_DISK, Disk, atomic_write, write_all

ENTRY = struct.Struct(">qiqiq")  # physical_offset, size, base_queue_offset, count, store_ts_ms
ENTRY_BYTES = ENTRY.size


class ConsumeQueue:
    def __init__(self, path: Path, topic: str, queue_id: int, *, disk: Disk = OS_DISK) -> None:
        self.path = path
        self.disk = disk
        self.topic = topic
        self.queue_id = queue_id
        self.phys = array("q")
        self.size = array("i")
        self.base = array("q")
        self.count = array("i")
        self.store_ts = array("q")
        self._unwritten = bytearray()
        self._load()

    # -- offsets ------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.base[0] if self.base else self._empty_offset

    @property
    def max_offset(self) -> int:
        """Next queue offset to assign (RocketMQ: the queue's max offset)."""
        return self.base[-1] + self.count[-1] if self.base else self._empty_offset

    @property
    def max_physical_end(self) -> int:
        return self.phys[-1] + self.size[-1] if self.phys else -1

    def __len__(self) -> int:
        return len(self.base)

    # -- writing ------------------------------------------------------------------------
    def append(self, phys: int, size: int, base: int, count: int, store_ts_ms: int) -> None:
        self.phys.append(phys)
        self.size.append(size)
        self.base.append(base)
        self.count.append(count)
        self.store_ts.append(store_ts_ms)
        self._unwritten += ENTRY.pack(phys, size, base, count, store_ts_ms)

    def append_many(self, entries: list[int]) -> None:
        """``append`` for many entries in one go (a slave indexing a transfer), given flat:
        phys, size, base, count, store_ts_ms per entry."""
        self.phys.extend(entries[0::5])
        self.size.extend(entries[1::5])
        self.base.extend(entries[2::5])
        self.count.extend(entries[3::5])
        self.store_ts.extend(entries[4::5])
        self._unwritten += struct.pack(">" + ENTRY.format[1:] * (len(entries) // 5), *entries)

    def write_unwritten(self) -> bool:
        """Hand new entries to the OS; returns whether there were any (the caller fsyncs,
        off the event loop)."""
        if not self._unwritten:
            return False
        file = self.disk.open(self.path, append=True)
        try:
            size = file.size()
            try:
                write_all(file, [self._unwritten])
            except OSError:  # ENOSPC part-way: no half entry may stay before the retry
                file.truncate(size)
                raise
        finally:
            file.close()
        self._unwritten.clear()
        return True

    def drop_from_physical(self, phys_end: int) -> None:
        """Forget entries whose record is at or past ``phys_end`` (commit log truncated).
        The file is cut in place, not rewritten: a restart after a crash pays for what it
        cuts, not for the queue's length."""
        keep = bisect.bisect_left(self.phys, phys_end)
        if keep == len(self.phys):
            return
        if keep == 0 and self.base[0] != self._empty_offset:
            # emptied: the queue continues at the first dropped offset, written before the
            # entries go (see _rewrite). Undoing a failed send on a full disk drops entries
            # that began where the queue already continued: nothing to write, so the undo
            # cannot fail half-way and leave them for the retry to append again.
            self._write_min(self.base[0])
            self._empty_offset = self.base[0]
        in_file = len(self.phys) - len(self._unwritten) // ENTRY_BYTES
        for arr in (self.phys, self.size, self.base, self.count, self.store_ts):
            del arr[keep:]
        if keep >= in_file:
            del self._unwritten[(keep - in_file) * ENTRY_BYTES :]
            return
        self._unwritten.clear()
        file = self.disk.open(self.path, create=False)
        try:
            file.truncate(keep * ENTRY_BYTES)
            file.fsync()
        finally:
            file.close()

    def drop_below_physical(self, phys_min: int) -> None:
        """Retention: forget entries whose record was deleted from the commit log."""
        first = bisect.bisect_left(self.phys, phys_min)
        if first:
            if first == len(self.phys):
                self._empty_offset = self.max_offset
            self._keep_slice(first, len(self.phys))

    # -- reading ------------------------------------------------------------------------
    def locate(self, queue_offset: int) -> int:
        """Index of the entry holding ``queue_offset`` (caller checks the bounds)."""
        return bisect.bisect_right(self.base, queue_offset) - 1

    def offset_by_timestamp(self, ts_ms: int) -> int:
        """First queue offset stored at or after ``ts_ms`` (RocketMQ's searchOffset)."""
        idx = bisect.bisect_left(self.store_ts, ts_ms)
        return self.base[idx] if idx < len(self.base) else self.max_offset

    # -- internals ----------------------------------------------------------------------
    def _load(self) -> None:
        self._empty_offset = 0
        meta = self.path.with_suffix(".min")
        if self.disk.exists(meta):
            self._empty_offset = int(self.disk.read_bytes(meta) or 0)
        if not self.disk.exists(self.path):
            return
        raw = self.disk.read_bytes(self.path)
        whole = len(raw) - len(raw) % ENTRY_BYTES  # a torn last entry is rebuilt by recovery
        phys_end = base_end = 0
        for phys, size, base, count, ts in ENTRY.iter_unpack(raw[:whole]):
            if size <= 0 or count <= 0 or phys < phys_end or base < base_end:
                # never written so (a hole a failed fsync or a power loss left): this and
                # what follows are dropped, and recovery rebuilds them from the commit log
                break
            phys_end, base_end = phys + size, base + count
            self.phys.append(phys)
            self.size.append(size)
            self.base.append(base)
            self.count.append(count)
            self.store_ts.append(ts)
        if len(self) * ENTRY_BYTES != len(raw):
            self._rewrite()

    def _keep_slice(self, lo: int, hi: int) -> None:
        for arr in (self.phys, self.size, self.base, self.count, self.store_ts):
            del arr[hi:]
            del arr[:lo]
        self._rewrite()

    def _rewrite(self) -> None:
        self._unwritten.clear()
        # ".min" first: it counts only while the entries are empty, so a crash between the
        # two writes never leaves an emptied queue without where it continues
        self._write_min(self._empty_offset)
        atomic_write(
            self.disk,
            self.path,
            b"".join(
                ENTRY.pack(*e)
                for e in zip(self.phys, self.size, self.base, self.count, self.store_ts)
            ),
        )

    def _write_min(self, offset: int) -> None:
        atomic_write(self.disk, self.path.with_suffix(".min"), str(offset).encode())
