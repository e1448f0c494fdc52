"""User-facing message types, named as in RocketMQ's client."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

from hamq.protocol.message import (DecodedMessage, decode_properties, encode_message,
                                   encode_properties, offset_msg_id)

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"


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

    def encode(self) -> bytes:
        """The wire form of one message inside a batch (see ``protocol.message``)."""
        if not isinstance(self.body, (bytes, bytearray, memoryview)):
            raise TypeError(f"message body must be bytes, not {type(self.body).__name__}")
        if not (self.keys or self.tags or self.properties):
            return encode_message(self.body)
        props = dict(self.properties)
        if self.keys:
            props[PROPERTY_KEYS] = self.keys if isinstance(self.keys, str) else " ".join(self.keys)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        return encode_message(self.body, encode_properties(props))


class MessageExt:
    """A consumed message: the body plus where and when it was stored. Properties are
    decoded on first access, so consumers that only read bodies pay nothing for them."""

    __slots__ = ("_d", "broker_name", "__dict__")

    def __init__(self, decoded: DecodedMessage, broker_name: str) -> None:
        self._d = decoded
        self.broker_name = broker_name

    topic = property(lambda self: self._d.topic)
    queue_id = property(lambda self: self._d.queue_id)
    queue_offset = property(lambda self: self._d.queue_offset)
    body = property(lambda self: self._d.body)
    store_timestamp_ms = property(lambda self: self._d.store_timestamp_ms)
    born_timestamp_ms = property(lambda self: self._d.born_timestamp_ms)

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self._d.topic, self.broker_name, self._d.queue_id)

    @property
    def msg_id(self) -> str:
        return offset_msg_id(self._d.physical_offset, self._d.index)

    @cached_property
    def properties(self) -> dict[str, str]:
        return decode_properties(self._d.properties)

    @property
    def keys(self) -> str | None:
        return self.properties.get(PROPERTY_KEYS)

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    def __repr__(self) -> str:
        return (f"MessageExt(topic={self.topic!r}, queue={self.broker_name}:{self.queue_id}, "
                f"offset={self.queue_offset}, body={len(self.body)} bytes)")


class SendStatus(Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(frozen=True)
class SendResult:
    status: SendStatus
    msg_id: str            # of the first message when a batch was sent
    queue: MessageQueue
    queue_offset: int      # of the first message when a batch was sent
    count: int = 1

    @property
    def msg_ids(self) -> list[str]:
        phys, index = int(self.msg_id[:16], 16), int(self.msg_id[16:], 16)
        return [offset_msg_id(phys, index + i) for i in range(self.count)]
