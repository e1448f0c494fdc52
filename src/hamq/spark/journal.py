"""The exactly-once streaming sink's journal: which micro-batch was committed last, and
with which half batches, kept in hamq itself (a topic of one queue per sink).

Spark replays a micro-batch with the same id after a crash; the sink journals ``(B,
halves)`` before committing ``B``, so a replay can tell it was committed (or half
committed) already. The sink is named by the query's checkpoint and the query id Spark
keeps there (a new checkpoint, which restarts at batch 0, is a new sink).

What the journal's answers are worth decides exactly once, so:

- it lives in one broker group, chosen once when the topic is created (the smallest group
  name of the cluster, master or not) and read back as the group the topic is in — never
  "the first writable queue", which moves to another group while this one has no master;
- it is read from that group's master (or DLedger leader) only, never a slave that may
  lag; while the group has none the sink waits, up to the sink's timeout, then fails;
- an append is a compare-and-set on the queue's end (``expected_queue_offset``), so of two
  drivers on one checkpoint one wins and the other learns it, and an append whose answer
  was lost can be sent again: it lands at most once;
- a journal whose entries retention removed is an error, never "no batch yet".
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import msgpack

from hamq.client.admin import AsyncAdmin
from hamq.client.consumer import AsyncPullConsumer, PullStatus
from hamq.client.core import MASTER_ID, TopicRoute
from hamq.client.message import Message, MessageQueue, SendStatus
from hamq.client.producer import AsyncProducer
from hamq.clock import monotonic_s
from hamq.errors import (
    BrokerNotFound,
    ConnectionLost,
    HamqError,
    NoPermission,
    NotLeader,
    QueueOffsetMismatch,
    RequestTimeout,
    ServiceNotAvailable,
    TopicNotExist,
)
from hamq.protocol.codes import RequestCode
from hamq.protocol.message import RecordHeader, decode_records
from hamq.spark.options import WriteOptions
from hamq.store.metadata import PERM_READ_WRITE

JOURNAL_TOPIC_PREFIX = "HAMQ_SINK_"
JOURNAL_QUEUE_ID = 0
NO_BATCH = -1  # the batch id of an entry that fences an empty journal
RETRY_PAUSE_S = 0.2

Halves = dict[str, list[int]]  # broker group name -> half message offsets
T = TypeVar("T")

# The group has no master (yet), or the one the route names is gone or was demoted.
_NO_MASTER = (
    BrokerNotFound,
    ConnectionLost,
    NoPermission,
    NotLeader,
    RequestTimeout,
    ServiceNotAvailable,
    TimeoutError,
)


class JournalError(HamqError):
    """The journal says the query cannot go on without losing or repeating a batch."""


@dataclass(frozen=True)
class JournalEntry:
    batch_id: int
    halves: Halves

    def encode(self) -> bytes:
        return msgpack.packb({"batch": self.batch_id, "halves": self.halves})

    @staticmethod
    def decode(body: bytes | memoryview) -> JournalEntry:
        entry = msgpack.unpackb(body, raw=False)
        return JournalEntry(entry["batch"], entry["halves"])


@dataclass(frozen=True)
class JournalTail:
    """The journal as its group's master has it: the offset the next entry goes to, the
    last entry (None in an empty journal or after a fence of one) and when it was stored."""

    end: int
    last: JournalEntry | None
    stored_ms: int


def journal_topic(sink_key: str) -> str:
    return JOURNAL_TOPIC_PREFIX + hashlib.sha1(sink_key.encode()).hexdigest()[:24]


class SinkJournal:
    """One sink's journal. Every call waits up to ``wait_s`` for the journal's group to
    have a reachable master, then raises ``ServiceNotAvailable``."""

    def __init__(self, producer: AsyncProducer, topic: str, wait_s: float) -> None:
        self.producer = producer
        self.core = producer.core
        self.topic = topic
        self.wait_s = wait_s
        self.consumer = AsyncPullConsumer(producer.group, core=producer.core, master_only=True)
        self._mq: MessageQueue | None = None

    async def queue(self) -> MessageQueue:
        """The journal's queue: queue 0 of the one group the topic is in (the smallest
        group name, for journals older sinks created in every group)."""
        if self._mq is None:
            try:
                route = await self.core.route(self.topic, refresh=True)
            except TopicNotExist:
                route = await self._create()
            self._mq = MessageQueue(self.topic, min(route.brokers), JOURNAL_QUEUE_ID)
        return self._mq

    async def _create(self) -> TopicRoute:
        """Create the topic in one group: the cluster's smallest group name whether or not
        it has a master now (waiting for one), so two drivers creating it at once, or a
        driver while a master is down, choose the same group."""
        admin = AsyncAdmin(core=self.core)

        async def master_of_first_group() -> str:
            groups = (await admin.cluster_info())["broker_addr_table"]
            if not groups:
                raise BrokerNotFound("no broker group registered for the sink's journal")
            group = min(groups)
            members = {int(i): a for i, a in groups[group]["broker_addrs"].items()}
            master = members.get(MASTER_ID)
            if master is None:
                raise ServiceNotAvailable(
                    f"broker group {group}, which keeps the sink journal {self.topic}, "
                    "has no master"
                )
            return str(master)

        master = await self._with_master(master_of_first_group)
        ext = {
            "topic": self.topic,
            "read_queue_nums": 1,
            "write_queue_nums": 1,
            "perm": PERM_READ_WRITE,
        }
        await self.core.invoke(master, RequestCode.UPDATE_AND_CREATE_TOPIC, ext)

        async def routed() -> TopicRoute:
            try:
                return await self.core.route(self.topic, refresh=True)
            except TopicNotExist as err:
                raise ServiceNotAvailable(
                    f"the new sink journal {self.topic} is not routed yet"
                ) from err

        return await self._with_master(routed)

    async def _with_master(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt`` until the journal's group answers from its master, up to ``wait_s``."""
        deadline = monotonic_s() + self.wait_s
        while True:
            try:
                return await attempt()
            except _NO_MASTER as err:
                if monotonic_s() > deadline:
                    reason = err.message if isinstance(err, HamqError) else "no answer"
                    raise ServiceNotAvailable(
                        f"the sink journal {self.topic} was not readable from its group's "
                        f"master for {self.wait_s:.0f} s ({reason}); the sink does not read "
                        "a slave, which may lag"
                    ) from err
            await asyncio.sleep(RETRY_PAUSE_S)
            try:
                await self.core.route(self.topic, refresh=True)
            except HamqError:
                pass  # the next attempt says what is wrong

    async def tail(self) -> JournalTail:
        mq = await self.queue()

        async def read() -> JournalTail:
            end = await self.consumer.max_offset(mq)
            if end == 0:
                return JournalTail(0, None, 0)
            found = await self._entry_at(mq, end - 1)
            if found is None:
                raise JournalError(
                    f"the sink journal {self.topic} has {end} entries but retention removed "
                    "them all: which micro-batches were committed is unknown. Delete the "
                    "journal (hamq admin spark-journals --delete) and restart the query from "
                    "a new checkpoint, or keep journal topics longer than the query may be "
                    "stopped"
                )
            entry, stored_ms = found
            return JournalTail(end, None if entry.batch_id == NO_BATCH else entry, stored_ms)

        return await self._with_master(read)

    async def entry_at(self, offset: int) -> JournalEntry | None:
        """The entry stored at ``offset`` (from the master), None if there is none."""
        mq = await self.queue()
        found = await self._with_master(lambda: self._entry_at(mq, offset))
        return None if found is None else found[0]

    async def _entry_at(self, mq: MessageQueue, offset: int) -> tuple[JournalEntry, int] | None:
        result = await self.consumer.pull_raw(mq, offset, 1)
        if result.status is not PullStatus.FOUND:
            return None

        def entry(h: RecordHeader, _i: int, _o: int, _p: object, body: bytes) -> tuple:
            return JournalEntry.decode(body), h.store_timestamp_ms

        found = decode_records(result.records, offset, entry)
        return found[0] if found else None

    async def append(self, entry: JournalEntry, expected: int) -> bool:
        """Store ``entry`` at offset ``expected``; False if another entry is there. An
        append whose answer is lost is sent again (it lands at most once: the broker
        stores it only at ``expected``), up to ``wait_s``."""
        mq = await self.queue()
        message = Message(self.topic, entry.encode())

        async def attempt() -> bool:
            try:
                result = await self.producer.send(message, mq, expected_queue_offset=expected)
            except QueueOffsetMismatch as err:
                if 0 <= err.end_offset <= expected:
                    raise JournalError(
                        f"the sink journal {self.topic} ends at {err.end_offset}, below the "
                        f"{expected} entries read from it before: its group lost entries "
                        "(an asynchronous master failed over?). The journal's group needs "
                        "sync flush or replication for exactly once"
                    ) from err
                found = await self._entry_at(mq, expected)
                return found is not None and found[0] == entry
            if result.status is not SendStatus.SEND_OK:
                raise JournalError(
                    f"sink journal write ended {result.status.value}: the entry is stored "
                    "but not as durably as the journal's group promises"
                )
            return True

        return await self._with_master(attempt)


def sink_key(options: WriteOptions, query_id: str) -> str:
    """The query's identity: its checkpoint plus the id Spark keeps there (``query_id``,
    which Spark hands every task of the query as a local property), so a new checkpoint
    (which restarts at batch 0) is a new sink even at the same path, on any file system."""
    location = options.checkpoint_location
    if not location:
        raise ValueError(
            "the hamq streaming sink needs option checkpointLocation (it keys "
            "its exactly-once journal on the query's checkpoint)"
        )
    return f"{location}#{query_id}"
