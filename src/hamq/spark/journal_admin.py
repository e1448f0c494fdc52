"""``hamq admin spark-journals``: the exactly-once sinks' journals, listed and removed.

A journal outlives its query (a stopped query restarts from it), so nothing removes it on
its own; an operator lists them (which sink, last committed micro-batch, how old) and
deletes the journal of a query that will never run again."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hamq.client.admin import AsyncAdmin
from hamq.client.producer import AsyncProducer
from hamq.clock import wall_ms
from hamq.errors import HamqError
from hamq.spark.journal import JOURNAL_TOPIC_PREFIX, SinkJournal
from hamq.spark.options import DEFAULT_SINK_GROUP


@dataclass(frozen=True)
class JournalRow:
    topic: str
    sink_key_hash: str  # sha1 of the sink's checkpoint and query id, as in the topic's name
    group: str
    entries: int
    last_batch: int | None
    age_s: float | None  # since the last entry was stored
    error: str = ""  # why the journal could not be read

    def as_dict(self) -> dict:
        return asdict(self)


async def list_journals(namesrv: str, wait_s: float) -> list[JournalRow]:
    producer = AsyncProducer(namesrv, DEFAULT_SINK_GROUP, wait_s)
    try:
        topics = await AsyncAdmin(core=producer.core).topic_list()
        return [
            await _row(SinkJournal(producer, topic, wait_s))
            for topic in sorted(topics)
            if topic.startswith(JOURNAL_TOPIC_PREFIX)
        ]
    finally:
        await producer.core.close()


async def _row(journal: SinkJournal) -> JournalRow:
    key_hash = journal.topic.removeprefix(JOURNAL_TOPIC_PREFIX)
    try:
        group = (await journal.queue()).broker_name
        tail = await journal.tail()
    except HamqError as err:
        return JournalRow(journal.topic, key_hash, "", 0, None, None, err.message)
    last_batch = tail.last.batch_id if tail.last is not None else None
    age_s = (wall_ms() - tail.stored_ms) / 1000 if tail.end else None
    return JournalRow(journal.topic, key_hash, group, tail.end, last_batch, age_s)


async def delete_journal(namesrv: str, topic: str, wait_s: float) -> None:
    if not topic.startswith(JOURNAL_TOPIC_PREFIX):
        raise ValueError(
            f"{topic!r} is not a sink journal (their names start with {JOURNAL_TOPIC_PREFIX})"
        )
    admin = AsyncAdmin(namesrv, wait_s)
    try:
        await admin.delete_topic(topic)
    finally:
        await admin.close()
