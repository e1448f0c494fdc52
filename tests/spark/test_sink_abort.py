"""Spark's own abort path: a micro-batch commit that throws after the sink journaled the
batch (its journal answer "lost") makes Spark call ``abort``, which must roll the batch
forward; the restarted query then replays it without showing a row twice."""

from __future__ import annotations

import pytest

from hamq import Message
from hamq.client.sync import Admin, Producer
from spark_harness import StreamJob

pytestmark = pytest.mark.slow  # two driver processes, each a cold Spark session

ROWS = 9_000
PER_TRIGGER = 3_000


def sink_values(spark, ns: str, topic: str) -> list[int]:
    df = spark.read.format("hamq").option("namesrv", ns).option("topic", topic).load()
    return sorted(int(r.v) for r in df.selectExpr("cast(value as string) as v").collect())


def test_abort_after_the_journal_append_commits_the_batch_once(spark, hamq_cluster, tmp_path):
    ns, source, sink = hamq_cluster.namesrv, "AbortIn", "AbortOut"
    with Admin(ns) as admin:
        admin.create_topic(source, queue_nums=2)
        admin.create_topic(sink, queue_nums=2)
    with Producer(ns, "abort-test") as producer:
        for lo in range(0, ROWS, 500):
            producer.send_batch([Message(source, str(i).encode()) for i in range(lo, lo + 500)])
    spec = dict(
        namesrv=ns,
        source=source,
        sink="hamq",
        output=sink,
        checkpoint=str(tmp_path / "ckpt"),
        max_per_trigger=PER_TRIGGER,
    )
    marker = tmp_path / "journal-answer-lost"
    failing = StreamJob(
        tmp_path / "job-fails.log",
        trigger="available_now",
        failpoint=f"after_journal+raise:1:{marker}",
        **spec,
    )
    assert failing.wait() != 0 and marker.exists()  # batch 1's commit threw: the query failed
    # Spark aborted batch 1 after its commit threw; journaled, it was committed, not rolled back
    assert sink_values(spark, ns, sink) == list(range(2 * PER_TRIGGER))
    assert StreamJob(tmp_path / "job-restarts.log", trigger="available_now", **spec).wait() == 0
    assert sink_values(spark, ns, sink) == list(range(ROWS))
