"""The message browser and offset reset on real brokers (broker/message_lookup.py,
broker/consumer_admin.py): a message by msg id, by key, by queue offset; a group's offsets
reset by time while a push consumer of it runs; bad input answered with clear codes."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

import hamq
from hamq import ConsumeConcurrentlyStatus, Message
from hamq.client.admin import AsyncAdmin
from hamq.errors import (
    BrokerNotFound,
    InvalidArgument,
    QueueNotExist,
    TopicNotExist,
)
from hamq.manage.fanout import MAX_IN_FLIGHT
from hamq.manage.groups import broker_groups
from hamq.manage.processes import broker_processes
from hamq.manage.queues import messages_held
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import encode_frame_bytes
from hamq.protocol.message import offset_msg_id, parse_offset_msg_id
from harness import Cluster
from helpers import wait_for
from push_consumers import start_consumer

TOPIC = "Browse"


@pytest.fixture(scope="module")
def lookup(tmp_path_factory):
    """One name server and one broker, with ``TOPIC`` (2 queues) holding 20 messages
    (keys ``k<i> even|odd``) and one batch of 3 sharing the key ``batch``."""
    cluster = Cluster(tmp_path_factory.mktemp("lookup"))
    try:
        cluster.start_namesrv()
        cluster.start_broker()
        with hamq.Admin(cluster.namesrv) as admin:
            admin.create_topic(TOPIC, 2)
            admin.create_topic("Other", 1)
        with hamq.Producer(cluster.namesrv) as producer:
            sent = [
                producer.send(
                    Message(TOPIC, b"m%d" % i, keys=f"k{i} {'even' if i % 2 == 0 else 'odd'}")
                )
                for i in range(20)
            ]
            batch = producer.send_batch(
                [Message(TOPIC, b"b%d" % i, keys="batch") for i in range(3)]
            )
        yield cluster, sent, batch
    finally:
        cluster.stop_all()


def test_view_message_by_id(lookup):
    cluster, sent, batch = lookup
    with hamq.Admin(cluster.namesrv) as admin:
        (msg,) = admin.view_message(TOPIC, sent[7].msg_id)
        assert (msg.body, msg.keys, msg.queue_offset) == (b"m7", "k7 odd", sent[7].queue_offset)
        second = batch.msg_ids[1]  # a message inside a batch record: its index picks it
        assert [m.body for m in admin.view_message(TOPIC, second.lower())] == [b"b1"]
        assert admin.view_message("Other", sent[7].msg_id) == []  # a record of another topic
        phys, _ = parse_offset_msg_id(sent[7].msg_id)
        for wrong in (offset_msg_id(phys + 1, 0), offset_msg_id(10**15, 0)):
            assert admin.view_message(TOPIC, wrong) == []  # not a record start / past the log
        for bad in ("", "xyz", "G" * 24, sent[7].msg_id + "0"):
            with pytest.raises(InvalidArgument, match="24 hex digits"):
                admin.view_message(TOPIC, bad)
        with pytest.raises(TopicNotExist):
            admin.view_message("NoSuchTopic", sent[7].msg_id)


def test_view_message_refuses_hostile_offsets(lookup, raw_conn):
    cluster, _, _ = lookup
    conn = raw_conn(cluster.broker_addr())
    for i, ext in enumerate(
        [{"physical_offset": -1}, {"physical_offset": "0"}, {}, {"physical_offset": 2**63}]
    ):
        conn.send(encode_frame_bytes(RequestCode.VIEW_MESSAGE_BY_ID, i + 1, ext=ext))
        answer = conn.read_frame()
        assert answer is not None and answer.code == ResponseCode.INVALID_ARGUMENT, ext
    conn.send(encode_frame_bytes(RequestCode.VIEW_MESSAGE_BY_ID, 9, ext={"physical_offset": 3}))
    answer = conn.read_frame()
    assert answer.code == ResponseCode.QUERY_NOT_FOUND and "offset 3" in answer.remark


def test_query_by_key_scans_newest_first_and_says_when_it_stopped(lookup):
    cluster, sent, _ = lookup
    with hamq.Admin(cluster.namesrv) as admin:
        found, truncated = admin.query_messages_by_key(TOPIC, "even")
        assert sorted(m.body for m in found) == sorted(b"m%d" % i for i in range(0, 20, 2))
        assert not truncated
        stamps = [m.store_timestamp_ms for m in found]
        assert stamps == sorted(stamps, reverse=True)
        found, _ = admin.query_messages_by_key(TOPIC, "batch")
        assert sorted(m.body for m in found) == [b"b0", b"b1", b"b2"]
        uniq = admin.view_message(TOPIC, sent[3].msg_id)[0].uniq_key
        assert [m.body for m in admin.query_messages_by_key(TOPIC, uniq)[0]] == [b"m3"]
        # two messages per queue: only the newest of each queue are looked at
        found, truncated = admin.query_messages_by_key(TOPIC, "k0", max_scan=2)
        assert (found, truncated) == ([], True)
        assert admin.query_messages_by_key(TOPIC, "k0", max_scan=10**15)[0][0].body == b"m0"
        assert admin.query_messages_by_key(TOPIC, "k1 odd") == ([], False)  # one key each
        with pytest.raises(InvalidArgument):
            admin.query_messages_by_key(TOPIC, "k0", max_scan=0)
        with pytest.raises(InvalidArgument):
            admin.query_messages_by_key(TOPIC, "")
        with pytest.raises(TopicNotExist):
            admin.query_messages_by_key("NoSuchTopic", "k0")


def test_message_at_a_queue_offset(lookup):
    cluster, sent, _ = lookup
    where = sent[5].queue
    with hamq.Admin(cluster.namesrv) as admin:
        msg = admin.message_at(TOPIC, where.broker_name, where.queue_id, sent[5].queue_offset)
        assert msg is not None and msg.body == b"m5"
        assert admin.message_at(TOPIC, where.broker_name, where.queue_id, 10**6) is None
        with pytest.raises(InvalidArgument):
            admin.message_at(TOPIC, where.broker_name, where.queue_id, -1)
        with pytest.raises(BrokerNotFound):
            admin.message_at(TOPIC, "no-such-group", 0, 0)
        with pytest.raises(QueueNotExist):
            admin.message_at(TOPIC, where.broker_name, 99, 0)


def test_reset_by_time_is_taken_by_a_live_push_consumer(lookup):
    """The consumer read everything and committed; the reset moves the group back to the
    start, and the running consumer reads it all again instead of committing its old
    position over the reset."""
    cluster, _, _ = lookup
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Reset", 1)
    lock = threading.Lock()
    seen: list[bytes] = []

    def listener(messages):
        with lock:
            seen.extend(m.body for m in messages)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    start_ms = int(time.time() * 1000) - 1
    with hamq.Producer(cluster.namesrv) as producer:
        for i in range(10):
            producer.send(Message("Reset", b"r%d" % i))
    consumer = start_consumer(cluster.namesrv, "resetters", "Reset", listener)
    try:
        with hamq.Admin(cluster.namesrv) as admin:
            wait_for(lambda: len(seen) == 10, 15, "the first pass")
            wait_for(lambda: _committed(admin, "resetters", "Reset") == [10], 10, "its commit")
            assert "resetters" in admin.consumer_groups()
            assert consumer.client_id in admin.consumer_members("resetters")
            rows = admin.reset_offset("resetters", "Reset", start_ms)
            assert [(r["queue_id"], r["old_offset"], r["new_offset"]) for r in rows] == [(0, 10, 0)]
            wait_for(lambda: len(seen) == 20, 15, "the second pass after the reset")
            assert sorted(seen[10:]) == sorted(seen[:10])
            wait_for(lambda: _committed(admin, "resetters", "Reset") == [10], 10, "its commit")
            with pytest.raises(TopicNotExist):
                admin.reset_offset("resetters", "NoSuchTopic", start_ms)
            with pytest.raises(InvalidArgument):
                admin.reset_offset("resetters", "Reset", -5)
            with pytest.raises(InvalidArgument):
                admin.reset_offset("bad group!", "Reset", start_ms)
    finally:
        consumer.shutdown()


def test_reset_reaches_a_queue_being_released(lookup):
    """A reset that arrives while the consumer is releasing the queue (its listener still
    on the batch in hand: a rebalance drop or, here, a shutdown) is what the release
    commits, not the position past that batch over the reset."""
    cluster, _, _ = lookup
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("ResetDrop", 1)
    entered, gate = threading.Event(), threading.Event()

    def listener(messages):
        entered.set()
        gate.wait(30)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    start_ms = int(time.time() * 1000) - 1
    with hamq.Producer(cluster.namesrv) as producer:
        for i in range(5):
            producer.send(Message("ResetDrop", b"d%d" % i))
    consumer = start_consumer(cluster.namesrv, "releasers", "ResetDrop", listener)
    stopping = threading.Thread(target=consumer.shutdown)
    try:
        assert entered.wait(15), "the listener never got the batch"
        stopping.start()
        wait_for(
            lambda: [pq.dropped for pq in list(consumer.process_queues.values())] == [True],
            10,
            "the queue being released (its listener holding the batch)",
        )
        with hamq.Admin(cluster.namesrv) as admin:
            rows = admin.reset_offset("releasers", "ResetDrop", start_ms)
            assert [r["new_offset"] for r in rows] == [0]
            gate.set()
            stopping.join(30)
            assert _committed(admin, "releasers", "ResetDrop") == [0]
    finally:
        gate.set()
        if stopping.is_alive():
            stopping.join(30)
        else:
            consumer.shutdown()  # not started (closing twice does nothing)


def test_reset_by_time_moves_a_pop_group(lookup):
    """Pop consumers read where the broker's pop state says: the reset moves it."""
    cluster, _, _ = lookup
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("PopReset", 1)
        start_ms = int(time.time() * 1000) - 1
        with hamq.Producer(cluster.namesrv) as producer:
            for i in range(5):
                producer.send(Message("PopReset", b"p%d" % i))
        with hamq.SimpleConsumer(
            "popper", cluster.namesrv, {"PopReset": "*"}, await_duration_s=0.5
        ) as consumer:
            first = _receive(consumer, 5)
            for m in first:
                consumer.ack(m)
            assert consumer.receive(32, 30) == []
            rows = admin.reset_offset("popper", "PopReset", start_ms)
            assert [(r["old_offset"], r["new_offset"]) for r in rows] == [(5, 0)]
            again = _receive(consumer, 5)
            assert sorted(m.body for m in again) == sorted(m.body for m in first)
            assert all(m.reconsume_times == 0 for m in again)  # read anew, not redelivered


def _receive(consumer, count: int) -> list:
    got: list = []
    deadline = time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.receive(32, 30)
    return got


def test_cli_query_and_reset(lookup, hamq_cli):
    cluster, sent, _ = lookup
    ns = ("--namesrv", cluster.namesrv, "--json")
    done = hamq_cli("admin", "query-msg-by-id", "--topic", TOPIC, "--id", sent[2].msg_id, *ns)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["messages"]
    assert (row["body"], row["msg_id"], row["keys"]) == ("m2", sent[2].msg_id, "k2 even")
    text = hamq_cli("admin", "query-msg-by-key", "--topic", TOPIC, "--key", "k4", *ns[:2])
    assert "body (utf-8) m4" in text.stdout and "keys k4 even" in text.stdout
    done = hamq_cli(
        "admin", "reset-offset", "--group", "cli-g", "--topic", TOPIC, "--timestamp", "0", *ns
    )
    assert done.returncode == 0, done.stderr
    assert {r["new_offset"] for r in json.loads(done.stdout)["queues"]} == {0}
    done = hamq_cli("admin", "query-msg-by-id", "--topic", TOPIC, "--id", "nope", *ns)
    assert done.returncode != 0 and "24 hex digits" in done.stderr


def _committed(admin, group: str, topic: str) -> list[int]:
    return [r["consumer_offset"] for r in admin.consumer_progress(group) if r["topic"] == topic]


class CountedAdmin(AsyncAdmin):
    """An admin client that counts the requests it sends: how many at once at most
    (``peak``) and of which codes (``codes``)."""

    def __init__(self, namesrv: str) -> None:
        super().__init__(namesrv)
        self.in_flight, self.peak, self.codes = 0, 0, []
        invoke = self.core.invoke

        async def counted(addr, code, *args, **kwargs):
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.codes.append(code)
            try:
                return await invoke(addr, code, *args, **kwargs)
            finally:
                self.in_flight -= 1

        self.core.invoke = counted


def test_messages_held_over_many_topics_asks_a_few_at_a_time(lookup):
    """/api/overview's message total (manage.queues.messages_held) runs on the name
    server's loop: every topic's offset requests were sent together (two per queue), so a
    cluster of thousands of topics flooded the loop and the late ones timed out as empty."""
    cluster, _, _ = lookup
    topics = [f"Held{i}" for i in range(40)]
    with hamq.Admin(cluster.namesrv) as admin:
        for topic in topics:
            admin.create_topic(topic, 4)
    with hamq.Producer(cluster.namesrv) as producer:
        for topic in topics[:5]:
            producer.send(Message(topic, b"x"))

    async def count() -> tuple[int, int]:
        admin = CountedAdmin(cluster.namesrv)
        try:
            return await messages_held(admin, topics), admin.peak
        finally:
            await admin.close()

    total, peak = asyncio.run(count())
    assert total == 5
    assert peak <= MAX_IN_FLIGHT * 2 * 4, peak  # a few topics' queues, not all 40 topics'


def test_one_round_of_member_runtime_info_serves_concurrent_readers(lookup):
    """The console's overview asks /api/overview, /api/nodes and /api/groups together every
    few seconds; each asked every member's runtime info on the name server's loop."""
    cluster, _, _ = lookup

    async def read() -> list[int]:
        admin = CountedAdmin(cluster.namesrv)
        try:
            processes, groups, again = await asyncio.gather(
                broker_processes(admin), broker_groups(admin, None), broker_processes(admin)
            )
        finally:
            await admin.close()
        assert processes == again and [p["role"] for p in processes] == ["master"]
        assert [m["addr"] for m in groups[0]["members"]] == [cluster.broker_addr()]
        return admin.codes

    codes = asyncio.run(read())
    assert codes.count(RequestCode.GET_BROKER_RUNTIME_INFO) == 1, codes
