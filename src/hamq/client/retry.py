"""Handing a message the listener failed on back for a later retry (RocketMQ's
``DefaultMQPushConsumerImpl.sendMessageBack``).

First CONSUMER_SEND_MSG_BACK to the master of the group the message came from, once. If
that fails (the master is down, or the group cannot take it), the client re-sends a copy to
``%RETRY%<group>`` itself with its inner producer, which may land on any broker group that
has the retry topic (brokers create it when a clustering consumer's heartbeat arrives).
Either way the attempt is bounded: the caller learns whether the message is safe elsewhere
and otherwise keeps it, so a queue never waits forever on a broker that cannot answer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from hamq.client.consumer import AsyncPullConsumer
from hamq.client.message import PROPERTY_KEYS, PROPERTY_TAGS, Message, MessageExt
from hamq.client.producer import AsyncProducer
from hamq.errors import HamqError
from hamq.protocol.properties import (
    DLQ_GROUP_TOPIC_PREFIX,
    HELD_BACK_PROPERTIES,
    MAX_DELAY_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
)

log = logging.getLogger(__name__)

INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"  # RocketMQ MixAll.CLIENT_INNER_PRODUCER_GROUP
BASE_RETRY_DELAY_LEVEL = 3  # RocketMQ: delay level 3 + reconsume times
# Properties of the failed copy that describe where it was stored, not what it is.
_NOT_COPIED = (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_REAL_TOPIC,
    PROPERTY_REAL_QUEUE_ID,
    *HELD_BACK_PROPERTIES,
)


def retry_copy(message: MessageExt, group: str, max_reconsume_times: int) -> Message:
    """The copy the client sends itself: RocketMQ's fallback message — same body, keys,
    tags and user properties, ``RETRY_TOPIC``/``ORIGIN_MESSAGE_ID`` kept from the first
    failure, one more reconsume time, delayed like the broker would; past
    ``max_reconsume_times`` it goes to the dead-letter topic instead."""
    reconsume_times = message.reconsume_times
    properties = {k: v for k, v in message.properties.items() if k not in _NOT_COPIED}
    properties.setdefault(PROPERTY_RETRY_TOPIC, message.queue.topic)  # its wire name
    properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, message.msg_id)
    properties[PROPERTY_RECONSUME_TIME] = str(reconsume_times + 1)
    if reconsume_times >= max_reconsume_times:
        return Message(
            DLQ_GROUP_TOPIC_PREFIX + group, message.body, message.keys, message.tags, properties
        )
    return Message(
        RETRY_GROUP_TOPIC_PREFIX + group,
        message.body,
        message.keys,
        message.tags,
        properties,
        delay_level=min(BASE_RETRY_DELAY_LEVEL + reconsume_times, MAX_DELAY_LEVEL),
    )


class SendBack:
    def __init__(
        self, puller: AsyncPullConsumer, namesrv: Iterable[str], max_reconsume_times: int
    ) -> None:
        self.puller = puller
        self.namesrv = list(namesrv)
        self.max_reconsume_times = max_reconsume_times
        self._producer: AsyncProducer | None = None  # made on the first fallback

    async def __call__(self, message: MessageExt) -> bool:
        """True once the message is stored for a retry (or dead-lettered)."""
        try:
            await self.puller.send_back(message, 0, self.max_reconsume_times)
            return True
        except HamqError as err:
            log.warning(
                "send back of %s failed (%s); re-sending it from the client",
                message.msg_id,
                err.message,
            )
        if self._producer is None:
            self._producer = AsyncProducer(self.namesrv, INNER_PRODUCER_GROUP)
        try:
            await self._producer.send(
                retry_copy(message, self.puller.group, self.max_reconsume_times)
            )
            return True
        except HamqError as err:
            log.warning("re-send of %s to the retry topic failed: %s", message.msg_id, err.message)
            return False

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.close()
