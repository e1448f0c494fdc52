"""Slave acting master (issue 15, seed 004) end to end on real processes: group A's master
is killed with kill -9 and A's smallest-id slave serves what only a master could (locks,
END_TRANSACTION, offset queries, delay, transaction and pop messages, escaped to group B's
master); then A's master returns through pre-online and neither consumer offsets nor delay
progress go back. Through all of it, the acting master's commit log grows by nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from acting_cluster import (
    ACTING,
    GROUP_A,
    GROUP_B,
    LOCK_LEASE_MS,
    ActingCluster,
    CheckBack,
    halves_on_a,
    keys_by_group,
    receive_until,
)

import hamq
from hamq import Message, MessageQueue, TransactionState
from helpers import wait_for

pytestmark = pytest.mark.slow

CLI_TIMEOUT_S = 60.0
POP_INVISIBLE_S = 1.0


def _admin_cli(namesrv: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "hamq.cli.main", "admin", *args, "-n", namesrv, "--json"],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _push_consumer(
    ac: ActingCluster, group: str, topic: str, listener, orderly: bool
) -> hamq.PushConsumer:
    """A started push consumer from the first offset, with every period short (a lock
    lease of 2.5 s), so it follows route changes within about a second."""
    consumer = hamq.PushConsumer(
        group,
        ac.c.namesrv,
        consume_from_where="first",
        heartbeat_interval_s=1.0,
        rebalance_interval_s=1.0,
        lock_renew_interval_s=1.0,
        lock_max_live_s=2.5,
        persist_offset_interval_s=0.5,
        pull_suspend_ms=500,
        poll_name_server_interval_s=1.0,
    )
    consumer.subscribe(topic, "*")
    consumer.register_message_listener(listener, orderly=orderly)
    consumer.start()
    return consumer


def test_ordered_consumption_goes_on_past_the_lock_lease(cluster_factory):
    """An orderly push consumer holds A's queues; its listener is held across the kill
    until every lock lease (the client's and the broker's) has run out, so going on needs
    new locks, which only the acting master can grant."""
    per_queue, queues = 30, 2
    ac = ActingCluster(cluster_factory, {"Ord": queues})
    try:
        for q in range(queues):
            bodies = [b"%d-%03d" % (q, i) for i in range(per_queue)]
            ac.send_to(GROUP_A, [Message("Ord", b) for b in bodies], queue_id=q)
        consumed: list[bytes] = []
        gate = threading.Event()

        def listener(messages):
            consumed.extend(m.body for m in messages)
            if len(consumed) >= per_queue // 2:
                gate.wait(60)  # held across the kill and the leases
            return hamq.ConsumeOrderlyStatus.SUCCESS

        consumer = _push_consumer(ac, "g-ordered", "Ord", listener, orderly=True)
        try:
            wait_for(lambda: len(consumed) >= per_queue // 2, 30, "ordered consumption")
            ac.kill_master("Ord")
            lapsed = ac.killed_at + LOCK_LEASE_MS / 1000 + 1.0
            wait_for(lambda: time.monotonic() > lapsed, 30, "every lock lease run out")
            held = len(consumed)
            gate.set()
            wait_for(
                lambda: len(set(consumed)) == per_queue * queues,
                60,
                "every ordered message consumed",
            )
        finally:
            gate.set()
            consumer.shutdown()
        assert len(consumed) > held, "nothing consumed once the leases ran out"
        for q in range(queues):
            firsts = list(dict.fromkeys(b for b in consumed if b.startswith(b"%d-" % q)))
            assert firsts == sorted(firsts), f"queue {q} consumed out of order"
        ac.assert_acting_log_unchanged()
    finally:
        ac.close()


def test_end_transaction_on_the_acting_master_commits_a_half_message_once(cluster_factory):
    """A half left undecided on A is committed by END_TRANSACTION to the acting master (its
    message escaped into B); after A's master returns and checks its halves back (the
    producer now answers COMMIT for it: its local transaction did commit), it is still
    there once."""
    ac = ActingCluster(cluster_factory, {"Tx": 1})
    check = CheckBack()
    try:
        with hamq.TransactionProducer(
            ac.c.namesrv,
            "pg-acting",
            lambda *_: TransactionState.UNKNOW,
            check,
            heartbeat_interval_s=0.3,
        ) as producer:
            halves = halves_on_a(producer, "Tx")
            ac.kill_master("Tx")
            key, half_offset = next(iter(halves.items()))
            check.committed.add(key)
            ac.commit_half(ac.routed_master("Tx", GROUP_A), "pg-acting", half_offset)
            wait_for(
                lambda: key in keys_by_group(ac.read_topic("Tx")).get(GROUP_B, []),
                20,
                "the committed message in group B",
            )
            got = keys_by_group(ac.read_topic("Tx"))
            assert got.get(GROUP_B, []).count(key) == 1, f"in the outage: {got}"
            assert not got.get(GROUP_A), f"group A (no master) took a message: {got}"
            assert not set(halves) - {key} & set(got.get(GROUP_B, [])), "an undecided half shows"
            ac.assert_acting_log_unchanged()
            ac.restart_master("Tx")
            returned_at = time.monotonic()
            other = next(k for k in halves if k != key)
            wait_for(
                lambda: check.asked_since(other, returned_at),
                30,
                "the returned master checking its undecided half back",
            )
        got = keys_by_group(ac.read_topic("Tx"))
        count = sum(keys.count(key) for keys in got.values())
        assert count == 1, (
            f"after the master's return the committed message is there {count}x: {got}"
        )
    finally:
        ac.close()


def test_admin_offset_queries_answer_for_the_masterless_group(cluster_factory):
    ac = ActingCluster(cluster_factory, {"Offs": 1})
    try:
        mq = MessageQueue("Offs", GROUP_A, 0)
        ac.send_to(GROUP_A, [Message("Offs", b"o%d" % i) for i in range(10)])
        stored = ac.read_queue(mq)
        with hamq.PullConsumer("g-offsets", ac.c.namesrv) as consumer:
            consumer.commit_offset(mq, 4)
        for name in ("a1", "a2"):
            wait_for(lambda n=name: ac.consumer_offset(n, "g-offsets", mq) == 4, 20, "offset sync")
        ac.kill_master("Offs")
        progress = _admin_cli(ac.c.namesrv, "consumer-progress", "-g", "g-offsets")
        rows = [r for r in progress["queues"] if r["broker_name"] == GROUP_A]
        assert [(r["broker_offset"], r["consumer_offset"], r["lag"]) for r in rows] == [
            (10, 4, 6)
        ], progress
        with hamq.PullConsumer("g-offsets", ac.c.namesrv) as consumer:
            assert consumer.max_offset(mq) == 10
            assert consumer.min_offset(mq) == 0
            assert consumer.search_offset(mq, stored[5].store_timestamp_ms) <= 5
            assert consumer.earliest_msg_store_time_ms(mq) == stored[0].store_timestamp_ms
        ac.assert_acting_log_unchanged()
    finally:
        ac.close()


def test_delay_message_due_in_the_outage_is_delivered_once_and_not_again_after_return(
    cluster_factory,
):
    """Level 3 (10 s) sent to A just before the kill: due while A has no master, delivered
    by the acting master into B's master; A's master returns, takes the delay progress from
    its slaves (pre-online) and does not deliver it again."""
    level = 3
    ac = ActingCluster(cluster_factory, {"Dly": 1})
    try:
        sent_ms = int(time.time() * 1000)
        ac.send_to(GROUP_A, [Message("Dly", b"due-in-outage", keys="dly", delay_level=level)])
        ac.kill_master("Dly")

        def delivered() -> dict[str, list[str]]:
            return keys_by_group(ac.read_topic("Dly"))

        wait_for(lambda: "dly" in delivered().get(GROUP_B, []), 40, "the delay message in B")
        got = ac.read_topic("Dly")
        assert [m.keys for m in got.get(GROUP_B, [])] == ["dly"], keys_by_group(got)
        assert got[GROUP_B][0].store_timestamp_ms >= sent_ms + 10_000, "delivered early"
        assert not got.get(GROUP_A), "the acting master delivered into its own group"
        ac.assert_acting_log_unchanged()
        wait_for(
            lambda: int(ac.delay_offsets(ACTING).get(str(level), 0)) >= 1,
            10,
            "the acting master's delay progress past the message",
        )
        ac.restart_master("Dly")
        wait_for(
            lambda: int(ac.delay_offsets("a0").get(str(level), 0)) >= 1 or delivered().get(GROUP_A),
            30,
            "a0 past the delay message (or delivering it again)",
        )
        after = delivered()
        assert not after.get(GROUP_A), f"the returned master delivered it again: {after}"
        assert after.get(GROUP_B) == ["dly"], after
        for name in ("a1", "a2"):  # slave sync copies the returned master's progress
            wait_for(
                lambda n=name: int(ac.delay_offsets(n).get(str(level), 0)) >= 1,
                10,
                f"{name}'s delay progress past the message",
            )
    finally:
        ac.close()


def test_pop_messages_not_acked_in_the_outage_are_redelivered(cluster_factory):
    """Popped and not acked before the kill (their checkpoints in A's log) and during it
    (checkpoints the acting master escapes to B): all come back; the one acked in the
    outage does not."""
    ac = ActingCluster(cluster_factory, {"PopT": 1})
    try:
        bodies = [b"p%d" % i for i in range(6)]
        ac.send_to(GROUP_A, [Message("PopT", b) for b in bodies])
        with hamq.SimpleConsumer(
            "g-pop-acting", ac.c.namesrv, {"PopT": "*"}, await_duration_s=0.5
        ) as consumer:
            before = []
            deadline = time.monotonic() + 10
            while len(before) < 3 and time.monotonic() < deadline:
                before += consumer.receive(3 - len(before), 5.0)  # invisible past the kill
            assert len(before) == 3
        ac.kill_master("PopT")
        with hamq.SimpleConsumer(
            "g-pop-acting", ac.c.namesrv, {"PopT": "*"}, await_duration_s=0.5
        ) as consumer:
            rest = set(bodies) - {m.body for m in before}
            during = receive_until(consumer, rest, 20, POP_INVISIBLE_S)
            assert {m.body for m in during} >= rest, "the acting master popped nothing"
            acked = during[0]
            consumer.ack(acked)
            unacked = set(bodies) - {acked.body}
            again = receive_until(consumer, unacked, 40, POP_INVISIBLE_S)
            redelivered = {m.body for m in again}
            assert redelivered >= unacked, f"not redelivered: {unacked - redelivered}"
            assert acked.body not in redelivered, "a message acked in the outage came back"
            assert all(m.reconsume_times >= 1 for m in again)
        ac.assert_acting_log_unchanged()
    finally:
        ac.close()


def test_returning_master_keeps_the_consumer_offsets_of_the_outage(cluster_factory):
    """A group consumes A's queues to their end during the outage (its offsets on the
    acting master); after the master's return a consumer of the group gets nothing it had
    already consumed: pre-online took the newer offsets."""
    per_queue, queues, committed = 30, 2, 10
    ac = ActingCluster(cluster_factory, {"Cons": queues})
    try:
        mqs = ac.fill_queues("Cons", queues, per_queue)
        ac.commit_offsets("g-cons", mqs, committed)
        ac.kill_master("Cons")
        outage = (per_queue - committed) * queues
        during = _consume(ac, lambda got: len(got) >= outage, f"{outage} messages consumed")
        assert len(during) == outage, "the outage consumption"
        for mq in mqs:
            wait_for(
                lambda mq=mq: ac.consumer_offset(ACTING, "g-cons", mq) == per_queue,
                20,
                "the outage's offsets on the acting master",
            )
        ac.assert_acting_log_unchanged()
        ac.restart_master("Cons")
        for mq in mqs:
            assert ac.consumer_offset("a0", "g-cons", mq) == per_queue, (
                f"a0's offset of {mq} after pre-online: "
                f"{ac.consumer_offset('a0', 'g-cons', mq)}, the outage's is {per_queue}"
            )
        ends = {b"end-%d" % mq.queue_id for mq in mqs}  # each queue's last message
        for mq in mqs:
            ac.send_to(GROUP_A, [Message("Cons", b"end-%d" % mq.queue_id)], mq.queue_id)
        after = _consume(ac, lambda got: ends <= set(got), "every queue's last message")
        again = [b for b in after if b not in ends]
        assert not again, f"{len(again)} messages consumed again after the master's return"
    finally:
        ac.close()


def _consume(ac: ActingCluster, done, what: str) -> list[bytes]:
    """A push consumer of g-cons from its committed offsets until ``done(consumed)``;
    everything it consumed (its listeners finished: shutdown waits for them)."""
    consumed: list[bytes] = []

    def listener(messages):
        consumed.extend(m.body for m in messages)
        return hamq.ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = _push_consumer(ac, "g-cons", "Cons", listener, orderly=False)
    try:
        wait_for(lambda: done(consumed), 40, what)
    finally:
        consumer.shutdown()
    return consumed
