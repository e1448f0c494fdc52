"""Reading single messages back from the store by queue offset, for the broker's own
services (schedule delivery, send-back, transactions) that re-store a message elsewhere."""

from __future__ import annotations

from typing import NamedTuple

from hamq.protocol.message import RecordHeader, decode_properties, decode_records, offset_msg_id
from hamq.store.message_store import GetStatus, MessageStore

READ_MAX_BYTES = 8 * 1024 * 1024  # a read returns whole records: room for the largest batch


class StoredMessage(NamedTuple):
    queue_offset: int
    physical_offset: int
    index: int  # in its record
    store_timestamp_ms: int
    born_timestamp_ms: int
    properties: dict[str, str]
    body: bytes

    @property
    def msg_id(self) -> str:
        return offset_msg_id(self.physical_offset, self.index)


def _stored(
    header: RecordHeader, index: int, queue_offset: int, props: bytes, body: bytes
) -> StoredMessage:
    return StoredMessage(
        queue_offset,
        header.physical_offset,
        index,
        header.store_timestamp_ms,
        header.born_timestamp_ms,
        decode_properties(props),
        body,
    )


def read_messages(
    store: MessageStore, topic: str, queue_id: int, offset: int, max_messages: int
) -> list[StoredMessage]:
    """Messages from ``offset`` (or from the queue's minimum, if retention removed those
    before it); empty past the end. The broker's own reads: they may pass the durable cap
    (``MessageStore.get_messages``), so a timer due before its message's fsync is not
    taken for one retention removed."""
    result = store.get_messages(
        topic, queue_id, offset, max_messages, READ_MAX_BYTES, past_durable=True
    )
    if result.status is GetStatus.OFFSET_TOO_SMALL:
        offset = result.next_begin_offset
        result = store.get_messages(
            topic, queue_id, offset, max_messages, READ_MAX_BYTES, past_durable=True
        )
    if result.status is not GetStatus.FOUND:
        return []
    # bytes, so bodies and properties handed on are immutable (the records are a bytearray)
    return decode_records(bytes(result.records), offset, _stored)[:max_messages]


def read_message(
    store: MessageStore, topic: str, queue_id: int, offset: int
) -> StoredMessage | None:
    """The message at exactly ``offset``, or None."""
    found = read_messages(store, topic, queue_id, offset, 1)
    return found[0] if found and found[0].queue_offset == offset else None
