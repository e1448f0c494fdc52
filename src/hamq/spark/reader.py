"""Batch and streaming reads of hamq topics: the driver plans offset ranges per queue; the
executors pull them (``pull.py``)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from hamq.broker.topics import is_system_topic
from hamq.client.message import MessageQueue
from hamq.client.sync import Admin, PullConsumer
from hamq.errors import TopicNotExist
from hamq.spark.offsets import (
    LATEST,
    Offsets,
    OffsetSpec,
    QueueBounds,
    QueueRange,
    TopicQueue,
    below_minimum,
    cap_to_limit,
    clamp,
    from_stream_offset,
    plan_ranges,
    plan_starts,
    stream_offset,
)
from hamq.spark.options import ReadOptions, TopicSelection
from hamq.spark.pull import read_range
from hamq.spark.schema import READ_COLUMNS

log = logging.getLogger(__name__)

Bounds = dict[TopicQueue, QueueBounds]


class DataLoss(RuntimeError):
    """Offsets the read should have covered are gone (Kafka's source reports the same
    under ``failOnDataLoss``)."""


def report_data_loss(options: ReadOptions, losses: list[str]) -> None:
    """Fail the query with the losses, or with ``failOnDataLoss=false`` warn and go on."""
    if not losses:
        return
    text = "; ".join(losses)
    if options.fail_on_data_loss:
        raise DataLoss(
            f"hamq source: {text}. Some data may have been lost: retention removed it, the "
            "topic was deleted, or a master lost messages it had not replicated. If you "
            "don't want the query to fail in such cases, set the source option "
            "failOnDataLoss to false."
        )
    log.warning("hamq source: %s. Some data may have been lost (failOnDataLoss=false)", text)


def read_topics(admin: Admin, topics: TopicSelection) -> list[str]:
    """The topics read now: ``subscribePattern`` is matched against the cluster's topics
    (system topics left out, as Kafka leaves out internal ones) at every call."""
    if topics.pattern is None:
        return list(topics.topics or dict(topics.assigned))
    return sorted(
        t
        for t in admin.topic_list()
        if re.fullmatch(topics.pattern, t) is not None and not is_system_topic(t)
    )


def queue_bounds(options: ReadOptions) -> Bounds:
    """Min and max offset of every readable queue of the topics read, and whether a
    master answered. A topic the pattern matched that is gone by now is left out."""
    bounds: Bounds = {}
    assigned = dict(options.topics.assigned)
    with Admin(options.namesrv, options.timeout_s) as admin:
        for topic in read_topics(admin, options.topics):
            try:
                route = admin.topic_route(topic)
                rows = admin.topic_offsets(topic)
            except TopicNotExist:
                if options.topics.pattern is None:
                    raise
                continue
            for r in rows:
                queue = TopicQueue(topic, r["broker_name"], r["queue_id"])
                if topic not in assigned or queue.key in assigned[topic]:
                    master = route.master_addr(queue.broker) is not None
                    bounds[queue] = QueueBounds(r["min_offset"], r["max_offset"], master)
    return bounds


def check_assigned(options: ReadOptions, bounds: Bounds) -> None:
    """An ``assign`` naming a queue the topic does not have is a typo, not an empty read."""
    for topic, keys in options.topics.assigned:
        missing = [k for k in keys if TopicQueue.of(topic, k) not in bounds]
        if missing:  # bounds hold the assigned queues only: name the topic's others
            with Admin(options.namesrv, options.timeout_s) as admin:
                route = admin.topic_route(topic)
            queues = sorted(TopicQueue(topic, q.broker_name, q.queue_id) for q in route.read_queues)
            have = [q.key for q in queues]
            raise ValueError(
                f"option assign: topic {topic} has no readable queue {', '.join(missing)} "
                f"(it has {', '.join(have) or 'none'})"
            )


def starting_offsets(options: ReadOptions, bounds: Bounds, default: str) -> Offsets:
    """Where a read starts: ``startingTimestamp`` (the brokers' search by store time),
    ``startingOffsets`` or ``default``. An offset asked for that retention removed is
    data loss, not a silent clamp; one past the end starts at the end."""
    o = options
    check_assigned(o, bounds)
    committed: dict[TopicQueue, int | None] = {}
    if o.starting_timestamp_ms is not None:
        spec = OffsetSpec("timestamp", by_timestamp(o, list(bounds), o.starting_timestamp_ms))
    else:
        spec = OffsetSpec.parse(
            o.starting_offsets, o.topics, "group" if o.group else default, "startingOffsets"
        )
        if spec.kind == "group":
            committed = committed_offsets(o, list(bounds))
    start: Offsets = {}
    losses = []
    for queue, b in sorted(bounds.items()):
        wanted = spec.wanted(queue, committed.get(queue), missing=-2)
        loss = below_minimum(queue, wanted, b)
        if loss:
            losses.append(f"startingOffsets: {loss}")
        start[queue] = clamp(wanted, b)
    report_data_loss(o, losses)
    return start


def by_timestamp(options: ReadOptions, queues: list[TopicQueue], timestamp_ms: int) -> Offsets:
    """Per queue the first offset stored at or after ``timestamp_ms``; a queue with nothing
    that recent starts at its end (Kafka's ``startingOffsetsByTimestampStrategy=latest``)."""
    with PullConsumer(options.pull_group, options.namesrv, options.timeout_s) as consumer:
        return {q: consumer.search_offset(MessageQueue(*q), timestamp_ms) for q in queues}


def committed_offsets(options: ReadOptions, queues: list[TopicQueue]) -> dict:
    if not options.group:
        return {}
    with PullConsumer(options.group, options.namesrv, options.timeout_s) as consumer:
        return {q: consumer.fetch_offset(MessageQueue(*q)) for q in queues}


class HamqBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions, columns: tuple[str, ...] = READ_COLUMNS) -> None:
        self.options = options
        self.columns = columns

    def partitions(self) -> list[QueueRange]:
        o = self.options
        end_spec = OffsetSpec.parse(o.ending_offsets, o.topics, "latest", "endingOffsets")
        if end_spec.kind in ("earliest", "group"):
            raise ValueError("option endingOffsets must be 'latest' or JSON offsets")
        bounds = queue_bounds(o)
        start = starting_offsets(o, bounds, "earliest")
        end = {
            q: max(clamp(end_spec.wanted(q, None, missing=LATEST), b), start[q])
            for q, b in bounds.items()
        }
        return plan_ranges(start, end, o.max_records_per_partition, o.min_partitions)

    def read(self, partition: QueueRange) -> Iterator[pa.RecordBatch]:
        yield from read_range(self.options, partition, self.columns)


class HamqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are the next offset to read per queue. Queues that appear later (the topic
    was expanded, ``subscribePattern`` matched a new topic) are read from their earliest
    offset, as Spark's Kafka source does with new partitions. Each trigger checks the
    offsets it starts from against what the queues hold (``plan_starts``)."""

    def __init__(self, options: ReadOptions, columns: tuple[str, ...] = READ_COLUMNS) -> None:
        self.options = options
        self.columns = columns
        self.target: Offsets | None = None  # Trigger.AvailableNow's end
        # Spark asks initialOffset() to plan batch 0 and again to run it: a ``latest``
        # start must not move between the two (Kafka's source keeps it in its checkpoint).
        self.initial: dict | None = None
        # The last batch latestOffset planned: its start and end offsets as Spark passes
        # them back to partitions(), and where each queue really starts.
        self.planned: tuple[dict, dict, Offsets] | None = None

    def initialOffset(self) -> dict:
        if self.initial is None:
            bounds = queue_bounds(self.options)
            self.initial = stream_offset(starting_offsets(self.options, bounds, "latest"))
        return self.initial

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {q: b.max_offset for q, b in queue_bounds(self.options).items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        bounds = queue_bounds(self.options)
        begin, losses = plan_starts(from_stream_offset(start), bounds)
        report_data_loss(self.options, losses)
        latest = {q: b.max_offset for q, b in bounds.items()}
        if self.target is not None:
            latest = {q: min(v, self.target.get(q, begin[q])) for q, v in latest.items()}
        latest = {q: max(v, begin[q]) for q, v in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = cap_to_limit(begin, latest, limit.max_rows)
        end = stream_offset({**begin, **latest})
        self.planned = (start, end, begin)
        return end

    def reportLatestOffset(self) -> dict:
        return stream_offset({q: b.max_offset for q, b in queue_bounds(self.options).items()})

    def partitions(self, start: dict, end: dict) -> list[QueueRange]:
        stop = from_stream_offset(end)
        if self.planned is not None and self.planned[:2] == (start, end):
            begin = self.planned[2]
        else:  # a batch planned before a restart: check it again
            reached = from_stream_offset(start)
            if start == self.initial:
                # batch 0 replayed: this reader's initial offset is not the one it was
                # planned from, and may be past its end without anything going backwards
                reached = {q: min(v, stop.get(q, v)) for q, v in reached.items()}
            begin, losses = plan_starts(reached, queue_bounds(self.options), stop)
            report_data_loss(self.options, losses)
        return plan_ranges(
            begin,
            {q: max(v, begin.get(q, v)) for q, v in stop.items()},
            self.options.max_records_per_partition,
            self.options.min_partitions,
        )

    def read(self, partition: QueueRange) -> Iterator[pa.RecordBatch]:
        yield from read_range(self.options, partition, self.columns)

    def commit(self, end: dict) -> None:
        """With option ``group``, record progress as the group's consumer offsets so
        ``hamq admin consumer-progress`` shows the pipeline's lag (the checkpoint stays the
        source of truth for where the query resumes)."""
        o = self.options
        if not o.group:
            return
        with PullConsumer(o.group, o.namesrv, o.timeout_s) as consumer:
            for queue, offset in from_stream_offset(end).items():
                consumer.commit_offset(MessageQueue(*queue), offset)
