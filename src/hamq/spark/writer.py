"""Writes to hamq from Spark, as transactional batches.

An executor stores its rows as *half* batches (``TRAN_MSG`` + ``TRAN_BATCH``, see
``broker/transaction/service.py``): invisible to consumers, one per queue and ~1 MiB. Its commit
message lists where they landed; the driver's commit then ends them all with
END_TRANSACTION COMMIT, and an abort rolls them back. Halves a failed task left behind
are never named in a commit; no producer answers the broker's check for them, so they
stay invisible until retention removes them.

Streaming adds exactly once across restarts: before committing micro-batch ``B`` the
driver appends ``(B, halves)`` to the sink's journal (``journal.py``), a one-queue hamq
topic keyed on the query's checkpoint and id (the tasks report the id: Spark gives it to
each as a local property, whatever file system holds the checkpoint). A micro-batch
replayed after a crash finds itself journaled: its journaled halves are (re-)committed,
which is idempotent, and the replay's own halves rolled back, so each row becomes visible
once. ``commit.py`` has the order of the driver's steps.
"""

from __future__ import annotations

import random
import threading
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from itertools import repeat

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from hamq.client.message import MessageQueue, SendResult, SendStatus
from hamq.client.producer import AsyncProducer
from hamq.client.sync import Producer
from hamq.errors import HamqError
from hamq.protocol.limits import MAX_BATCH_MESSAGES
from hamq.protocol.message import encode_properties, message_head
from hamq.protocol.properties import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_BATCH,
    PROPERTY_TRANSACTION_PREPARED,
)
from hamq.spark.arrow_codec import BatchEncoder, queue_for_key
from hamq.spark.commit import (
    Decider,
    abort_batch,
    abort_micro_batch,
    commit_batch,
    commit_micro_batch,
)
from hamq.spark.failpoint import Failpoint
from hamq.spark.journal import Halves, SinkJournal, journal_topic, sink_key
from hamq.spark.options import WriteOptions

CHUNK_BYTES = 1 << 20  # one half batch
# No producer answers the broker's check-backs for the sink's halves (Spark runs commits in
# short-lived workers), so the broker would roll them back after transaction_check_max
# rounds: a micro-batch's commit (or a crashed query's restart, which re-commits what its
# journal names) must come before that. An hour keeps slow batches and restarts safe;
# halves a failed task left behind go after that.
HALF_IMMUNITY_S = 3600
HALVES_IN_FLIGHT = 8


QUERY_ID_PROPERTY = "sql.streaming.queryId"  # Spark's local property of a stream's tasks


@dataclass
class HalvesWritten(WriterCommitMessage):
    halves: Halves = field(default_factory=dict)
    query_id: str | None = None  # the streaming query's id (kept in its checkpoint)


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
        # Tasks start on different queues: a reused Python worker runs many small tasks,
        # so its pid would send all of them to one queue.
        self.next = random.randrange(len(queues))

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
        task = TaskContext.get()
        query_id = task.getLocalProperty(QUERY_ID_PROPERTY) if task is not None else None
        return HalvesWritten(sender.finish(), query_id)


class _Committer:
    """Driver-side commit/abort, run on a Producer facade's event loop."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def run(self, make_coro: Callable[[AsyncProducer, Decider], Awaitable[None]]) -> None:
        with Producer(self.options.namesrv, self.options.group, self.options.timeout_s) as p:
            decider = Decider(p.core, self.options.group, self.options.timeout_s)
            p.submit(make_coro(p.async_client, decider)).result()


class HamqBatchWriter(DataSourceArrowWriter):
    """``df.write.format("hamq")``: all or nothing per job. The first half batch is the
    commit point (``commit.py``): until it is committed no row is visible, and once it is,
    ``commit`` — or, when ``commit`` fails, Spark's ``abort`` — commits every other half.
    Only a driver that dies between the commit point and the last half (and so never
    aborts) leaves the job partly visible."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> HalvesWritten:
        return write_halves(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        halves = merge_halves(messages)
        _Committer(self.options).run(lambda _, decider: commit_batch(decider, halves))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        halves = merge_halves(messages)
        _Committer(self.options).run(lambda _, decider: abort_batch(decider, halves))


class HamqStreamWriter(DataSourceStreamArrowWriter):
    """The exactly-once streaming sink (``commit.py`` has the order of its steps)."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        sink_key(options, "")  # a missing checkpointLocation fails the query at its start

    def write(self, iterator: Iterator[pa.RecordBatch]) -> HalvesWritten:
        return write_halves(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        halves = merge_halves(messages)
        topic = self._journal_topic(messages, halves)
        if topic is None:
            return
        failpoint = Failpoint.from_environment()

        async def commit(producer: AsyncProducer, decider: Decider) -> None:
            journal = SinkJournal(producer, topic, self.options.timeout_s)
            await commit_micro_batch(journal, decider, batchId, halves, failpoint)

        _Committer(self.options).run(commit)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        halves = merge_halves(messages)
        topic = self._journal_topic(messages, halves)
        if topic is None:
            return

        async def abort(producer: AsyncProducer, decider: Decider) -> None:
            journal = SinkJournal(producer, topic, self.options.timeout_s)
            await abort_micro_batch(journal, decider, batchId, halves)

        _Committer(self.options).run(abort)

    def _journal_topic(
        self, messages: list[WriterCommitMessage | None], halves: Halves
    ) -> str | None:
        """The journal of the query the tasks ran in; None for a micro-batch that ran no
        task (nothing was written, so nothing can be repeated or lost)."""
        ids = {m.query_id for m in messages if isinstance(m, HalvesWritten) and m.query_id}
        if len(ids) > 1:
            raise ValueError(f"the micro-batch's tasks ran in several queries: {sorted(ids)}")
        if not ids:
            if halves:
                raise ValueError("the sink's tasks did not say which streaming query they ran in")
            return None
        return journal_topic(sink_key(self.options, ids.pop()))
