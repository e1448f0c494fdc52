"""The Spark source's pure parts: stored records to Arrow columns, Arrow rows to messages
(offset planning: test_spark_offsets.py)."""

from __future__ import annotations

import zlib

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamq.client.message import Message, MessageExt
from hamq.errors import CrcMismatch
from hamq.protocol.message import decode_records, encode_batch, encode_record_header
from hamq.spark.arrow_codec import BatchEncoder, records_to_batch
from hamq.spark.schema import ARROW_SCHEMA, READ_COLUMNS, arrow_schema


def record(messages: list[Message], base_offset: int, born_ms: int = 1_700_000_000_000) -> bytes:
    payload, crc = encode_batch([m.encode() for m in messages])
    header = encode_record_header(
        b"T",
        2,
        len(payload),
        crc,
        len(messages),
        base_offset,
        physical_offset=0,
        store_timestamp_ms=born_ms + 5,
        born_timestamp_ms=born_ms,
    )
    return header + payload


def test_records_become_one_arrow_batch_trimmed_to_the_range():
    data = record(
        [Message("T", b"a"), Message("T", b"bb", keys="k1", tags="x", properties={"p": "1"})], 10
    ) + record([Message("T", b""), Message("T", b"dddd")], 12, born_ms=1_700_000_001_000)
    batch, next_offset = records_to_batch(data, 11, 13, "T", "broker-a", 2)
    assert batch.schema == ARROW_SCHEMA and next_offset == 13
    rows = batch.to_pylist()
    assert [r["value"] for r in rows] == [b"bb", b""]  # offsets 11 and 12; 13 is past `end`
    assert [r["offset"] for r in rows] == [11, 12]
    assert rows[0]["key"] == b"k1" and rows[0]["tags"] == "x"
    assert rows[0]["properties"] == [("p", "1")] and rows[1]["properties"] == []
    assert rows[1]["key"] is None and rows[1]["tags"] is None
    assert {(r["topic"], r["broker"], r["queue"]) for r in rows} == {("T", "broker-a", 2)}
    assert rows[1]["timestamp"].timestamp() == 1_700_000_001


def test_nothing_in_range_gives_no_batch():
    data = record([Message("T", b"a")], 10)
    assert records_to_batch(data, 11, 20, "T", "b", 0) == (None, 11)


def test_encoded_rows_decode_back_to_the_same_messages():
    batch = pa.RecordBatch.from_pydict(
        {
            "value": ["v0", "v1"],
            "key": [b"k", None],
            "tags": [None, "t"],
            "properties": pa.array([[("a", "1")], None], pa.map_(pa.string(), pa.string())),
        }
    )
    rows = BatchEncoder("T").encode(batch)
    payload = b"".join(h + v for h, v in zip(rows.heads, rows.values))
    decoded = decode_records(record_from_payload(payload, 2), 0, MessageExt, "b")
    assert [m.body for m in decoded] == [b"v0", b"v1"]
    assert decoded[0].properties == {"a": "1", "KEYS": "k"}
    assert decoded[1].properties == {"TAGS": "t"}


def record_from_payload(payload: bytes, count: int) -> bytes:
    return (
        encode_record_header(b"T", 0, len(payload), zlib.crc32(payload), count, 0, 0, 0, 0)
        + payload
    )


def test_a_value_column_of_another_type_is_refused():
    with pytest.raises(TypeError, match="'value' column must be binary or string, not int64"):
        BatchEncoder("T").encode(pa.RecordBatch.from_pydict({"value": [1, 2]}))


@st.composite
def records(draw) -> tuple[bytes, int]:
    """Records as producers batch them: often messages of one size (the codec takes those
    a record at a time), sometimes with properties, sometimes of mixed sizes."""
    data, offset = b"", draw(st.integers(0, 50))
    first = offset
    for _ in range(draw(st.integers(1, 4))):
        count = draw(st.integers(1, 20))
        size = draw(st.integers(0, 40))
        # one size; sizes that still add up to count x the first (size, size+d, size-d,
        # ...: only the heads tell them apart); any sizes
        sizes = draw(st.sampled_from(["one", "balanced", "any"]))
        props = draw(st.sampled_from([{}, {"p": "1"}, "keys"]))
        messages = []
        for i in range(count):
            if sizes == "any":
                length = draw(st.integers(0, 40))
            else:
                length = size + (0 if sizes == "one" or i == 0 else (1 if i % 2 else -1) * size)
            body = bytes([i % 256]) * length
            if props == "keys":
                messages.append(Message("T", body, keys=f"k{i}", tags="t" if i % 2 else None))
            else:
                messages.append(Message("T", body, properties=dict(props)))
        data += record(messages, offset, born_ms=1_700_000_000_000 + offset)
        offset += count
    return data, first


@settings(max_examples=300, deadline=None)
@given(
    records(),
    st.integers(0, 120),
    st.integers(0, 120),
    st.lists(st.sampled_from(READ_COLUMNS), unique=True, max_size=len(READ_COLUMNS)),
)
def test_every_column_set_and_range_reads_what_the_message_decoder_reads(
    stored, start, length, columns
):
    data, _ = stored
    batch, next_offset = records_to_batch(
        data, start, start + length, "T", "b", 2, arrow_schema(tuple(columns))
    )
    expected = [
        m for m in decode_records(data, start, MessageExt, "b") if m.queue_offset < start + length
    ]
    if not expected:
        assert batch is None
        return
    assert next_offset == expected[-1].queue_offset + 1
    want = {
        "key": [None if m.keys is None else m.keys.encode() for m in expected],
        "value": [m.body for m in expected],
        "topic": ["T"] * len(expected),
        "broker": ["b"] * len(expected),
        "queue": [2] * len(expected),
        "offset": [m.queue_offset for m in expected],
        "timestamp": [m.born_timestamp_ms for m in expected],
        "tags": [m.tags for m in expected],
        "properties": [
            sorted((k, v) for k, v in m.properties.items() if k not in ("KEYS", "TAGS", "UNIQ_KEY"))
            for m in expected
        ],
    }
    assert batch.num_rows == len(expected) and batch.schema.names == columns
    got = batch.to_pydict()
    if "timestamp" in got:
        got["timestamp"] = [int(t.timestamp() * 1000) for t in got["timestamp"]]
    if "properties" in got:
        got["properties"] = [sorted(p) for p in got["properties"]]
    assert got == {name: want[name] for name in columns}


@pytest.mark.parametrize("columns", [("value",), READ_COLUMNS, ()])
@pytest.mark.parametrize("count", [2, 8])  # message by message; a record at a time
def test_a_truncated_record_is_refused_never_read_short(columns, count):
    data = record([Message("T", b"ab")] * count, 0)[:-1]
    with pytest.raises(CrcMismatch, match="truncated"):
        records_to_batch(data, 0, 100, "T", "b", 0, arrow_schema(columns))


def test_values_do_not_alias_the_pulled_bytes():
    pulled = bytearray(record([Message("T", b"hello")], 0))
    batch, _ = records_to_batch(pulled, 0, 1, "T", "b", 0, arrow_schema(("value",)))
    pulled[-5:] = b"XXXXX"
    assert batch.column(0).to_pylist() == [b"hello"]
