"""Stored records to Arrow columns and Arrow rows to encoded messages: the data source's
hot paths, written so that no Python object is made per message beyond one memoryview
slice (read) or one bytes object (write). A record whose messages share one size (a
producer's batch of fixed-size messages) is read without a Python step per message.

A partition reads one queue, so topic, broker and queue are constants of a pull and the
offsets a range; only bodies, timestamps and (when present) properties vary per message.
"""

from __future__ import annotations

import zlib
from array import array
from dataclasses import dataclass, field
from itertools import repeat

import msgpack
import numpy as np
import pyarrow as pa

from hamq.client.message import PROPERTY_KEYS, PROPERTY_TAGS
from hamq.errors import CrcMismatch
from hamq.protocol.message import (
    MSG_HEAD,
    MSG_HEAD_BYTES,
    encode_properties,
    message_bounds,
    message_head,
    parse_record_header,
)
from hamq.protocol.properties import PROPERTY_UNIQ_KEY
from hamq.spark.schema import ARROW_SCHEMA

_EMPTY_STRINGS = pa.array([], pa.string())
# Columns that need every message walked; the others follow from each record's header.
_MESSAGE_COLUMNS = frozenset(("key", "value", "tags", "properties"))
_PROPERTY_COLUMNS = frozenset(("key", "tags", "properties"))
# Below this many messages a record is walked message by message: numpy's set-up costs
# more than the walk.
_UNIFORM_MIN_MESSAGES = 8
_MAX_BINARY_BYTES = 2**31 - 1  # Arrow's binary type has int32 offsets


@dataclass
class _Rows:
    """The messages of a pull inside the range: ``count`` rows from offset ``first`` on;
    timestamps, bodies and properties only when a column needs them."""

    first: int = -1
    count: int = 0
    next_offset: int = 0  # after the last message seen
    stamps: array = field(default_factory=lambda: array("q"))  # born timestamps in µs
    parts: list = field(default_factory=list)  # buffers joined into the value column's data
    lengths: array = field(default_factory=lambda: array("i"))  # body length per row
    props: list[tuple[int, bytes]] = field(default_factory=list)  # (row, raw properties)


def records_to_batch(
    data: bytes | memoryview,
    start: int,
    end: int,
    topic: str,
    broker: str,
    queue_id: int,
    schema: pa.Schema = ARROW_SCHEMA,
) -> tuple[pa.RecordBatch | None, int]:
    """Messages with ``start <= offset < end`` from a pull's records, as one Arrow batch of
    ``schema``'s columns (None if there were none), and the offset after the last message
    seen. Only what the columns need is decoded: without key, value, tags and properties
    no message is looked at (a record's header says how many it holds)."""
    names = schema.names
    with_props = not _PROPERTY_COLUMNS.isdisjoint(names)
    rows = _scan(
        memoryview(data),
        start,
        end,
        not _MESSAGE_COLUMNS.isdisjoint(names),
        with_props,
        "timestamp" in names,
    )
    n = rows.count
    if not n:
        return None, max(rows.next_offset, start)
    if not names:  # row counts only: Spark still takes each batch's length from it
        rowless = pa.StructArray.from_buffers(pa.struct([]), n, [None])
        return pa.RecordBatch.from_struct_array(rowless), rows.first + n
    key = tags = properties = None
    if with_props:
        key, tags, properties = _property_columns(n, rows.props)
    build = {
        "key": lambda: key,
        "value": lambda: _binary_array(rows),
        "topic": lambda: pa.repeat(pa.scalar(topic, pa.string()), n),
        "broker": lambda: pa.repeat(pa.scalar(broker, pa.string()), n),
        "queue": lambda: pa.repeat(pa.scalar(queue_id, pa.int32()), n),
        "offset": lambda: pa.array(np.arange(rows.first, rows.first + n, dtype=np.int64)),
        "timestamp": lambda: pa.Array.from_buffers(
            pa.timestamp("us", tz="UTC"), n, [None, pa.py_buffer(rows.stamps)]
        ),
        "tags": lambda: tags,
        "properties": lambda: properties,
    }
    columns = [build[name]() for name in names]
    return pa.RecordBatch.from_arrays(columns, schema=schema), rows.first + n


def _scan(
    view: memoryview, start: int, end: int, with_bodies: bool, with_props: bool, with_stamps: bool
) -> _Rows:
    """The rows in range, record by record; a record's messages are walked only for
    bodies or properties."""
    rows = _Rows(next_offset=start)
    pos, size = 0, len(view)
    while pos < size:
        h = parse_record_header(view, pos)
        base, record_end = h.base_queue_offset, pos + h.total_size
        if record_end > size:  # else its last message would be read short
            raise CrcMismatch(f"the record at byte {pos} is truncated")
        rows.next_offset = base + h.count
        lo, hi = max(start, base), min(end, base + h.count)
        if hi > lo:
            if rows.first < 0:
                rows.first = lo
            if with_bodies:
                mpos = pos + h.payload_start
                skip, stop = lo - base, hi - base
                _take_messages(view, mpos, record_end, h.count, skip, stop, rows, with_props)
            if with_stamps:
                rows.stamps.extend(array("q", [h.born_timestamp_ms * 1000]) * (hi - lo))
            rows.count += hi - lo
        pos = record_end
    return rows


def _take_messages(
    view: memoryview,
    mpos: int,
    record_end: int,
    count: int,
    skip: int,
    stop: int,
    rows: _Rows,
    with_props: bool,
) -> None:
    """Bodies (and raw properties) of a record's messages ``skip..stop-1``."""
    uniform = _uniform_bodies(view, mpos, record_end, count, with_props)
    if uniform is not None:
        rows.parts.append(uniform[skip:stop].tobytes())
        rows.lengths.extend(array("i", [uniform.shape[1]]) * (stop - skip))
        return
    for i in range(stop):
        props_start, body_start, mpos = message_bounds(view, mpos, record_end)
        if i >= skip:
            if with_props and body_start > props_start:
                props = bytes(view[props_start:body_start])
                rows.props.append((rows.count + i - skip, props))
            rows.parts.append(view[body_start:mpos])
            rows.lengths.append(mpos - body_start)


def _uniform_bodies(
    view: memoryview, mpos: int, record_end: int, count: int, with_props: bool
) -> np.ndarray | None:
    """A record whose messages all have the first one's size and property length (a
    producer's batch of fixed-size messages) as a ``count x body length`` grid of its
    bodies, found without a Python step per message; None for any other record, or when
    properties are asked for and the messages carry some. Equal heads at every stride are
    what a message-by-message walk would find, so both give the same rows."""
    if count < _UNIFORM_MIN_MESSAGES:
        return None
    props_start, body_start, next_pos = message_bounds(view, mpos, record_end)
    stride = next_pos - mpos
    if stride * count != record_end - mpos or (with_props and body_start > props_start):
        return None
    grid = np.frombuffer(view, np.uint8, record_end - mpos, mpos).reshape(count, stride)
    heads = grid[:, :MSG_HEAD_BYTES]
    if not (heads == heads[0]).all():
        return None
    return grid[:, body_start - mpos :]


def _binary_array(rows: _Rows) -> pa.Array:
    """The bodies as one binary column; joined into bytes of their own (a memoryview of
    the pull would keep the whole response alive, and see a caller's later writes)."""
    offsets = np.zeros(rows.count + 1, np.int64)
    np.cumsum(np.frombuffer(rows.lengths, np.int32), out=offsets[1:])
    if offsets[-1] > _MAX_BINARY_BYTES:  # int32 offsets would wrap around
        raise OverflowError(f"{offsets[-1]} bytes of values do not fit one Arrow batch")
    return pa.Array.from_buffers(
        pa.binary(),
        rows.count,
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(rows.parts))],
    )


def _property_columns(
    n: int, props: list[tuple[int, bytes]]
) -> tuple[pa.Array, pa.Array, pa.Array]:
    """key (from KEYS), tags (from TAGS) and the remaining properties as a map; the
    producer's UNIQ_KEY is a system property (RocketMQ's client id of the send), not one
    the user set, so it stays out of the map as KEYS and TAGS do."""
    if not props:
        empty = pa.MapArray.from_arrays(
            pa.array(repeat(0, n + 1), pa.int32(), size=n + 1), _EMPTY_STRINGS, _EMPTY_STRINGS
        )
        return pa.nulls(n, pa.binary()), pa.nulls(n, pa.string()), empty
    keys: list[bytes | None] = [None] * n
    tags: list[str | None] = [None] * n
    map_offsets = array("i", [0] * (n + 1))
    names: list[str] = []
    items: list[str] = []
    row_props = dict(props)
    for row in range(n):
        raw = row_props.get(row)
        if raw is not None:
            decoded = msgpack.unpackb(raw, raw=False)
            key = decoded.pop(PROPERTY_KEYS, None)
            keys[row] = None if key is None else key.encode()
            tags[row] = decoded.pop(PROPERTY_TAGS, None)
            decoded.pop(PROPERTY_UNIQ_KEY, None)
            names.extend(decoded)
            items.extend(decoded.values())
        map_offsets[row + 1] = len(names)
    properties = pa.MapArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(map_offsets)]),
        pa.array(names, pa.string()),
        pa.array(items, pa.string()),
    )
    return pa.array(keys, pa.binary()), pa.array(tags, pa.string()), properties


@dataclass
class EncodedRows:
    """A batch's rows in hamq's message format, column-wise: ``heads[i] + values[i]`` is
    row i's encoded message (kept apart so the body is never copied before the send)."""

    topics: list[str] | str
    keys: list[bytes | None] | None
    heads: list[bytes]
    values: list[bytes]


class BatchEncoder:
    """Encodes the rows of Arrow batches into hamq's message format."""

    def __init__(self, default_topic: str | None) -> None:
        self.default_topic = default_topic

    def encode(self, batch: pa.RecordBatch) -> EncodedRows:
        n = batch.num_rows
        names = batch.schema.names
        values = _as_bytes(batch.column(names.index("value")), "value")
        if None in values:
            raise ValueError("the hamq sink got a null 'value'; every row needs one")
        keys = _as_bytes(batch.column(names.index("key")), "key") if "key" in names else None
        tags = batch.column(names.index("tags")).to_pylist() if "tags" in names else None
        props = (
            batch.column(names.index("properties")).to_pylist() if "properties" in names else None
        )
        topics: list[str] | str | None = self.default_topic
        if "topic" in names:
            topics = [
                t or self.default_topic for t in batch.column(names.index("topic")).to_pylist()
            ]
            if None in topics:
                raise ValueError(
                    "the hamq sink got a row with a null 'topic' and no 'topic' "
                    "option to fall back on"
                )
        pack = MSG_HEAD.pack
        if tags is None and props is None and (keys is None or not any(keys)):
            return EncodedRows(topics, None, [pack(len(v) + 2, 0) for v in values], values)
        heads = []
        for i in range(n):
            message_props = dict(props[i]) if props is not None and props[i] else {}
            if keys is not None and keys[i] is not None:
                message_props[PROPERTY_KEYS] = keys[i].decode("utf-8", "surrogateescape")
            if tags is not None and tags[i] is not None:
                message_props[PROPERTY_TAGS] = tags[i]
            heads.append(message_head(len(values[i]), encode_properties(message_props)))
        return EncodedRows(topics, keys, heads, values)


def _as_bytes(column: pa.Array, name: str) -> list[bytes | None]:
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return [None if s is None else s.encode() for s in column.to_pylist()]
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        return column.to_pylist()
    raise TypeError(f"the hamq sink's {name!r} column must be binary or string, not {column.type}")


def queue_for_key(key: bytes, queue_count: int) -> int:
    """Rows with the same key go to the same queue (Kafka's keyed partitioning)."""
    return zlib.crc32(key) % queue_count
