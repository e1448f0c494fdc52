"""The commit log: every record of every queue, appended to segment files named by their
start offset (``00000000000000000000``, ...).

Appends go to an in-memory list and reach the file in one ``writev`` per event-loop read
(``write_pending``), so a pipelined burst of sends costs one system call. A record never
spans two segments; a segment ends where its data ends, so physical offsets stay dense.
"""
from __future__ import annotations

import bisect
import errno
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hamq.errors import CrcMismatch
from hamq.protocol.limits import MAX_TOPIC_LENGTH
from hamq.protocol.message import (RECORD_HEADER_BYTES, RecordHeader, check_record_payload,
                                   parse_record_header)
from hamq.store.fsutil import fsync_dir

log = logging.getLogger(__name__)

SEGMENT_NAME_DIGITS = 20
# writev takes at most IOV_MAX pieces per call.
_IOV_MAX = 1024
# Recovery reads the log in chunks of this size.
_SCAN_CHUNK_BYTES = 8 * 1024 * 1024
_HEADER_PEEK_BYTES = RECORD_HEADER_BYTES + MAX_TOPIC_LENGTH


@dataclass
class Segment:
    start: int
    path: Path
    fd: int
    size: int  # bytes written to the file

    @property
    def end(self) -> int:
        return self.start + self.size


class CommitLog:
    def __init__(self, directory: str | Path, segment_bytes: int) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segments: list[Segment] = []
        self._starts: list[int] = []
        self._pending: list[bytes | memoryview] = []
        self._pending_bytes = 0
        self._rolled: list[Segment] = []  # closed-for-writing segments not yet fsynced
        self._flush_lock = threading.Lock()
        self.flushed_offset = 0
        self._open_segments()

    # -- offsets ------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.segments[0].start if self.segments else 0

    @property
    def written_offset(self) -> int:
        return self.segments[-1].end if self.segments else 0

    @property
    def max_offset(self) -> int:
        """End of the log including appends not yet handed to the OS."""
        return self.written_offset + self._pending_bytes

    # -- appending ----------------------------------------------------------------------
    def reserve(self, size: int) -> int:
        """Physical offset at which a record of ``size`` bytes will be written."""
        active = self.segments[-1]
        if active.size + self._pending_bytes and \
                active.size + self._pending_bytes + size > self.segment_bytes:
            self.write_pending()
            self._roll(active.end)
        return self.max_offset

    def append(self, pieces: list[bytes | memoryview], size: int) -> None:
        self._pending += pieces
        self._pending_bytes += size

    def write_pending(self) -> None:
        if not self._pending_bytes:
            return
        active = self.segments[-1]
        pieces, self._pending = self._pending, []
        size, self._pending_bytes = self._pending_bytes, 0
        try:
            for i in range(0, len(pieces), _IOV_MAX):
                chunk = pieces[i:i + _IOV_MAX]
                written = os.writev(active.fd, chunk)
                rest = b"".join(chunk)[written:] if written != sum(map(len, chunk)) else b""
                while rest:  # a short write; ENOSPC surfaces as OSError on the next call
                    rest = rest[os.write(active.fd, rest):]
        except OSError:
            os.ftruncate(active.fd, active.size)  # nothing half-written stays behind
            raise
        active.size += size

    # -- durability ---------------------------------------------------------------------
    def flush(self) -> int:
        """fsync everything handed to the OS; returns the durable offset. Runs in a worker
        thread while the event loop appends: the offset is read before the files are
        synced, and a segment rolled meanwhile is either ours to sync or in ``_rolled``."""
        with self._flush_lock:
            target = self.written_offset
            active = self.segments[-1]
            if target == self.flushed_offset and not self._rolled:
                return target
            rolled, self._rolled = self._rolled, []
            for seg in rolled + [active]:
                try:
                    os.fdatasync(seg.fd)
                except OSError as exc:
                    if exc.errno != errno.EBADF:  # EBADF: removed by retention meanwhile
                        raise
            self.flushed_offset = max(self.flushed_offset, target)
            return self.flushed_offset

    # -- reading ------------------------------------------------------------------------
    def read_range(self, offset: int, end: int) -> bytearray:
        """Bytes in [offset, end), crossing segment ends."""
        data = bytearray(end - offset)
        self.read_into(offset, memoryview(data))
        return data

    def read_into(self, offset: int, into: memoryview) -> None:
        """Fill ``into`` with the bytes from ``offset``, crossing segment ends: reads land
        in place, so a pull response is assembled without a copy per record."""
        self.write_pending()
        pos, end = 0, len(into)
        while pos < end:
            idx = bisect.bisect_right(self._starts, offset) - 1
            seg = self.segments[idx]
            n = min(end - pos, seg.end - offset)
            if n <= 0:
                raise OSError(f"read of the commit log past its end at {offset}")
            got = os.preadv(seg.fd, [into[pos:pos + n]], offset - seg.start)
            if got != n:
                raise OSError(f"short read of the commit log at {offset}: {got} of {n} bytes")
            pos += n
            offset += n

    def iter_records(self, start: int) -> Iterator[tuple[int, RecordHeader, bytes]]:
        """Yield (offset, header, record bytes) from ``start`` while records are valid; stops
        at the first torn or corrupt record (``self.scan_stopped_at`` tells where)."""
        self.write_pending()
        self.scan_stopped_at = start
        for seg in list(self.segments):
            if seg.end <= start:
                continue
            window = _Window(seg)
            pos = max(start, seg.start)
            while pos < seg.end:
                try:
                    buf, rel = window.get(pos, min(_HEADER_PEEK_BYTES, seg.end - pos))
                    header = parse_record_header(buf, rel)
                    if header.physical_offset != pos:
                        raise CrcMismatch("record physical offset does not match its position")
                    buf, rel = window.get(pos, header.total_size)
                    check_record_payload(buf, rel, header)
                except CrcMismatch as err:
                    log.warning("commit log scan stops at %d: %s", pos, err.message)
                    return
                yield pos, header, buf[rel:rel + header.total_size]
                pos += header.total_size
                self.scan_stopped_at = pos

    # -- shrinking ----------------------------------------------------------------------
    def truncate(self, offset: int) -> None:
        """Drop everything at and after ``offset`` (a torn tail, or a diverged suffix)."""
        self.write_pending()
        while len(self.segments) > 1 and self.segments[-1].start >= offset:
            seg = self.segments.pop()
            self._starts.pop()
            os.close(seg.fd)
            seg.path.unlink()
        seg = self.segments[-1]
        keep = max(0, offset - seg.start)
        if keep < seg.size:
            os.ftruncate(seg.fd, keep)
            os.fsync(seg.fd)
            seg.size = keep
        if seg.start > offset:  # the whole log is gone: restart at offset
            seg.start = offset
        self._rolled = [s for s in self._rolled if s in self.segments]
        self.flushed_offset = min(self.flushed_offset, self.written_offset)

    def reset(self, start: int) -> None:
        """Drop every segment and restart the log, empty, at ``start``."""
        self._pending, self._pending_bytes, self._rolled = [], 0, []
        for seg in self.segments:
            os.close(seg.fd)
            seg.path.unlink()
        self.segments, self._starts = [], []
        self._roll(start)
        self.flushed_offset = start

    def delete_segments_before(self, mtime_s: float) -> int:
        """Retention: remove whole segments last written before ``mtime_s`` (never the
        active one); returns the new minimum offset."""
        while len(self.segments) > 1 and self.segments[0].path.stat().st_mtime < mtime_s:
            seg = self.segments.pop(0)
            self._starts.pop(0)
            os.close(seg.fd)
            seg.path.unlink()
            log.info("retention removed segment %s", seg.path.name)
        return self.min_offset

    def close(self) -> None:
        self.write_pending()
        self.flush()
        for seg in self.segments:
            os.close(seg.fd)
        self.segments = []
        self._starts = []

    # -- internals ----------------------------------------------------------------------
    def _open_segments(self) -> None:
        names = sorted(p for p in self.directory.iterdir()
                       if p.name.isdigit() and len(p.name) == SEGMENT_NAME_DIGITS)
        for path in names:
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
            seg = Segment(int(path.name), path, fd, os.fstat(fd).st_size)
            if self.segments and self.segments[-1].end != seg.start:
                log.warning("gap in commit log before %s; later segments are dropped", path.name)
                os.close(fd)
                break
            self.segments.append(seg)
            self._starts.append(seg.start)
        if not self.segments:
            self._roll(0)
        self.flushed_offset = self.written_offset

    def _roll(self, start: int) -> None:
        path = self.directory / f"{start:0{SEGMENT_NAME_DIGITS}d}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        fsync_dir(self.directory)
        if self.segments:
            self._rolled.append(self.segments[-1])
        self.segments.append(Segment(start, path, fd, 0))
        self._starts.append(start)


class _Window:
    """Sequential reads of one segment through a large buffer (recovery scans)."""

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        self.buf = b""
        self.start = seg.start

    def get(self, pos: int, size: int) -> tuple[bytes, int]:
        if pos < self.start or pos + size > self.start + len(self.buf):
            self.buf = os.pread(self.seg.fd, max(size, _SCAN_CHUNK_BYTES), pos - self.seg.start)
            self.start = pos
        return self.buf, pos - self.start


def now_ms() -> int:
    return int(time.time() * 1000)
