"""The commit log: every record of every queue, appended to segment files named by their
start offset (``00000000000000000000``, ...).

Appends go to an in-memory list and reach the file in one ``writev`` per event-loop read
(``write_pending``), so a pipelined burst of sends costs one system call. A record never
spans two segments; a segment ends where its data ends, so physical offsets stay dense.

Opening after a crash: every segment is fsynced before ``flushed_offset`` claims it (a
killed process leaves its writes in the page cache, where a later power loss could still
take them). A segment that does not start where the one before it ends means the earlier
one lost its tail: if that tail lies below ``checkpoint_flushed`` (what the store's
checkpoint says was fsynced) the disk lost confirmed data and opening is refused;
otherwise the later segments can only hold bytes that were never fsynced (a flush syncs a
rolled segment before the one after it counts) and are removed.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hamq.errors import BrokerSystemError, CrcMismatch
from hamq.protocol.limits import MAX_TOPIC_LENGTH
from hamq.protocol.message import (
    RECORD_HEADER_BYTES,
    RecordHeader,
    check_record_payload,
    parse_record_header,
)
from hamq.store.disk import AFTER_FAILED_FSYNC, OS_DISK, Disk, DiskFile, write_all

log = logging.getLogger(__name__)

SEGMENT_NAME_DIGITS = 20
# Recovery reads the log in chunks of this size.
_SCAN_CHUNK_BYTES = 8 * 1024 * 1024
_HEADER_PEEK_BYTES = RECORD_HEADER_BYTES + MAX_TOPIC_LENGTH


@dataclass(eq=False)  # one per file: compared by identity
class Segment:
    start: int
    file: DiskFile  # opened for appending
    size: int  # bytes written to the file
    # The file's mtime when this log closed it: every byte in it was written (and checked
    # on the way in) by this log, so while the mtime stays so, its reads need no CRC
    # check. None: opened from disk (or since changed), its reads are checked.
    sealed_mtime: float | None = None

    @property
    def path(self) -> Path:
        return self.file.path

    @property
    def end(self) -> int:
        return self.start + self.size


class CommitLog:
    def __init__(
        self,
        directory: str | Path,
        segment_bytes: int,
        *,
        disk: Disk = OS_DISK,
        checkpoint_flushed: int = 0,
    ) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.disk = disk
        disk.mkdir(self.directory)
        self.segments: list[Segment] = []
        self._starts: list[int] = []
        self._pending: list[bytes | memoryview] = []
        self._pending_bytes = 0
        self._rolled: list[Segment] = []  # closed-for-writing segments not yet fsynced
        # Guards flushed_offset against a flush job finishing after a truncation: the job's
        # target may lie past the new end, so a truncation bumps the generation.
        self._flush_lock = threading.Lock()
        self._generation = 0
        self.flushed_offset = 0
        # Set by a failed fsync, and for good: Linux marks the pages it could not write back
        # clean, so a later fsync would succeed without them; nothing is claimed durable
        # again until a restart has re-read (and re-checked) what the disk really holds.
        self.fsync_error = ""
        try:
            self._open_segments(checkpoint_flushed)
        except BrokerSystemError:
            for seg in self.segments:  # refusing to open: leave no file open behind
                seg.file.close()
            raise

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

    @property
    def active_start(self) -> int:
        """Where the segment being appended to starts: bytes below it lie in closed
        segments, which this log never rewrites: reads check their CRCs unless ``sealed``."""
        return self._starts[-1] if self._starts else 0

    @property
    def unflushed(self) -> bool:
        """Whether bytes handed to the OS wait for an fsync."""
        return self.written_offset > self.flushed_offset or bool(self._rolled)

    # -- appending ----------------------------------------------------------------------
    def reserve(self, size: int) -> int:
        """Physical offset at which a record of ``size`` bytes will be written."""
        active = self.segments[-1]
        if (
            active.size + self._pending_bytes
            and active.size + self._pending_bytes + size > self.segment_bytes
        ):
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
            write_all(active.file, pieces)
        except OSError:
            active.file.truncate(active.size)  # nothing half-written stays behind
            raise
        active.size += size

    # -- durability ---------------------------------------------------------------------
    def flush(self) -> int:
        """fsync everything handed to the OS; returns the durable offset."""
        return self.detach_flush()()

    def detach_flush(self) -> Callable[[], int]:
        """Take what ``flush`` would fsync as a job a worker thread may run while the event
        loop appends: the offset is read now, and the job fsyncs duplicates of the files
        written up to it, so a segment that retention or a truncation closes meanwhile
        cannot make it fsync a reused descriptor. The job returns the durable offset."""
        if self.fsync_error:
            raise BrokerSystemError(self.fsync_error)
        target = self.written_offset
        if target <= self.flushed_offset and not self._rolled:
            return self._durable
        rolled, self._rolled = self._rolled, []
        files = [seg.file.dup() for seg in [*rolled, self.segments[-1]]]
        generation = self._generation

        def job() -> int:
            try:
                for file in files:
                    file.fsync()
            except OSError as err:
                self.fsync_error = (
                    f"fsync of commit log segment {file.path} failed "
                    f"({err.strerror or err}): its writes may never reach "
                    f"the disk; nothing past offset {self.flushed_offset} "
                    f"counts as durable; {AFTER_FAILED_FSYNC}"
                )
                log.error("%s", self.fsync_error)
                raise BrokerSystemError(self.fsync_error) from err
            finally:
                for file in files:
                    file.close()
            with self._flush_lock:
                if generation == self._generation:
                    self.flushed_offset = max(self.flushed_offset, target)
                return self.flushed_offset

        return job

    def _durable(self) -> int:
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
            got = seg.file.pread_into(into[pos : pos + n], offset - seg.start)
            if got != n:
                raise OSError(f"short read of the commit log at {offset}: {got} of {n} bytes")
            pos += n
            offset += n

    def iter_records(self, start: int) -> Iterator[tuple[int, RecordHeader, bytes]]:
        """Yield (offset, header, record bytes) from ``start`` while records are valid; stops
        at the first torn or corrupt record (``self.scan_stopped_at`` tells where). A
        closed segment's record whose header holds but whose payload fails its CRC is no
        torn tail (the log went on past it): it is yielded and named in ``damaged``, for
        its reads to refuse and a replica to repair, rather than cut with all after it."""
        self.write_pending()
        self.scan_stopped_at = start
        self.damaged: list[tuple[int, int]] = []
        last = self.segments[-1] if self.segments else None
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
                    try:
                        check_record_payload(buf, rel, header)
                    except CrcMismatch:
                        if seg is last or pos + header.total_size > seg.end:
                            raise
                        log.error("commit log record at %d is damaged (payload CRC)", pos)
                        self.damaged.append((pos, header.total_size))
                except CrcMismatch as err:
                    log.warning("commit log scan stops at %d: %s", pos, err.message)
                    return
                yield pos, header, buf[rel : rel + header.total_size]
                pos += header.total_size
                self.scan_stopped_at = pos

    def sealed(self, start: int, end: int) -> bool:
        """Whether the closed segments holding [start, end) are as this log wrote them
        (their mtime unchanged since it closed them): an fstat of each open segment a read
        touches, instead of a CRC per record; any other write to them (a stray one, a fault
        injected) moves the mtime and brings the checks back. Every read stats: a cached
        answer would serve a byte flipped since, unchecked, until it expired."""
        segments = self.segments
        idx = max(0, bisect.bisect_right(self._starts, start) - 1)
        last = len(segments) - 1  # the active segment: never sealed, never checked here
        while idx < last and segments[idx].start < end:
            seg = segments[idx]
            if seg.sealed_mtime is None or seg.file.mtime() != seg.sealed_mtime:
                seg.sealed_mtime = None
                return False
            idx += 1
        return True

    def seal(self, seg: Segment, mtime: float) -> bool:
        """Mark a closed segment whose records were all checked, while its mtime was
        ``mtime``, as sealed (its reads skip the checks); False when it is no longer a
        closed segment of this log, or was written since."""
        if not any(s is seg for s in self.segments[:-1]) or self.disk.mtime(seg.path) != mtime:
            return False
        seg.sealed_mtime = mtime
        return True

    def repair(self, offset: int, record: bytes | bytearray) -> None:
        """Overwrite a damaged record of a closed segment with a replica's copy of it (the
        same bytes: replicas copy the log byte for byte), durably. The segment's own handle
        appends (O_APPEND), so the write goes through a second one."""
        idx = bisect.bisect_right(self._starts, offset) - 1
        seg = self.segments[idx]
        if idx == len(self.segments) - 1 or offset + len(record) > seg.end:
            raise BrokerSystemError(f"no closed segment holds [{offset}, {offset + len(record)})")
        file = self.disk.open(seg.path, create=False)
        try:
            write_all(file, [record], offset - seg.start)
            file.fsync()
        finally:
            file.close()

    # -- shrinking ----------------------------------------------------------------------
    def truncate(self, offset: int) -> None:
        """Drop everything at and after ``offset`` (a torn tail, or a diverged suffix); the
        cut is durable before anything is written again at those offsets. Refused below
        ``min_offset``: retention removed the bytes before the cut, and no segment may start
        anywhere but where its name says (use ``reset`` to restart the log elsewhere)."""
        self.check_cut(offset)
        self.write_pending()
        removed = False
        while len(self.segments) > 1 and self.segments[-1].start >= offset:
            self._starts.pop()
            self._remove(self.segments.pop())
            removed = True
        if removed:  # a removed segment must not come back after a power loss
            self.disk.fsync_dir(self.directory)
        seg = self.segments[-1]
        if seg in self._rolled:  # active again: a flush syncs it as such
            self._rolled.remove(seg)
        if offset - seg.start < seg.size:
            seg.file.truncate(offset - seg.start)
            seg.file.fsync()
            seg.size = offset - seg.start
        with self._flush_lock:
            self._generation += 1
            self.flushed_offset = min(self.flushed_offset, self.written_offset)

    def check_cut(self, offset: int) -> None:
        """Refuse a cut ``truncate`` would refuse, before the caller changes anything."""
        if offset < self.min_offset:
            raise BrokerSystemError(
                f"cannot cut the commit log back to {offset}: retention "
                f"already removed everything below {self.min_offset}"
            )

    def reset(self, start: int) -> None:
        """Drop every segment and restart the log, empty, at ``start``."""
        self._pending, self._pending_bytes = [], 0
        for seg in self.segments:
            self._remove(seg)
        self.segments, self._starts = [], []
        self._roll(start)
        with self._flush_lock:
            self._generation += 1
            self.flushed_offset = start

    def delete_segments_before(self, mtime_s: float) -> int:
        """Retention: remove whole segments last written before ``mtime_s`` (never the
        active one); returns the new minimum offset. The removals are durable before the
        consume queues drop their entries: a segment back after a power loss (torn, if its
        tail was never fsynced) held records no queue indexed, or made the log refuse to
        open."""
        removed = False
        while len(self.segments) > 1 and self.disk.mtime(self.segments[0].path) < mtime_s:
            self._starts.pop(0)
            seg = self.segments.pop(0)
            self._remove(seg)
            removed = True
            log.info("retention removed segment %s", seg.path.name)
        if removed:
            self.disk.fsync_dir(self.directory)
        return self.min_offset

    def close(self) -> None:
        try:
            self.write_pending()
            self.flush()
        finally:  # a failed fsync is reported, but leaves no file open behind
            for seg in self.segments:
                seg.file.close()
            self.segments = []
            self._starts = []

    # -- internals ----------------------------------------------------------------------
    def _open_segments(self, checkpoint_flushed: int) -> None:
        names = [
            name
            for name in self.disk.listdir(self.directory)
            if name.isdigit() and len(name) == SEGMENT_NAME_DIGITS
        ]
        for position, name in enumerate(names):
            file = self.disk.open(self.directory / name, create=False, append=True)
            seg = Segment(int(name), file, file.size())
            if self.segments and self.segments[-1].end != seg.start:
                file.close()
                self._drop_after_gap(names[position:], checkpoint_flushed)
                break
            self.segments.append(seg)
            self._starts.append(seg.start)
        if not self.segments:
            self._roll(0)
        for seg in self.segments:
            seg.file.fsync()
        # and so are the segments it created or removed: one it removed (retention cut
        # short) must not come back after a power loss with a tail never fsynced
        self.disk.fsync_dir(self.directory)
        self.flushed_offset = self.written_offset

    def _drop_after_gap(self, names: list[str], checkpoint_flushed: int) -> None:
        end = self.segments[-1].end
        where = (
            f"commit log segment {self.directory / names[0]} starts at {int(names[0])}, "
            f"but the log before it ends at {end}"
        )
        if end < checkpoint_flushed:
            raise BrokerSystemError(
                f"{where}, below offset {checkpoint_flushed} that the checkpoint says was "
                f"fsynced: the disk lost confirmed data; refusing to start"
            )
        log.warning(
            "%s, past the fsynced offset %d: removing %d segment(s) never fsynced",
            where,
            checkpoint_flushed,
            len(names),
        )
        for name in names:
            self.disk.unlink(self.directory / name)
        self.disk.fsync_dir(self.directory)

    def _roll(self, start: int) -> None:
        file = self.disk.open(self.directory / f"{start:0{SEGMENT_NAME_DIGITS}d}", append=True)
        self.disk.fsync_dir(self.directory)
        if self.segments:
            closed = self.segments[-1]
            closed.sealed_mtime = self.disk.mtime(closed.path)
            self._rolled.append(closed)
        self.segments.append(Segment(start, file, 0))
        self._starts.append(start)

    def _remove(self, seg: Segment) -> None:
        """Close and delete a segment already taken out of ``segments``."""
        if seg in self._rolled:
            self._rolled.remove(seg)
        seg.file.close()
        self.disk.unlink(seg.path)


class _Window:
    """Sequential reads of one segment through a large buffer (recovery scans)."""

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        self.buf = b""
        self.start = seg.start

    def get(self, pos: int, size: int) -> tuple[bytes, int]:
        if pos < self.start or pos + size > self.start + len(self.buf):
            self.buf = self.seg.file.pread(max(size, _SCAN_CHUNK_BYTES), pos - self.seg.start)
            self.start = pos
        return self.buf, pos - self.start
