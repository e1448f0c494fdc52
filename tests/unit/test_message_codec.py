"""Batch and record codecs (``hamq.protocol.message``): what a producer encodes is what a
consumer decodes, and every kind of damage — wrong CRC, wrong count, truncation, oversize,
one flipped byte on disk — is detected instead of stored or delivered."""

from __future__ import annotations

import zlib
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamq.errors import CrcMismatch, MessageIllegal
from hamq.protocol.limits import MAX_MESSAGE_BYTES
from hamq.protocol.message import (
    RECORD_HEADER_BYTES,
    RecordHeader,
    check_record_payload,
    decode_properties,
    decode_records,
    encode_batch,
    encode_message,
    encode_properties,
    encode_record_header,
    parse_record_header,
    validate_batch,
)

messages = st.lists(
    st.tuples(
        st.binary(max_size=300),
        st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=20), max_size=4),
    ),
    min_size=1,
    max_size=20,
)


class Decoded(NamedTuple):
    header: RecordHeader
    index: int
    queue_offset: int
    properties: bytes
    body: bytes


def decode(data: bytes, min_queue_offset: int = 0) -> list[Decoded]:
    """Decode raw records as a consumer does (``decode_records`` with a plain factory)."""
    return decode_records(data, min_queue_offset, Decoded)


def make_record(bodies, topic="T", queue_id=3, base=0, phys=0, props=None):
    """A record as the broker stores it: header + topic + batch payload."""
    encoded = [encode_message(b, encode_properties(props)) for b in bodies]
    payload, crc = encode_batch(encoded)
    header = encode_record_header(
        topic.encode(),
        queue_id,
        len(payload),
        crc,
        len(bodies),
        base,
        phys,
        1_700_000_000_000,
        1_699_999_999_000,
    )
    return header + payload


@settings(max_examples=100, deadline=None)
@given(messages)
def test_batch_round_trip(msgs):
    """Encoded messages validate, and decode back to the same bodies and properties."""
    encoded = [encode_message(body, encode_properties(props)) for body, props in msgs]
    payload, crc = encode_batch(encoded)
    validate_batch(payload, len(msgs), crc)
    header = encode_record_header(b"Topic", 1, len(payload), crc, len(msgs), 40, 0, 5, 6)
    decoded = decode(header + payload)
    assert [(d.body, decode_properties(d.properties)) for d in decoded] == [
        (body, props) for body, props in msgs
    ]
    assert [d.queue_offset for d in decoded] == list(range(40, 40 + len(msgs)))
    assert [d.index for d in decoded] == list(range(len(msgs)))
    assert {
        (d.header.topic, d.header.queue_id, d.header.store_timestamp_ms, d.header.born_timestamp_ms)
        for d in decoded
    } == {("Topic", 1, 5, 6)}


def test_validate_rejects_wrong_crc():
    payload, crc = encode_batch([encode_message(b"hello")])
    with pytest.raises(CrcMismatch):
        validate_batch(payload, 1, crc ^ 1)


@pytest.mark.parametrize("count", [0, 1, 3, 5000])
def test_validate_rejects_wrong_count(count):
    payload, crc = encode_batch([encode_message(b"a"), encode_message(b"b")])
    with pytest.raises(MessageIllegal):
        validate_batch(payload, count, crc)


@pytest.mark.parametrize("cut", [1, 3, 5, 8])
def test_validate_rejects_truncated_message(cut):
    """A batch whose last message lost bytes (CRC recomputed, so only structure is wrong)."""
    payload, _ = encode_batch([encode_message(b"first"), encode_message(b"second", b"\x80")])
    truncated = payload[:-cut]
    with pytest.raises(MessageIllegal, match=r"truncated|inconsistent"):
        validate_batch(truncated, 2, zlib.crc32(truncated))


def test_validate_rejects_props_longer_than_message():
    bad = (5).to_bytes(4, "big") + (100).to_bytes(2, "big") + b"abc"
    with pytest.raises(MessageIllegal, match="inconsistent"):
        validate_batch(bad, 1, zlib.crc32(bad))


def test_oversized_messages_rejected():
    """Over the 4 MiB limit: the encoder refuses, and so does the broker-side check (also
    against a smaller per-broker max_message_size)."""
    with pytest.raises(MessageIllegal, match="limit"):
        encode_message(b"\0" * (MAX_MESSAGE_BYTES + 1))
    body = b"\0" * 1000
    payload, crc = encode_batch([encode_message(body)])
    with pytest.raises(MessageIllegal, match="limit of 999"):
        validate_batch(payload, 1, crc, max_message_bytes=999)
    validate_batch(payload, 1, crc, max_message_bytes=1000)


def test_oversized_properties_rejected():
    with pytest.raises(MessageIllegal, match="properties"):
        encode_properties({"k": "v" * 40_000})


@given(
    topic=st.text(min_size=1, max_size=30),
    queue_id=st.integers(0, 65535),
    payload_len=st.integers(0, 2**31),
    crc=st.integers(0, 2**32 - 1),
    count=st.integers(1, 4096),
    base=st.integers(0, 2**62),
    phys=st.integers(0, 2**62),
    ts=st.integers(0, 2**62),
    sys_flag=st.integers(0, 2**32 - 1),
)
def test_record_header_round_trip(
    topic, queue_id, payload_len, crc, count, base, phys, ts, sys_flag
):
    raw_topic = topic.encode()
    raw = encode_record_header(
        raw_topic, queue_id, payload_len, crc, count, base, phys, ts, ts + 1, sys_flag
    )
    h = parse_record_header(b"junk" + raw, 4)
    assert h.total_size == RECORD_HEADER_BYTES + len(raw_topic) + payload_len
    assert (
        h.payload_crc,
        h.physical_offset,
        h.base_queue_offset,
        h.store_timestamp_ms,
        h.born_timestamp_ms,
        h.count,
        h.sys_flag,
        h.queue_id,
        h.topic,
    ) == (crc, phys, base, ts, ts + 1, count, sys_flag, queue_id, topic)
    assert h.payload_start == len(raw)


def test_every_flipped_byte_is_detected():
    """Flip each byte of a record in turn: the header check or the payload check fails."""
    record = make_record([b"alpha", b"beta" * 10], props={"KEYS": "k1"})
    parse_record_header(record)  # intact record is fine
    check_record_payload(record, 0, parse_record_header(record))
    for i in range(len(record)):
        damaged = bytearray(record)
        damaged[i] ^= 0x40
        with pytest.raises(CrcMismatch):
            h = parse_record_header(damaged)
            check_record_payload(damaged, 0, h)


def test_truncated_record_is_detected():
    record = make_record([b"x" * 100])
    with pytest.raises(CrcMismatch, match="truncated"):
        parse_record_header(record[: RECORD_HEADER_BYTES - 1])
    h = parse_record_header(record[:-1])
    with pytest.raises(CrcMismatch, match="truncated"):
        check_record_payload(record[:-1], 0, h)


def test_a_truncated_record_in_a_pull_is_refused_never_read_short():
    with pytest.raises(CrcMismatch, match="truncated"):
        decode(make_record([b"ab", b"cd"])[:-1])


def test_decode_records_skips_below_min_queue_offset():
    """A pull that starts inside a batch: earlier messages of that record are skipped,
    later records are decoded in full."""
    first = make_record([b"m10", b"m11", b"m12"], base=10, phys=0)
    second = make_record([b"m13", b"m14"], base=13, phys=len(first))
    data = first + second
    got = [
        (d.queue_offset, d.body, d.header.physical_offset, d.index)
        for d in decode(data, min_queue_offset=12)
    ]
    assert got == [(12, b"m12", 0, 2), (13, b"m13", len(first), 0), (14, b"m14", len(first), 1)]
    assert [d.body for d in decode(data)] == [b"m10", b"m11", b"m12", b"m13", b"m14"]
    assert decode(data, min_queue_offset=15) == []
