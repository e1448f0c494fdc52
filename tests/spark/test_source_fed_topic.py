"""A stream over a topic being fed is not data loss: Spark asks the source's
``initialOffset()`` once to plan batch 0 and again to run it (and a restarted query asks
a new reader before replaying batch 0), so a ``latest`` start read twice moved past the
batch's planned end and the replay check reported "offset was changed" on every queue.
Against a replicated group (sync master and slave), fed by a thread while the driver's
planning runs in-process as Spark calls it."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from hamq import Message
from hamq.client.message import MessageQueue
from hamq.client.sync import Admin, Producer
from hamq.spark.options import ReadOptions
from hamq.spark.reader import HamqStreamReader
from harness import Cluster
from helpers import wait_for

TOPIC, QUEUES = "Fed", 2


@pytest.fixture(scope="module")
def fed(tmp_path_factory) -> Iterator[str]:
    """A sync master and its slave; ``TOPIC`` fed by a thread, each message's value its
    queue offset, until the module ends."""
    c = Cluster(tmp_path_factory.mktemp("spark-fed"))
    stop = threading.Event()
    try:
        c.start_namesrv()
        c.start_broker("master", broker_role="sync_master", total_replicas=2)
        c.start_broker("slave", broker_id=1, broker_role="slave", total_replicas=2)
        with Admin(c.namesrv) as admin:
            admin.create_topic(TOPIC, QUEUES)

        def feed() -> None:
            sent = 0
            with Producer(c.namesrv, "spark-fed") as producer:
                while not stop.is_set() and sent < 100_000:
                    for q in range(QUEUES):
                        batch = [Message(TOPIC, str(sent + i).encode()) for i in range(10)]
                        producer.send_batch(batch, MessageQueue(TOPIC, "broker-a", q))
                    sent += 10
                    stop.wait(0.02)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        yield c.namesrv
        stop.set()
        feeder.join(30)
    finally:
        stop.set()
        c.stop_all()


def stream(ns: str) -> HamqStreamReader:
    return HamqStreamReader(ReadOptions.parse({"namesrv": ns, "topic": TOPIC}))


def fed_past(ns: str, offset: dict) -> None:
    """Wait until every queue holds more than ``offset`` says."""
    with Admin(ns) as admin:
        wait_for(
            lambda: all(
                r["max_offset"] > offset[TOPIC][f"broker-a:{r['queue_id']}"]
                for r in admin.topic_offsets(TOPIC)
            ),
            30,
            "the feeder to pass the planned end",
        )


def values(reader: HamqStreamReader, start: dict, end: dict) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            out.setdefault(part.queue_id, []).extend(map(int, batch.column("value").to_pylist()))
    return out


def test_batch_zero_reads_from_the_initial_offset_spark_planned_it_with(fed):
    reader = stream(fed)
    fed_past(fed, {TOPIC: {f"broker-a:{q}": 0 for q in range(QUEUES)}})
    start = reader.initialOffset()  # constructNextBatch
    end = reader.latestOffset(start, ReadAllAvailable())
    fed_past(fed, end)
    assert reader.initialOffset() == start  # runBatch asks again
    read = values(reader, start, end)
    for q in range(QUEUES):
        key = f"broker-a:{q}"
        assert read.get(q, []) == list(range(start[TOPIC][key], end[TOPIC][key]))


def test_batch_zero_replayed_by_a_restarted_query_is_not_data_loss(fed):
    first = stream(fed)
    start = first.initialOffset()
    end = first.latestOffset(start, ReadAllAvailable())
    fed_past(fed, end)
    restarted = stream(fed)  # batch 0 in the offset log, not committed
    moved = restarted.initialOffset()
    assert moved != start
    # what it replays is at most the planned batch, never past its end, with no loss
    for q, got in values(restarted, moved, end).items():
        key = f"broker-a:{q}"
        assert not got or got == list(range(got[0], end[TOPIC][key]))
    nxt = restarted.latestOffset(end, ReadAllAvailable())
    assert all(nxt[TOPIC][k] >= v for k, v in end[TOPIC].items())
