"""A push consumer cancelled by a failover (``cancel_on_ha_failover``, seed 003) has left
its group: it takes no queue afterwards, not even one it was refused before the failover
(orderly: locked by another member) and asks for again by itself. Real processes: the
group's master is restarted at another address, which the consumer's routes show as a
master change; the new master's lock table is empty, so nothing but the cancel keeps the
queue from it."""

from __future__ import annotations

import threading
import time

import hamq
from hamq import ConsumeOrderlyStatus, Message
from helpers import free_port, wait_for

TOPIC = "Ordered"
WATCH_S = 3.0  # three of the consumer's lock retries (LOCK_RETRY_S)


def test_a_cancelled_orderly_consumer_takes_no_queue_it_was_refused_before(cluster):
    # the slave answers who is in the group while the master is away, as in a failover
    cluster.start_broker("slave", broker_id=1, broker_role="slave")
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic(TOPIC, 2)
    with hamq.Producer(cluster.namesrv) as producer:
        for i in range(20):  # keys on both queues
            producer.send_orderly(Message(TOPIC, b"m%d" % i), f"k{i}")
    release = threading.Event()
    busy: set[int] = set()

    def hold(messages):  # the holder's listener keeps both queues (and their locks)
        busy.add(messages[0].queue_id)
        release.wait(60)
        return ConsumeOrderlyStatus.SUCCESS

    got: list[bytes] = []
    cancels: list[str] = []

    def record(messages):
        got.extend(bytes(m.body) for m in messages)
        return ConsumeOrderlyStatus.SUCCESS

    holder = hamq.PushConsumer("ordered", cluster.namesrv, consume_from_where="first")
    cancelled = hamq.PushConsumer(
        "ordered",
        cluster.namesrv,
        consume_from_where="first",
        rebalance_interval_s=0.5,
        cancel_on_ha_failover=True,
        on_cancel=cancels.append,
    )
    try:
        holder.subscribe(TOPIC)
        holder.register_message_listener(hold, orderly=True)
        holder.start()
        wait_for(lambda: busy == {0, 1}, 20, "the holder busy on both queues")
        cancelled.subscribe(TOPIC)
        cancelled.register_message_listener(record, orderly=True)
        cancelled.start()  # its queue's lock is refused: the holder's listener runs
        # (the retry topic's queue, which the holder does not hold busy, it may take)
        assert not any(mq.topic == TOPIC for mq in cancelled.process_queues)

        cluster.procs["broker"].stop()
        cluster.start_broker(listen=f"127.0.0.1:{free_port()}")
        wait_for(lambda: cancels, 30, "the cancel notice")
        until = time.monotonic() + WATCH_S
        while time.monotonic() < until:  # bounded: what it must not do in this window
            assert not cancelled.process_queues, "a cancelled consumer took a queue"
            time.sleep(0.1)
        assert not got
    finally:
        release.set()
        cancelled.shutdown()
        holder.shutdown()
