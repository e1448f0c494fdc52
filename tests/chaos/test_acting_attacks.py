"""Break-it tests of slave acting master (issue 15, seed 004) on real processes: faults the
builders' tests do not make. A master that is only paused (SIGSTOP past the name server's
``broker_not_active_timeout_ms``, then SIGCONT) never restarts, so the pre-online of its
start does not run again; meanwhile its slave acted. Stopped processes are resumed and
every process is stopped by its PID (tests/harness.py)."""

from __future__ import annotations

import os
import signal
import struct
import time

import pytest
from acting_cluster import (
    ACTING,
    BROKER_SETTINGS,
    GROUP_A,
    GROUP_B,
    ActingCluster,
    CheckBack,
    halves_on_a,
    keys_by_group,
    receive_until,
)
from faultproxy import FaultProxy

import hamq
from hamq import Message, MessageQueue, TransactionState
from hamq.broker.pre_online import RETURNING_HOLD_MS
from hamq.client.consumer import PullStatus
from hamq.errors import NoPermission
from hamq.protocol.codes import RequestCode
from hamq.protocol.message import encode_batch
from helpers import wait_for

DELAY_LEVEL = 3  # 10 s: due while A's master is paused


def test_paused_master_takes_the_outage_back_before_it_serves_again(cluster_factory):
    """A's master is frozen past its liveness timeout: the name server drops it, a1 acts,
    the group consumes everything through a1 and a delay message falls due and is
    delivered once, through B. Thawed, the master did not restart: it must still not
    serve its older offsets nor deliver the delay message a second time (into A), and
    while it is back a1 no longer acts."""
    per_queue, committed = 20, 5
    ac = ActingCluster(cluster_factory, {"PauseT": 2, "PauseDly": 1})
    a0 = ac.c.procs["a0"]
    paused = False
    try:
        mqs = ac.fill_queues("PauseT", 2, per_queue)
        ac.commit_offsets("g-pause", mqs, committed)
        ac.send_to(GROUP_A, [Message("PauseDly", b"d", keys="dly", delay_level=DELAY_LEVEL)])
        ac.wait_replicated()

        os.kill(a0.pid, signal.SIGSTOP)
        paused = True
        wait_for(lambda: ac.routed_master("PauseT", GROUP_A) == ac.addr(ACTING), 20, "a1 routed")
        wait_for(lambda: ac.runtime(ACTING)["acting_master"]["acting"], 20, "a1 acting")
        with hamq.PullConsumer("g-pause", ac.c.namesrv) as consumer:
            for mq in mqs:
                offset = consumer.fetch_offset(mq)
                assert offset == committed
                while offset < per_queue:
                    result = consumer.pull(mq, offset, 8)
                    assert result.status is PullStatus.FOUND
                    offset = result.next_begin_offset
                    consumer.commit_offset(mq, offset)
        for mq in mqs:
            assert ac.consumer_offset(ACTING, "g-pause", mq) == per_queue
        _escaped_through_b(ac, "PauseDly", ACTING)

        os.kill(a0.pid, signal.SIGCONT)
        paused = False
        wait_for(lambda: ac.routed_master("PauseT", GROUP_A) == ac.addr("a0"), 40, "a0 routed")
        # the master serves the outage's offsets (a consumer that restarts resumes there)
        for mq in mqs:
            assert ac.consumer_offset("a0", "g-pause", mq) == per_queue, (
                f"a0 answers {ac.consumer_offset('a0', 'g-pause', mq)} for {mq}: the offsets "
                f"committed on the acting member ({per_queue}) went back"
            )
        wait_for(
            lambda: "delay_delivery" in ac.runtime("a0")["role"]["services"],
            30,
            "a0's delay delivery running",
        )
        wait_for(
            lambda: int(ac.delay_offsets("a0").get(str(DELAY_LEVEL), 0)) >= 1,
            30,
            "a0's delay progress past the message",
        )
        delivered = keys_by_group(ac.read_topic("PauseDly"))
        assert not delivered.get(GROUP_A), f"delivered again by the thawed master: {delivered}"
        assert delivered.get(GROUP_B) == ["dly"], delivered
        wait_for(lambda: not ac.runtime(ACTING)["acting_master"]["acting"], 20, "a1 stops")
    finally:
        if paused:
            os.kill(a0.pid, signal.SIGCONT)
        ac.close()


def test_paused_acting_member_does_not_act_on_its_stale_metadata(cluster_factory):
    """A's master is killed and a1 acts; then a1 is frozen past its liveness timeout, so a2
    acts: the group commits through a2 and the delay message falls due and is escaped by
    a2 into B. a1 thawed is the smallest id again and acts again: it must not escape the
    delay message a second time, and it must answer the offsets committed through a2."""
    per_queue = 20
    ac = ActingCluster(cluster_factory, {"PauseT": 1, "PauseDly": 1})
    a1 = ac.c.procs[ACTING]
    paused = False
    try:
        mq = MessageQueue("PauseT", GROUP_A, 0)
        ac.send_to(GROUP_A, [Message("PauseT", b"%d" % i) for i in range(per_queue)])
        ac.send_to(GROUP_A, [Message("PauseDly", b"d", keys="dly", delay_level=DELAY_LEVEL)])
        ac.kill_master("PauseT")
        # a send straight to the acting master (not through the read-only route) is
        # refused, and stores nothing
        payload, crc = encode_batch([struct.pack(">IH", 3, 0) + b"x"])
        ext = {"topic": "PauseT", "queue_id": 0, "count": 1, "crc": crc}
        with pytest.raises(NoPermission, match="slave"):
            ac.invoke(ac.addr(ACTING), RequestCode.SEND_MESSAGE, ext, body=payload)
        ac.assert_acting_log_unchanged()
        os.kill(a1.pid, signal.SIGSTOP)
        paused = True
        wait_for(lambda: ac.routed_master("PauseT", GROUP_A) == ac.addr("a2"), 20, "a2 routed")
        wait_for(lambda: ac.runtime("a2")["acting_master"]["acting"], 20, "a2 acting")
        with hamq.PullConsumer("g-pause", ac.c.namesrv) as consumer:
            consumer.commit_offset(mq, per_queue)
        _escaped_through_b(ac, "PauseDly", "a2")

        os.kill(a1.pid, signal.SIGCONT)
        paused = False
        wait_for(lambda: ac.routed_master("PauseT", GROUP_A) == ac.addr(ACTING), 20, "a1 routed")
        wait_for(lambda: ac.runtime(ACTING)["acting_master"]["acting"], 20, "a1 acting again")
        wait_for(lambda: not ac.runtime("a2")["acting_master"]["acting"], 20, "a2 stops")
        wait_for(
            lambda: (
                int(ac.delay_offsets(ACTING).get(str(DELAY_LEVEL), 0)) >= 1
                or len(ac.read_topic("PauseDly").get(GROUP_B, [])) > 1
            ),
            20,
            "a1 past the delay message (or escaping it again)",
        )
        delivered = {
            g: keys for g, keys in keys_by_group(ac.read_topic("PauseDly")).items() if keys
        }
        assert delivered == {GROUP_B: ["dly"]}, f"escaped again by the thawed a1: {delivered}"
        assert ac.consumer_offset(ACTING, "g-pause", mq) == per_queue, (
            f"a1 answers {ac.consumer_offset(ACTING, 'g-pause', mq)}: the offset committed "
            f"through a2 ({per_queue}) went back"
        )
        ac.assert_acting_log_unchanged()
    finally:
        if paused:
            os.kill(a1.pid, signal.SIGCONT)
        ac.close()


def test_a_restarted_name_server_does_not_make_a_slave_act_beside_a_live_master(
    cluster_factory,
):
    """The name server restarts while A's master is alive but has not registered with it
    yet (frozen for a few seconds, well within its 10 s liveness timeout): the slaves
    register first, so the new name server knows A without a master. The smallest-id
    slave must not act on that (its delay delivery and check-back would run beside the
    master's) until the name server could have heard from every live master."""
    c = cluster_factory()
    c.start_namesrv(support_acting_master=True, broker_not_active_timeout_ms=10_000)
    settings = {
        "enable_slave_acting_master": True,
        "broker_heartbeat_interval_ms": 300,
        "sync_broker_member_group_period_ms": 300,
    }
    for broker_id, name in enumerate(("a0", "a1")):
        c.start_broker(
            name,
            broker_id=broker_id,
            broker_role="slave" if broker_id else "async_master",
            total_replicas=2,
            **settings,
        )
    a0 = c.procs["a0"]
    with hamq.Admin(c.namesrv) as admin:

        def group() -> dict:
            table = admin.cluster_info()["broker_addr_table"]
            return {int(i): a for i, a in table.get(GROUP_A, {}).get("broker_addrs", {}).items()}

        def acting_changes() -> int:
            return admin.broker_runtime_info(c.broker_addr("a1"))["acting_master"]["changes"]

        wait_for(lambda: set(group()) == {0, 1}, 20, "both members registered")
        os.kill(a0.pid, signal.SIGSTOP)
        try:
            c.restart("namesrv")
            wait_for(lambda: set(group()) == {1}, 20, "the new name server knows a1 only")
            deadline = time.monotonic() + 1.5  # five member-group syncs of a1
            while time.monotonic() < deadline:
                assert acting_changes() == 0, "a1 acted while its master was alive"
                time.sleep(0.1)
        finally:
            os.kill(a0.pid, signal.SIGCONT)
        wait_for(lambda: set(group()) == {0, 1}, 20, "a0 registered again")
        assert acting_changes() == 0, "a1 acted while its master was alive"


def test_master_killed_in_pre_online_leaves_the_group_masterless_for_a_bounded_time(
    cluster_factory,
):
    """A's master returns while a2 is frozen, takes a1's metadata (a1 stops acting for it)
    and is killed with kill -9 while it still waits for a2. a1 acts again once the hold
    the master asked for passed; the master's next return takes the group back, and the
    offsets committed through a1 before the kill are still there."""
    ac = ActingCluster(cluster_factory, {"PreT": 1})
    a0, a2 = ac.c.procs["a0"], ac.c.procs["a2"]
    paused = False
    try:
        mq = MessageQueue("PreT", GROUP_A, 0)
        ac.send_to(GROUP_A, [Message("PreT", b"%d" % i) for i in range(10)])
        ac.kill_master("PreT")
        with hamq.PullConsumer("g-pre", ac.c.namesrv) as consumer:
            consumer.commit_offset(mq, 10)
        os.kill(a2.pid, signal.SIGSTOP)
        paused = True
        a0.start()
        wait_for(lambda: 1 in ac.runtime("a0")["pre_online"]["done"], 30, "a0 took a1's")
        assert ac.runtime("a0")["pre_online"]["isolated"]
        assert not ac.runtime(ACTING)["acting_master"]["acting"]  # held off for a0
        a0.kill9()
        killed = time.monotonic()
        os.kill(a2.pid, signal.SIGCONT)
        paused = False
        wait_for(lambda: ac.runtime(ACTING)["acting_master"]["acting"], 60, "a1 acting again")
        assert time.monotonic() - killed < RETURNING_HOLD_MS / 1000 + 10
        assert ac.routed_master("PreT", GROUP_A) == ac.addr(ACTING)
        ac.restart_master("PreT")
        assert ac.consumer_offset("a0", "g-pre", mq) == 10
        wait_for(lambda: not ac.runtime(ACTING)["acting_master"]["acting"], 20, "a1 stops")
    finally:
        if paused:
            os.kill(a2.pid, signal.SIGCONT)
        ac.close()


def test_acting_member_cut_off_from_the_name_server_stops_acting(cluster_factory):
    """a1 acts for A's killed master; then a1 alone is cut off from the name server (a
    fault proxy between them): the name server drops a1 and a2 acts. a1, alive and still
    seeing its old group, must stop acting; healed, it acts again from a2's progress: a
    delay message falling due while it was cut off is escaped once (by a2), not by both."""
    ac = ActingCluster(cluster_factory, {"CutT": 1, "CutDly": 1})
    proxy = FaultProxy(ac.c.namesrv_addrs[0])
    try:
        # a1 again, reaching the name server through the proxy only
        ac.c.procs[ACTING].stop()
        ac.c.write_broker_config(
            ACTING,
            broker_name=GROUP_A,
            broker_id=1,
            broker_role="slave",
            total_replicas=3,
            namesrv=[proxy.address],
            **BROKER_SETTINGS,
        )
        ac.c.procs[ACTING].start()
        wait_for(lambda: ac.topics_of(ACTING) >= {"CutT", "CutDly"}, 20, "a1's topics")
        ac.send_to(GROUP_A, [Message("CutDly", b"d", keys="dly", delay_level=DELAY_LEVEL)])
        ac.kill_master("CutT")
        proxy.block()
        wait_for(lambda: ac.routed_master("CutT", GROUP_A) == ac.addr("a2"), 20, "a2 routed")
        wait_for(lambda: ac.runtime("a2")["acting_master"]["acting"], 20, "a2 acting")
        assert not ac.runtime(ACTING)["acting_master"]["acting"], "a1 acts beside a2"
        _escaped_through_b(ac, "CutDly", "a2")
        # healed: a1 is the smallest id again and acts again, from a2's progress
        proxy.unblock()
        wait_for(lambda: ac.routed_master("CutT", GROUP_A) == ac.addr(ACTING), 20, "a1 routed")
        wait_for(lambda: ac.runtime(ACTING)["acting_master"]["acting"], 20, "a1 acting again")
        wait_for(
            lambda: (
                int(ac.delay_offsets(ACTING).get(str(DELAY_LEVEL), 0)) >= 1
                or len(ac.read_topic("CutDly").get(GROUP_B, [])) > 1
            ),
            20,
            "a1 past the delay message (or escaping it again)",
        )
        delivered = {g: k for g, k in keys_by_group(ac.read_topic("CutDly")).items() if k}
        assert delivered == {GROUP_B: ["dly"]}, f"escaped by both acting members: {delivered}"
    finally:
        proxy.stop()
        ac.close()


def test_paused_master_does_not_commit_again_what_its_acting_slave_committed(cluster_factory):
    """Halves are left undecided on A; A's master is frozen past its liveness timeout and
    END_TRANSACTION commits one on the acting a1 (the message escaped into B). Thawed, the
    master checks its halves back (the producer now answers COMMIT for that one): it must
    take a1's decision first and not commit the message a second time, into A."""
    ac = ActingCluster(cluster_factory, {"PauseTx": 1})
    a0 = ac.c.procs["a0"]
    check = CheckBack()
    paused = False
    try:
        with hamq.TransactionProducer(
            ac.c.namesrv,
            "pg-pause",
            lambda *_: TransactionState.UNKNOW,
            check,
            heartbeat_interval_s=0.3,
        ) as producer:
            halves = halves_on_a(producer, "PauseTx")
            ac.wait_replicated()
            os.kill(a0.pid, signal.SIGSTOP)
            paused = True
            acting = ac.addr(ACTING)
            wait_for(lambda: ac.routed_master("PauseTx", GROUP_A) == acting, 20, "a1 routed")
            wait_for(lambda: ac.runtime(ACTING)["acting_master"]["acting"], 20, "a1 acting")
            key, half_offset = next(iter(halves.items()))
            check.committed.add(key)
            ac.commit_half(acting, "pg-pause", half_offset)
            wait_for(
                lambda: key in keys_by_group(ac.read_topic("PauseTx")).get(GROUP_B, []),
                20,
                "the committed message in group B",
            )
            os.kill(a0.pid, signal.SIGCONT)
            paused = False
            thawed_at = time.monotonic()
            other = next(k for k in halves if k != key)
            wait_for(
                lambda: (
                    check.asked_since(other, thawed_at)
                    and ac.routed_master("PauseTx", GROUP_A) == ac.addr("a0")
                ),
                30,
                "the thawed master routed and checking its undecided half back",
            )
            time.sleep(1.0)  # a check-back of the committed half would have come by now
        got = keys_by_group(ac.read_topic("PauseTx"))
        count = sum(keys.count(key) for keys in got.values())
        assert count == 1, f"after the thaw the committed message is there {count}x: {got}"
    finally:
        if paused:
            os.kill(a0.pid, signal.SIGCONT)
        ac.close()


def test_paused_master_does_not_redeliver_pops_acked_on_its_acting_slave(cluster_factory):
    """Every message of A is popped from the acting a1 while A's master is frozen, and
    half of them acked there. Thawed, the master takes a1's pop state before it serves
    again: the unacked come back, the acked do not."""
    invisible_s = 1.0
    ac = ActingCluster(cluster_factory, {"PausePop": 1})
    a0 = ac.c.procs["a0"]
    paused = False
    try:
        bodies = {b"p%d" % i for i in range(6)}
        ac.send_to(GROUP_A, [Message("PausePop", b) for b in sorted(bodies)])
        ac.wait_replicated()
        os.kill(a0.pid, signal.SIGSTOP)
        paused = True
        wait_for(lambda: ac.routed_master("PausePop", GROUP_A) == ac.addr(ACTING), 20, "routed")
        wait_for(lambda: ac.runtime(ACTING)["acting_master"]["acting"], 20, "a1 acting")
        with hamq.SimpleConsumer(
            "g-pause-pop", ac.c.namesrv, {"PausePop": "*"}, await_duration_s=0.5
        ) as consumer:
            during = receive_until(consumer, bodies, 20, 5.0)
            assert {m.body for m in during} == bodies
            acked = {m.body for m in during[:3]}
            for m in during[:3]:
                consumer.ack(m)
        os.kill(a0.pid, signal.SIGCONT)
        paused = False
        wait_for(lambda: ac.routed_master("PausePop", GROUP_A) == ac.addr("a0"), 40, "a0 routed")
        with hamq.SimpleConsumer(
            "g-pause-pop", ac.c.namesrv, {"PausePop": "*"}, await_duration_s=0.5
        ) as consumer:
            unacked = bodies - acked
            again = receive_until(consumer, unacked, 40, invisible_s)
            again += consumer.receive(32, invisible_s)  # an acked one would come by now
        came_back = {m.body for m in again}
        assert came_back >= unacked, f"not redelivered: {unacked - came_back}"
        assert not came_back & acked, f"acked on a1, redelivered by a0: {came_back & acked}"
    finally:
        if paused:
            os.kill(a0.pid, signal.SIGCONT)
        ac.close()


def test_offsets_committed_to_a_slave_whose_master_is_back_are_refused(cluster_factory):
    """After the master's return a consumer whose route still names the member that acted
    (until its next route refresh) commits there: the member, no longer acting, refuses
    with a clear error instead of keeping an offset the master never sees (a consumer
    told OK would not commit it again, so a restart would go back by it for good)."""
    ac = ActingCluster(cluster_factory, {"StaleT": 1})
    try:
        mq = MessageQueue("StaleT", GROUP_A, 0)
        ac.send_to(GROUP_A, [Message("StaleT", b"%d" % i) for i in range(10)])
        ac.kill_master("StaleT")
        with hamq.PullConsumer("g-stale", ac.c.namesrv) as consumer:
            consumer.commit_offset(mq, 5)  # through the acting member: taken
        ac.restart_master("StaleT")
        assert ac.consumer_offset("a0", "g-stale", mq) == 5
        wait_for(lambda: not ac.runtime(ACTING)["acting_master"]["acting"], 20, "a1 stops")
        ext = {"group": "g-stale", "topic": "StaleT", "queue_id": 0, "offset": 8}
        with pytest.raises(NoPermission, match="master"):
            ac.invoke(ac.addr(ACTING), RequestCode.UPDATE_CONSUMER_OFFSET, ext)
        assert ac.consumer_offset(ACTING, "g-stale", mq) == 5
    finally:
        ac.close()


def _escaped_through_b(ac: ActingCluster, topic: str, member: str) -> None:
    """The delay message keyed "dly" of ``topic`` is delivered once through B, and the
    acting ``member``'s delay progress moved past it."""
    wait_for(
        lambda: keys_by_group(ac.read_topic(topic)).get(GROUP_B) == ["dly"],
        40,
        "the delay message delivered through B",
    )
    wait_for(
        lambda: int(ac.delay_offsets(member).get(str(DELAY_LEVEL), 0)) >= 1,
        20,
        f"{member}'s delay progress past it",
    )
