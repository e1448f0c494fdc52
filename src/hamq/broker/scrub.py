"""Background scrub of the commit log's closed segments (ZFS scrub, HDFS's block scanner).

A read checks the records of a closed segment whose mtime moved since the log sealed it
(``record_repair``), but only the records a client reads: a byte flipped in a slave's
record nobody reads stays there, ready to be served once that slave is elected or copied
from. So each member looks at its closed segments every ``scrub_interval_ms``: one that
is not sealed (opened from disk) or whose mtime moved since is read and its records'
CRCs checked, at most ``SCRUB_BYTES_PER_PASS`` a pass, in a worker thread (the event loop
keeps serving). While one is found, the passes follow each other, each pausing three times
as long as its chunk took (a restarted member seals its segments in minutes, not hours).
A clean segment is sealed again (its reads skip the checks); a damaged record is refused
to readers like one a read found and repaired from another member's copy (the repair
moves the mtime, so the segment is checked once more, then sealed). A segment whose
damage no member can repair is not checked again until its mtime moves: a broker with
no peer counts and logs it once and never loops over it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from hamq.broker.record_repair import RecordRepair
from hamq.clock import monotonic_s
from hamq.errors import CrcMismatch
from hamq.net.tasks import PeriodicTask
from hamq.protocol.limits import MAX_MESSAGE_BYTES
from hamq.protocol.message import check_record_payload, parse_record_header
from hamq.store.commitlog import Segment
from hamq.store.disk import DiskFile
from hamq.store.message_store import MessageStore

log = logging.getLogger(__name__)

# Bytes read and checked per pass (a larger record is read whole): tens of ms of a worker.
SCRUB_BYTES_PER_PASS = MAX_MESSAGE_BYTES
CATCH_UP_PAUSE_FACTOR = 3  # pause after a chunk, in units of the time it took


@dataclass
class _Scan:
    """A closed segment being checked, and what its mtime was when the check began."""

    seg: Segment
    mtime: float
    pos: int  # next commit-log offset to check
    damaged: list[tuple[int, int]] = field(default_factory=list)  # (offset, size)


@dataclass(frozen=True)
class _Checked:
    """What a worker found in one chunk of a segment."""

    next_pos: int
    damaged: list[tuple[int, int]]
    unreadable: str  # a header that does not parse: the records after it cannot be found


class Scrubber:
    def __init__(self, store: MessageStore, repair: RecordRepair, interval_s: float) -> None:
        self.store = store
        self.repair = repair
        self.task = PeriodicTask("commit-log scrub", interval_s, self._pass)
        self._scan: _Scan | None = None
        # segment start -> the mtime at which it was checked and found damaged: not read
        # again until that changes (a repair, or more damage)
        self._checked_damaged: dict[int, float] = {}
        self.damaged_found = 0  # records (or unreadable headers) the scrub found damaged
        self.bytes_checked = 0
        self.segments_sealed = 0

    def start(self) -> None:
        self.task.start()

    async def stop(self) -> None:
        await self.task.stop()

    def info(self) -> dict[str, int]:
        return {
            "damaged_found": self.damaged_found,
            "damaged_now": len(self.store.damaged),
            "repaired": self.repair.repaired,
            "bytes_checked": self.bytes_checked,
            "segments_sealed": self.segments_sealed,
        }

    async def _pass(self) -> None:
        for phys, size in list(self.store.damaged.items()):  # unrepaired: one try a pass
            if phys >= self.store.commitlog.min_offset:  # else retention removed it
                self.repair.damaged(phys, size)
        scan = self._scan if self._scan is not None and self._current(self._scan) else None
        scan = scan or self._next_scan()
        self._scan = scan
        if scan is None:
            return
        # the worker owns a handle of its own (closed there, also when a stop cancels the
        # wait): retention may close the segment's meanwhile
        file = scan.seg.file.dup()
        started = monotonic_s()
        checked = await asyncio.to_thread(
            _check_chunk, file, scan.seg.start, scan.pos, scan.seg.end
        )
        # A restart leaves every closed segment unsealed (each read of them checked): the
        # next chunk follows after three times this one took, not a whole interval later,
        # so the scrub catches up using at most about a quarter of a worker.
        await asyncio.sleep(CATCH_UP_PAUSE_FACTOR * (monotonic_s() - started))
        self.task.wake()
        if not self._current(scan):  # changed under the check: it starts again
            self._scan = None
            return
        self.bytes_checked += checked.next_pos - scan.pos
        scan.pos = checked.next_pos
        for phys, size in checked.damaged:
            self._found(phys, size)
        scan.damaged += checked.damaged
        if checked.unreadable:
            self.damaged_found += 1
            log.error("scrub of commit log segment %s: %s", scan.seg.path.name, checked.unreadable)
        elif scan.pos < scan.seg.end:
            return
        self._scan = None
        if scan.damaged or checked.unreadable:
            self._checked_damaged[scan.seg.start] = scan.mtime
        elif self.store.commitlog.seal(scan.seg, scan.mtime):
            self._checked_damaged.pop(scan.seg.start, None)
            self.segments_sealed += 1

    def _current(self, scan: _Scan) -> bool:
        """Whether the segment is still a closed one of the log, unchanged since its check
        began."""
        log_ = self.store.commitlog
        closed = log_.segments[:-1]
        return (
            any(seg is scan.seg for seg in closed) and log_.disk.mtime(scan.seg.path) == scan.mtime
        )

    def _next_scan(self) -> _Scan | None:
        """The first closed segment not sealed at its present mtime, nor checked damaged at
        it."""
        log_ = self.store.commitlog
        for seg in log_.segments[:-1]:
            mtime = log_.disk.mtime(seg.path)
            if mtime != seg.sealed_mtime and mtime != self._checked_damaged.get(seg.start):
                return _Scan(seg, mtime, seg.start)
        return None

    def _found(self, phys: int, size: int) -> None:
        """A damaged record: refused to readers from now on (the store's ``damaged``), and
        repaired from another member's copy."""
        self.damaged_found += 1
        if phys not in self.store.damaged:
            self.store.damaged[phys] = size
            log.error(
                "scrub found the commit log record at %d (%d bytes) damaged: CRC mismatch",
                phys,
                size,
            )
        self.repair.damaged(phys, size)


def _check_chunk(file: DiskFile, seg_start: int, pos: int, seg_end: int) -> _Checked:
    """Check the records from ``pos`` in about ``SCRUB_BYTES_PER_PASS`` of the segment
    (runs in a worker thread: reads and CRCs only); closes ``file``."""
    try:
        return _check_records(file, seg_start, pos, seg_end)
    finally:
        file.close()


def _check_records(file: DiskFile, seg_start: int, pos: int, seg_end: int) -> _Checked:
    buf = file.pread(min(SCRUB_BYTES_PER_PASS, seg_end - pos), pos - seg_start)
    rel, damaged = 0, []
    while pos + rel < seg_end:
        try:
            header = parse_record_header(buf, rel)
            if header.physical_offset != pos + rel:
                raise CrcMismatch("record physical offset does not match its position")
        except CrcMismatch as err:
            if rel and pos + len(buf) < seg_end:
                break  # maybe cut by the chunk's end: the next pass starts with it
            return _Checked(pos + rel, damaged, f"record at {pos + rel}: {err.message}")
        if rel + header.total_size > len(buf):
            if rel:
                break
            buf = file.pread(header.total_size, pos - seg_start)  # larger than a chunk
        try:
            check_record_payload(buf, rel, header)
        except CrcMismatch:
            damaged.append((pos + rel, header.total_size))
        rel += header.total_size
    return _Checked(pos + rel, damaged, "")
