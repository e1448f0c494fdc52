"""A file-backed `LogStorage`: segment files named by their first index, one CRC per entry.

Record layout: u32 body length | u32 crc32(body) | body, where the body is u64 index |
u64 term | u8 is_noop | data. The data is never copied into the record: a Ready's records
go to disk with one pwritev per segment. The index of (segment, offset) per entry is rebuilt
by scanning on open. Hard state and checkpoint are small files replaced by
write-then-rename. `entry` may run on the event loop while a worker thread appends: it
reads only persisted records, and the list and dict lookups it shares with `append` are
atomic under the GIL.

Recovery after a power loss. The durable point is the checkpoint's `committed_index` on
disk: a checkpoint is saved only after the log it describes was fsynced, and committed
entries are never cut or rewritten, so every record up to that index is bytes an fsync
made durable. (Its `ledger_end_index` is no such bound: entries past the commit point may
have been cut and rewritten since.) The scan stops at the first bad place — a record torn
or failing its CRC, a record for the wrong index, a term lower than the one before it
(an older record left behind a rewrite that was only partly written), a segment that does
not start where the previous one ends. Past the durable point that can only be data that
was never fsynced: the log is cut there and later segments are removed. At or before it,
or when the log ends before it, the disk lost data it had confirmed: `CorruptLogError`
names the file, offset and index, and the member does not start. `truncate_suffix` fsyncs
the cut before anything is written again at the same offsets, so old records can never
survive behind new ones.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgpack

from hamq.raft.errors import CorruptLogError, LogIndexError
from hamq.raft.log import Checkpoint, Entry, HardState
from hamq.raft.storage import LogStorage
from hamq.store.disk import AFTER_FAILED_FSYNC, OS_DISK, Disk, DiskFile, atomic_write, write_all

log = logging.getLogger(__name__)

SEGMENT_MAX_BYTES = 64 * 1024 * 1024  # roll to a new segment past this size
MAX_RECORD_BYTES = 256 * 1024 * 1024  # a larger length field can only be garbage
_HEADER = struct.Struct(">II")  # body length, crc32 of body
_ENTRY_HEAD = struct.Struct(">QQ?")  # index, term, is_noop; the entry's data follows
_SEGMENT_SUFFIX = ".log"
_SEGMENT_NAME_DIGITS = 20  # zero-padded so names sort by index
_HARD_STATE_FILE = "hardstate"
_CHECKPOINT_FILE = "checkpoint"


@dataclass(frozen=True, slots=True)
class _Location:
    segment_start: int
    offset: int
    length: int  # header included
    term: int  # so that starting a node reads no entry data


def _segment_name(start_index: int) -> str:
    return f"{start_index:0{_SEGMENT_NAME_DIGITS}d}{_SEGMENT_SUFFIX}"


def _record_pieces(entry: Entry) -> list[bytes]:
    head = _ENTRY_HEAD.pack(entry.index, entry.term, entry.is_noop)
    crc = zlib.crc32(entry.data, zlib.crc32(head))
    return [_HEADER.pack(len(head) + len(entry.data), crc), head, entry.data]


def _parse_record(data: bytes, offset: int) -> tuple[int, int, int] | str:
    """(record length, index, term) of a whole, intact record at `offset`, else what is
    wrong with it."""
    if len(data) - offset < _HEADER.size:
        return "record header cut short"
    length, crc = _HEADER.unpack_from(data, offset)
    end = offset + _HEADER.size + length
    if length > MAX_RECORD_BYTES or end > len(data):
        return f"record of {length} bytes cut short"
    body = memoryview(data)[offset + _HEADER.size : end]
    if zlib.crc32(body) != crc or length < _ENTRY_HEAD.size:
        return "record fails its CRC"
    index, term, _ = _ENTRY_HEAD.unpack_from(body)
    return end - offset, index, term


def _decode_body(body: bytes | memoryview) -> Entry:
    index, term, is_noop = _ENTRY_HEAD.unpack_from(body)
    return Entry(index, term, bytes(body[_ENTRY_HEAD.size :]), is_noop)


class FileStorage(LogStorage):
    def __init__(
        self,
        directory: str | os.PathLike[str],
        segment_max_bytes: int = SEGMENT_MAX_BYTES,
        *,
        disk: Disk = OS_DISK,
    ) -> None:
        self._dir = Path(directory)
        self._disk = disk
        disk.mkdir(self._dir)
        self._segment_max_bytes = segment_max_bytes
        self._locations: list[_Location] = []
        self._files: dict[int, DiskFile] = {}  # segment start index -> open file
        self._sizes: dict[int, int] = {}
        self._dirty: set[int] = set()
        self._dir_dirty = False
        self._sync_error = ""  # set for good by a failed fsync (see detach_sync)
        try:
            self._recover()
        except CorruptLogError:
            self.close()  # refusing to start: leave no file open behind
            raise

    # ---- recovery -------------------------------------------------------------------

    def _recover(self) -> None:
        durable = self.load_checkpoint().committed_index
        starts = sorted(
            int(name[: -len(_SEGMENT_SUFFIX)])
            for name in self._disk.listdir(self._dir)
            if name.endswith(_SEGMENT_SUFFIX)
        )
        for position, start in enumerate(starts):
            if start != len(self._locations):
                self._cut(durable, start, 0, f"segment starts at index {start}", starts[position:])
                break
            self._open_segment(start)
            bad = self._scan_segment(start)
            if bad is not None:
                self._cut(durable, start, *bad, starts[position + 1 :])
                break
        if self.last_index() < durable:
            raise CorruptLogError(
                f"Raft log in {self._dir} ends at index {self.last_index()}, but the checkpoint "
                f"says entries up to {durable} were committed and fsynced: refusing to start"
            )
        # records a killed process left in the page cache are durable only once synced: a
        # checkpoint saved later must not vouch for records a power loss could still take
        # (nor a sync acknowledge them in a segment whose directory entry it never synced)
        for file in self._files.values():
            file.fsync()
        self._disk.fsync_dir(self._dir)

    def _scan_segment(self, start: int) -> tuple[int, str] | None:
        """Index the records of one segment; (offset, what is wrong) of the first bad one."""
        data = self._disk.read_bytes(self._dir / _segment_name(start))
        offset = 0
        while offset < len(data):
            record = _parse_record(data, offset)
            if isinstance(record, str):
                return offset, record
            length, index, term = record
            if index != len(self._locations):
                return offset, f"record for index {index}"
            if self._locations and term < self._locations[-1].term:
                return offset, f"term {term} after term {self._locations[-1].term}"
            self._locations.append(_Location(start, offset, length, term))
            offset += length
        return None

    def _cut(self, durable: int, segment: int, offset: int, problem: str, later: list[int]) -> None:
        """Cut the log at a bad place found by recovery: at ``offset`` of ``segment`` (kept if
        open), removing the segments in ``later``; refused at or below ``durable``."""
        index = len(self._locations)
        where = f"{self._dir / _segment_name(segment)} offset {offset} (index {index})"
        if index <= durable:
            raise CorruptLogError(
                f"bad Raft log record at {where}: {problem}; the checkpoint says entries up to "
                f"{durable} were committed and fsynced, so this is lost or damaged data, not "
                f"a torn write: refusing to start"
            )
        log.warning(
            "Raft log cut at %s: %s (past committed index %d, never fsynced)",
            where,
            problem,
            durable,
        )
        if segment in self._files:
            self._files[segment].truncate(offset)
            self._files[segment].fsync()
            self._sizes[segment] = offset
        for start in later:
            self._disk.unlink(self._dir / _segment_name(start))
        if later:
            self._disk.fsync_dir(self._dir)

    def _open_segment(self, start: int) -> None:
        file = self._disk.open(self._dir / _segment_name(start))
        self._files[start] = file
        self._sizes[start] = file.size()

    # ---- log ------------------------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        self._check_append(entries)
        if not entries:
            return
        # Entries already on disk with the same term stay as they are: rewriting them would
        # open a moment (until the rewrite lands) in which a committed entry is off the disk.
        # RaftLog.truncate_after re-emits the entry at the cut, which ends up here.
        last = self.last_index()
        keep = 0
        while (
            keep < len(entries)
            and entries[keep].index <= last
            and self._locations[entries[keep].index].term == entries[keep].term
        ):
            keep += 1
        cut = entries[keep].index if keep < len(entries) else entries[-1].index + 1
        if cut <= last:
            self.truncate_suffix(cut)
        entries = entries[keep:]
        if not entries:
            return
        count, sizes = len(self._locations), dict(self._sizes)
        try:
            self._append_records(entries)
        except OSError:
            self._undo_append(count, sizes)
            raise

    def _append_records(self, entries: Sequence[Entry]) -> None:
        pieces: list[bytes] = []  # records for `segment`, written from `offset`
        segment = offset = -1
        for entry in entries:
            record = _record_pieces(entry)
            length = sum(map(len, record))
            start = self._active_segment(entry.index)
            if start != segment:
                self._write(segment, offset, pieces)
                pieces, segment, offset = [], start, self._sizes[start]
            self._locations.append(_Location(start, self._sizes[start], length, entry.term))
            self._sizes[start] += length
            pieces += record
        self._write(segment, offset, pieces)

    def _undo_append(self, count: int, sizes: dict[int, int]) -> None:
        """A write failed (ENOSPC): forget the entries of this append and cut what reached
        the files, so the log holds exactly what it did before (a retried append must
        write them, not find them already there)."""
        del self._locations[count:]
        for start in [s for s in self._files if s not in sizes]:  # opened by this append
            self._files.pop(start).close()
            del self._sizes[start]
            self._dirty.discard(start)
            self._disk.unlink(self._dir / _segment_name(start))
        for start, size in sizes.items():
            if self._sizes[start] != size:
                self._files[start].truncate(size)
                self._sizes[start] = size

    def _write(self, segment: int, offset: int, pieces: list[bytes]) -> None:
        if pieces:
            write_all(self._files[segment], pieces, offset)
            self._dirty.add(segment)

    def _active_segment(self, next_index: int) -> int:
        if self._files:
            start = max(self._files)
            if self._sizes[start] < self._segment_max_bytes:
                return start
        self._open_segment(next_index)
        self._dir_dirty = True
        return next_index

    def truncate_suffix(self, from_index: int) -> None:
        if from_index < 0:
            raise LogIndexError(f"negative truncate index {from_index}")
        if from_index > self.last_index():
            return
        cut = self._locations[from_index]
        removed = [s for s in self._files if s > cut.segment_start]
        for start in removed:
            self._files.pop(start).close()
            del self._sizes[start]
            self._dirty.discard(start)
            self._disk.unlink(self._dir / _segment_name(start))
        # durable before anything is written again at these offsets: a power loss must not
        # leave old records behind new ones that were only partly written
        file = self._files[cut.segment_start]
        file.truncate(cut.offset)
        file.fsync()
        if removed:
            self._disk.fsync_dir(self._dir)
        self._sizes[cut.segment_start] = cut.offset
        del self._locations[from_index:]

    def entry(self, index: int) -> Entry:
        if not 0 <= index <= self.last_index():
            raise LogIndexError(f"index {index} outside [0, {self.last_index()}]")
        loc = self._locations[index]
        record = self._files[loc.segment_start].pread(loc.length, loc.offset)
        return _decode_body(memoryview(record)[_HEADER.size :])

    def last_index(self) -> int:
        return len(self._locations) - 1

    def term(self, index: int) -> int:
        if not 0 <= index <= self.last_index():
            return super().term(index)  # EMPTY_INDEX's term, or the out-of-range error
        return self._locations[index].term

    def sync(self) -> None:
        self.detach_sync()()

    def detach_sync(self) -> Callable[[], None]:
        """Take what `sync` would fsync as a job another thread may run while this one
        keeps appending: the job fsyncs duplicates of the dirty segments' files, so a
        segment closed meanwhile (a truncation) cannot make it fsync a reused descriptor.
        Writes made before the call are durable once the job returns. After a failed
        fsync every job fails: Linux marks the pages it could not write back clean, so a
        later fsync would succeed without them, and a checkpoint saved after it would vouch
        for entries the disk may not hold (a restart re-reads and re-checks the log)."""
        if self._sync_error:
            return self._failed_sync
        files = [self._files[start].dup() for start in sorted(self._dirty)]
        dir_dirty = self._dir_dirty
        self._dirty.clear()
        self._dir_dirty = False

        def job() -> None:
            try:
                for file in files:
                    file.fsync()
                if dir_dirty:
                    self._disk.fsync_dir(self._dir)
            except OSError as err:
                self._sync_error = (
                    f"fsync of the Raft log in {self._dir} failed "
                    f"({err.strerror or err}); nothing written since the "
                    f"last good sync counts as durable; {AFTER_FAILED_FSYNC}"
                )
                log.error("%s", self._sync_error)
                raise
            finally:
                for file in files:
                    file.close()

        return job

    def _failed_sync(self) -> None:
        raise OSError(errno.EIO, self._sync_error)

    def close(self) -> None:
        for file in self._files.values():
            file.close()
        self._files.clear()

    # ---- small state files ----------------------------------------------------------

    def save_hard_state(self, hard_state: HardState) -> None:
        self._replace_file(_HARD_STATE_FILE, [hard_state.term, hard_state.voted_for])

    def load_hard_state(self) -> HardState:
        fields = self._read_file(_HARD_STATE_FILE)
        return HardState() if fields is None else HardState(int(fields[0]), int(fields[1]))

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        self._replace_file(
            _CHECKPOINT_FILE, [checkpoint.ledger_end_index, checkpoint.committed_index]
        )

    def load_checkpoint(self) -> Checkpoint:
        fields = self._read_file(_CHECKPOINT_FILE)
        return Checkpoint() if fields is None else Checkpoint(int(fields[0]), int(fields[1]))

    def _replace_file(self, name: str, fields: list[int]) -> None:
        """Write-then-rename, so a crash leaves the old or the new file, never half of one."""
        payload = msgpack.packb(fields)
        atomic_write(
            self._disk, self._dir / name, _HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        )

    def _read_file(self, name: str) -> list[int] | None:
        path = self._dir / name
        if not self._disk.exists(path):
            return None
        data = self._disk.read_bytes(path)
        if len(data) < _HEADER.size:
            raise CorruptLogError(f"{path} is truncated")
        length, crc = _HEADER.unpack_from(data)
        payload = data[_HEADER.size : _HEADER.size + length]
        if len(payload) != length or zlib.crc32(payload) != crc:
            raise CorruptLogError(f"{path} fails its CRC")
        fields = msgpack.unpackb(payload)
        if not isinstance(fields, list):
            raise CorruptLogError(f"{path} does not hold a list of numbers")
        return fields
