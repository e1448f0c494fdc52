"""Messages move through real name server and broker processes: same bytes, per-queue
order, offsets that survive a consumer restart, routes that follow broker liveness."""

from __future__ import annotations

import random
import time

import pytest

import hamq
from hamq import Message, MessageQueue, SendStatus
from hamq.client.consumer import PullStatus
from hamq.errors import TopicNotExist
from hamq.store.metadata import PERM_READ
from helpers import topic_routed, wait_for


def drain(consumer: hamq.PullConsumer, queues: list[MessageQueue], start: dict) -> dict:
    got: dict[MessageQueue, list] = {mq: [] for mq in queues}
    for mq in queues:
        offset = start[mq]
        while True:
            result = consumer.pull(mq, offset, 500)
            if result.status is not PullStatus.FOUND:
                break
            got[mq].extend(result.messages)
            offset = result.next_begin_offset
    return got


def test_ten_thousand_mixed_sizes_same_bytes_per_queue_order(cluster):
    rng = random.Random(7)
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Mixed", 4)
    sizes = [rng.choice([0, 1, 100, 1024, 4096, 65536, 300_000]) for _ in range(10_000)]
    sent: dict[MessageQueue, list[bytes]] = {}
    with hamq.Producer(cluster.namesrv) as producer:
        i = 0
        while i < len(sizes):
            n = rng.randint(1, 50)
            bodies = [
                bytes([j % 251]) * sizes[j] + str(j).encode()
                for j in range(i, min(i + n, len(sizes)))
            ]
            msgs = [Message("Mixed", b, keys=f"k{i}", tags="TagA") for b in bodies]
            result = producer.send_batch(msgs) if len(msgs) > 1 else producer.send(msgs[0])
            assert result.status is hamq.SendStatus.SEND_OK
            sent.setdefault(result.queue, []).extend(bodies)
            i += len(bodies)
    with hamq.PullConsumer("g-mixed", cluster.namesrv) as consumer:
        queues = consumer.fetch_message_queues("Mixed")
        assert len(queues) == 4
        got = drain(consumer, queues, dict.fromkeys(queues, 0))
    assert sum(len(v) for v in got.values()) == 10_000
    for mq, bodies in sent.items():
        assert [m.body for m in got[mq]] == bodies
        assert [m.queue_offset for m in got[mq]] == list(range(len(bodies)))
        assert all(m.tags == "TagA" for m in got[mq])


def test_offsets_survive_consumer_restart(cluster):
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Offsets", 2)
    with hamq.Producer(cluster.namesrv) as producer:
        for i in range(100):
            producer.send(Message("Offsets", f"m{i}".encode()))
    with hamq.PullConsumer("g-off", cluster.namesrv) as consumer:
        queues = consumer.fetch_message_queues("Offsets")
        assert all(consumer.fetch_offset(mq) is None for mq in queues)
        first = {mq: consumer.pull(mq, 0, 10) for mq in queues}
        for mq, result in first.items():
            consumer.commit_offset(mq, result.next_begin_offset)
    with hamq.PullConsumer("g-off", cluster.namesrv) as consumer:
        for mq in queues:
            offset = consumer.fetch_offset(mq)
            assert offset == first[mq].next_begin_offset
            rest = consumer.pull(mq, offset, 1000)
            assert rest.messages[0].queue_offset == offset
    # And across a broker restart (offsets are persisted at shutdown).
    cluster.restart("broker")
    with hamq.PullConsumer("g-off", cluster.namesrv) as consumer:
        for mq in queues:
            assert consumer.fetch_offset(mq) == first[mq].next_begin_offset


def test_route_appears_within_one_heartbeat_and_disappears_after_kill9(cluster):
    addr = cluster.broker_addr()
    with hamq.Admin(cluster.namesrv) as admin:
        start = time.monotonic()
        admin.create_topic("Routes", 4, wait_s=0)
        while True:
            try:
                route = admin.topic_route("Routes")
                break
            except TopicNotExist:
                # room for a loaded machine; the next periodic registration is 30 s away
                assert time.monotonic() - start < 3.0, "route not visible within a heartbeat"
                time.sleep(0.02)
        assert route.brokers == {"broker-a": {0: addr}}
        assert len(route.write_queues) == 4
        cluster.procs["broker"].kill9()
        killed = time.monotonic()
        while True:
            try:
                admin.topic_route("Routes")
            except TopicNotExist:
                break
            # broker_not_active_timeout_ms=3000 plus one scan interval of 500 ms, and room
            # for a loaded machine
            assert time.monotonic() - killed < 3.0 + 0.5 + 2.0, "dead broker still routed"
            time.sleep(0.1)
        assert time.monotonic() - killed >= 2.5  # not dropped before the timeout


def test_unknown_topic_is_a_clear_error(cluster):
    with (
        hamq.Producer(cluster.namesrv) as producer,
        pytest.raises(TopicNotExist, match="does not exist"),
    ):
        producer.send(Message("NoSuchTopic", b"x"))


def test_a_producer_that_found_no_writable_queue_looks_again(cluster):
    """A route without a writable queue (a read-only topic here; a group between two
    masters during a role change) is looked up again on the next send: the producer used
    to keep it and fail every later send, whatever the name servers said."""
    with hamq.Admin(cluster.namesrv) as admin, hamq.Producer(cluster.namesrv) as producer:
        admin.create_topic("Frozen", 1, perm=PERM_READ, wait_s=0)
        wait_for(lambda: topic_routed(admin, "Frozen"), 5, "the read-only route")
        with pytest.raises(TopicNotExist, match="no writable queue"):
            producer.send(Message("Frozen", b"refused"))
        admin.create_topic("Frozen", 1)  # writable again
        assert producer.send(Message("Frozen", b"taken")).status is SendStatus.SEND_OK


def test_long_polling_pull_wakes_on_arrival(cluster):
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Poll", 1)
    import threading

    with (
        hamq.PullConsumer("g-poll", cluster.namesrv) as consumer,
        hamq.Producer(cluster.namesrv) as producer,
    ):
        mq = consumer.fetch_message_queues("Poll")[0]
        timer = threading.Timer(0.5, lambda: producer.send(Message("Poll", b"late")))
        timer.start()
        started = time.monotonic()
        result = consumer.pull(mq, 0, 10, suspend_timeout_ms=5000)
        waited = time.monotonic() - started
        timer.join()
    assert [m.body for m in result.messages] == [b"late"]
    assert 0.4 < waited < 3.0


def test_sends_fail_over_to_another_group_when_a_master_dies(cluster_factory):
    """Two broker groups serve the topic; after one master is killed every send still
    succeeds, on the other group (retry on another broker + fault avoidance)."""
    c = cluster_factory()
    c.start_namesrv(scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=3000)
    c.start_broker("a", broker_name="broker-a")
    c.start_broker("b", broker_name="broker-b")
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic("TwoGroups", 2)
    with hamq.Producer(c.namesrv) as producer:
        groups = {producer.send(Message("TwoGroups", b"x")).queue.broker_name for _ in range(8)}
        assert groups == {"broker-a", "broker-b"}
        c.procs["a"].kill9()
        started = time.monotonic()
        after = [producer.send(Message("TwoGroups", b"y%d" % i)) for i in range(200)]
        elapsed = time.monotonic() - started
    assert all(r.status is hamq.SendStatus.SEND_OK for r in after)
    assert {r.queue.broker_name for r in after} == {"broker-b"}
    assert elapsed < 10.0  # no send timeout (3 s) paid per send: 200 would take 600 s
