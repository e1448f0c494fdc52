"""Pop consumption on real processes: invisibility, redelivery with reconsume_times + 1,
acks that never come back, change_invisible_duration, sharing within a group, and the
revive log across SIGTERM and kill -9 restarts; idle long-polling pops cost no CPU."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

import hamq
from hamq import Message
from hamq.errors import InvalidArgument
from hamq.protocol.codes import RequestCode, ResponseCode
from helpers import wait_for

INVISIBLE_S = 1.0


def produce(namesrv: str, topic: str, bodies: list[bytes], tags: str | None = None) -> None:
    with hamq.Producer(namesrv) as producer:
        producer.send_batch([Message(topic, b, tags=tags) for b in bodies])


def receive_all(
    consumer: hamq.SimpleConsumer, want: int, invisible_s: float, timeout_s: float = 10.0
) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += consumer.receive(32, invisible_s)
    return got


@pytest.fixture
def pop_topic(cluster):
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("PopT", 2)
    return "PopT"


def test_unacked_reappear_with_reconsume_times_acked_never(cluster, pop_topic):
    produce(cluster.namesrv, pop_topic, [b"m%d" % i for i in range(20)])
    with hamq.SimpleConsumer(
        "g-pop", cluster.namesrv, {pop_topic: "*"}, await_duration_s=0.5
    ) as consumer:
        started = time.monotonic()
        first = receive_all(consumer, 20, INVISIBLE_S)
        assert sorted(m.body for m in first) == sorted(b"m%d" % i for i in range(20))
        assert all(m.reconsume_times == 0 for m in first)
        unacked = {m.body for m in first if int(m.body[1:]) % 3 == 0}
        for m in first:
            if m.body not in unacked:
                consumer.ack(m)
        again = receive_all(consumer, len(unacked), INVISIBLE_S)
        assert time.monotonic() - started >= INVISIBLE_S  # invisible until then
        assert {m.body for m in again} == unacked
        assert all(m.reconsume_times == 1 for m in again)
        for m in again[:-1]:
            consumer.ack(m)
        third = receive_all(consumer, 1, INVISIBLE_S)
        assert [(m.body, m.reconsume_times) for m in third] == [(again[-1].body, 2)]
        with pytest.raises(InvalidArgument, match="stale"):
            consumer.ack(again[-1])  # its handle is from the previous delivery
        consumer.ack(third[0])
        consumer.ack(again[-1])  # once acked, acking again is a no-op
        time.sleep(INVISIBLE_S * 1.5)  # the point: an unacked one would be visible again
        assert consumer.receive(32, INVISIBLE_S) == []
    # The group's consumer offset followed the acked prefix of each queue.
    with hamq.PullConsumer("g-pop", cluster.namesrv) as pull:
        for mq in pull.fetch_message_queues(pop_topic):
            assert pull.fetch_offset(mq) == pull.max_offset(mq)


def test_change_invisible_duration_extends_and_shortens(cluster, pop_topic):
    produce(cluster.namesrv, pop_topic, [b"a", b"b"])
    with hamq.SimpleConsumer(
        "g-change", cluster.namesrv, {pop_topic: "*"}, await_duration_s=0.3
    ) as consumer:
        got = receive_all(consumer, 2, INVISIBLE_S)
        by_body = {m.body: m for m in got}
        consumer.change_invisible_duration(by_body[b"a"], 4.0)  # extend
        consumer.change_invisible_duration(by_body[b"b"], 0)  # visible at once
        back = receive_all(consumer, 1, 10.0, timeout_s=2.0)
        assert [(m.body, m.reconsume_times) for m in back] == [(b"b", 1)]
        consumer.ack(back[0])
        time.sleep(INVISIBLE_S * 1.5)  # the point: past the original invisible time
        assert consumer.receive(32, 10.0) == []  # "a" is still invisible past 1 s
        consumer.ack(by_body[b"a"])  # the changed handle acks it
        time.sleep(3.0)  # the point: past the extended invisible time, "a" stays acked
        assert consumer.receive(32, 10.0) == []


def test_tag_filter_returns_matching_and_consumes_the_rest(cluster, pop_topic):
    produce(cluster.namesrv, pop_topic, [b"x1", b"x2"], tags="TagX")
    produce(cluster.namesrv, pop_topic, [b"a1"], tags="TagA")
    produce(cluster.namesrv, pop_topic, [b"b1"], tags="TagB")
    with hamq.SimpleConsumer(
        "g-tags", cluster.namesrv, {pop_topic: "TagA || TagB"}, await_duration_s=0.3
    ) as consumer:
        got = []
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            got += consumer.receive(32, INVISIBLE_S)
        assert sorted(m.body for m in got) == [b"a1", b"b1"]
        for m in got:
            consumer.ack(m)
        time.sleep(INVISIBLE_S * 1.5)  # the point: an unacked one would be visible again
        assert consumer.receive(32, INVISIBLE_S) == []  # filtered ones were acked


def test_two_consumers_of_a_group_share_without_overlap(cluster, pop_topic):
    produce(cluster.namesrv, pop_topic, [b"s%d" % i for i in range(400)])
    seen: list[list[bytes]] = [[], []]

    def run(index: int) -> None:
        with hamq.SimpleConsumer(
            "g-share", cluster.namesrv, {pop_topic: "*"}, await_duration_s=0.3
        ) as consumer:
            idle_until = time.monotonic() + 2.0
            while time.monotonic() < idle_until:
                batch = consumer.receive(8, 30.0)  # long enough that nothing reappears
                if batch:
                    idle_until = time.monotonic() + 2.0
                for m in batch:
                    seen[index].append(m.body)
                    consumer.ack(m)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen[0] and seen[1]
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == sorted(b"s%d" % i for i in range(400))


@pytest.mark.parametrize("stop", ["sigterm", "kill9"])
def test_restart_keeps_acks_and_redelivers_unacked(cluster, pop_topic, stop):
    bodies = [b"r%d" % i for i in range(60)]
    produce(cluster.namesrv, pop_topic, bodies)
    with hamq.SimpleConsumer(
        "g-restart", cluster.namesrv, {pop_topic: "*"}, await_duration_s=0.3
    ) as consumer:
        got = receive_all(consumer, 60, 2.0)
        assert len(got) == 60
        unacked = {m.body for m in got if int(m.body[1:]) % 4 == 1}
        for m in got:
            if m.body not in unacked:
                consumer.ack(m)  # answered before the broker goes down
    if stop == "kill9":
        cluster.procs["broker"].kill9()
        cluster.procs["broker"].start()
    else:
        cluster.restart("broker")
    with hamq.SimpleConsumer(
        "g-restart", cluster.namesrv, {pop_topic: "*"}, await_duration_s=0.3
    ) as consumer:
        again = receive_all(consumer, len(unacked), 2.0)
        assert sorted(m.body for m in again) == sorted(unacked)
        assert all(m.reconsume_times == 1 for m in again)
        for m in again:
            consumer.ack(m)
        time.sleep(2.5)  # the point: past their invisible time, acked ones stay gone
        assert consumer.receive(32, 2.0) == []


def test_sync_flush_broker_keeps_acks_across_kill9(cluster_factory):
    """Under sync flush an ack is answered after the group commit covering its record."""
    c = cluster_factory()
    c.start_namesrv(scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=3000)
    c.start_broker(flush_disk_type="sync")
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic("PopSync", 1)
    produce(c.namesrv, "PopSync", [b"y%d" % i for i in range(10)])
    with hamq.SimpleConsumer(
        "g-sync", c.namesrv, {"PopSync": "*"}, await_duration_s=0.3
    ) as consumer:
        got = receive_all(consumer, 10, 2.0)
        for m in got[:7]:
            consumer.ack(m)
    c.procs["broker"].kill9()
    c.procs["broker"].start()
    with hamq.SimpleConsumer(
        "g-sync", c.namesrv, {"PopSync": "*"}, await_duration_s=0.3
    ) as consumer:
        again = receive_all(consumer, 3, 2.0)
        assert sorted(m.body for m in again) == sorted(m.body for m in got[7:])


def test_receive_long_polls_until_a_message_arrives(cluster, pop_topic):
    with hamq.SimpleConsumer(
        "g-poll", cluster.namesrv, {pop_topic: "*"}, await_duration_s=5.0
    ) as consumer:
        timer = threading.Timer(0.5, produce, (cluster.namesrv, pop_topic, [b"late"]))
        timer.start()
        started = time.monotonic()
        got = consumer.receive(32, 10.0)
        waited = time.monotonic() - started
        timer.join()
    assert [m.body for m in got] == [b"late"]
    assert 0.4 < waited < 3.0


def test_cli_consume_pop_acks_what_it_prints(cluster, pop_topic, hamq_cli):
    produce(cluster.namesrv, pop_topic, [b"c1", b"c2", b"c3"])
    args = ("consume", pop_topic, "--group", "g-cli", "--pop", "--namesrv", cluster.namesrv)
    first = hamq_cli(*args, "--from-beginning", "--max", "3", "--json")
    assert first.returncode == 0, first.stderr
    assert sorted(json.loads(line)["body"] for line in first.stdout.splitlines()) == [
        "c1",
        "c2",
        "c3",
    ]
    again = hamq_cli(*args, "--timeout", "1")
    assert again.returncode == 0, again.stderr
    assert again.stdout == ""  # all acked: nothing comes back


def test_cli_bench_consume_pop(cluster, hamq_cli):
    produced = hamq_cli(
        "bench",
        "produce",
        "--count",
        "2048",
        "--topic",
        "PopBenchT",
        "--namesrv",
        cluster.namesrv,
        "--json",
    )
    assert produced.returncode == 0, produced.stderr
    result = hamq_cli(
        "bench",
        "consume",
        "--pop",
        "--count",
        "2048",
        "--topic",
        "PopBenchT",
        "--namesrv",
        cluster.namesrv,
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["messages"] == 2048 and report["errors"] == 0
    assert {"msgs_per_s", "mb_per_s", "p50_ms", "p99_ms", "p999_ms", "params"} <= set(report)


def test_deleted_topic_takes_its_pop_state_with_it(cluster, pop_topic):
    """Unacked messages of a deleted topic are not redelivered into the topic created again
    under the same name, and its new messages are popped from their first offset."""
    produce(cluster.namesrv, pop_topic, [b"old%d" % i for i in range(4)])
    with hamq.SimpleConsumer(
        "deleted", cluster.namesrv, subscriptions={pop_topic: "*"}
    ) as consumer:
        assert len(receive_all(consumer, 4, INVISIBLE_S)) == 4  # in flight, never acked
        with hamq.Admin(cluster.namesrv) as admin:
            admin.delete_topic(pop_topic)
            admin.create_topic(pop_topic, 2)
        produce(cluster.namesrv, pop_topic, [b"new%d" % i for i in range(3)])
        time.sleep(INVISIBLE_S + 0.5)  # the old messages' invisible time has passed
        got = receive_all(consumer, 3, 30.0, timeout_s=5.0)
    assert sorted(m.body for m in got) == [b"new0", b"new1", b"new2"]
    assert all(m.reconsume_times == 0 for m in got)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_idle_long_polling_pops_cost_no_cpu_and_a_write_wakes_one(cluster):
    """400 held pops on an idle 8-queue topic: the broker does no work for them (only
    their own queues' writes, due redeliveries or poll ends wake them); a message sent
    then is handed to exactly one of them at once."""
    topic, held = "PopIdle", 400
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic(topic, 8)
        ext = {
            "group": "g-idle",
            "topic": topic,
            "queue_id": -1,
            "invisible_time_ms": 60_000,
            "max_msgs": 1,
            "poll_time_ms": 15_000,
        }
        pops = [
            admin.submit(
                admin.core.invoke(
                    cluster.broker_addr(),
                    RequestCode.POP_MESSAGE,
                    ext,
                    timeout_s=30.0,
                    ok=(ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND),
                )
            )
            for _ in range(held)
        ]
        pid = cluster.procs["broker"].pid
        time.sleep(1.0)  # the pops arrive and are held
        before, started = cpu_seconds(pid), time.monotonic()
        time.sleep(3.0)  # the measurement window
        busy = (cpu_seconds(pid) - before) / (time.monotonic() - started)
        assert busy < 0.05, f"idle held pops cost {busy:.0%} of a core"
        assert not any(p.done() for p in pops)  # all still held
        produce(cluster.namesrv, topic, [b"wake"])
        answered = wait_for(lambda: [p for p in pops if p.done()], 3.0, "a pop woken")
        assert len(answered) == 1 and answered[0].result().code == ResponseCode.SUCCESS


def test_a_poison_message_goes_to_the_dlq_after_max_reconsume_times(cluster):
    """A message never acked is redelivered with reconsume_times 0..16 (RocketMQ's default
    retryMaxTimes), then stored in %DLQ%<group> and acked, so the queue's consume offset
    moves past it and the acks behind it."""
    topic = "PopPoison"
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic(topic, 1)
    produce(cluster.namesrv, topic, [b"poison"] + [b"ok%d" % i for i in range(20)])
    deliveries: list[int] = []
    deadline = time.monotonic() + 30.0
    with hamq.SimpleConsumer(
        "g-poison", cluster.namesrv, {topic: "*"}, await_duration_s=0.5
    ) as consumer:
        while time.monotonic() < deadline:
            for m in consumer.receive(32, 0.1):
                if m.body == b"poison":
                    deliveries.append(m.reconsume_times)
                else:
                    consumer.ack(m)
            if len(deliveries) > 16:
                time.sleep(0.3)  # past its last invisible time: due, and dead-lettered
                assert consumer.receive(32, 0.1) == []
                break
    assert deliveries == list(range(17))
    with hamq.PullConsumer("g-poison", cluster.namesrv) as pull:
        dlq = wait_for(
            lambda: (
                pull.pull(
                    pull.fetch_message_queues("%DLQ%g-poison")[0], 0, 32, suspend_timeout_ms=500
                ).messages
            ),
            5.0,
            "the DLQ copy",
        )
        assert [m.body for m in dlq] == [b"poison"]
        assert dlq[0].reconsume_times == 17
        assert dlq[0].properties["RETRY_TOPIC"] == topic
        mq = pull.fetch_message_queues(topic)[0]
        assert wait_for(lambda: pull.fetch_offset(mq) == 21, 5.0, "the offset past it")
