"""The Spark source's pure parts: stored records to Arrow columns, Arrow rows to messages,
offset specs and how a read limit is shared out."""

from __future__ import annotations

import zlib

import pyarrow as pa
import pytest

from hamq.client.message import Message, MessageExt
from hamq.protocol.message import decode_records, encode_batch, encode_record_header
from hamq.spark.arrow_codec import BatchEncoder, records_to_batch
from hamq.spark.offsets import OffsetSpec, QueueBounds, cap_to_limit, plan_ranges
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


def test_offset_specs_resolve_and_clamp():
    bounds = QueueBounds(5, 50)
    spec = OffsetSpec.parse('{"T": {"b:0": 7, "b:1": -1, "b:2": 99}}', "T", "earliest", "o")
    assert [spec.resolve(k, bounds) for k in ("b:0", "b:1", "b:2", "b:3")] == [7, 50, 50, 5]
    assert OffsetSpec.parse(None, "T", "latest", "o").resolve("b:0", bounds) == 50
    group = OffsetSpec.parse("group", "T", "earliest", "o")
    assert group.resolve("b:0", bounds, committed=20) == 20
    assert group.resolve("b:0", bounds, committed=None) == 5
    for bad in ("nope", '{"T": {"b:0": "x"}}', '{"T": 3}', '{"T": {"b:0": -3}}'):
        with pytest.raises(ValueError, match="option o"):
            OffsetSpec.parse(bad, "T", "earliest", "o")


def test_read_limit_is_shared_by_what_waits_and_never_exceeded():
    start = {"b:0": 0, "b:1": 0, "b:2": 0}
    latest = {"b:0": 900, "b:1": 100, "b:2": 0}
    end = cap_to_limit(start, latest, 100)
    assert sum(end[k] - start[k] for k in end) <= 100
    assert end["b:0"] == 90 and end["b:1"] == 10 and end["b:2"] == 0
    assert cap_to_limit(start, {"b:0": 1, "b:1": 1, "b:2": 1}, 2) == {"b:0": 1, "b:1": 1, "b:2": 0}
    assert cap_to_limit(start, latest, 5_000) == latest


def test_ranges_split_by_max_records():
    ranges = plan_ranges("T", {"b:0": 0, "b:1": 5}, {"b:0": 10, "b:1": 5}, 4)
    assert [(r.queue_id, r.start, r.end) for r in ranges] == [(0, 0, 4), (0, 4, 8), (0, 8, 10)]
