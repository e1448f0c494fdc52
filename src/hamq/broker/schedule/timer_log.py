"""The timer log (RocketMQ 5's ``TimerLog``): fixed-size records, one per pending timer
message, appended to segment files; each record points to the previous record of its
wheel slot, so a slot's timers are a chain on disk and the wheel keeps one position per
slot in memory.

A record is (previous position in its slot, due ms, timer-queue offset, commit-log offset
of the message, CRC32 of those). Positions are record numbers. Recovery after ``kill -9``
or a power loss keeps the prefix of valid records and cuts the rest: the timer queue in
the commit log stays the source of truth, and whatever the cut lost is indexed again from
it. The oldest segments are deleted once every timer in them is due before the read cursor.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from hamq.store.disk import OS_DISK, Disk, DiskFile, atomic_write, write_all

log = logging.getLogger(__name__)

RECORD = struct.Struct("<qqqqI4x")
RECORD_SIZE = RECORD.size  # 40 bytes
_CHECKED = struct.Struct("<qqqq")  # the part the CRC covers
SEGMENT_RECORDS = 1 << 20  # 40 MiB segment files
SCAN_RECORDS = 1 << 15  # records read per step of recovery
ID_FILE = "id"


class TimerRecord(NamedTuple):
    pos: int
    prev_pos: int  # -1: first of its slot
    due_ms: int
    queue_offset: int
    physical_offset: int


def _segment_name(first_pos: int) -> str:
    return f"{first_pos:020d}"


class TimerLog:
    def __init__(
        self, directory: Path, *, disk: Disk = OS_DISK, segment_records: int = SEGMENT_RECORDS
    ) -> None:
        self.directory = directory
        self.disk = disk
        self.segment_records = segment_records
        self._files: dict[int, DiskFile] = {}  # first position -> open segment
        self._max_due: dict[int, int] = {}  # first position -> latest due in it
        self._dirty: set[int] = set()  # segments written since the last fsync
        self._new_file = False  # a segment created since the last fsync
        self._lock = threading.Lock()  # fsync runs in a worker thread
        self.end = 0  # position of the next record
        self.cut = False  # recovery cut records off
        disk.mkdir(directory)
        id_path = directory / ID_FILE
        if not disk.exists(id_path):
            atomic_write(disk, id_path, os.urandom(8).hex().encode())
        self.log_id = disk.read_bytes(id_path).decode()

    # -- recovery --------------------------------------------------------------------------
    def recover(self, visit: Callable[[TimerRecord], None]) -> None:
        """Call ``visit`` for every valid record in order; cut the log at the first record
        that is torn, zero or fails its CRC (and drop every segment after it). The next
        ``fsync`` syncs every segment and the directory: a killed process may have left
        them unsynced."""
        firsts = sorted(int(name) for name in self.disk.listdir(self.directory) if name.isdigit())
        self._new_file = True
        expected = firsts[0] if firsts else 0
        self.end = expected
        for first in firsts:
            if first != expected:  # a gap: a lost segment, everything after it is cut
                self._remove(first)
                self.cut = True
                continue
            file = self.disk.open(self.directory / _segment_name(first), append=True)
            self._files[first] = file
            self._max_due[first] = -1
            self._dirty.add(first)  # a killed process may have left it unsynced
            valid = self._scan(first, file, visit)
            if valid < file.size():
                log.warning(
                    "timer log %s cut at record %d (torn or damaged tail)",
                    file.path.name,
                    valid // RECORD_SIZE,
                )
                file.truncate(valid)
                self.cut = True
            # a segment not full is the last: any later one is cut with it
            full = valid == self.segment_records * RECORD_SIZE
            expected = first + self.segment_records if full else -1
            self.end = first + valid // RECORD_SIZE

    def _scan(self, first: int, file: DiskFile, visit: Callable[[TimerRecord], None]) -> int:
        """Visit a segment's valid records; returns the size of its valid prefix."""
        size = min(file.size(), self.segment_records * RECORD_SIZE)
        at = 0
        while at + RECORD_SIZE <= size:
            chunk = file.pread(min(SCAN_RECORDS * RECORD_SIZE, size - at), at)
            for i, (prev, due, offset, physical, crc) in enumerate(
                RECORD.iter_unpack(chunk[: len(chunk) - len(chunk) % RECORD_SIZE])
            ):
                if crc != zlib.crc32(_CHECKED.pack(prev, due, offset, physical)):
                    return at + i * RECORD_SIZE
                self._max_due[first] = max(self._max_due[first], due)
                visit(TimerRecord(first + (at // RECORD_SIZE) + i, prev, due, offset, physical))
            at += len(chunk) - len(chunk) % RECORD_SIZE
        return at

    # -- writing and reading ---------------------------------------------------------------
    def append(self, prev_pos: int, due_ms: int, queue_offset: int, physical_offset: int) -> int:
        """Append one record; returns its position. On a failed write (disk full) the
        segment is cut back to its last whole record and ``OSError`` raised."""
        first = self.end - self.end % self.segment_records
        file = self._files.get(first)
        if file is None:
            file = self.disk.open(self.directory / _segment_name(first), append=True)
            self._files[first] = file
            self._max_due[first] = -1
            with self._lock:
                self._new_file = True
        checked = (prev_pos, due_ms, queue_offset, physical_offset)
        try:
            write_all(file, [RECORD.pack(*checked, zlib.crc32(_CHECKED.pack(*checked)))])
        except OSError:
            file.truncate((self.end - first) * RECORD_SIZE)
            raise
        with self._lock:  # not lost to a concurrent fsync's swap
            self._dirty.add(first)
        self._max_due[first] = max(self._max_due[first], due_ms)
        self.end += 1
        return self.end - 1

    def read(self, pos: int) -> TimerRecord | None:
        """The record at ``pos``, or None if it is not in the log (cut or deleted)."""
        file = self._files.get(pos - pos % self.segment_records)
        if file is None or not 0 <= pos < self.end:
            return None
        raw = file.pread(RECORD_SIZE, (pos % self.segment_records) * RECORD_SIZE)
        if len(raw) < RECORD_SIZE:
            return None
        prev, due, offset, physical, crc = RECORD.unpack(raw)
        if crc != zlib.crc32(_CHECKED.pack(prev, due, offset, physical)):
            return None
        return TimerRecord(pos, prev, due, offset, physical)

    def fsync(self) -> None:
        """Make every record appended so far durable (called before the progress that
        counts on them is written; safe from a worker thread)."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            new_file, self._new_file = self._new_file, False
            for first in dirty:
                file = self._files.get(first)
                if file is not None:
                    file.fsync()
            if new_file:
                self.disk.fsync_dir(self.directory)

    def delete_due_before(self, read_ms: int) -> None:
        """Delete the oldest segments, up to the first holding a timer due at or after
        ``read_ms`` (not delivered), never the last: the log stays one run of positions,
        so a gap found by recovery is damage."""
        last = self.end - self.end % self.segment_records
        for first in sorted(self._max_due):
            if first == last or self._max_due[first] >= read_ms:
                return
            with self._lock:
                self._dirty.discard(first)
                self._files.pop(first).close()
                del self._max_due[first]
                self._remove(first)

    def _remove(self, first: int) -> None:
        self.disk.unlink(self.directory / _segment_name(first))

    def close(self) -> None:
        with self._lock:
            for file in self._files.values():
                file.close()
            self._files.clear()
