"""Kafka's option names through a real Spark session (Spark lower-cases the keys):
several topics, named queues, a start by store time, more partitions than queues, the
headers column, and an unknown option refused."""

from __future__ import annotations

import time

import pytest

from hamq import Message
from hamq.client.message import MessageQueue
from hamq.client.sync import Admin, Producer
from helpers import wait_for


@pytest.fixture(scope="module")
def loaded(hamq_cluster):
    """OptA: 0..19 on queue 0, 20..39 on queue 1; OptB: 100..119, then 120..129 stored
    after ``split_ms``."""
    ns = hamq_cluster.namesrv
    with Admin(ns) as admin:
        admin.create_topic("OptA", queue_nums=2)
        admin.create_topic("OptB", queue_nums=1)
    with Producer(ns, "spark-options-test") as producer:

        def send(topic: str, queue_id: int, values: range) -> None:
            messages = [Message(topic, str(i).encode()) for i in values]
            producer.send_batch(messages, MessageQueue(topic, "broker-a", queue_id))

        send("OptA", 0, range(20))
        send("OptA", 1, range(20, 40))
        send("OptB", 0, range(100, 120))
        split_ms = int(time.time() * 1000) + 1
        wait_for(lambda: time.time() * 1000 > split_ms, 5, "the clock to pass the split")
        send("OptB", 0, range(120, 130))
    return ns, split_ms


def load(spark, ns, **options):
    r = spark.read.format("hamq").option("namesrv", ns)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def values(df) -> list[int]:
    return sorted(int(r.v) for r in df.selectExpr("cast(value as string) as v").collect())


def test_subscribe_assign_timestamp_and_min_partitions(spark, loaded):
    ns, split_ms = loaded
    both = load(spark, ns, subscribe="OptA,OptB", minPartitions=7)
    assert both.rdd.getNumPartitions() >= 7
    assert values(both) == list(range(40)) + list(range(100, 130))
    assigned = load(spark, ns, assign='{"OptA": ["broker-a:1"]}')
    assert values(assigned) == list(range(20, 40))
    recent = load(spark, ns, topic="OptB", startingTimestamp=str(split_ms))
    assert values(recent) == list(range(120, 130))
    assert "properties" not in load(spark, ns, topic="OptB", includeHeaders="false").columns


def test_unknown_option_is_refused(spark, loaded):
    ns, _ = loaded
    with pytest.raises(Exception, match="unknown option 'maxrecordspertriger' of the hamq source"):
        load(spark, ns, topic="OptA", maxRecordsPerTriger="10").count()
