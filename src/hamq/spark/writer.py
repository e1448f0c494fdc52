"""Writes to hamq from Spark, as transactional batches.

An executor stores its rows as *half* batches (``TRAN_MSG`` + ``TRAN_BATCH``, see
``broker/transaction/service.py``): invisible to consumers, one per queue and ~1 MiB. Its commit
message lists where they landed; the driver's commit then ends them all with
END_TRANSACTION COMMIT, and an abort rolls them back. Halves a failed task left behind
are never named in a commit, so the broker's check rolls them back (an hour later, see
``HALF_IMMUNITY_S``); consumers never see them.

Streaming adds exactly once across restarts: before committing micro-batch ``B`` the
driver appends ``(B, halves)`` to the sink's journal (``journal.py``), a one-queue hamq
topic keyed on the query's checkpoint and id. A micro-batch replayed after a crash finds
itself journaled: its journaled halves are (re-)committed, which is idempotent, and the
replay's own halves rolled back, so each row becomes visible once.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from itertools import repeat

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from hamq.client.admin import AsyncAdmin
from hamq.client.core import ClientCore
from hamq.client.message import MessageQueue, SendResult, SendStatus
from hamq.client.producer import AsyncProducer
from hamq.client.sync import Producer
from hamq.errors import HamqError, ServiceNotAvailable
from hamq.protocol.codes import RequestCode
from hamq.protocol.limits import MAX_BATCH_MESSAGES
from hamq.protocol.message import encode_properties, message_head
from hamq.protocol.properties import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_BATCH,
    PROPERTY_TRANSACTION_PREPARED,
)
from hamq.protocol.transaction import TransactionState
from hamq.spark.arrow_codec import BatchEncoder, queue_for_key
from hamq.spark.journal import Halves, JournalEntry, SinkJournal, sink_key
from hamq.spark.options import WriteOptions

CHUNK_BYTES = 1 << 20  # one half batch
# No producer answers the broker's check-backs for the sink's halves (Spark runs commits in
# short-lived workers), so the broker would roll them back after transaction_check_max
# rounds: a micro-batch's commit (or a crashed query's restart, which re-commits what its
# journal names) must come before that. An hour keeps slow batches and restarts safe;
# halves a failed task left behind go after that.
HALF_IMMUNITY_S = 3600
HALVES_IN_FLIGHT = 8
END_TRANSACTIONS_IN_FLIGHT = 512


@dataclass
class HalvesWritten(WriterCommitMessage):
    halves: Halves = field(default_factory=dict)


def merge_halves(messages: list[WriterCommitMessage | None]) -> Halves:
    merged: Halves = {}
    for message in messages:
        if isinstance(message, HalvesWritten):
            for broker, offsets in message.halves.items():
                merged.setdefault(broker, []).extend(offsets)
    return merged


class HalfSender:
    """Sends half batches from a Spark task thread, a few in flight, remembering where
    each landed."""

    def __init__(self, producer: Producer, group: str) -> None:
        self.producer = producer
        self.errors: list[HamqError] = []
        self.halves: Halves = {}
        self._slots = threading.BoundedSemaphore(HALVES_IN_FLIGHT)
        self._group = group

    def send(self, mq: MessageQueue, chunk: Chunk) -> None:
        props = encode_properties(
            {
                PROPERTY_TRANSACTION_PREPARED: "true",
                PROPERTY_PRODUCER_GROUP: self._group,
                PROPERTY_TRANSACTION_BATCH: str(chunk.count),
                PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: str(HALF_IMMUNITY_S),
            }
        )
        # the half is one message whose body is the batch
        half = b"".join([message_head(chunk.nbytes, props), *chunk.pieces])
        self._slots.acquire()
        self.producer.loop.call_soon_threadsafe(
            self.producer.async_client.send_payload_async,
            mq.topic,
            half,
            zlib.crc32(half),
            1,
            self._sent,
            mq,
        )

    def _sent(self, result: SendResult | None, err: HamqError | None) -> None:
        if err is not None:
            self.errors.append(err)
        elif result.status is not SendStatus.SEND_OK:
            self.errors.append(HamqError(f"half batch stored as {result.status.value}"))
        else:
            self.halves.setdefault(result.queue.broker_name, []).append(result.queue_offset)
        self._slots.release()

    def finish(self) -> Halves:
        for _ in range(HALVES_IN_FLIGHT):
            self._slots.acquire()
        if self.errors:
            raise self.errors[0]
        return self.halves


class Chunk:
    """The encoded messages gathered for one queue's next half batch."""

    __slots__ = ("count", "nbytes", "pieces")

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.count = 0
        self.nbytes = 0

    def add(self, head: bytes, value: bytes) -> bool:
        """Add a message; True once the chunk is full."""
        self.pieces += (head, value)
        self.count += 1
        self.nbytes += len(head) + len(value)
        return self.nbytes >= CHUNK_BYTES or self.count >= MAX_BATCH_MESSAGES


class TopicChunks:
    """A topic's queues and the chunk being filled for each. Rows with a key go to the
    queue of its hash; the others fill one queue's chunk, then the next (round robin)."""

    def __init__(self, queues: list[MessageQueue], sender: HalfSender) -> None:
        self.queues = queues
        self.sender = sender
        self.chunks = [Chunk() for _ in queues]
        self.next = os.getpid() % len(queues)  # tasks start on different queues

    def add(self, key: bytes | None, head: bytes, value: bytes) -> None:
        index = self.next if key is None else queue_for_key(key, len(self.queues))
        if self.chunks[index].add(head, value):
            self.sender.send(self.queues[index], self.chunks[index])
            self.chunks[index] = Chunk()
            if key is None:
                self.next = (self.next + 1) % len(self.queues)

    def add_all(self, heads: list[bytes], values: list[bytes]) -> None:
        """Rows without keys, the common case: no per-row queue choice."""
        chunk = self.chunks[self.next]
        for head, value in zip(heads, values):
            if chunk.add(head, value):
                self.sender.send(self.queues[self.next], chunk)
                self.chunks[self.next] = Chunk()
                self.next = (self.next + 1) % len(self.queues)
                chunk = self.chunks[self.next]

    def flush(self) -> None:
        for mq, chunk in zip(self.queues, self.chunks):
            if chunk.count:
                self.sender.send(mq, chunk)


def write_halves(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> HalvesWritten:
    """Executor side: every row into a half batch of its queue."""
    encoder = BatchEncoder(options.topic)
    with Producer(options.namesrv, options.group, options.timeout_s) as producer:
        sender = HalfSender(producer, options.group)
        topics: dict[str, TopicChunks] = {}

        def chunks_of(topic: str) -> TopicChunks:
            if topic not in topics:
                route = producer.submit(producer.core.route(topic)).result()
                topics[topic] = TopicChunks(sorted(route.write_queues), sender)
            return topics[topic]

        for batch in batches:
            encoded = encoder.encode(batch)
            if isinstance(encoded.topics, str) and encoded.keys is None:
                chunks_of(encoded.topics).add_all(encoded.heads, encoded.values)
            else:
                topic_of = (
                    repeat(encoded.topics) if isinstance(encoded.topics, str) else encoded.topics
                )
                for topic, key, head, value in zip(
                    topic_of, encoded.keys or repeat(None), encoded.heads, encoded.values
                ):
                    chunks_of(topic).add(key, head, value)
        for chunks in topics.values():
            chunks.flush()
        return HalvesWritten(sender.finish())


async def end_halves(core: ClientCore, group: str, halves: Halves, state: TransactionState) -> None:
    """END_TRANSACTION for every half; a half already decided is left as it is."""
    masters = await AsyncAdmin(core=core).master_addrs()
    missing = sorted(halves.keys() - masters.keys())
    if missing:
        raise ServiceNotAvailable(
            f"broker groups {missing} have no master to end the sink's "
            "transactions on; the micro-batch will be retried"
        )
    requests = [(masters[b], o) for b, offsets in sorted(halves.items()) for o in offsets]
    for i in range(0, len(requests), END_TRANSACTIONS_IN_FLIGHT):
        await asyncio.gather(
            *(
                core.invoke(
                    addr,
                    RequestCode.END_TRANSACTION,
                    {
                        "group": group,
                        "tran_state_table_offset": offset,
                        "commit_or_rollback": state.value,
                    },
                )
                for addr, offset in requests[i : i + END_TRANSACTIONS_IN_FLIGHT]
            )
        )


FAILPOINT_ENV = "HAMQ_TEST_FAILPOINT"


class Failpoint:
    """A test hook: at ``stage`` of committing micro-batch ``batch``, touch a marker file
    and wait to be killed, so a test can crash the driver exactly between the sink's steps.
    Stages: ``before_journal``, ``after_journal``, ``after_commit``. Armed only by the
    driver's environment (``HAMQ_TEST_FAILPOINT="<stage>:<batch id>:<marker file>"``),
    which the test harness sets; no query option reaches it, so no user can stop a driver
    with it."""

    def __init__(self, spec: str | None) -> None:
        self.stage, self.batch_id, self.marker = (None, -1, "")
        if spec:
            stage, batch_id, marker = spec.split(":", 2)
            self.stage, self.batch_id, self.marker = stage, int(batch_id), marker

    @classmethod
    def from_environment(cls) -> Failpoint:
        return cls(os.environ.get(FAILPOINT_ENV))

    def reached(self, stage: str, batch_id: int) -> None:
        if stage == self.stage and batch_id == self.batch_id:
            with open(self.marker, "w") as f:
                f.write(f"{stage}:{batch_id}:{os.getpid()}\n")
            while True:
                time.sleep(1)


class _Committer:
    """Driver-side commit/abort, run on a Producer facade's event loop."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def run(self, make_coro: Callable[[AsyncProducer], Awaitable[None]]) -> None:
        with Producer(self.options.namesrv, self.options.group, self.options.timeout_s) as p:
            p.submit(make_coro(p.async_client)).result()

    def end(self, messages: list[WriterCommitMessage | None], state: TransactionState) -> None:
        halves = merge_halves(messages)
        if halves:
            self.run(lambda producer: end_halves(producer.core, self.options.group, halves, state))


class HamqBatchWriter(DataSourceArrowWriter):
    """``df.write.format("hamq")``: all or nothing per job — rows become visible only
    when the driver commits, unless the driver dies halfway through its commit."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> HalvesWritten:
        return write_halves(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _Committer(self.options).end(messages, TransactionState.COMMIT_MESSAGE)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _Committer(self.options).end(messages, TransactionState.ROLLBACK_MESSAGE)


class HamqStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.sink_key = sink_key(options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> HalvesWritten:
        return write_halves(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        halves = merge_halves(messages)
        group = self.options.group
        failpoint = Failpoint.from_environment()

        async def commit(producer: AsyncProducer) -> None:
            core = producer.core
            journal = SinkJournal(producer, self.sink_key)
            last = await journal.last()
            if last is not None and last.batch_id >= batchId:
                # a replay: the batch was journaled before the crash
                if last.batch_id == batchId:
                    await end_halves(core, group, last.halves, TransactionState.COMMIT_MESSAGE)
                await end_halves(core, group, halves, TransactionState.ROLLBACK_MESSAGE)
                return
            failpoint.reached("before_journal", batchId)
            await journal.append(JournalEntry(batchId, halves))
            failpoint.reached("after_journal", batchId)
            await end_halves(core, group, halves, TransactionState.COMMIT_MESSAGE)
            failpoint.reached("after_commit", batchId)

        _Committer(self.options).run(commit)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _Committer(self.options).end(messages, TransactionState.ROLLBACK_MESSAGE)
