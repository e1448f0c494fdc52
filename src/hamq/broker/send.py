"""SEND_MESSAGE / SEND_BATCH_MESSAGE: validate, append as one record, answer — at once, or
once the group commit of a sync flush and, on a sync master, the slaves' acks cover it
(RIP-34: ``needAckNums`` decided before the message is stored). Sends whose answer waits
use up the member's credit (``broker/flow.py``)."""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic_ns

from hamq.broker.conditional import UNCONDITIONAL, mismatch_pieces, queue_offset_mismatch
from hamq.broker.dledger.driver import DLedgerCommitLog
from hamq.broker.dledger.wire import encode_entry
from hamq.broker.flow import PublisherFlow
from hamq.broker.ha.service import HAMaster
from hamq.broker.stats import BrokerStats
from hamq.broker.topics import TopicService
from hamq.errors import HamqError, InvalidArgument, MessageIllegal, QueueOffsetMismatch
from hamq.net.connection import Connection, error_pieces, response_pieces
from hamq.net.metrics import COUNTS
from hamq.protocol.codes import ResponseCode
from hamq.protocol.frame import Frame, optional, require
from hamq.protocol.message import offset_msg_id, validate_batch
from hamq.protocol.properties import first_message_is_held_back
from hamq.replication.master import ReplicaStatus
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore, PutResult

_CODE_BY_REPLICA_STATUS = {
    ReplicaStatus.PUT_OK: ResponseCode.SUCCESS,
    ReplicaStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    ReplicaStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
}


class SendProcessor:
    def __init__(
        self,
        store: MessageStore,
        topics: TopicService,
        flush: FlushService,
        ha: HAMaster | None,
        dledger: DLedgerCommitLog | None,
        *,
        on_put: Callable[[str, int], None],
        put_held_back: Callable[[str, int, bytes, int, int], PutResult],
        flow: PublisherFlow,
        stats: BrokerStats | None = None,
    ) -> None:
        self.store = store
        self.topics = topics
        self.flush = flush
        self.on_put = on_put  # wakes pulls held on the queue
        self.ha = ha  # None in DLedger mode; a slave refuses sends before it
        self.put_held_back = put_held_back  # delay, timer, half messages (broker/held_back.py)
        self.dledger = dledger  # DLedger mode: sends are Raft proposals
        self.max_message_bytes = store.config.max_message_size
        self.flow = flow  # credit for answers that wait, and which connections publish
        self.stats = stats or BrokerStats()  # the broker's, shared with pulls and pops
        # Sends of the read being handled answered at once, and when the first of them was
        # handled: their answers leave together after the read's write (``after_write``),
        # so their latency is observed once per read, not per request.
        self._answered_at_once = 0
        self._read_ns = 0

    def send(self, conn: Connection, frame: Frame, batch: bool) -> list | None:
        if not conn.publishes:
            self.flow.publisher(conn)
        ext = frame.ext
        topic = require(ext, "topic")
        queue_id = require(ext, "queue_id", int)
        count = require(ext, "count", int)
        if not batch and count != 1:
            raise MessageIllegal(
                "SEND_MESSAGE carries exactly one message; use SEND_BATCH_MESSAGE for batches"
            )
        if self.dledger is not None and not self.dledger.is_leader:
            raise self.dledger.not_leader()
        self.topics.for_write(topic, queue_id)
        validate_batch(frame.body, count, require(ext, "crc", int), self.max_message_bytes)
        expected = optional(ext, "expected_queue_offset", UNCONDITIONAL)
        if expected != UNCONDITIONAL and first_message_is_held_back(frame.body):
            raise InvalidArgument(
                "expected_queue_offset cannot go with a delay, timer or transaction message:"
                " it is not stored in its queue when sent"
            )
        if self.dledger is not None:
            return self._propose(conn, frame, topic, queue_id, count, expected)
        mismatch = queue_offset_mismatch(self.store, topic, queue_id, expected)
        if mismatch is not None:
            return None if frame.is_oneway else mismatch_pieces(frame, mismatch)
        result, need_ack_nums = self.store_batch(
            topic, queue_id, frame.body, count, ext["crc"], optional(ext, "born_ts", 0)
        )
        if frame.is_oneway:
            return None
        answer = {
            "msg_id": offset_msg_id(result.physical_offset, 0),
            "queue_id": queue_id,
            "queue_offset": result.base_queue_offset,
        }
        if not self.flush.sync and need_ack_nums <= 1:
            if not self._answered_at_once:
                self._read_ns = monotonic_ns()
            self._answered_at_once += 1
            return response_pieces(frame, ext=answer)
        latency, arrived_ns = self.stats.send_latency_us, monotonic_ns()
        flow, size = self.flow, len(frame.body)
        flow.take(size)
        # An answer decided while this request is handled (all-ack with the master alone
        # in its SyncStateSet acks at once) is returned, not sent: it leaves with the
        # read's other answers, after the read's commit wrote the record. Sent at once, a
        # kill -9 before that write lost an acknowledged send, and a failed write undid one.
        handling = True
        at_once: list = []

        def stored(code: int, remark: str) -> None:
            flow.give(size)
            latency.observe((monotonic_ns() - arrived_ns) // 1000)
            pieces = response_pieces(frame, code, ext=answer, remark=remark)
            if handling:
                at_once.extend(pieces)
            else:
                conn.reply(pieces)

        self.when_stored(result, need_ack_nums, stored)
        handling = False
        return at_once or None

    def after_write(self) -> None:
        """After a read's commit-log write: the answers given at once leave now. (When the
        write fails they never leave, and count with the next read's.)"""
        answered = self._answered_at_once
        if answered:
            self._answered_at_once = 0
            latency_us = (monotonic_ns() - self._read_ns) // 1000
            self.stats.send_latency_us.observe(latency_us, answered)

    def store_batch(
        self, topic: str, queue_id: int, payload: bytes, count: int, crc: int, born_ts: int
    ) -> tuple[PutResult, int]:
        """Append a checked batch (a send's, or one another group's acting master escapes
        here, ``broker/escape.py``); returns it and the acks it needs (RIP-34)."""
        need_ack_nums = self.ha.check_quorum() if self.ha is not None else 1
        if first_message_is_held_back(payload):
            result = self.put_held_back(topic, queue_id, payload, count, born_ts)
        else:
            result = self.store.put_batch(topic, queue_id, payload, count, crc, born_ts)
            self.on_put(topic, queue_id)
        # counted once stored: a send the put refused (a bad delay level) stored nothing
        COUNTS.send_requests += 1
        COUNTS.messages_in += count
        COUNTS.bytes_in += len(payload)
        self.stats.produced(topic, count, len(payload))
        return result, need_ack_nums

    def when_stored(
        self, result: PutResult, need_ack_nums: int, answer: Callable[[int, str], None]
    ) -> None:
        """``answer(code, remark)`` once ``result`` is as durable as a send's answer waits
        for: fsynced under sync flush, then acked by ``need_ack_nums`` members."""

        def replicated(status: ReplicaStatus) -> None:
            code = _CODE_BY_REPLICA_STATUS[status]
            answer(code, "" if code == 0 else f"{status.value}: message stored on the master")

        def flushed(ok: bool) -> None:
            if not ok:
                answer(ResponseCode.FLUSH_DISK_TIMEOUT, "flush to disk timed out; message stored")
            elif need_ack_nums > 1:
                self.ha.wait_for_acks(result.end_offset, need_ack_nums, replicated)
            else:
                answer(ResponseCode.SUCCESS, "")

        if self.flush.sync:
            self.flush.wait_flushed(result.end_offset, flushed)
        else:
            flushed(True)

    def _propose(
        self, conn: Connection, frame: Frame, topic: str, queue_id: int, count: int, expected: int
    ) -> None:
        """DLedger: the batch becomes one Raft entry; the answer waits for its commit (a
        conditional send's ``expected`` offset is checked when the entry is applied)."""
        if first_message_is_held_back(frame.body):
            raise MessageIllegal(
                "delay, timer and transaction messages are not supported by "
                'DLedger groups yet (replication_mode = "dledger")'
            )
        COUNTS.send_requests += 1
        COUNTS.messages_in += count
        COUNTS.bytes_in += len(frame.body)
        self.stats.produced(topic, count, len(frame.body))
        ext = frame.ext
        entry = encode_entry(
            topic,
            queue_id,
            count,
            ext["crc"],
            optional(ext, "born_ts", 0),
            self.store.clock_ms(),
            bytes(frame.body),
            expected,
        )

        flow, size = self.flow, len(frame.body)
        flow.take(size)

        latency, arrived_ns = self.stats.send_latency_us, monotonic_ns()

        def committed(result: PutResult | None, err: HamqError | None) -> None:
            flow.give(size)
            if frame.is_oneway:
                return
            latency.observe((monotonic_ns() - arrived_ns) // 1000)
            if isinstance(err, QueueOffsetMismatch):
                conn.reply(mismatch_pieces(frame, err))
            elif err is not None:
                conn.reply(error_pieces(frame, err))
            else:
                conn.reply(
                    response_pieces(
                        frame,
                        ext={
                            "msg_id": offset_msg_id(result.physical_offset, 0),
                            "queue_id": queue_id,
                            "queue_offset": result.base_queue_offset,
                        },
                    )
                )

        self.dledger.propose_send(topic, entry, committed)
        return None
