"""The Spark source's pure parts: stored records to Arrow columns, Arrow rows to messages
(offset planning: test_spark_offsets.py)."""

from __future__ import annotations

import zlib

import pyarrow as pa
import pytest

from hamq.client.message import Message, MessageExt
from hamq.protocol.message import decode_records, encode_batch, encode_record_header
from hamq.spark.arrow_codec import BatchEncoder, records_to_batch
from hamq.spark.schema import ARROW_SCHEMA


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
