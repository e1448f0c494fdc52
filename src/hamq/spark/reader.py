"""Batch and streaming reads of a hamq topic: the driver plans offset ranges per queue; the
executors pull them (``pull.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from hamq.client.message import MessageQueue
from hamq.client.sync import Admin, PullConsumer
from hamq.spark.offsets import (
    OffsetSpec,
    QueueBounds,
    QueueRange,
    cap_to_limit,
    from_stream_offset,
    parse_queue_key,
    plan_ranges,
    queue_key,
    stream_offset,
)
from hamq.spark.options import ReadOptions
from hamq.spark.pull import read_range


def queue_bounds(options: ReadOptions) -> dict[str, QueueBounds]:
    """Min and max offset of every readable queue of the topic, by queue key."""
    with Admin(options.namesrv, options.timeout_s) as admin:
        rows = admin.topic_offsets(options.topic)
    return {
        queue_key(r["broker_name"], r["queue_id"]): QueueBounds(r["min_offset"], r["max_offset"])
        for r in rows
    }


def committed_offsets(options: ReadOptions, keys: list[str]) -> dict[str, int | None]:
    if not options.group:
        return {}
    with PullConsumer(options.group, options.namesrv, options.timeout_s) as consumer:
        return {
            key: consumer.fetch_offset(MessageQueue(options.topic, *parse_queue_key(key)))
            for key in keys
        }


def resolve(
    spec: OffsetSpec, bounds: dict[str, QueueBounds], committed: dict[str, int | None], missing: int
) -> dict[str, int]:
    return {
        key: spec.resolve(key, b, committed.get(key), missing) for key, b in sorted(bounds.items())
    }


class HamqBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[QueueRange]:
        o = self.options
        start_spec = OffsetSpec.parse(
            o.starting_offsets, o.topic, "group" if o.group else "earliest", "startingOffsets"
        )
        end_spec = OffsetSpec.parse(o.ending_offsets, o.topic, "latest", "endingOffsets")
        if end_spec.kind in ("earliest", "group"):
            raise ValueError("option endingOffsets must be 'latest' or JSON offsets")
        bounds = queue_bounds(o)
        committed = committed_offsets(o, list(bounds)) if start_spec.kind == "group" else {}
        start = resolve(start_spec, bounds, committed, missing=-2)
        end = resolve(end_spec, bounds, {}, missing=-1)
        return plan_ranges(
            o.topic, start, {k: max(end[k], start[k]) for k in end}, o.max_records_per_partition
        )

    def read(self, partition: QueueRange) -> Iterator[pa.RecordBatch]:
        yield from read_range(self.options, partition)


class HamqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are the next offset to read per queue. Queues that appear later (the topic
    was expanded) are read from their earliest offset, as Spark's Kafka source does with
    new partitions."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.target: dict[str, int] | None = None  # Trigger.AvailableNow's end

    def initialOffset(self) -> dict:
        o = self.options
        spec = OffsetSpec.parse(
            o.starting_offsets, o.topic, "group" if o.group else "latest", "startingOffsets"
        )
        bounds = queue_bounds(o)
        committed = committed_offsets(o, list(bounds)) if spec.kind == "group" else {}
        return stream_offset(o.topic, resolve(spec, bounds, committed, missing=-2))

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {k: b.max_offset for k, b in queue_bounds(self.options).items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        topic = self.options.topic
        begin = from_stream_offset(topic, start)
        bounds = queue_bounds(self.options)
        for key, b in bounds.items():
            begin.setdefault(key, b.min_offset)  # a new queue
        latest = {k: b.max_offset for k, b in bounds.items()}
        if self.target is not None:
            latest = {k: min(v, self.target.get(k, begin[k])) for k, v in latest.items()}
        latest = {k: max(v, begin[k]) for k, v in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = cap_to_limit(begin, latest, limit.max_rows)
        return stream_offset(topic, {**begin, **latest})

    def reportLatestOffset(self) -> dict:
        bounds = queue_bounds(self.options)
        return stream_offset(self.options.topic, {k: b.max_offset for k, b in bounds.items()})

    def partitions(self, start: dict, end: dict) -> list[QueueRange]:
        topic = self.options.topic
        begin, stop = from_stream_offset(topic, start), from_stream_offset(topic, end)
        bounds = None
        for key in stop:
            if key not in begin:  # a queue that appeared in this batch
                bounds = bounds or queue_bounds(self.options)
                begin[key] = bounds[key].min_offset if key in bounds else 0
        return plan_ranges(
            topic,
            begin,
            {k: max(v, begin[k]) for k, v in stop.items()},
            self.options.max_records_per_partition,
        )

    def read(self, partition: QueueRange) -> Iterator[pa.RecordBatch]:
        yield from read_range(self.options, partition)

    def commit(self, end: dict) -> None:
        """With option ``group``, record progress as the group's consumer offsets so
        ``hamq admin consumer-progress`` shows the pipeline's lag (the checkpoint stays the
        source of truth for where the query resumes)."""
        o = self.options
        if not o.group:
            return
        with PullConsumer(o.group, o.namesrv, o.timeout_s) as consumer:
            for key, offset in from_stream_offset(o.topic, end).items():
                consumer.commit_offset(MessageQueue(o.topic, *parse_queue_key(key)), offset)
