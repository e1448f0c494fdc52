"""Message and record codecs.

A producer encodes a batch once: per message ``u32 size | u16 props_len | props | body``
(``size`` counts what follows it). The broker validates the batch (structure, sizes and the
producer's CRC), prefixes a fixed-size *record header* (offsets, store time) and the topic,
and appends the unchanged bytes in one write. Replication ships records as they are; pull
responses are raw records that consumers decode client-side. One record per send, so a
batch of 64 messages costs one header, one CRC and one consume-queue entry.
"""

from __future__ import annotations

import string
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack

from hamq.errors import CrcMismatch, HamqError, InvalidArgument, MessageIllegal
from hamq.protocol.limits import (
    MAX_BATCH_BYTES,
    MAX_BATCH_MESSAGES,
    MAX_MESSAGE_BYTES,
    MAX_NAME_LENGTH,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_LENGTH,
)

T = TypeVar("T")

MSG_HEAD = struct.Struct(">IH")
MSG_HEAD_BYTES = MSG_HEAD.size
_SIZE_BYTES = 4  # a message's size counts what follows these
_unpack_head = MSG_HEAD.unpack_from

RECORD_MAGIC = 0x48414D51  # "HAMQ"
# magic, header_crc | total_size, payload_crc, physical_offset, base_queue_offset,
# store_timestamp_ms, born_timestamp_ms, count, sys_flag, queue_id, topic_len, topic.
# header_crc covers everything after itself up to the payload.
_RECORD_CHECKED = struct.Struct(">II")
_RECORD_TAIL = struct.Struct(">IIQQqqIIHH")
RECORD_HEADER_BYTES = _RECORD_CHECKED.size + _RECORD_TAIL.size
HEADER_CRC_FROM = _RECORD_CHECKED.size  # the header CRC covers what follows it
# The fixed header in one unpack, for walks over many records without a ``RecordHeader``
# each (a slave appending a transfer): fields as above, header_crc over
# [HEADER_CRC_FROM, RECORD_HEADER_BYTES + topic_len).
RECORD_FIXED_HEADER = struct.Struct(_RECORD_CHECKED.format + _RECORD_TAIL.format[1:])


@dataclass(slots=True)
class RecordHeader:
    """A record's header as parsed, built once per record on every read path: not a
    NamedTuple, whose ``count`` would shadow ``tuple.count``, and not frozen, which makes
    building one about 5x slower."""

    total_size: int
    payload_crc: int
    physical_offset: int
    base_queue_offset: int
    store_timestamp_ms: int
    born_timestamp_ms: int
    count: int
    sys_flag: int
    queue_id: int
    topic: str
    payload_start: int  # relative to the record start


def encode_properties(properties: dict[str, str] | None) -> bytes:
    if not properties:
        return b""
    raw = msgpack.packb(properties, use_bin_type=True)
    if len(raw) > MAX_PROPERTIES_BYTES:
        raise MessageIllegal(
            f"message properties are {len(raw)} bytes encoded, more than "
            f"the limit of {MAX_PROPERTIES_BYTES}"
        )
    return raw


def decode_properties(raw: bytes) -> dict[str, str]:
    return msgpack.unpackb(raw, raw=False) if raw else {}


def encode_message(body: bytes, props: bytes = b"") -> bytes:
    if len(body) > MAX_MESSAGE_BYTES:
        raise MessageIllegal(
            f"message body is {len(body)} bytes, more than the limit of {MAX_MESSAGE_BYTES}"
        )
    return message_head(len(body), props) + body


def message_bounds(buf: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int, int]:
    """``(props_start, body_start, next_pos)`` of the message encoded at ``buf[pos:]``: its
    properties, then its body up to ``next_pos``, where the next message starts. The one
    reader of a message head: every walk over a batch or a record's messages steps with
    it (a function, not a generator, whose set-up would cost every one-message send).
    ``MessageIllegal`` unless the message lies within ``buf[pos:end]``."""
    if end - pos < MSG_HEAD_BYTES:
        raise MessageIllegal(f"the message at byte {pos} is truncated")
    msg_size, props_len = _unpack_head(buf, pos)
    props_start = pos + MSG_HEAD_BYTES
    body_start = props_start + props_len
    next_pos = pos + _SIZE_BYTES + msg_size
    if body_start > next_pos or next_pos > end:
        raise MessageIllegal(f"the message at byte {pos} declares inconsistent sizes")
    return props_start, body_start, next_pos


def message_head(body_len: int, props: bytes = b"") -> bytes:
    """What goes before a body of ``body_len`` bytes: callers that hold the body in pieces
    send it after this without joining it first."""
    return MSG_HEAD.pack(2 + len(props) + body_len, len(props)) + props


def encode_batch(messages: list[bytes]) -> tuple[bytes, int]:
    """Join encoded messages into a batch payload; returns (payload, crc32)."""
    payload = b"".join(messages)
    return payload, zlib.crc32(payload)


# First bytes of a msgpack map (fixmap, map16, map32). Send checks only this much of a
# plain message's properties: decoding them all would cost four times the rest of the
# check; messages the broker acts on are checked in full (``validate_properties``).
_MAP_HEADS = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}


def validate_batch(
    payload: bytes | memoryview,
    count: int,
    payload_crc: int,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
) -> None:
    """Check a producer's batch before it is stored; raise a clear error if it is bad."""
    size = len(payload)
    if size > MAX_BATCH_BYTES:
        raise MessageIllegal(f"batch is {size} bytes, more than the limit of {MAX_BATCH_BYTES}")
    if not 1 <= count <= MAX_BATCH_MESSAGES:
        raise MessageIllegal(f"batch declares {count} messages; 1..{MAX_BATCH_MESSAGES} allowed")
    if zlib.crc32(payload) != payload_crc:
        raise CrcMismatch("batch CRC does not match its bytes (corrupted in transit?)")
    pos = 0
    seen = 0
    while pos < size:
        props_start, body_start, pos = message_bounds(payload, pos, size)
        if pos - body_start > max_message_bytes:
            raise MessageIllegal(
                f"message {seen} is {pos - body_start} bytes, more than the "
                f"limit of {max_message_bytes}"
            )
        if body_start > props_start and payload[props_start] not in _MAP_HEADS:
            raise MessageIllegal(
                f"message {seen} has properties that are not a map of string to string"
            )
        seen += 1
    if seen != count:
        raise MessageIllegal(f"batch declares {count} messages but holds {seen}")


# Characters of topic, group, broker and cluster names: RocketMQ's TopicValidator set
# (``^[%|a-zA-Z0-9_-]+$``) plus '.'. A topic name becomes a directory of the store, so no
# separator, NUL or control character may reach it; '.' and '..' are refused by name.
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "%|_-.")
_NAME_CHARS_TEXT = "letters, digits and % | _ - ."


def validate_name(
    value: object,
    field: str,
    max_length: int = MAX_NAME_LENGTH,
    error: type[HamqError] = InvalidArgument,
) -> str:
    """A name a peer sent (topic, group, broker, cluster), checked so that it is safe as a
    path component and in logs; ``error`` names the field and what is wrong."""
    if not isinstance(value, str):
        raise error(f"{field} must be a string, got {type(value).__name__}")
    if not value:
        raise error(f"{field} must not be empty")
    if len(value) > max_length:
        raise error(f"{field} is {len(value)} characters, more than the limit of {max_length}")
    if not _NAME_CHARS.issuperset(value):
        bad = next(c for c in value if c not in _NAME_CHARS)
        what = "NUL" if bad == "\0" else repr(bad)
        raise error(f"{field} {value!r} contains {what}; allowed: {_NAME_CHARS_TEXT}")
    if value in (".", ".."):
        raise error(f"{field} {value!r} is a directory reference, not a name")
    return value


def validate_topic(topic: object) -> bytes:
    """A topic name as the bytes stored in record headers; ``MessageIllegal`` if unsafe."""
    return validate_name(topic, "topic", MAX_TOPIC_LENGTH, MessageIllegal).encode()


def encode_record_header(
    topic: bytes,
    queue_id: int,
    payload_len: int,
    payload_crc: int,
    count: int,
    base_queue_offset: int,
    physical_offset: int,
    store_timestamp_ms: int,
    born_timestamp_ms: int,
    sys_flag: int = 0,
) -> bytes:
    """The fixed header plus topic that the broker stamps in front of a payload."""
    total = RECORD_HEADER_BYTES + len(topic) + payload_len
    tail = (
        _RECORD_TAIL.pack(
            total,
            payload_crc,
            physical_offset,
            base_queue_offset,
            store_timestamp_ms,
            born_timestamp_ms,
            count,
            sys_flag,
            queue_id,
            len(topic),
        )
        + topic
    )
    return _RECORD_CHECKED.pack(RECORD_MAGIC, zlib.crc32(tail)) + tail


def parse_record_header(
    buf: bytes | bytearray | memoryview, pos: int = 0, available: int | None = None
) -> RecordHeader:
    """Parse and check the header at ``buf[pos:]``; raise ``CrcMismatch`` if it is torn."""
    end = len(buf) if available is None else pos + available
    if end - pos < RECORD_HEADER_BYTES:
        raise CrcMismatch("record header truncated")
    magic, header_crc = _RECORD_CHECKED.unpack_from(buf, pos)
    if magic != RECORD_MAGIC:
        raise CrcMismatch(f"bad record magic {magic:#x}")
    (total, payload_crc, phys, base, store_ts, born_ts, count, sys_flag, queue_id, topic_len) = (
        _RECORD_TAIL.unpack_from(buf, pos + HEADER_CRC_FROM)
    )
    payload_start = RECORD_HEADER_BYTES + topic_len
    if pos + payload_start > end:
        raise CrcMismatch("record header truncated")
    if zlib.crc32(buf[pos + HEADER_CRC_FROM : pos + payload_start]) != header_crc:
        raise CrcMismatch("record header CRC mismatch")
    if total < payload_start:
        raise CrcMismatch("record declares a size smaller than its header")
    topic = bytes(buf[pos + RECORD_HEADER_BYTES : pos + payload_start]).decode()
    return RecordHeader(
        total,
        payload_crc,
        phys,
        base,
        store_ts,
        born_ts,
        count,
        sys_flag,
        queue_id,
        topic,
        payload_start,
    )


def check_record_payload(
    buf: bytes | bytearray | memoryview, pos: int, header: RecordHeader
) -> None:
    end = pos + header.total_size
    if end > len(buf):
        raise CrcMismatch("record payload truncated")
    if zlib.crc32(buf[pos + header.payload_start : end]) != header.payload_crc:
        raise CrcMismatch("record payload CRC mismatch")


def decode_records(
    data: bytes, min_queue_offset: int, factory: Callable[..., T], *context: Any
) -> list[T]:
    """Decode a pull response (raw records) into ``factory(*context, header, index,
    queue_offset, properties, body)`` objects, skipping messages below
    ``min_queue_offset`` (a pull may start inside a batch). One call per message and no
    intermediate objects: this loop is the consumer's hot path."""
    out: list[T] = []
    append = out.append
    pos = 0
    size = len(data)
    while pos < size:
        h = parse_record_header(data, pos)
        mpos = pos + h.payload_start
        end = pos + h.total_size
        if end > size:  # else its last message would be read short
            raise CrcMismatch(f"the record at byte {pos} is truncated")
        offset = h.base_queue_offset
        for index in range(h.count):
            props_start, body_start, mpos = message_bounds(data, mpos, end)
            if offset >= min_queue_offset:
                append(
                    factory(
                        *context,
                        h,
                        index,
                        offset,
                        data[props_start:body_start] if body_start > props_start else b"",
                        data[body_start:mpos],
                    )
                )
            offset += 1
        pos = end
    return out


def offset_msg_id(physical_offset: int, index: int) -> str:
    """RocketMQ's offsetMsgId idea: where the message sits in its group's commit log (the
    same on every replica, since replicas copy the log byte for byte)."""
    return f"{physical_offset:016X}{index:08X}"


def parse_offset_msg_id(msg_id: object) -> tuple[int, int]:
    """(physical_offset, index) of an ``offset_msg_id``; ``InvalidArgument`` for anything
    else (an operator's typo, a producer's UNIQ_KEY given where a msg id is wanted)."""
    if not isinstance(msg_id, str) or len(msg_id) != 24 or not set(msg_id) <= set(string.hexdigits):
        raise InvalidArgument(
            f"msg id {msg_id!r:.80} is not 24 hex digits (a commit-log offset and an index)"
        )
    return int(msg_id[:16], 16), int(msg_id[16:], 16)
