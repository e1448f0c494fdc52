"""The message store: commit log + consume queues + recovery + retention + disk guard.

Synchronous and single-threaded by design (it runs on the broker's event loop); the only
work handed to a thread is ``fsync`` (see ``flush.py``). Consume-queue entries are written
inline at append time, so a send is readable as soon as its response is sent.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import NamedTuple, NoReturn
from zlib import crc32

from hamq.clock import wall_ms
from hamq.config import StoreConfig
from hamq.errors import BrokerSystemError, CrcMismatch, DiskFull, QueueNotExist
from hamq.protocol.message import (
    HEADER_CRC_FROM,
    RECORD_FIXED_HEADER,
    RECORD_HEADER_BYTES,
    RECORD_MAGIC,
    encode_record_header,
    validate_topic,
)
from hamq.store.commitlog import CommitLog
from hamq.store.consume_queue import ConsumeQueue
from hamq.store.disk import AFTER_FAILED_FSYNC, OS_DISK, Disk, atomic_write
from hamq.store.epoch_file import EpochFile
from hamq.store.metadata import ConsumerOffsetManager, TopicConfigManager

log = logging.getLogger(__name__)

_OWN_FIELDS = ("dispatched", "flushed", "timestamp_ms")  # the store's checkpoint fields
UNCAPPED = (1 << 63) - 1  # a read cap no log reaches


class GetStatus(Enum):
    FOUND = "FOUND"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"  # caught up: wait for new messages
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # asked past the end
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"  # asked below the retained minimum


class PutResult(NamedTuple):  # a tuple: built once per send on the hot path
    physical_offset: int
    base_queue_offset: int
    store_timestamp_ms: int
    end_offset: int  # commit-log offset after this record: what flush/replication wait for


@dataclass(frozen=True)
class GetResult:
    status: GetStatus
    records: bytes | bytearray  # whole stored records, read in place (see _read_entries)
    next_begin_offset: int
    min_offset: int
    max_offset: int
    message_count: int = 0


class WritesUndone(DiskFull):
    """A write failed and the store undid every append since the last ``commit`` (the
    turn), those a segment roll had already written included: a caller that counts the
    turn's earlier puts as stored (DLedger's applied index) must go back to that commit."""


class MessageStore:
    def __init__(
        self, config: StoreConfig, clock_ms: Callable[[], int] = wall_ms, *, disk: Disk = OS_DISK
    ) -> None:
        self.config = config
        self.clock_ms = clock_ms
        self.disk = disk
        self.root = Path(config.store_dir)
        disk.mkdir(self.root)
        self.commitlog = CommitLog(
            self.root / "commitlog",
            config.mapped_file_size_commitlog,
            disk=disk,
            checkpoint_flushed=self.read_checkpoint().get("flushed", 0),
        )
        self.cq_root = self.root / "consumequeue"
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.topics = TopicConfigManager(self.root, clock_ms(), disk=disk)
        self.offsets = ConsumerOffsetManager(self.root, clock_ms(), disk=disk)
        self._touched: list[ConsumeQueue] = []
        self._turn_start = 0  # where this turn's first append went (while _touched has any)
        # A checkpoint is written (maybe in a worker thread) only once every queue file
        # written before it was taken is fsynced: _unsynced counts the writes per file (or
        # directory) since its last fsync. Candidates are numbered so an older one never
        # replaces a newer one, and a failed fsync stops checkpoints until a restart.
        self._checkpoint_lock = threading.Lock()
        self._unsynced_lock = threading.Lock()
        self._unsynced: dict[Path, int] = {}
        self._candidate: tuple[int, dict] = (0, {})
        self._written_candidate = 0
        self._queue_fsync_error = ""
        # Extra state to record with each checkpoint, read at the same instant as the log
        # offsets (DLedger: the Raft index applied up to that offset).
        self.checkpoint_extra: Callable[[], dict] | None = None
        # Progress kept outside the store that counts records (delay delivery, pop state):
        # told when consumer offsets are clamped (clamp_progress).
        self.after_cut: list[Callable[[], None]] = []
        self._carried_extra: dict = {}
        # queues whose file (and topic directory) no checkpoint has fsynced the directory
        # entry of: a power loss could drop the file the checkpoint vouches for
        self._new_queues: list[ConsumeQueue] = []
        self._replica_tail = bytearray()
        self._disk_refusal = ""  # why writes are refused right now, "" when they are not
        self._written_since_disk_check = 0
        self._free_bytes_at_check = 0
        # Controller mode: readers never get records past this commit-log offset (the
        # confirm offset, held by the whole SyncStateSet), so a message a consumer saw is
        # never cut by a failover. Set by HA (``set_read_cap``); listeners wake held reads.
        self.read_cap = UNCAPPED
        # Sync flush: nor past what fsyncs made durable (``set_durable_cap``), so a message
        # a consumer saw is never taken by a power loss before its send was acknowledged.
        self.durable_cap = UNCAPPED
        self.reads_end = UNCAPPED  # the lower of the two: where every reader stops
        self.read_cap_listeners: list[Callable[[], None]] = []
        # Records of closed segments found damaged (bit rot: a payload that fails its CRC),
        # by commit-log offset -> size: never served; ``on_damaged`` listeners (the broker's
        # repair from a replica) are told of each once; ``damaged_reads`` counts refusals.
        self.damaged: dict[int, int] = {}
        self.on_damaged: list[Callable[[int, int], None]] = []
        self.damaged_reads = 0
        self.recover()
        # The master epochs this log holds (``store/epoch_file.py``). After a power loss the
        # log can end before an epoch the fsynced file names: that epoch holds nothing here.
        self.epochs = EpochFile(self.root / "epoch", disk)
        self.epochs.truncate_suffix_from(self.commitlog.max_offset + 1)
        self.check_disk()

    # -- recovery -----------------------------------------------------------------------
    def recover(self) -> None:
        """Load consume queues, then re-dispatch and validate the commit log from the last
        checkpoint: a torn or corrupt tail past its fsynced offset is truncated, missing
        queue entries rebuilt; a log missing or damaged below that offset is refused."""
        checkpoint = self.read_checkpoint()
        # What others claimed in it (DLedger's applied pair) stays claimed by the
        # checkpoints this recovery writes, until its owner installs checkpoint_extra:
        # otherwise a restart would forget how far the store had applied.
        self._carried_extra = {k: v for k, v in checkpoint.items() if k not in _OWN_FIELDS}
        # What a killed process created or removed in these directories is durable only once
        # they are synced: a power loss must not bring back a queue file this recovery
        # found removed (a topic delete cut short) under a topic sent to again.
        for topic in self.disk.listdir(self.cq_root):
            for name in self.disk.listdir(self.cq_root / topic):
                if name.isdigit():
                    self._queue(topic, int(name))
            self.disk.fsync_dir(self.cq_root / topic)
        if self.disk.is_dir(self.cq_root):
            self.disk.fsync_dir(self.cq_root)
        # Queue files are trusted up to "dispatched", the log's bytes up to "flushed".
        dispatched, flushed = checkpoint.get("dispatched", 0), checkpoint.get("flushed", 0)
        for cq in self.queues.values():  # entries no checkpoint vouched for: rebuilt below
            cq.drop_from_physical(dispatched)
        start = max(min(dispatched, flushed), self.commitlog.min_offset)
        if start > self.commitlog.written_offset:
            self._refuse_lost_data(self.commitlog.written_offset, flushed, "ends")
        rebuilt = 0
        for phys, h, _ in self.commitlog.iter_records(start):
            if phys < dispatched:
                # only checked: its queue file holds it already, or its topic was deleted
                continue
            cq = self._queue(h.topic, h.queue_id)
            if cq.max_physical_end <= phys:
                cq.append(phys, h.total_size, h.base_queue_offset, h.count, h.store_timestamp_ms)
                rebuilt += 1
        valid_end = self.commitlog.scan_stopped_at
        self.damaged.update(self.commitlog.damaged)
        if valid_end < flushed:
            self._refuse_lost_data(valid_end, flushed, "has a bad record at")
        if valid_end < self.commitlog.written_offset:
            log.warning(
                "truncating torn commit log tail: %d bytes at %d",
                self.commitlog.written_offset - valid_end,
                valid_end,
            )
            self.commitlog.truncate(valid_end)
        for cq in self.queues.values():
            cq.drop_from_physical(self.commitlog.written_offset)
            cq.drop_below_physical(self.commitlog.min_offset)
        if rebuilt:
            log.info("recovery rebuilt %d consume-queue entries from offset %d", rebuilt, start)
        self.flush_consume_queues()

    def _refuse_lost_data(self, offset: int, flushed: int, what: str) -> None:
        """A cut lowers the checkpoint before it cuts (see ``_lower_checkpoint``), so bytes
        missing or damaged below its fsynced offset were lost by the disk, not by a crash:
        cutting there would silently drop acknowledged messages."""
        raise BrokerSystemError(
            f"commit log in {self.commitlog.directory} {what} offset {offset}, below offset "
            f"{flushed} that the checkpoint says was fsynced: the disk lost or damaged "
            f"confirmed data; refusing to start (nothing was changed)"
        )

    # -- writing ------------------------------------------------------------------------
    def put_batch(
        self,
        topic: str,
        queue_id: int,
        payload: bytes | memoryview,
        count: int,
        payload_crc: int,
        born_timestamp_ms: int,
        sys_flag: int = 0,
        store_timestamp_ms: int | None = None,
    ) -> PutResult:
        """Append one producer batch (already validated) as one record. DLedger passes the
        leader's ``store_timestamp_ms`` so every member writes identical bytes."""
        if self._disk_refusal:
            raise DiskFull(self._disk_refusal)
        cq = self._queue(topic, queue_id)
        topic_raw = topic.encode()
        store_ts = self.clock_ms() if store_timestamp_ms is None else store_timestamp_ms
        base = cq.max_offset
        total = RECORD_HEADER_BYTES + len(topic_raw) + len(payload)
        try:
            phys = self.commitlog.reserve(total)
        except OSError as exc:  # a segment roll writes this turn's appends first
            touched, self._touched = self._touched, []
            self._undo_failed_write(touched, exc)
        header = encode_record_header(
            topic_raw,
            queue_id,
            len(payload),
            payload_crc,
            count,
            base,
            phys,
            store_ts,
            born_timestamp_ms,
            sys_flag,
        )
        if not self._touched:
            self._turn_start = phys
        self.commitlog.append([header, payload], total)
        cq.append(phys, total, base, count, store_ts)
        self._touched.append(cq)
        self._written_since_disk_check += total
        return PutResult(phys, base, store_ts, phys + total)

    def commit(self) -> None:
        """Write every append of this event-loop turn in one system call. On failure (disk
        full) the appends are undone, so nothing half-written is ever acknowledged."""
        touched, self._touched = self._touched, []
        if not touched:
            return
        try:
            self.commitlog.write_pending()
        except OSError as exc:
            self._undo_failed_write(touched, exc)
        if (
            self._free_bytes_at_check - self._written_since_disk_check
            < self.config.disk_min_free_bytes
        ):
            self.check_disk()

    def _undo_failed_write(self, touched: list[ConsumeQueue], exc: OSError) -> NoReturn:
        """A failed write undoes the whole turn (``WritesUndone``), so that its callers can
        go back to their last ``commit``: the appends past the log's end, their queue
        entries (they would point at the next records written there), and what a segment
        roll already wrote of the turn. Writes are refused until a disk check finds room."""
        self._disk_refusal = f"write to commit log failed: {exc.strerror or exc}"
        log.error("%s; refusing writes until the next disk check", self._disk_refusal)
        if not touched:
            raise DiskFull(self._disk_refusal) from None
        if self.commitlog.written_offset > self._turn_start:
            self.commitlog.truncate(self._turn_start)  # nothing past it was fsynced yet
        for cq in touched:
            cq.drop_from_physical(self.commitlog.written_offset)
        raise WritesUndone(
            f"{self._disk_refusal}; this turn's earlier uncommitted writes were undone"
        ) from None

    @property
    def durable_offset(self) -> int:
        """Commit-log offset up to which every byte is fsynced (what a power loss keeps)."""
        return self.commitlog.flushed_offset

    # -- replication (slave side) ----------------------------------------------------------
    @property
    def replica_offset(self) -> int:
        """Where the next replicated bytes must start: the log end plus any partial record
        held in memory."""
        return self.commitlog.max_offset + len(self._replica_tail)

    def append_replicated(self, offset: int, data: bytes) -> list[tuple[str, int]]:
        """Append raw commit-log bytes shipped by the master at ``offset``. Complete records
        are checked, appended whole (so segments roll at record boundaries, as recovery
        expects) and indexed; a partial last record waits in memory for the rest. Returns
        the (topic, queue) pairs that got messages. A corrupt record raises ``CrcMismatch``
        after the records before it are stored; it and what follows are dropped (the slave
        attaches again from its log's end)."""
        if offset != self.replica_offset:
            raise CrcMismatch(
                f"replicated bytes start at {offset}, expected "
                f"{self.replica_offset}: the stream has a gap"
            )
        # The tail grows in place: a record shipped in many small pieces is copied once,
        # not once per piece.
        buf: bytes | bytearray = data
        if self._replica_tail:
            self._replica_tail += data
            buf = self._replica_tail
        arrived: list[tuple[str, int]] = []
        try:
            pos = self._append_replicated_records(buf, arrived)
        except OSError:  # the log kept only what it wrote whole: so do the queues
            for topic, queue_id in arrived:
                self.queues[(topic, queue_id)].drop_from_physical(self.commitlog.written_offset)
            self._replica_tail = bytearray()
            raise
        except CrcMismatch:
            self._replica_tail = bytearray()
            raise
        if buf is self._replica_tail:
            del self._replica_tail[:pos]  # the records appended were copied out of it
        else:
            self._replica_tail = bytearray(buf[pos:])
        return arrived

    def _append_replicated_records(
        self, buf: bytes | bytearray, arrived: list[tuple[str, int]]
    ) -> int:
        """Append and index the whole records of ``buf`` (``arrived`` names their queues);
        returns where the first partial record starts. A transfer is a master's log as it
        is, so its records go to the log in one write (one per segment when one fills) and
        each queue's entries in one ``append_many``: per record only its header is read and
        both CRCs checked, on views of ``buf`` (nothing copied)."""
        view = memoryview(buf)
        end = len(buf)
        commitlog = self.commitlog
        at = commitlog.max_offset  # where the next record lands
        roll_at = commitlog.segments[-1].start + commitlog.segment_bytes
        runs: dict[tuple[bytes, int], _ReplicatedRun] = {}
        pos = taken = 0  # buf positions: the next record, the first not handed to the log
        try:
            while end - pos >= RECORD_HEADER_BYTES:
                (magic, header_crc, size, payload_crc, phys, base, store_ts, _, count, _, queue_id,
                 topic_len) = RECORD_FIXED_HEADER.unpack_from(view, pos)  # fmt: skip
                payload = pos + RECORD_HEADER_BYTES + topic_len
                if end < payload:
                    break
                if (
                    magic != RECORD_MAGIC
                    or crc32(view[pos + HEADER_CRC_FROM : payload]) != header_crc
                    or size < payload - pos
                ):
                    raise CrcMismatch(f"replicated record at {at} has a corrupt header")
                if end - pos < size:
                    break
                if crc32(view[payload : pos + size]) != payload_crc:
                    raise CrcMismatch(f"replicated record at {at}: payload CRC mismatch")
                if phys != at:
                    raise CrcMismatch(f"replicated record claims offset {phys} but lands at {at}")
                key = (bytes(view[pos + RECORD_HEADER_BYTES : payload]), queue_id)
                run = runs.get(key)
                if run is None or base < run.next_base:
                    cq = run.cq if run else self._queue(key[0].decode(), queue_id)
                    if base < (run.next_base if run else cq.max_offset):
                        self._hand_over(view, taken, pos, runs, arrived)
                        commitlog.write_pending()
                        taken = pos
                        self._restart_replicated_queue(cq, base, at)
                    run = runs[key] = _ReplicatedRun(cq)
                if at + size > roll_at:  # the record may start a segment: the log decides
                    self._hand_over(view, taken, pos, runs, arrived)
                    taken = pos
                    commitlog.reserve(size)
                    roll_at = commitlog.segments[-1].start + commitlog.segment_bytes
                    run = runs[key] = _ReplicatedRun(run.cq)
                run.entries += (at, size, base, count, store_ts)
                run.next_base = base + count
                at += size
                pos += size
        finally:  # what was checked is stored, even when a later record is corrupt
            self._hand_over(view, taken, pos, runs, arrived)
            commitlog.write_pending()
        return pos

    def _hand_over(
        self,
        view: memoryview,
        start: int,
        end: int,
        runs: dict[tuple[bytes, int], _ReplicatedRun],
        arrived: list[tuple[str, int]],
    ) -> None:
        """Records ``view[start:end]`` (checked) to the log's pending write, their entries
        (``runs``, emptied) to their queues."""
        if end > start:
            self.commitlog.append([view[start:end]], end - start)
        for run in runs.values():
            if run.entries:
                run.cq.append_many(run.entries)
                arrived.append((run.cq.topic, run.cq.queue_id))
        runs.clear()

    def _restart_replicated_queue(self, cq: ConsumeQueue, base: int, at: int) -> None:
        """A replicated record starts its queue's offsets again: the master deleted the
        topic and created it anew after this queue's last record (a delete travels in no
        record). Its entries belong to the deleted topic, and go as they did on the master.
        The checkpoint first vouches for every record before this one, so a restart never
        indexes the deleted topic's records again."""
        log.warning(
            "replicated %s:%d goes back to queue offset %d at %d: the master deleted "
            "and re-created the topic; dropping %d entries of the old one",
            cq.topic,
            cq.queue_id,
            base,
            at,
            len(cq),
        )
        self.flush_consume_queues()
        cq.drop_from_physical(0)

    def reset_log(self, agreed: int, start: int) -> None:
        """Slave attaching to its master (see ``replication/slave.py``): its log agrees with
        the master's up to ``agreed``; what follows differs and is cut, with its queue
        entries. A ``start`` other than ``agreed`` (the master keeps nothing that old), or
        an ``agreed`` that retention removed during the handshake, restarts the log empty
        at ``start``: nothing in it was found to agree, so nothing is kept, even where it
        reaches past ``start``. A partial record held in memory is dropped either way."""
        self._replica_tail = bytearray()
        if start == agreed >= self.commitlog.min_offset:
            if start == self.commitlog.max_offset:
                return
            self.truncate_to(start)
        else:
            # Its segments go before the new one exists: a restart in between finds no log
            # at all, which the checkpoint must not call a loss of fsynced bytes.
            self._lower_checkpoint(0)
            self.commitlog.reset(start)
            for cq in self.queues.values():
                cq.drop_from_physical(0)
            self.epochs.truncate_suffix_from(0)
        # The checkpoint must not vouch for offsets past the cut: new, different records
        # will be written there.
        self.flush_consume_queues()
        # Nor may consumer offsets and delay progress: past the cut, they would skip those
        # records (this member serves them once it is master again).
        self.clamp_progress()

    def clamp_progress(self) -> None:
        """Consumer offsets, and the progress kept outside the store (``after_cut``), past
        their queues' ends go back to them: they count records this log does not hold."""
        self.offsets.clamp(self.max_offset, self.clock_ms())
        for callback in self.after_cut:
            callback()

    # -- reading ------------------------------------------------------------------------
    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        *,
        past_durable: bool = False,
    ) -> GetResult:
        """``past_durable``: the broker reading its own log (a timer or delay re-put, a
        revive, a state replay) may pass the durable cap, whose records only a power loss
        could take: what it writes from them lands later in the log, so it is served and
        acknowledged only once they are fsynced too. Consumers never pass it."""
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, b"", 0, 0, 0)
        lo, hi = cq.min_offset, cq.max_offset
        n_entries = len(cq)
        cap = self.read_cap if past_durable else self.reads_end
        if cap != UNCAPPED and cq.max_physical_end > cap:  # one comparison unless capped
            n_entries = self._entries_below_cap(cq, cap)
            capped_hi = cq.base[n_entries] if n_entries < len(cq) else hi
            if capped_hi <= offset <= hi:
                # not confirmed yet: as if it were not written (a consumer may already
                # stand there: it came from a member that knew a later confirm offset)
                return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, b"", offset, lo, capped_hi)
            hi = capped_hi
        if hi == lo:
            status = (
                GetStatus.NO_MESSAGE_IN_QUEUE if offset <= hi else GetStatus.OFFSET_OVERFLOW_BADLY
            )
            return GetResult(status, b"", hi if offset != hi else offset, lo, hi)
        if offset < lo:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, b"", lo, lo, hi)
        if offset == hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, b"", offset, lo, hi)
        if offset > hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, b"", hi, lo, hi)
        first = cq.locate(offset)
        last = first
        messages = cq.base[first] + cq.count[first] - offset
        nbytes = cq.size[first]
        while last + 1 < n_entries and messages < max_messages and nbytes < max_bytes:
            last += 1
            messages += cq.count[last]
            nbytes += cq.size[last]
        records = self._read_entries(cq, first, last)
        if cq.phys[first] < self.commitlog.active_start and not self.commitlog.sealed(
            cq.phys[first], cq.phys[last] + cq.size[last]
        ):  # one comparison at the log's head; one stat below it unless changed
            good = self._check_closed(cq, first, last, records)
            if good <= last:  # what precedes the damaged record is served
                last = good - 1
                del records[sum(cq.size[first:good]) :]
                messages = cq.base[last] + cq.count[last] - offset
        return GetResult(GetStatus.FOUND, records, cq.base[last] + cq.count[last], lo, hi, messages)

    def _check_closed(self, cq: ConsumeQueue, first: int, last: int, records: bytearray) -> int:
        """Check the CRCs of the records read from closed segments not sealed (opened from
        disk, or changed since: bit rot, a stray write; the segment being appended to was
        just written and is checked on recovery); returns the index of the first damaged
        entry (``last + 1``: none). A
        damaged first record raises ``CrcMismatch``: it is never handed out."""
        active = self.commitlog.active_start
        pos = 0
        with memoryview(records) as view:  # released before the caller shortens records
            for i in range(first, last + 1):
                phys, size = cq.phys[i], cq.size[i]
                if phys >= active:
                    break
                if phys in self.damaged or not _record_intact(view, pos, phys, size):
                    self._found_damaged(phys, size)
                    if i == first:
                        raise CrcMismatch(
                            f"record at commit-log offset {phys} ({cq.topic}:{cq.queue_id} "
                            f"offset {cq.base[i]}) is damaged on this broker's disk (CRC "
                            "mismatch); it is repaired from a replica when one holds it"
                        )
                    return i
                pos += size
        return last + 1

    def _found_damaged(self, phys: int, size: int) -> None:
        """Count a refused read; tell the listeners at each (a repair that failed is tried
        again by the next read), log it once."""
        self.damaged_reads += 1
        if phys not in self.damaged:
            self.damaged[phys] = size
            log.error("commit log record at %d (%d bytes) is damaged: CRC mismatch", phys, size)
        for listener in self.on_damaged:
            listener(phys, size)

    def repair_record(self, phys: int, record: bytes | bytearray) -> None:
        """Put back a damaged record from a replica's copy, once it is checked to be that
        record whole (replicas hold byte-identical logs)."""
        size = self.damaged.get(phys)
        if size is None:
            return
        if len(record) != size or not _record_intact(memoryview(record), 0, phys, size):
            raise CrcMismatch(f"a replica's copy of the record at {phys} is not that record")
        self.commitlog.repair(phys, record)
        del self.damaged[phys]
        log.warning("commit log record at %d repaired from a replica's copy", phys)

    def _entries_below_cap(self, cq: ConsumeQueue, cap: int) -> int:
        """How many of a queue's entries end at or below ``cap``."""
        n = bisect_left(cq.phys, cap)
        while n and cq.phys[n - 1] + cq.size[n - 1] > cap:
            n -= 1
        return n

    def readable_max_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset readers may reach now: the queue's max offset, or less while
        the read cap holds some of its records back."""
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            return 0
        if cq.max_physical_end <= self.reads_end:
            return cq.max_offset
        n = self._entries_below_cap(cq, self.reads_end)
        return cq.base[n] if n < len(cq) else cq.max_offset

    def set_read_cap(self, offset: int) -> None:
        """Readers may read records ending at or below ``offset`` (UNCAPPED: all) as far
        as replication goes."""
        self.read_cap = offset
        self._caps_changed()

    def set_durable_cap(self, offset: int) -> None:
        """Readers may read records ending at or below ``offset`` as far as fsyncs go."""
        self.durable_cap = offset
        self._caps_changed()

    def _caps_changed(self) -> None:
        """A ``reads_end`` that rose wakes the readers held for records it now lets through."""
        end = min(self.read_cap, self.durable_cap)
        rose = end > self.reads_end
        self.reads_end = end
        if rose:
            for listener in self.read_cap_listeners:
                try:
                    listener()
                except Exception:  # the group commit raises the cap: it must go on
                    log.exception("a reader woken by the read cap failed")

    def _read_entries(self, cq: ConsumeQueue, first: int, last: int) -> bytearray:
        """Read records first..last of a queue into one buffer; records that follow each
        other in the commit log (the usual case for one queue) are read with one call."""
        total = sum(cq.size[first : last + 1])
        records = bytearray(total)
        view = memoryview(records)
        pos = 0
        run_start, run_len = cq.phys[first], 0
        for i in range(first, last + 1):
            phys, size = cq.phys[i], cq.size[i]
            if phys != run_start + run_len:
                self.commitlog.read_into(run_start, view[pos : pos + run_len])
                pos += run_len
                run_start, run_len = phys, 0
            run_len += size
        self.commitlog.read_into(run_start, view[pos : pos + run_len])
        return records

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            raise QueueNotExist(f"no queue {queue_id} of topic {topic!r} on this broker")
        return cq

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.max_offset if cq is not None else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.min_offset if cq is not None else 0

    def offset_by_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.offset_by_timestamp(ts_ms) if cq is not None else 0

    def earliest_store_time_ms(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.store_ts[0] if cq and len(cq) else -1

    # -- topics ---------------------------------------------------------------------------
    def delete_topic(self, topic: str) -> None:
        """Forget a topic's queues and offsets; its records age out with their segments."""
        self.flush_consume_queues()
        for key in [k for k in self.queues if k[0] == topic]:
            del self.queues[key]
        self._new_queues = [cq for cq in self._new_queues if cq.topic != topic]
        directory = self.cq_root / validate_topic(topic).decode()  # never outside it
        # durably gone before a checkpoint claims the delete: a queue file back after a
        # power loss would make the topic's next messages continue its old offsets
        if self.disk.is_dir(directory):
            for name in self.disk.listdir(directory):
                self.disk.unlink(directory / name)
            self.disk.fsync_dir(directory)
            self.disk.rmtree(directory)
            self.disk.fsync_dir(self.cq_root)
        self.offsets.delete_topic(topic, self.clock_ms())
        self.offsets.persist()

    # -- background duties (driven by flush.py's services) --------------------------------
    def write_consume_queues(self) -> list[Path]:
        """Hand new queue entries to the OS and take a checkpoint candidate; returns the
        files (and directories) to fsync before ``write_checkpoint`` may claim them."""
        self.commitlog.write_pending()
        candidate = {
            "dispatched": self.commitlog.written_offset,
            "flushed": self.commitlog.flushed_offset,
            **(self.checkpoint_extra() if self.checkpoint_extra else self._carried_extra),
        }
        paths: list[Path] = []
        try:
            for cq in self.queues.values():
                if cq.write_unwritten():
                    paths.append(cq.path)
        finally:  # what reached a file waits for its fsync, even if a later write failed
            self._mark_unsynced(paths)
        created = [cq for cq in self._new_queues if self.disk.exists(cq.path)]
        if created:
            self._new_queues = [cq for cq in self._new_queues if cq not in created]
            directories = [*sorted({cq.path.parent for cq in created}), self.cq_root]
            self._mark_unsynced(directories)
            paths += directories
        # published only now: a checkpoint must not claim entries a failed write left out
        self._candidate = (self._candidate[0] + 1, candidate)
        return paths

    def _mark_unsynced(self, paths: list[Path]) -> None:
        with self._unsynced_lock:
            for path in paths:
                self._unsynced[path] = self._unsynced.get(path, 0) + 1

    def sync_files(self, paths: list[Path]) -> None:
        """fsync the queue files (and directories) ``write_consume_queues`` returned; a
        file whose topic was deleted meanwhile is skipped. May run in a worker thread. A
        failure is for good (see ``CommitLog.fsync_error``): no checkpoint is written again,
        so recovery rebuilds these entries from the commit log."""
        for path in paths:
            with self._unsynced_lock:
                writes = self._unsynced.get(path)
            try:
                self._fsync(path)
            except OSError as err:
                self._queue_fsync_error = (
                    f"fsync of {path} failed ({err.strerror or err}); "
                    f"no checkpoint is written; {AFTER_FAILED_FSYNC}"
                )
                log.error("%s", self._queue_fsync_error)
                raise
            with self._unsynced_lock:
                if self._unsynced.get(path) == writes:  # nothing written since
                    self._unsynced.pop(path, None)

    def _fsync(self, path: Path) -> None:
        if self.disk.is_dir(path):
            self.disk.fsync_dir(path)
            return
        try:
            file = self.disk.open(path, create=False)
        except FileNotFoundError:
            return
        try:
            file.fsync()
        finally:
            file.close()

    def write_checkpoint(self) -> None:
        """Write the newest candidate, after fsyncing whatever queue file is still unsynced
        (another thread's ``sync_files`` may not have run yet); an older candidate than the
        one on disk is not written. May run in a worker thread."""
        with self._checkpoint_lock:
            if self._queue_fsync_error:
                raise OSError(errno.EIO, self._queue_fsync_error)
            number, candidate = self._candidate
            if number <= self._written_candidate:
                return
            with self._unsynced_lock:
                paths = list(self._unsynced)
            self.sync_files(paths)
            atomic_write(
                self.disk,
                self.root / "checkpoint",
                json.dumps({**candidate, "timestamp_ms": self.clock_ms()}).encode(),
            )
            self._written_candidate = number

    def _lower_checkpoint(self, offset: int) -> None:
        """Before the log is cut at ``offset``: the checkpoint stops vouching for the bytes
        past it as fsynced first, so a power loss between the cut and the checkpoint after
        it does not look like a disk that lost fsynced data (recovery refuses that).
        "dispatched" stays: should the cut not reach the disk, records below it (a deleted
        topic's) must not be dispatched again; nothing is written past the cut before the
        checkpoint that follows it. Candidates taken before the cut are never written."""
        with self._checkpoint_lock:
            self._written_candidate = self._candidate[0]
            checkpoint = self.read_checkpoint()
            lowered = {**checkpoint, "flushed": min(checkpoint.get("flushed", 0), offset)}
            if lowered != checkpoint:
                atomic_write(self.disk, self.root / "checkpoint", json.dumps(lowered).encode())

    @property
    def fsync_error(self) -> str:
        """Why nothing more may be claimed durable (until a restart), "" if nothing failed."""
        return self.commitlog.fsync_error or self._queue_fsync_error

    def flush_consume_queues(self) -> None:
        """Synchronous ``write_consume_queues`` + fsync + ``write_checkpoint``."""
        self.sync_files(self.write_consume_queues())
        self.write_checkpoint()

    def delete_expired(self) -> None:
        cutoff_s = self.clock_ms() / 1000 - self.config.file_reserved_hours * 3600
        new_min = self.commitlog.delete_segments_before(cutoff_s)
        for cq in self.queues.values():
            cq.drop_below_physical(new_min)
        self.epochs.truncate_prefix_to(new_min)

    def check_disk(self) -> None:
        total, free = self.disk.usage(self.root)
        self._free_bytes_at_check = free
        self._written_since_disk_check = 0
        ratio = (total - free) / total if total else 0.0
        if self.fsync_error:
            self._disk_refusal = f"{self.fsync_error}; writes refused"
        elif free < self.config.disk_min_free_bytes:
            self._disk_refusal = (
                f"disk nearly full: {free // (1024 * 1024)} MiB free at "
                f"{self.root}, below disk_min_free_bytes="
                f"{self.config.disk_min_free_bytes}; writes refused"
            )
        elif ratio > self.config.disk_max_used_space_ratio:
            self._disk_refusal = (
                f"disk {ratio:.0%} used at {self.root}, above "
                f"disk_max_used_space_ratio="
                f"{self.config.disk_max_used_space_ratio}; writes refused"
            )
        else:
            if self._disk_refusal:
                log.info("disk has room again; accepting writes")
            self._disk_refusal = ""

    def close(self) -> None:
        try:
            self.commitlog.write_pending()
            self.commitlog.flush()
            self.flush_consume_queues()
            self.offsets.persist()
        finally:  # after a failed fsync too: no file is left open
            self.commitlog.close()

    # -- internals ------------------------------------------------------------------------
    def create_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        validate_topic(topic)
        return self._queue(topic, queue_id)

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            directory = self.cq_root / validate_topic(topic).decode()  # no name leaves it
            self.disk.mkdir(directory)
            cq = ConsumeQueue(directory / str(queue_id), topic, queue_id, disk=self.disk)
            self.queues[(topic, queue_id)] = cq
            self._new_queues.append(cq)
        return cq

    def truncate_to(self, offset: int) -> None:
        """Forget everything stored at and after ``offset`` (DLedger: state past the last
        checkpoint is rebuilt by applying the committed log again). Refused (by
        ``CommitLog.truncate``, before anything changes) below the log's first retained
        byte: the records between would be gone, and the queue offsets they had with them.
        The checkpoint is rewritten at once: its fsynced offset must not vouch for the
        different records that will be written past the cut."""
        self.commitlog.check_cut(offset)
        self._lower_checkpoint(offset)
        self.commitlog.truncate(offset)
        for cq in self.queues.values():
            cq.drop_from_physical(offset)
        self.epochs.truncate_suffix_from(offset)  # epochs starting there hold nothing now
        self.flush_consume_queues()

    def read_checkpoint(self) -> dict:
        try:
            return json.loads(self.disk.read_bytes(self.root / "checkpoint"))
        except (OSError, ValueError):
            return {}


def _record_intact(view: memoryview, pos: int, phys: int, size: int) -> bool:
    """Whether ``view[pos:pos + size]`` is the whole record stored at ``phys``: magic,
    both CRCs, and the offset and size it records."""
    if size < RECORD_HEADER_BYTES or len(view) < pos + size:
        return False
    (magic, header_crc, total, payload_crc, at, _, _, _, _, _, _, topic_len) = (
        RECORD_FIXED_HEADER.unpack_from(view, pos)
    )
    payload = pos + RECORD_HEADER_BYTES + topic_len
    return (
        magic == RECORD_MAGIC
        and total == size
        and at == phys
        and payload <= pos + size
        and crc32(view[pos + HEADER_CRC_FROM : payload]) == header_crc
        and crc32(view[payload : pos + size]) == payload_crc
    )


@dataclass(slots=True)
class _ReplicatedRun:
    """One queue's entries among a transfer's records not yet handed to the log."""

    cq: ConsumeQueue
    entries: list[int] = field(default_factory=list)  # flat: see ConsumeQueue.append_many
    next_base: int = -1  # the queue offset its next record must start at (or above)
