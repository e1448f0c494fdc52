"""Delay-level and timer messages on a real broker: held back in SCHEDULE_TOPIC_XXXX, then
delivered into their real queue no earlier than due and within a second after it, once,
also when the broker restarts while they wait."""

from __future__ import annotations

import json
import time

import pytest

import hamq
from hamq import Message
from hamq.client.consumer import PullStatus
from hamq.errors import InvalidArgument, MessageIllegal
from helpers import wait_for

LATE_MS_MAX = 1000  # the accuracy bound: delivered within 1 s after due
WAIT_S = 12.0


def now_ms() -> int:
    return int(time.time() * 1000)


def collect(consumer: hamq.PullConsumer, topic: str, count: int, timeout_s: float = WAIT_S):
    """Pull the topic's single queue from 0 until ``count`` messages arrived; returns them
    with the local time each was received."""
    mq = consumer.fetch_message_queues(topic)[0]
    got: list[tuple[hamq.MessageExt, int]] = []
    offset = 0
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        result = consumer.pull(mq, offset, 32, suspend_timeout_ms=500)
        if result.status is PullStatus.FOUND:
            got += [(m, now_ms()) for m in result.messages]
            offset = result.next_begin_offset
    return got


def send_timed(producer: hamq.Producer, message: Message, delay_ms: int) -> tuple[int, int]:
    """Send; returns the window [earliest due, latest due] in epoch ms."""
    before = now_ms()
    assert producer.send(message).status is hamq.SendStatus.SEND_OK
    after = now_ms()
    if message.deliver_time_ms:
        return message.deliver_time_ms, message.deliver_time_ms
    return before + delay_ms, after + delay_ms


def check_on_time(got, windows: dict[str, tuple[int, int]], watched: bool = True) -> None:
    """``watched``: a long poll was waiting, so each message was also received on time."""
    assert sorted(m.keys for m, _ in got) == sorted(windows)  # each exactly once
    for msg, received_ms in got:
        earliest, latest = windows[msg.keys]
        assert msg.store_timestamp_ms >= earliest, f"{msg.keys} delivered early"
        assert msg.store_timestamp_ms <= latest + LATE_MS_MAX, (
            f"{msg.keys} delivered {msg.store_timestamp_ms - latest} ms late"
        )
        assert not watched or received_ms <= latest + LATE_MS_MAX + 500
        assert msg.body == f"body-{msg.keys}".encode()
        assert msg.tags == "T"
        assert not {"DELAY", "TIMER_DELIVER_MS", "REAL_TOPIC", "REAL_QID"} & set(msg.properties)


def make_message(topic: str, key: str, **kw) -> Message:
    return Message(topic, f"body-{key}".encode(), keys=key, tags="T", **kw)


def send_level1_level2_timer(cluster, topic: str) -> dict[str, tuple[int, int]]:
    """Level 1 (1 s), level 2 (5 s) and a timer 4 s ahead, to a new one-queue topic."""
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic(topic, 1)
    with hamq.Producer(cluster.namesrv) as producer:
        return {
            "level1": send_timed(producer, make_message(topic, "level1", delay_level=1), 1000),
            "level2": send_timed(producer, make_message(topic, "level2", delay_level=2), 5000),
            "timer": send_timed(
                producer, make_message(topic, "timer", deliver_time_ms=now_ms() + 4000), 0
            ),
        }


def test_delay_levels_and_timer_delivered_in_their_window(cluster):
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("Delayed", 1)
    with (
        hamq.Producer(cluster.namesrv) as producer,
        hamq.PullConsumer("g-delay", cluster.namesrv) as consumer,
    ):
        windows = {
            "plain": send_timed(producer, make_message("Delayed", "plain"), 0),
            "level1": send_timed(producer, make_message("Delayed", "level1", delay_level=1), 1000),
            "level2": send_timed(producer, make_message("Delayed", "level2", delay_level=2), 5000),
            "timer": send_timed(
                producer, make_message("Delayed", "timer", deliver_time_ms=now_ms() + 3000), 0
            ),
        }
        got = collect(consumer, "Delayed", 4)
    check_on_time(got, windows)
    assert [m.keys for m, _ in got] == ["plain", "level1", "timer", "level2"]


def delivered_first(cluster, topic: str, key: str) -> None:
    """Wait until the first message delivered into the topic's queue is ``key``."""
    with hamq.PullConsumer("g-delay-first", cluster.namesrv) as consumer:
        assert [m.keys for m, _ in collect(consumer, topic, 1)] == [key]


def test_delivered_once_and_on_time_across_a_broker_restart(cluster):
    windows = send_level1_level2_timer(cluster, "DelayedRestart")
    delivered_first(cluster, "DelayedRestart", "level1")  # before the restart; not the others
    cluster.restart("broker")
    assert now_ms() < windows["timer"][0], "restart took too long for this test"
    with hamq.PullConsumer("g-delay", cluster.namesrv) as consumer:
        got = collect(consumer, "DelayedRestart", 3)
        # two seconds in which nothing more may arrive: nothing is delivered twice
        assert len(collect(consumer, "DelayedRestart", 4, timeout_s=2.0)) == 3
    check_on_time(got, windows, watched=False)


def test_bad_delay_messages_are_clear_errors(cluster):
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("DelayedBad", 1)
    with hamq.Producer(cluster.namesrv) as producer:
        with pytest.raises(MessageIllegal, match=r"1\.\.18"):
            producer.send(make_message("DelayedBad", "k", delay_level=19))
        with pytest.raises(InvalidArgument, match="cannot be batched"):  # refused client-side
            producer.send_batch(
                [
                    make_message("DelayedBad", "a", delay_level=1),
                    make_message("DelayedBad", "b", delay_level=1),
                ]
            )
        with pytest.raises(MessageIllegal, match="more than"):
            producer.send(
                make_message("DelayedBad", "t", deliver_time_ms=now_ms() + 4 * 24 * 3600 * 1000)
            )


def test_cli_produce_delay_level_and_deliver_at(cluster, hamq_cli):
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic("DelayedCli", 1)
    started = now_ms()
    for flags, body in (
        (["--delay-level", "1"], "a\n"),
        (["--deliver-at", str(started + 2000)], "b\n"),
    ):
        done = hamq_cli("produce", "DelayedCli", *flags, "--namesrv", cluster.namesrv, input=body)
        assert done.returncode == 0, done.stderr
    with hamq.PullConsumer("g-delay", cluster.namesrv) as consumer:
        got = collect(consumer, "DelayedCli", 2)
    assert [m.body for m, _ in got] == [b"a", b"b"]
    assert got[0][0].store_timestamp_ms >= started + 1000
    assert got[1][0].store_timestamp_ms >= started + 2000


def test_slave_takes_its_masters_delay_offsets(cluster_factory):
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker("master", total_replicas=2, flush_delay_offset_interval_ms=200)
    c.start_broker(
        "slave",
        broker_id=1,
        broker_role="slave",
        total_replicas=2,
        slave_sync_interval_ms=200,
        flush_delay_offset_interval_ms=200,
    )
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic("DelayedSync", 1)
    with hamq.Producer(c.namesrv) as producer:
        producer.send(make_message("DelayedSync", "a", delay_level=1))
    table = c.root / "slave" / "delay_offsets.json"
    wait_for(
        lambda: (
            table.exists() and json.loads(table.read_text())["table"]["delay_offsets"] == {"1": 1}
        ),
        WAIT_S,
        "the slave to take the master's delay offset",
    )
    with hamq.PullConsumer("g-delay", c.namesrv) as consumer:
        assert [m.keys for m, _ in collect(consumer, "DelayedSync", 1)] == ["a"]


def test_kill9_before_due_still_delivers_at_least_once(cluster):
    windows = send_level1_level2_timer(cluster, "DelayedKill")
    delivered_first(cluster, "DelayedKill", "level1")  # its progress not yet persisted
    broker = cluster.procs["broker"]
    broker.kill9()
    broker.start()
    with hamq.PullConsumer("g-delay", cluster.namesrv) as consumer:
        got = collect(consumer, "DelayedKill", 4)  # level 1 again: at least once
    assert sorted(m.keys for m, _ in got) == ["level1", "level1", "level2", "timer"]
    for msg, _ in got:
        assert windows[msg.keys][0] <= msg.store_timestamp_ms
        if msg.keys != "level1":
            assert msg.store_timestamp_ms <= windows[msg.keys][1] + LATE_MS_MAX


def send_timers(cluster, topic: str, dues: dict[str, int]) -> None:
    """One timer message per key, due at its epoch ms, to a new one-queue topic."""
    with hamq.Admin(cluster.namesrv) as admin:
        admin.create_topic(topic, 1)
    with hamq.Producer(cluster.namesrv) as producer:
        for key, due in dues.items():
            assert (
                producer.send(make_message(topic, key, deliver_time_ms=due)).status
                is hamq.SendStatus.SEND_OK
            )


def wait_until_ms(epoch_ms: int) -> None:
    """Time itself is the condition: timers fall due while the broker is down."""
    time.sleep(max(0.0, (epoch_ms - now_ms()) / 1000))


def test_timers_due_while_the_broker_was_down_come_at_start_in_due_order(cluster):
    start = now_ms() + 3000
    # sent in reverse due order, 37 ms apart: several wheel slots, several timers per slot
    dues = {f"t{i:02d}": start + (39 - i) * 37 for i in range(40)}
    dues["far"] = now_ms() + 24 * 3600 * 1000
    send_timers(cluster, "TimersDown", dues)
    broker = cluster.procs["broker"]
    broker.stop()  # clean: the timer log and the progress are written
    wait_until_ms(max(d for k, d in dues.items() if k != "far") + 500)
    broker.start()
    with hamq.PullConsumer("g-delay", cluster.namesrv) as consumer:
        got = collect(consumer, "TimersDown", 40)
        assert len(collect(consumer, "TimersDown", 41, timeout_s=2.0)) == 40  # once; far waits
    assert [m.keys for m, _ in got] == sorted(dues.keys() - {"far"}, key=dues.get)
    assert all(m.store_timestamp_ms >= dues[m.keys] for m, _ in got)


def test_delivered_timers_leave_no_trace_behind_a_far_one(cluster):
    """One far timer used to pin the timer progress, so every later delivered offset was
    kept in memory and in delay_offsets.json; the cursor now keeps a fixed size."""
    due = now_ms() + 2000
    dues = {"far": now_ms() + 24 * 3600 * 1000} | {f"n{i:04d}": due + i for i in range(1500)}
    send_timers(cluster, "TimersFar", dues)
    with hamq.PullConsumer("g-delay", cluster.namesrv) as consumer:
        got = collect(consumer, "TimersFar", 1500, timeout_s=30.0)
        assert [m.keys for m, _ in got] == sorted(dues.keys() - {"far"})  # due order
        cluster.restart("broker")  # clean: progress persisted
        assert len(collect(consumer, "TimersFar", 1501, timeout_s=2.0)) == 1500  # once
    table = cluster.root / "broker" / "delay_offsets.json"
    assert table.stat().st_size < 1024, table.read_text()[:300]


@pytest.mark.parametrize("flush_disk_type", ["async", "sync"])
def test_kill9_mid_delivery_with_a_torn_timer_log_still_delivers_every_timer(
    cluster_factory, flush_disk_type
):
    cluster = cluster_factory()
    cluster.start_namesrv()
    cluster.start_broker(flush_disk_type=flush_disk_type, flush_delay_offset_interval_ms=200)
    start = now_ms() + 2500
    dues = {f"k{i:03d}": start + i * 5 for i in range(400)}  # two seconds of timers
    send_timers(cluster, "TimersKill", dues)
    with hamq.PullConsumer("g-delay-count", cluster.namesrv) as consumer:
        mq = consumer.fetch_message_queues("TimersKill")[0]
        delivered = wait_for(
            lambda: consumer.max_offset(mq) >= 50 and consumer.max_offset(mq),
            WAIT_S,
            "the first timers delivered",
        )
    broker = cluster.procs["broker"]
    broker.kill9()
    assert delivered < len(dues), "every timer was delivered before the kill: nothing tested"
    segments = sorted((cluster.root / "broker" / "timerlog").glob("0*"))
    with open(segments[-1], "r+b") as f:  # as if the last append was torn by the crash
        f.truncate(f.seek(0, 2) - 13)
    broker.start()
    with hamq.PullConsumer("g-delay", cluster.namesrv) as consumer:
        mq = consumer.fetch_message_queues("TimersKill")[0]
        seen: set[str] = set()
        offset = 0
        deadline = time.monotonic() + WAIT_S
        while len(seen) < len(dues) and time.monotonic() < deadline:
            result = consumer.pull(mq, offset, 64, suspend_timeout_ms=500)
            if result.status is PullStatus.FOUND:
                for msg in result.messages:
                    assert msg.store_timestamp_ms >= dues[msg.keys], f"{msg.keys} early"
                    seen.add(msg.keys)
                offset = result.next_begin_offset
    assert seen == dues.keys()  # at least once
