"""Streaming reads and the exactly-once streaming sink, with real driver processes killed
(-9) mid-stream and restarted from their checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from hamq import Message
from hamq.client.message import MessageQueue
from hamq.client.sync import Admin, Producer
from spark_harness import StreamJob

pytestmark = pytest.mark.slow  # each driver process is a cold Spark session (10-30 s)

TRIGGER_LIMIT = 3_000


def produce(
    ns: str,
    topic: str,
    start: int,
    count: int,
    queue: MessageQueue | None = None,
    keyed: bool = False,
) -> None:
    with Producer(ns, "spark-stream-test") as producer:
        for lo in range(start, start + count, 500):
            batch = [
                Message(topic, str(i).encode(), keys=f"k{i % 13}" if keyed else None)
                for i in range(lo, min(lo + 500, start + count))
            ]
            if queue is None:
                producer.send_batch(batch)
            else:
                producer.send_batch(batch, queue)


def create(ns: str, topic: str, queues: int = 4) -> None:
    with Admin(ns) as admin:
        admin.create_topic(topic, queue_nums=queues)


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


def sink_values(spark, ns: str, topic: str) -> list[int]:
    df = spark.read.format("hamq").option("namesrv", ns).option("topic", topic).load()
    return sorted(int(r.v) for r in df.selectExpr("cast(value as string) as v").collect())


def test_max_records_per_trigger_bounds_batches_and_new_queues_are_read(
    spark, hamq_cluster, tmp_path
):
    ns, topic = hamq_cluster.namesrv, "StreamLimit"
    create(ns, topic)
    produce(ns, topic, 0, 10_000)

    def run() -> list[int]:
        query = (
            spark.readStream.format("hamq")
            .option("namesrv", ns)
            .option("topic", topic)
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", TRIGGER_LIMIT)
            .load()
            .selectExpr("cast(value as string) as value")
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

    sizes = run()
    assert sum(sizes) == 10_000 and max(sizes) <= TRIGGER_LIMIT and len(sizes) >= 4
    create(ns, topic, queues=6)  # the topic grows two queues
    produce(ns, topic, 10_000, 1_000, MessageQueue(topic, "broker-a", 5))
    produce(ns, topic, 11_000, 1_000)
    assert sum(run()) == 2_000  # the restart reads only what is new, new queue included
    values = sorted(int(r.value) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert values == list(range(12_000))


def test_killed_query_restarts_from_its_checkpoint_without_loss_or_repeat(
    spark, hamq_cluster, tmp_path
):
    ns, topic = hamq_cluster.namesrv, "StreamKill"
    create(ns, topic)
    produce(ns, topic, 0, 15_000)
    spec = dict(
        namesrv=ns,
        source=topic,
        sink="parquet",
        output=str(tmp_path / "out"),
        checkpoint=str(tmp_path / "ckpt"),
        max_per_trigger=TRIGGER_LIMIT,
        group="spark-kill",
    )
    job = StreamJob(tmp_path / "job1.log", trigger="processing", **spec)
    job.wait_until(lambda: committed_batches(tmp_path / "ckpt") >= 2)
    job.kill9()  # between batches, or in the middle of one
    done = committed_batches(tmp_path / "ckpt")
    assert done < 5, "the job read everything before it was killed; nothing tested"
    assert StreamJob(tmp_path / "job2.log", trigger="available_now", **spec).wait() == 0
    out = spark.read.parquet(str(tmp_path / "out"))
    assert sorted(int(r.value) for r in out.collect()) == list(range(15_000))
    with Admin(ns) as admin:  # the pipeline's progress shows as its group's offsets
        progress = admin.consumer_progress("spark-kill")
    assert {row["queue_id"] for row in progress} == {0, 1, 2, 3}
    assert all(row["consumer_offset"] > 0 for row in progress)


@pytest.mark.timeout(900)  # four cold drivers in sequence: 150 s idle, past 300 s in a loaded CI
def test_sink_crashes_between_write_and_commit_leave_each_record_once(
    spark, hamq_cluster, tmp_path
):
    """The driver is killed three times, each time in a different step of committing a
    micro-batch whose rows are already written; every restart replays that batch."""
    ns, source, sink = hamq_cluster.namesrv, "SinkIn", "SinkOut"
    create(ns, source)
    create(ns, sink)
    produce(ns, source, 0, 15_000, keyed=True)
    spec = dict(
        namesrv=ns,
        source=source,
        sink="hamq",
        output=sink,
        checkpoint=str(tmp_path / "ckpt"),
        max_per_trigger=TRIGGER_LIMIT,
    )
    for batch_id, stage in enumerate(["before_journal", "after_journal", "after_commit"], 1):
        marker = tmp_path / f"failpoint-{stage}"
        job = StreamJob(
            tmp_path / f"job-{stage}.log",
            trigger="available_now",
            failpoint=f"{stage}:{batch_id}:{marker}",
            **spec,
        )
        job.wait_until(marker.exists)  # batch_id is written; its commit stopped at `stage`
        job.kill9()
    assert StreamJob(tmp_path / "job-last.log", trigger="available_now", **spec).wait() == 0
    assert sink_values(spark, ns, sink) == list(range(15_000))
