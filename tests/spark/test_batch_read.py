"""Batch reads: every message once with its content, offsets like Kafka's options,
partitions split by maxRecordsPerPartition, a consumer group's committed offsets."""

from __future__ import annotations

import json

import pytest

from hamq import Message
from hamq.client.message import MessageQueue
from hamq.client.sync import Admin, Producer, PullConsumer

COUNT = 100_000
TOPIC = "SparkBatch"


@pytest.fixture(scope="module")
def loaded(hamq_cluster):
    """COUNT messages over 4 queues; every 1000th has a key, tags and a property."""
    ns = hamq_cluster.namesrv
    with Admin(ns) as admin:
        admin.create_topic(TOPIC, queue_nums=4)
    with Producer(ns, "spark-test") as producer:
        batch = []
        for i in range(COUNT):
            extra = {} if i % 1000 else {"keys": f"k{i}", "tags": "T", "properties": {"n": str(i)}}
            batch.append(Message(TOPIC, str(i).encode(), **extra))
            if len(batch) == 500:
                producer.send_batch(batch)
                batch = []
    return ns


def reader(spark, ns, **options):
    r = spark.read.format("hamq").option("namesrv", ns).option("topic", TOPIC)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def test_batch_read_returns_every_message_once_with_its_content(spark, loaded):
    df = reader(spark, loaded)
    assert df.rdd.getNumPartitions() == 4  # one per queue
    values = [r.v for r in df.selectExpr("cast(value as string) as v").collect()]
    assert sorted(map(int, values)) == list(range(COUNT))  # all there, none twice
    rows = df.where("key is not null").collect()
    assert len(rows) == COUNT // 1000
    for row in rows:
        n = int(row.value)
        assert row.key == f"k{n}".encode() and row.tags == "T" and row.properties == {"n": str(n)}
        assert row.topic == TOPIC and row.broker == "broker-a"
    per_queue = df.groupBy("queue").agg({"offset": "max", "*": "count"}).collect()
    # offsets of each queue are dense from 0
    assert all(r["max(offset)"] == r["count(1)"] - 1 for r in per_queue)


def test_offsets_json_and_partition_split(spark, loaded):
    start = json.dumps({TOPIC: {"broker-a:0": 100, "broker-a:1": -2}})
    end = json.dumps(
        {TOPIC: {"broker-a:0": 300, "broker-a:1": 50, "broker-a:2": -2, "broker-a:3": -2}}
    )
    df = reader(spark, loaded, startingOffsets=start, endingOffsets=end, maxRecordsPerPartition=64)
    rows = df.select("queue", "offset").collect()
    # queues 2 and 3 start at earliest (missing -> earliest) and end at earliest (-2): empty
    assert sorted((r.queue, r.offset) for r in rows) == [(0, o) for o in range(100, 300)] + [
        (1, o) for o in range(50)
    ]
    assert df.rdd.getNumPartitions() == 4 + 1  # ceil(200 / 64) + ceil(50 / 64)


def test_starting_from_a_consumer_groups_committed_offsets(spark, loaded):
    with PullConsumer("spark-resume", loaded) as consumer:
        for queue_id in range(4):
            consumer.commit_offset(MessageQueue(TOPIC, "broker-a", queue_id), 20_000)
    df = reader(spark, loaded, group="spark-resume")
    total = sum(consumer_max - 20_000 for consumer_max in _max_offsets(loaded))
    assert df.count() == total
    assert df.agg({"offset": "min"}).collect()[0][0] == 20_000


def _max_offsets(ns: str) -> list[int]:
    with Admin(ns) as admin:
        return [row["max_offset"] for row in admin.topic_offsets(TOPIC)]
