"""User-facing message types, named as in RocketMQ's client."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from hamq.errors import MessageIllegal
from hamq.policy.definition import PolicyError, split_wire_name
from hamq.protocol.message import (
    RecordHeader,
    decode_properties,
    encode_message,
    encode_properties,
    offset_msg_id,
)
from hamq.protocol.properties import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REDELIVERED,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_UNIQ_KEY,
    RETRY_GROUP_TOPIC_PREFIX,
    leading_held_back_properties,
    reconsume_times_of,
)

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
UNIQ_KEY_CHARS = 32  # RocketMQ's UNIQ_KEY: 32 hex digits
# The properties of a message that has only its UNIQ_KEY, less the key: its common case
# costs a concatenation instead of a msgpack map per message.
_UNIQ_KEY_ONLY = encode_properties({PROPERTY_UNIQ_KEY: "0" * UNIQ_KEY_CHARS})[:-UNIQ_KEY_CHARS]


def user_name(wire: str) -> str:
    """A topic or group's wire name without its vhost (``policy.definition.wire_name``; a
    retry topic keeps its prefix); a name whose part before '%' is no vhost is its own."""
    if "%" not in wire:  # the common case, cheaply
        return wire
    try:
        return split_wire_name(wire)[1]
    except PolicyError:
        return wire


@dataclass(frozen=True, order=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id}"


@dataclass
class Message:
    topic: str
    body: bytes
    keys: str | list[str] | None = None
    tags: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    delay_level: int = 0  # 1..18: RocketMQ's delay levels (1s 5s 10s 30s 1m ... 2h)
    deliver_time_ms: int = 0  # deliver at this epoch time (timer message)

    def encode(self, uniq_key: str | None = None) -> bytes:
        """The wire form of one message inside a batch (see ``protocol.message``), with
        ``uniq_key`` (``UNIQ_KEY_CHARS`` characters) as its UNIQ_KEY unless it has one."""
        if not isinstance(self.body, (bytes, bytearray, memoryview)):
            raise TypeError(f"message body must be bytes, not {type(self.body).__name__}")
        if not (
            self.keys or self.tags or self.properties or self.delay_level or self.deliver_time_ms
        ):
            if uniq_key is None:
                return encode_message(self.body)
            raw_key = uniq_key.encode()
            if len(raw_key) == UNIQ_KEY_CHARS:
                return encode_message(self.body, _UNIQ_KEY_ONLY + raw_key)
        if self.delay_level and self.deliver_time_ms:
            raise MessageIllegal("a message has either delay_level or deliver_time_ms")
        props = dict(self.properties)
        if self.delay_level:
            props[PROPERTY_DELAY_TIME_LEVEL] = str(self.delay_level)
        if self.deliver_time_ms:
            props[PROPERTY_TIMER_DELIVER_MS] = str(self.deliver_time_ms)
        props = leading_held_back_properties(props)  # the broker looks for them first
        if self.keys:
            props[PROPERTY_KEYS] = self.keys if isinstance(self.keys, str) else " ".join(self.keys)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        if uniq_key is not None:
            props.setdefault(PROPERTY_UNIQ_KEY, uniq_key)
        return encode_message(self.body, encode_properties(props))


class MessageExt:
    """A consumed message: the body plus where and when it was stored. The record header
    is shared by all messages of a batch; properties are decoded on first access, so
    consumers that only read bodies pay nothing for them."""

    __slots__ = (
        "_index",
        "_properties",
        "_props",
        "_record",
        "body",
        "broker_name",
        "queue_offset",
    )

    def __init__(
        self,
        broker_name: str,
        record: RecordHeader,
        index: int,
        queue_offset: int,
        props: bytes,
        body: bytes,
    ) -> None:
        self.broker_name = broker_name
        self._record = record
        self._index = index
        self.queue_offset = queue_offset
        self._props = props
        self.body = body
        self._properties: dict[str, str] | None = None

    queue_id = property(lambda self: self._record.queue_id)
    store_timestamp_ms = property(lambda self: self._record.store_timestamp_ms)
    born_timestamp_ms = property(lambda self: self._record.born_timestamp_ms)

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self._record.topic, self.broker_name, self._record.queue_id)

    @property
    def topic(self) -> str:
        """The topic the message was sent to: a retry copy, stored in ``%RETRY%<group>``,
        shows its original topic (RocketMQ's consumer restores it). ``queue`` is where this
        copy is stored: acks, offsets and send-back go there."""
        topic = self._record.topic
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            topic = self.properties.get(PROPERTY_RETRY_TOPIC, topic)
        return user_name(topic)  # the name in its vhost (``client/core.py``)

    @property
    def msg_id(self) -> str:
        """The id of the message as first stored: a retry copy keeps its original's."""
        if self._record.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            origin = self.properties.get(PROPERTY_ORIGIN_MESSAGE_ID)
            if origin:
                return origin
        return self.offset_msg_id

    @property
    def offset_msg_id(self) -> str:
        """The id of this stored copy (RocketMQ's offsetMsgId)."""
        return offset_msg_id(self._record.physical_offset, self._index)

    @property
    def uniq_key(self) -> str | None:
        """The producer's key of the message (RocketMQ's UNIQ_KEY): the same on every copy
        (retry, dead letter) and on a send the producer retried after a timeout."""
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def properties(self) -> dict[str, str]:
        if self._properties is None:
            self._properties = decode_properties(self._props)
        return self._properties

    @property
    def keys(self) -> str | None:
        return self.properties.get(PROPERTY_KEYS)

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def reconsume_times(self) -> int:
        """How many times the message came back through CONSUMER_SEND_MSG_BACK."""
        return reconsume_times_of(self.properties)

    @property
    def redelivered(self) -> bool:
        """The message may have been delivered before (RabbitMQ's redelivered flag): a pop
        consumer's message handed out again after its invisible time ran out or after a
        new master took over while it was unacked."""
        return self.properties.get(PROPERTY_REDELIVERED) == "true"

    def __repr__(self) -> str:
        return (
            f"MessageExt(topic={self.topic!r}, queue={self.broker_name}:{self.queue_id}, "
            f"offset={self.queue_offset}, body={len(self.body)} bytes)"
        )


class SendStatus(Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(frozen=True)
class SendResult:
    status: SendStatus
    msg_id: str  # of the first message when a batch was sent
    queue: MessageQueue
    queue_offset: int  # of the first message when a batch was sent
    count: int = 1

    @property
    def msg_ids(self) -> list[str]:
        phys, index = int(self.msg_id[:16], 16), int(self.msg_id[16:], 16)
        return [offset_msg_id(phys, index + i) for i in range(self.count)]
