"""VIEW_MESSAGE_BY_ID and QUERY_MESSAGE: the message browser's reads (RocketMQ's
QueryMessageProcessor).

A msg id is ``offset_msg_id(physical_offset, index)``: where the record sits in its group's
commit log, the same on every replica. Viewing one reads that record, after checking that
one starts there (magic, header CRC, the offset it records) and that it is whole and
readable (below the read cap): any other offset is QUERY_NOT_FOUND, never bytes read from
the middle of another record.

A key query has no index to read. RocketMQ's IndexFile costs an entry per message at
dispatch; hamq keeps the send and pull paths free of per-message work, so a key query
scans instead: the topic's consume queues on this broker backwards, newest first, at most
``max_scan`` messages per queue (and ``MAX_SCAN_TOTAL`` over them all), matching the
KEYS property (space-separated, as RocketMQ's) and the UNIQ_KEY. The records are read in
a worker thread, on duplicated file descriptors (retention may close a segment
meanwhile), so a long scan never holds up the event loop; the answer says whether the
scan stopped before a queue's first message. Scans run one at a time (RocketMQ gives
queries their own small thread pool): side by side they took every worker of the default
executor, and the commit log's fsync waited behind them (a sync-flush send took seconds).
A few more queries wait their turn; beyond ``MAX_WAITING_SCANS`` one is SYSTEM_BUSY.
"""

from __future__ import annotations

import asyncio
import bisect
from array import array
from dataclasses import dataclass, field

from hamq.broker.client_processor import answer_later
from hamq.broker.topics import TopicService
from hamq.client.message import PROPERTY_KEYS
from hamq.errors import CrcMismatch, InvalidArgument, QueryNotFound, SystemBusy
from hamq.net.connection import Connection, response_pieces
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, optional, require, require_int
from hamq.protocol.limits import MAX_PROPERTIES_BYTES, MAX_PULL_BYTES, MAX_TOPIC_LENGTH
from hamq.protocol.message import (
    RECORD_HEADER_BYTES,
    RecordHeader,
    check_record_payload,
    decode_properties,
    message_bounds,
    offset_msg_id,
    parse_record_header,
)
from hamq.protocol.properties import PROPERTY_UNIQ_KEY
from hamq.store.commitlog import CommitLog
from hamq.store.message_store import MessageStore

DEFAULT_MAX_SCAN = 10_000  # messages per queue a key query looks at unless told
# Messages one key query looks at, over all the topic's queues on a broker (each gets an
# equal share when max_scan asks for more): a million small messages read in well under
# a minute, and no answer should take longer.
MAX_SCAN_TOTAL = 1_000_000
# Messages one key query answers with (RocketMQ's defaultQueryMaxNum is 32); their
# records stop at MAX_PULL_BYTES so the answer fits a frame.
MAX_QUERY_MESSAGES = 64
_HEADER_PEEK_BYTES = RECORD_HEADER_BYTES + MAX_TOPIC_LENGTH
MAX_WAITING_SCANS = 8  # key queries queued behind the running one


class MessageLookup:
    def __init__(self, store: MessageStore, topics: TopicService) -> None:
        self.store = store
        self.topics = topics
        self._scan_turn = asyncio.Semaphore(1)
        self._scans = 0  # running or waiting their turn

    def handlers(self) -> dict:
        return {
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message_by_id,
            RequestCode.QUERY_MESSAGE: self.query_message,
        }

    def view_message_by_id(self, conn: Connection, frame: Frame) -> list:
        """The whole record at ``physical_offset`` (the client picks the message by its
        index): one record, read like a pull reads it."""
        phys = require_int(frame.ext, "physical_offset")
        return response_pieces(frame, body=bytes(self.record_at(phys)))

    def record_at(self, phys: int) -> bytearray:
        log = self.store.commitlog
        end = min(log.max_offset, self.store.reads_end)
        if not log.min_offset <= phys <= end - RECORD_HEADER_BYTES:
            raise QueryNotFound(
                f"commit-log offset {phys} is outside the readable log [{log.min_offset}, {end})"
            )
        head = log.read_range(phys, min(end, phys + _HEADER_PEEK_BYTES))
        try:
            h = parse_record_header(head)
            if h.physical_offset != phys or phys + h.total_size > end:
                raise CrcMismatch("not this record's offset")
            record = log.read_range(phys, phys + h.total_size)
            check_record_payload(record, 0, h)
        except CrcMismatch as err:
            raise QueryNotFound(
                f"no readable record starts at commit-log offset {phys} ({err.message})"
            ) from None
        return record

    def query_message(self, conn: Connection, frame: Frame) -> None:
        ext = frame.ext
        topic, key = require(ext, "topic"), require(ext, "key")
        if not 0 < len(key) <= MAX_PROPERTIES_BYTES:  # a longer key fits no message
            raise InvalidArgument(f"key must be 1..{MAX_PROPERTIES_BYTES} characters")
        self.topics.for_read(topic, 0)
        max_scan = optional(ext, "max_scan", DEFAULT_MAX_SCAN, low=1)
        if self._scans > MAX_WAITING_SCANS:
            raise SystemBusy(f"{self._scans} key queries are running or waiting; try later")
        self._scans += 1

        async def scan() -> list:
            try:
                async with self._scan_turn:  # the plan taken at its turn: the log moved on
                    plan = scan_plan(self.store, topic, max_scan)
                    reader = DetachedReader(self.store.commitlog, plan.queues)
                    try:
                        found = await asyncio.to_thread(scan_for_key, reader, plan, topic, key)
                    finally:
                        reader.close()
            finally:
                self._scans -= 1
            return response_pieces(
                frame,
                ext={"msg_ids": found.msg_ids, "truncated": plan.truncated or found.full},
                body=b"".join(found.records),
            )

        answer_later(conn, frame, scan())


@dataclass
class QueueSpan:
    """One queue's records a key query reads (copies of its consume-queue columns): the
    oldest may start with ``skip`` messages past the queue's ``max_scan``, not looked at."""

    phys: array[int]
    size: array[int]
    skip: int


@dataclass
class ScanPlan:
    queues: list[QueueSpan] = field(default_factory=list)
    truncated: bool = False  # some queue has older messages than the scan reaches


@dataclass
class KeyMatches:
    msg_ids: list[str] = field(default_factory=list)
    records: list[bytes] = field(default_factory=list)
    full: bool = False  # stopped at MAX_QUERY_MESSAGES (or the answer's byte budget)


def scan_plan(store: MessageStore, topic: str, max_scan: int) -> ScanPlan:
    """Taken on the event loop, where the consume queues change, in time independent of
    their length (two bisects and two array copies per queue); readable records only
    (below the read cap), so a scan never shows a message a consumer could not read. The
    topic's queues share ``MAX_SCAN_TOTAL`` between them."""
    plan = ScanPlan()
    queues = [(q, cq) for (name, q), cq in list(store.queues.items()) if name == topic]
    budget = min(max_scan, MAX_SCAN_TOTAL // max(1, len(queues)))
    for queue_id, cq in queues:
        end_offset = store.readable_max_offset(topic, queue_id)
        hi = bisect.bisect_left(cq.base, end_offset)
        if hi == 0:
            continue
        first = max(end_offset - budget, cq.base[0])
        lo = bisect.bisect_right(cq.base, first) - 1
        plan.queues.append(QueueSpan(cq.phys[lo:hi], cq.size[lo:hi], first - cq.base[lo]))
        plan.truncated |= first > cq.base[0]
    return plan


class DetachedReader:
    """Reads of records a worker thread may do while the event loop appends: duplicated
    descriptors of the segments that hold them, so retention closing a segment meanwhile
    cannot make the thread read a reused descriptor (``CommitLog.detach_flush`` does the
    same for fsync). A cut or a deleted segment shows as a record that fails its checks."""

    def __init__(self, log: CommitLog, queues: list[QueueSpan]) -> None:
        log.write_pending()
        lo = min((q.phys[0] for q in queues), default=0)
        hi = max((q.phys[-1] + q.size[-1] for q in queues), default=0)
        segments = [s for s in log.segments if s.end > lo and s.start < hi]
        self._starts = [s.start for s in segments]
        self._files = [s.file.dup() for s in segments]

    def read(self, phys: int, size: int) -> bytes:
        i = bisect.bisect_right(self._starts, phys) - 1  # a record never spans segments
        return self._files[i].pread(size, phys - self._starts[i]) if i >= 0 else b""

    def close(self) -> None:
        for file in self._files:
            file.close()
        self._files = []


def scan_for_key(reader: DetachedReader, plan: ScanPlan, topic: str, key: str) -> KeyMatches:
    """Runs in a worker thread: the records of ``plan``, each queue newest first, whose
    messages carry ``key``."""
    found = KeyMatches()
    budget = MAX_PULL_BYTES
    for queue in plan.queues:
        for i in range(len(queue.phys) - 1, -1, -1):
            phys = queue.phys[i]
            record = reader.read(phys, queue.size[i])
            try:
                h = parse_record_header(record)
                check_record_payload(record, 0, h)
            except CrcMismatch:
                continue  # cut or deleted since the plan was made
            if h.physical_offset != phys or h.topic != topic:
                continue
            ids = _matching(record, h, queue.skip if i == 0 else 0, key)
            if not ids:
                continue
            if len(record) > budget or len(found.msg_ids) >= MAX_QUERY_MESSAGES:
                found.full = True
                return found
            budget -= len(record)
            found.records.append(record)
            found.msg_ids += ids[: MAX_QUERY_MESSAGES - len(found.msg_ids)]
    return found


def _matching(record: bytes, h: RecordHeader, skip: int, key: str) -> list[str]:
    ids = []
    pos = h.payload_start
    for index in range(h.count):
        props_start, body_start, pos = message_bounds(record, pos, h.total_size)
        if index < skip or body_start == props_start:
            continue
        try:
            props = decode_properties(record[props_start:body_start])
        except ValueError:  # send checks only that properties start as a map
            continue
        keys = props.get(PROPERTY_KEYS) if isinstance(props, dict) else None
        uniq = props.get(PROPERTY_UNIQ_KEY) if isinstance(props, dict) else None
        if uniq == key or (isinstance(keys, str) and key in keys.split()):
            ids.append(offset_msg_id(h.physical_offset, index))
    return ids
