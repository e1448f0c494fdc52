"""Bad input fails the Spark job at once with a readable message, never a hang."""

from __future__ import annotations

import time

import pytest

from hamq.client.sync import Admin
from helpers import free_port

TOPIC = "SparkErrors"
FAIL_FAST_S = 60  # a cold Python worker included; a hang would hit the test timeout


@pytest.fixture(scope="module")
def ns(hamq_cluster):
    with Admin(hamq_cluster.namesrv) as admin:
        admin.create_topic(TOPIC, queue_nums=2)
    return hamq_cluster.namesrv


def expect_error(action, pattern: str) -> None:
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        action()
    assert time.monotonic() - started < FAIL_FAST_S
    assert pattern in str(info.value), str(info.value)[:2000]


def read(spark, namesrv, topic=TOPIC, **options):
    r = spark.read.format("hamq").option("namesrv", namesrv).option("topic", topic)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def test_unreachable_name_server(spark):
    dead = f"127.0.0.1:{free_port()}"
    expect_error(lambda: read(spark, dead).count(), f"name server {dead} unreachable")


def test_unknown_topic(spark, ns):
    expect_error(lambda: read(spark, ns, topic="NoSuchTopic").count(), "NoSuchTopic")


def test_bad_offsets_json(spark, ns):
    expect_error(
        lambda: read(spark, ns, startingOffsets="{not json").count(),
        "option startingOffsets: expected 'earliest', 'latest' or JSON",
    )
    expect_error(
        lambda: read(spark, ns, startingOffsets='{"Other": {"broker-a:0": 1}}').count(),
        "names topic 'Other', which this read does not cover (it reads SparkErrors)",
    )
    expect_error(
        lambda: read(spark, ns, endingOffsets=f'{{"{TOPIC}": {{"broker-a": 1}}}}').count(),
        "bad queue name 'broker-a'",
    )


def test_missing_and_bad_options(spark, ns):
    expect_error(
        lambda: spark.read.format("hamq").option("topic", TOPIC).load().count(),
        "needs option 'namesrv'",
    )
    expect_error(
        lambda: read(spark, ns, maxRecordsPerPartition="-5").count(),
        "maxRecordsPerPartition must be a positive integer",
    )


def test_value_column_of_the_wrong_type(spark, ns):
    df = spark.range(10).selectExpr("id as value")
    expect_error(
        lambda: (
            df.write.format("hamq")
            .option("namesrv", ns)
            .option("topic", TOPIC)
            .mode("append")
            .save()
        ),
        "'value' column must be binary or string, not bigint",
    )


def test_write_without_value_or_topic_and_overwrite(spark, ns):
    df = spark.range(3).selectExpr("cast(id as string) as body")
    expect_error(
        lambda: (
            df.write.format("hamq")
            .option("namesrv", ns)
            .option("topic", TOPIC)
            .mode("append")
            .save()
        ),
        "needs a 'value' column",
    )
    ok = spark.range(3).selectExpr("cast(id as string) as value")
    expect_error(
        lambda: ok.write.format("hamq").option("namesrv", ns).mode("append").save(),
        "needs option 'topic' or a 'topic' column",
    )
    expect_error(
        lambda: (
            ok.write.format("hamq")
            .option("namesrv", ns)
            .option("topic", TOPIC)
            .mode("overwrite")
            .save()
        ),
        "only appends",
    )


def test_write_to_unknown_topic(spark, ns):
    df = spark.range(3).selectExpr("cast(id as string) as value")
    expect_error(
        lambda: (
            df.write.format("hamq")
            .option("namesrv", ns)
            .option("topic", "NoSuchSinkTopic")
            .mode("append")
            .save()
        ),
        "NoSuchSinkTopic",
    )


def test_the_sinks_test_hook_is_no_option(spark, ns, tmp_path):
    """The sink's crash hook stops a driver until it is killed: only the test harness arms
    it (through the driver's environment); as an option it is refused before anything is
    written, batch or streaming."""
    df = spark.range(3).selectExpr("cast(id as string) as value")
    hook = f"before_journal:0:{tmp_path / 'marker'}"
    expect_error(
        lambda: (
            df.write.format("hamq")
            .option("namesrv", ns)
            .option("topic", TOPIC)
            .option("_failpoint", hook)
            .mode("append")
            .save()
        ),
        "unknown option '_failpoint'",
    )
    stream = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 1)
        .load()
        .selectExpr("cast(value as string) as value")
        .writeStream.format("hamq")
        .option("namesrv", ns)
        .option("topic", TOPIC)
        .option("_failpoint", hook)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
    )
    expect_error(
        lambda: stream.start().awaitTermination(FAIL_FAST_S), "unknown option '_failpoint'"
    )
    assert not (tmp_path / "marker").exists()
