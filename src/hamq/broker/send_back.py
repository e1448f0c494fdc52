"""CONSUMER_SEND_MSG_BACK: a consumer could not process a message, so the broker stores a
copy to be consumed again later (RocketMQ's retry and dead-letter queues).

The copy goes to ``%RETRY%<group>`` through the delay levels (``delay_level`` 0 lets the
broker choose ``3 + reconsume_times``); once the message was reconsumed
``max_reconsume_times`` times it goes to ``%DLQ%<group>`` instead, without delay. Both
topics are created on demand with one read-write queue, as in RocketMQ. The consumer
commits its offset past the message once it has this answer, so under sync flush the copy
is fsynced before the answer (as a send would be).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from hamq.broker.durable import answer_when_durable
from hamq.broker.schedule.service import ScheduleMessageService
from hamq.broker.stored_message import StoredMessage, read_message
from hamq.broker.topics import TopicService
from hamq.errors import NoPermission, QueryNotFound
from hamq.net.connection import Connection
from hamq.protocol.frame import Frame, optional, require
from hamq.protocol.message import encode_message, encode_properties
from hamq.protocol.properties import (
    DEFAULT_MAX_RECONSUME_TIMES,
    DLQ_GROUP_TOPIC_PREFIX,
    MAX_DELAY_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_PROPERTIES,
    reconsume_times_of,
)
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore, PutResult
from hamq.store.metadata import PERM_READ_WRITE

RETRY_QUEUE_NUMS = 1  # RocketMQ retryQueueNums
DLQ_QUEUE_NUMS = 1  # RocketMQ: DLQ_NUMS_PER_GROUP
# With delay_level 0 the broker picks this level plus the reconsume count (RocketMQ).
BASE_RETRY_DELAY_LEVEL = 3


def retry_delay_level(reconsume_times: int) -> int:
    return min(BASE_RETRY_DELAY_LEVEL + reconsume_times, MAX_DELAY_LEVEL)


class ConsumerSendMsgBackProcessor:
    def __init__(
        self,
        store: MessageStore,
        topics: TopicService,
        schedule: ScheduleMessageService,
        flush: FlushService,
        *,
        on_put: Callable[[str, int], None],
    ) -> None:
        self.store = store
        self.flush = flush
        self.on_put = on_put  # wakes pulls held on the dead-letter queue
        self.topics = topics
        self.schedule = schedule

    def send_back(self, conn: Connection, frame: Frame) -> list | None:
        ext = frame.ext
        group = require(ext, "group")
        topic = require(ext, "topic")
        queue_id = require(ext, "queue_id", int)
        queue_offset = require(ext, "queue_offset", int)
        delay_level = optional(ext, "delay_level", 0, 0, MAX_DELAY_LEVEL)
        max_reconsume_times = optional(ext, "max_reconsume_times", DEFAULT_MAX_RECONSUME_TIMES)
        if not self.topics.role.is_master:
            # A client with a route from before a role change: once the retry or dead-letter
            # topic exists no topic is created, so nothing else would stop this member
            # writing a copy into a log its master's bytes are replicated into.
            raise NoPermission(
                "this broker is a slave and does not accept writes; send the message back "
                "to the group's master"
            )
        self.topics.for_read(topic, queue_id)
        original = read_message(self.store, topic, queue_id, queue_offset)
        if original is None:
            raise QueryNotFound(f"no message at offset {queue_offset} of {topic}:{queue_id}")
        reconsume_times = reconsume_times_of(original.properties)
        properties = copy_properties(original, topic, reconsume_times + 1)
        if reconsume_times >= max_reconsume_times:
            dlq, put = put_dead_letter(
                self.store, self.topics, group, original, properties, self.on_put
            )
            return answer_when_durable(
                self.flush, conn, frame, put.end_offset, {"topic": dlq}, "message"
            )
        retry = ensure_topic(self.topics, RETRY_GROUP_TOPIC_PREFIX + group, RETRY_QUEUE_NUMS)
        put = self.schedule.put_delayed(
            retry,
            0,
            properties,
            original.body,
            original.born_timestamp_ms,
            delay_level or retry_delay_level(reconsume_times),
        )
        return answer_when_durable(
            self.flush, conn, frame, put.end_offset, {"topic": retry}, "message"
        )


def copy_properties(original: StoredMessage, topic: str, reconsume_times: int) -> dict[str, str]:
    """The properties of a copy of ``original`` (read from ``topic``) to be consumed again or
    dead-lettered: marked with the topic and id it was first stored under, and
    ``reconsume_times``; without the schedule and real-queue properties of its last trip."""
    properties = dict(original.properties)
    for name in (*SCHEDULE_PROPERTIES, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID):
        properties.pop(name, None)
    properties.setdefault(PROPERTY_RETRY_TOPIC, topic)
    properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, original.msg_id)
    properties[PROPERTY_RECONSUME_TIME] = str(reconsume_times)
    return properties


def put_dead_letter(
    store: MessageStore,
    topics: TopicService,
    group: str,
    original: StoredMessage,
    properties: dict[str, str],
    on_put: Callable[[str, int], None],
) -> tuple[str, PutResult]:
    """Store a copy of ``original`` in ``%DLQ%<group>`` (created on demand, no delay)."""
    dlq = ensure_topic(topics, DLQ_GROUP_TOPIC_PREFIX + group, DLQ_QUEUE_NUMS)
    payload = encode_message(original.body, encode_properties(properties))
    put = store.put_batch(dlq, 0, payload, 1, zlib.crc32(payload), original.born_timestamp_ms)
    on_put(dlq, 0)
    return dlq, put


def ensure_topic(topics: TopicService, topic: str, queue_nums: int) -> str:
    if topics.store.topics.get(topic) is None:
        topics.create(topic, queue_nums, queue_nums, PERM_READ_WRITE)
    return topic
