"""A read produces the columns of the schema it is given (Spark's Python data sources get no
column pruning, so a user schema is how a job reads less): each pull decodes only those
columns, an empty schema counts rows, and a schema the source cannot produce fails with a
message naming the column."""

from __future__ import annotations

import pytest
from pyspark.sql.types import StructType

from hamq import Message
from hamq.client.message import MessageQueue
from hamq.client.sync import Admin, Producer, PullConsumer
from hamq.spark.arrow_codec import records_to_batch
from hamq.spark.schema import ARROW_SCHEMA, arrow_schema

TOPIC = "SparkColumns"
QUEUES = 2
COUNT = 2_000
RECORD = 50  # messages per send, stored as one record
STREAM_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def loaded(hamq_cluster):
    """COUNT messages over QUEUES queues in records of RECORD; every 100th has a key, tags
    and a property."""
    ns = hamq_cluster.namesrv
    with Admin(ns) as admin:
        admin.create_topic(TOPIC, queue_nums=QUEUES)
    with Producer(ns, "spark-columns") as producer:
        for first in range(0, COUNT, RECORD):
            producer.send_batch(
                [
                    Message(TOPIC, str(i).encode())
                    if i % 100
                    else Message(
                        TOPIC, str(i).encode(), keys=f"k{i}", tags="T", properties={"n": "1"}
                    )
                    for i in range(first, first + RECORD)
                ],
                MessageQueue(TOPIC, "broker-a", first // RECORD % QUEUES),
            )
    return ns


def read(spark, ns, schema):
    return (
        spark.read.format("hamq").schema(schema).option("namesrv", ns).option("topic", TOPIC).load()
    )


def test_a_pull_decodes_only_the_columns_asked_for(loaded):
    with PullConsumer("spark-columns", loaded) as consumer:
        pulled = consumer.pull_raw(MessageQueue(TOPIC, "broker-a", 0), 0, 1000)
    start, end = 30, 470  # both ends cut a record
    full, next_offset = records_to_batch(pulled.records, start, end, TOPIC, "broker-a", 0)
    assert full.num_rows == end - start and next_offset == end
    for columns in [("value",), ("offset", "value"), ("timestamp", "offset"), ("key", "tags"), ()]:
        schema = arrow_schema(columns)
        batch, after = records_to_batch(pulled.records, start, end, TOPIC, "broker-a", 0, schema)
        assert (batch.num_rows, after, batch.schema) == (end - start, end, schema), columns
        for name in columns:
            assert batch.column(name).equals(full.column(name)), name
    assert full.schema == ARROW_SCHEMA
    beyond = records_to_batch(pulled.records, 1000, 2000, TOPIC, "broker-a", 0, arrow_schema(()))
    assert beyond == (None, 1000)  # the queue holds offsets 0..999


def test_a_user_schema_reads_its_columns_in_its_order(spark, loaded):
    df = read(spark, loaded, "offset long, value binary, key binary")
    assert df.columns == ["offset", "value", "key"]
    rows = df.collect()
    assert sorted(int(r.value) for r in rows) == list(range(COUNT))
    assert sorted(r.offset for r in rows) == sorted(list(range(COUNT // QUEUES)) * QUEUES)
    assert {r.key for r in rows if r.key} == {f"k{i}".encode() for i in range(0, COUNT, 100)}


def test_count_and_value_only_jobs(spark, loaded):
    assert read(spark, loaded, StructType()).count() == COUNT
    value_bytes = sum(len(str(i)) for i in range(COUNT))
    totals = read(spark, loaded, "value binary").selectExpr("count(*)", "sum(length(value))")
    assert tuple(totals.collect()[0]) == (COUNT, value_bytes)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("value string", "the hamq source's column 'value' is binary, not string"),
        ("value binary, partition int", "the hamq source has no column 'partition'"),
        ("value binary not null", "column 'value' must be nullable in the schema"),
    ],
)
def test_a_schema_the_source_cannot_produce_fails_with_a_message(spark, loaded, schema, message):
    with pytest.raises(Exception) as info:
        read(spark, loaded, schema).collect()
    assert message in str(info.value), str(info.value)[:2000]


def test_a_stream_reads_the_user_schemas_columns(spark, loaded, tmp_path):
    query = (
        spark.readStream.format("hamq")
        .schema("value binary")
        .option("namesrv", loaded)
        .option("topic", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("memory")
        .queryName("hamq_columns")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(STREAM_TIMEOUT_S), "the stream did not finish"
    assert query.exception() is None
    result = spark.table("hamq_columns")
    assert result.columns == ["value"]
    assert sorted(int(r.value) for r in result.collect()) == list(range(COUNT))
