"""Data loss the source must report (Kafka's ``failOnDataLoss``), against real brokers:
retention removing what a stream has not read, a topic deleted and re-created under a
running stream, explicit starting offsets retention removed, and a new queue whose first
offsets are gone. The driver's planning runs in-process (no Spark behaviour is involved);
the executor's read of the planned ranges is the real one."""

from __future__ import annotations

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from hamq import Message
from hamq.client.message import MessageQueue
from hamq.client.sync import Admin, Producer
from hamq.spark.options import ReadOptions
from hamq.spark.reader import HamqBatchReader, HamqStreamReader
from harness import Cluster
from helpers import wait_for

SEGMENT = 64 * 1024


@pytest.fixture(scope="module")
def expiring(tmp_path_factory):
    """A broker that removes commit-log segments last written over a second ago (all but
    the one being written), checking every 200 ms."""
    c = Cluster(tmp_path_factory.mktemp("spark-retention"))
    try:
        c.start_namesrv()
        c.start_broker(
            mapped_file_size_commitlog=SEGMENT,
            file_reserved_hours=1.0 / 3600,
            clean_resource_interval_ms=200,
        )
        yield c.namesrv
    finally:
        c.stop_all()


def options(ns: str, **extra: str) -> ReadOptions:
    """As Spark hands them over: lower-cased keys."""
    return ReadOptions.parse({k.lower(): v for k, v in {"namesrv": ns, **extra}.items()})


def produce(ns: str, topic: str, values: range) -> None:
    with Producer(ns, "spark-loss-test") as producer:
        producer.send_batch(
            [Message(topic, str(i).encode()) for i in values], MessageQueue(topic, "broker-a", 0)
        )


def create(ns: str, topic: str) -> None:
    with Admin(ns) as admin:
        admin.create_topic(topic, queue_nums=1)


def expire(ns: str, topic: str) -> int:
    """Roll the commit log past ``topic``'s messages and wait until retention removed
    them all; returns the queue's offsets now (min == max)."""
    create(ns, "Filler")
    with Producer(ns, "spark-loss-filler") as producer, Admin(ns) as admin:

        def emptied() -> int:
            producer.send_batch([Message("Filler", bytes(1000)) for _ in range(80)])
            row = admin.topic_offsets(topic)[0]
            return row["max_offset"] if row["min_offset"] == row["max_offset"] > 0 else 0

        return wait_for(emptied, 30, f"retention to empty {topic}")


def read_values(reader, ranges) -> list[int]:
    return [
        int(v)
        for r in ranges
        for batch in reader.read(r)
        for v in batch.column("value").to_pylist()
    ]


def test_a_queue_emptied_by_retention_is_data_loss_not_no_new_messages(expiring):
    ns, topic = expiring, "Expiring"
    create(ns, topic)
    produce(ns, topic, range(10))
    strict = HamqStreamReader(options(ns, topic=topic, startingOffsets="earliest"))
    lenient = HamqStreamReader(
        options(ns, topic=topic, startingOffsets="earliest", failOnDataLoss="false")
    )
    start = strict.initialOffset()
    assert start == {topic: {"broker-a:0": 0}}
    held = expire(ns, topic)
    with pytest.raises(Exception, match=r"no longer holds offsets 0\.\.9 .*removed by retention"):
        strict.latestOffset(start, ReadAllAvailable())
    end = lenient.latestOffset(start, ReadAllAvailable())
    assert end == {topic: {"broker-a:0": held}}
    assert lenient.partitions(start, end) == []  # nothing left to wait for
    produce(ns, topic, range(10, 15))
    later = lenient.latestOffset(end, ReadAllAvailable())
    assert read_values(lenient, lenient.partitions(end, later)) == list(range(10, 15))


def test_explicit_starting_offsets_that_retention_removed_are_data_loss(expiring):
    ns, topic = expiring, "ExpiringBatch"
    create(ns, topic)
    produce(ns, topic, range(10))
    held = expire(ns, topic)
    produce(ns, topic, range(10, 13))
    asked = dict(topic=topic, startingOffsets=f'{{"{topic}": {{"broker-a:0": 4}}}}')
    with pytest.raises(Exception, match=rf"no longer holds offsets 4\.\.{held - 1}"):
        HamqBatchReader(options(ns, **asked)).partitions()
    lenient = HamqBatchReader(options(ns, failOnDataLoss="false", **asked))
    assert read_values(lenient, lenient.partitions()) == [10, 11, 12]


def test_a_new_queue_whose_first_offsets_are_gone_is_data_loss(expiring):
    """subscribePattern is matched again at every trigger: a topic created later is read
    from its start, and a start above 0 is reported."""
    ns = expiring
    stream = HamqStreamReader(options(ns, subscribePattern="Late.*", startingOffsets="earliest"))
    start = stream.initialOffset()
    create(ns, "LateTopic")
    produce(ns, "LateTopic", range(5))
    assert stream.latestOffset(start, ReadAllAvailable()) == {"LateTopic": {"broker-a:0": 5}}
    held = expire(ns, "LateTopic")
    with pytest.raises(
        Exception, match=rf"queue broker-a:0 of LateTopic is new and starts at offset {held}, not 0"
    ):
        stream.latestOffset(start, ReadAllAvailable())


def test_a_topic_deleted_and_re_created_under_a_stream(hamq_cluster):
    ns, topic = hamq_cluster.namesrv, "Recreated"
    create(ns, topic)
    produce(ns, topic, range(30))
    strict = HamqStreamReader(options(ns, topic=topic, startingOffsets="earliest"))
    lenient = HamqStreamReader(
        options(ns, topic=topic, startingOffsets="earliest", failOnDataLoss="false")
    )
    start = strict.initialOffset()
    end = strict.latestOffset(start, ReadAllAvailable())
    assert read_values(strict, strict.partitions(start, end)) == list(range(30))
    with Admin(ns) as admin:
        admin.delete_topic(topic)
    create(ns, topic)
    produce(ns, topic, range(100, 110))
    with pytest.raises(
        Exception, match="queue broker-a:0 of Recreated: offset was changed from 30 to 10"
    ):
        strict.latestOffset(end, ReadAllAvailable())
    later = lenient.latestOffset(end, ReadAllAvailable())
    assert later == {topic: {"broker-a:0": 10}}
    # failOnDataLoss=false: warned, and the re-created topic is read from its start
    assert read_values(lenient, lenient.partitions(end, later)) == list(range(100, 110))
    # a restarted query replays the batch from its checkpoint (no plan in memory)
    replay = HamqStreamReader(lenient.options)
    assert read_values(replay, replay.partitions(end, later)) == list(range(100, 110))
