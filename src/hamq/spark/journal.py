"""The exactly-once streaming sink's journal: which micro-batch was committed last, and
with which half batches, kept in hamq itself (a topic of one queue per sink).

Spark replays a micro-batch with the same id after a crash; the sink journals ``(B,
halves)`` before committing ``B``, so a replay can tell it was committed (or half
committed) already. The sink is named by the query's checkpoint and the query id Spark
keeps there, so a new checkpoint, which restarts at batch 0, is a new sink.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import msgpack

from hamq.client.admin import AsyncAdmin
from hamq.client.consumer import AsyncPullConsumer, PullStatus
from hamq.client.message import Message, MessageQueue, SendStatus
from hamq.client.producer import AsyncProducer
from hamq.errors import ServiceNotAvailable, TopicNotExist
from hamq.protocol.message import decode_records
from hamq.spark.options import WriteOptions

JOURNAL_TOPIC_PREFIX = "HAMQ_SINK_"

Halves = dict[str, list[int]]  # broker group name -> half message offsets


@dataclass(frozen=True)
class JournalEntry:
    batch_id: int
    halves: Halves


class SinkJournal:
    """The streaming sink's committed micro-batches, in a hamq topic of one queue per
    sink: the last message says which batch was committed last and with which halves."""

    def __init__(self, producer: AsyncProducer, sink_key: str) -> None:
        self.producer = producer
        self.core = producer.core
        self.topic = JOURNAL_TOPIC_PREFIX + hashlib.sha1(sink_key.encode()).hexdigest()[:24]
        self.consumer = AsyncPullConsumer(producer.group, core=producer.core)
        self._mq: MessageQueue | None = None

    async def queue(self) -> MessageQueue:
        if self._mq is None:
            try:
                route = await self.core.route(self.topic, refresh=True)
            except TopicNotExist:
                await AsyncAdmin(core=self.core).create_topic(self.topic, queue_nums=1)
                route = await self.core.route(self.topic, refresh=True)
            self._mq = min(route.write_queues)
        return self._mq

    async def last(self) -> JournalEntry | None:
        mq = await self.queue()
        end = await self.consumer.max_offset(mq)
        if end == 0:
            return None
        result = await self.consumer.pull_raw(mq, end - 1, 1)
        if result.status is not PullStatus.FOUND:
            raise ServiceNotAvailable(
                f"the sink journal {self.topic} did not serve offset {end - 1}"
            )
        body = decode_records(result.records, end - 1, lambda *a: a[-1])[0]
        entry = msgpack.unpackb(body, raw=False)
        return JournalEntry(entry["batch"], entry["halves"])

    async def append(self, entry: JournalEntry) -> None:
        body = msgpack.packb({"batch": entry.batch_id, "halves": entry.halves})
        result = await self.producer.send(Message(self.topic, body), await self.queue())
        if result.status is not SendStatus.SEND_OK:
            raise ServiceNotAvailable(f"sink journal write ended {result.status.value}")


def sink_key(options: WriteOptions) -> str:
    """The query's identity: its checkpoint plus the id Spark keeps there, so a new
    checkpoint (which restarts at batch 0) is a new sink even at the same path."""
    location = options.checkpoint_location
    if not location:
        raise ValueError(
            "the hamq streaming sink needs option checkpointLocation (it keys "
            "its exactly-once journal on the query's checkpoint)"
        )
    path = location.removeprefix("file://").removeprefix("file:")
    try:
        with open(os.path.join(path, "metadata")) as f:
            query_id = json.load(f)["id"]
    except (OSError, ValueError, KeyError):
        query_id = ""  # not a local file system: the path alone names the query
    return f"{location}#{query_id}"
