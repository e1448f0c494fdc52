"""A queue's master gone (kill -9) while a restarted stream replays a batch its master
planned: the slave answers the queue's bounds and may be behind the batch's start. That
is a slave waiting for its master, not offsets going backwards, so it is no data loss.
Against real processes: an async master and its slave."""

from __future__ import annotations

from hamq import Message
from hamq.client.message import MessageQueue
from hamq.client.sync import Admin, Producer
from hamq.spark.options import ReadOptions
from hamq.spark.reader import HamqStreamReader
from harness import Cluster
from helpers import wait_for

TOPIC = "Failover"


def send(ns: str, values: range) -> None:
    with Producer(ns, "spark-failover") as producer:
        producer.send_batch(
            [Message(TOPIC, str(i).encode()) for i in values], MessageQueue(TOPIC, "broker-a", 0)
        )


def test_a_replayed_batch_past_a_lagging_slave_is_not_data_loss(tmp_path):
    c = Cluster(tmp_path)
    try:
        c.start_namesrv(scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=3000)
        c.start_broker("master", broker_role="async_master", total_replicas=2)
        c.start_broker("slave", broker_id=1, broker_role="slave", total_replicas=2)
        ns, master = c.namesrv, c.broker_addr("master")
        with Admin(ns) as admin:
            admin.create_topic(TOPIC, 1)
            send(ns, range(10))

            def slave_caught_up() -> bool:
                slaves = admin.broker_runtime_info(master)["ha"]["slaves"]
                return [(s["state"], s["behind_bytes"]) for s in slaves] == [("TRANSFER", 0)]

            wait_for(slave_caught_up, 30, "the slave to hold the first 10 messages")
            c.procs["slave"].kill9()
            send(ns, range(10, 20))  # only the master holds 10..19
            c.procs["master"].kill9()
            c.procs["slave"].start()

            def slave_only() -> bool:
                route = admin.topic_route(TOPIC)
                return route.master_addr("broker-a") is None and bool(route.read_queues)

            wait_for(slave_only, 30, "the route to name the slave alone")
        # a restarted query replays batch [15, 20) that the master planned
        replay = HamqStreamReader(ReadOptions.parse({"namesrv": ns, "topic": TOPIC}))
        start, end = {TOPIC: {"broker-a:0": 15}}, {TOPIC: {"broker-a:0": 20}}
        ranges = replay.partitions(start, end)
        assert [(r.start, r.end) for r in ranges] == [(15, 20)]  # waits for its master
    finally:
        c.stop_all()
