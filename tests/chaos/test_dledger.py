"""A DLedger (Raft) broker group of three real processes: leader failover with kill -9,
a leader cut off by a partition, leadership transfer, and identical logs everywhere."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from faultproxy import FaultProxy

import hamq
from hamq import Message, SendStatus
from hamq.client.consumer import PullStatus
from hamq.errors import HamqError
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import unpack_body
from helpers import free_port, wait_for

MEMBERS = (1, 2, 3)


class Group:
    """Members (three by default) whose Raft links all go through their own FaultProxy."""

    def __init__(self, cluster_factory, members: tuple[int, ...] = MEMBERS, **settings) -> None:
        self.c = cluster_factory()
        self.members = members
        self.c.start_namesrv(
            scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=3000
        )
        raft = {m: f"127.0.0.1:{free_port()}" for m in members}
        self.proxies = {(a, b): FaultProxy(raft[b]) for a in members for b in members if a != b}
        for m in members:
            peers = [f"{p}@{raft[p] if p == m else self.proxies[(m, p)].address}" for p in members]
            self.c.start_broker(
                f"m{m}",
                broker_name="dl",
                broker_id=m,
                replication_mode="dledger",
                dledger_self_id=m,
                dledger_peers=peers,
                **settings,
            )
        self.admin = hamq.Admin(self.c.namesrv)
        self.leader()  # an election happened, and the leader is routed as brokerId 0:
        wait_for(lambda: "dl" in self.admin.master_addrs(), 15, "the leader's registration")
        self.admin.create_topic("Raft", 2)

    def info(self, m: int) -> dict:
        return self.admin.broker_runtime_info(self.c.broker_addr(f"m{m}"))

    def leader(self, timeout_s: float = 15.0) -> int:
        def find():
            for m in self.members:
                proc = self.c.procs[f"m{m}"]
                if not proc.alive():
                    continue
                try:
                    ha = self.info(m)["ha"]
                except HamqError:
                    continue
                if ha["is_leader"]:
                    return m
            return None

        return wait_for(find, timeout_s, "a leader")

    def isolate(self, m: int) -> None:
        for (a, b), proxy in self.proxies.items():
            if m in (a, b):
                proxy.block()

    def heal(self) -> None:
        for proxy in self.proxies.values():
            proxy.unblock()

    def close(self) -> None:
        self.admin.close()
        for proxy in self.proxies.values():
            proxy.stop()


@pytest.fixture
def group(cluster_factory):
    g = Group(cluster_factory)
    yield g
    g.close()


class SteadyProducer(threading.Thread):
    """One send at a time, a fresh body per attempt, for as long as it runs."""

    def __init__(self, namesrv: str) -> None:
        super().__init__(daemon=True)
        self.namesrv = namesrv
        self.acked: dict[bytes, float] = {}
        self.attempted: set[bytes] = set()
        self.stop_flag = threading.Event()

    def run(self) -> None:
        with hamq.Producer(self.namesrv, send_timeout_s=2.0) as producer:
            i = 0
            while not self.stop_flag.is_set() and i < 100_000:
                body = b"attempt-%06d" % i
                i += 1
                self.attempted.add(body)
                try:
                    if producer.send(Message("Raft", body)).status is SendStatus.SEND_OK:
                        self.acked[body] = time.monotonic()
                except HamqError:
                    time.sleep(0.05)


def consume_all(namesrv: str) -> list[bytes]:
    with hamq.PullConsumer("raft-check", namesrv) as consumer:
        bodies = []
        for mq in consumer.fetch_message_queues("Raft"):
            offset = 0
            while (r := consumer.pull(mq, offset, 500)).status is PullStatus.FOUND:
                bodies += [m.body for m in r.messages]
                offset = r.next_begin_offset
        return bodies


@pytest.mark.slow
def test_leader_kill9_failover_loses_and_duplicates_nothing(group):
    producer = SteadyProducer(group.c.namesrv)
    producer.start()
    wait_for(lambda: len(producer.acked) > 200, 30, "steady sends")
    old = group.leader()
    killed_at = time.monotonic()
    group.c.procs[f"m{old}"].kill9()
    wait_for(
        lambda: any(t > killed_at for t in producer.acked.values()),
        30,
        "a send acknowledged by the new leader",
    )
    failover_s = min(t for t in producer.acked.values() if t > killed_at) - killed_at
    wait_for(
        lambda: sum(t > killed_at for t in producer.acked.values()) > 100,
        30,
        "steady sends after failover",
    )
    producer.stop_flag.set()
    producer.join(10)
    new = group.leader()
    assert new != old
    print(f"\nleader kill -9 -> first acknowledged send: {failover_s:.2f} s")
    bodies = consume_all(group.c.namesrv)
    counts = {b: bodies.count(b) for b in set(bodies)}
    assert set(producer.acked) <= set(bodies), "an acknowledged message was lost"
    assert all(counts[b] == 1 for b in producer.acked), "an acknowledged message repeats"
    assert set(bodies) <= producer.attempted, "a message appeared that was never sent"
    assert failover_s < 10


@pytest.mark.slow
def test_leader_cut_off_from_both_followers_acknowledges_nothing(group):
    old = group.leader()
    old_addr = group.c.broker_addr(f"m{old}")
    before = group.info(old)["ha"]
    group.isolate(old)
    cut_at = time.monotonic()
    # Sends still routed to the cut-off leader must not be acknowledged by it.
    with hamq.Producer(
        group.c.namesrv, send_timeout_s=1.0, retry_times_when_send_failed=0
    ) as producer:
        mq = hamq.MessageQueue("Raft", "dl", 0)
        outcomes = []
        while time.monotonic() - cut_at < 3.0:
            route = producer.core.routes.get("Raft")
            try:
                r = producer.send(Message("Raft", b"partitioned"), mq)
                outcomes.append((route.master_addr("dl") if route else None, r.status))
            except HamqError as err:
                outcomes.append((None, type(err).__name__))
    # The sends reached the cut-off leader: it appended them, and committed none.
    cut_off = group.info(old)["ha"]
    assert cut_off["ledger_end_index"] > before["ledger_end_index"], (before, cut_off)
    assert cut_off["committed_index"] == before["committed_index"], (before, cut_off)
    assert not any(
        addr == old_addr and status is SendStatus.SEND_OK for addr, status in outcomes
    ), outcomes
    new = group.leader(timeout_s=20)
    assert new != old
    # Healed, the old leader follows the new one and catches up.
    group.heal()
    with hamq.Producer(group.c.namesrv) as producer:
        wait_for(lambda: _send_ok(producer), 20, "sends through the new leader")


def _send_ok(producer) -> bool:
    try:
        return producer.send(Message("Raft", b"after")).status is SendStatus.SEND_OK
    except HamqError:
        return False


@pytest.mark.slow
def test_admin_elect_moves_leadership_and_logs_stay_identical(group):
    with hamq.Producer(group.c.namesrv) as producer:
        for i in range(300):
            producer.send(Message("Raft", b"m%d" % i))
    old = group.leader()
    target = next(m for m in MEMBERS if m != old)
    address = group.admin.elect("dl", target)
    assert address == group.c.broker_addr(f"m{target}")
    with hamq.Producer(group.c.namesrv) as producer:
        wait_for(lambda: _send_ok(producer), 20, "sends through the elected leader")
        for i in range(100):
            producer.send(Message("Raft", b"n%d" % i))
    assert_identical_logs(group)


def assert_identical_logs(group: Group) -> None:
    """Every member applies the same log; stopped, their commit logs are equal byte for byte."""

    def logs_equal():
        ends = {m: group.info(m)["commitlog_max_offset"] for m in group.members}
        return len(set(ends.values())) == 1 and ends

    wait_for(logs_equal, 20, "every member to apply the same log")
    group.c.stop_all()
    logs = {
        m: b"".join(
            p.read_bytes() for p in sorted(Path(group.c.root / f"m{m}" / "commitlog").iterdir())
        )
        for m in group.members
    }
    assert len(set(logs.values())) == 1, "members' commit logs differ"


def _invoke(group: Group, m: int, code: RequestCode, ext: dict) -> dict:
    frame = group.admin.submit(
        group.admin.async_client.core.invoke(group.c.broker_addr(f"m{m}"), code, ext)
    ).result(10)
    return frame.ext


def _probe_offset(group: Group, m: int) -> int | None:
    try:
        return _invoke(
            group,
            m,
            RequestCode.QUERY_CONSUMER_OFFSET,
            {"group": "probe", "topic": "Raft", "queue_id": 0},
        )["offset"]
    except HamqError:
        return None


@pytest.mark.slow
def test_topic_deleted_and_recreated_while_a_follower_lags_leaves_logs_identical(cluster_factory):
    """Issue 10, defect 4: a lagging follower must take the delete from the log, not copy
    the leader's topic table over SlaveSynchronize (it then skipped the delete, and its
    queue offsets continued from the old topic once the topic was created again)."""
    group = Group(cluster_factory, slave_sync_interval_ms=300)
    try:
        group.admin.create_topic("Again", 1)
        with hamq.Producer(group.c.namesrv) as producer:
            for i in range(20):
                assert producer.send(Message("Again", b"old-%d" % i)).status is SendStatus.SEND_OK
        leader = group.leader()
        lagging = next(m for m in group.members if m != leader)
        wait_for(
            lambda: (
                group.info(lagging)["ha"]["applied_index"]
                == group.info(leader)["ha"]["applied_index"]
            ),
            15,
            "the follower applying all",
        )
        group.isolate(lagging)
        _invoke(group, leader, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Again"})
        # committed after the delete: once the lagging member holds it, its slave sync has
        # run since the delete
        _invoke(
            group,
            leader,
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"group": "probe", "topic": "Raft", "queue_id": 0, "offset": 7},
        )
        wait_for(lambda: _probe_offset(group, lagging) == 7, 15, "the lagging member's sync")
        group.heal()  # it applies the delete now, before the topic exists again
        wait_for(
            lambda: (
                group.info(lagging)["ha"]["applied_index"]
                == group.info(leader)["ha"]["applied_index"]
            ),
            15,
            "the follower catching up",
        )
        group.admin.create_topic("Again", 1)
        with hamq.Producer(group.c.namesrv) as producer:
            for i in range(10):
                assert producer.send(Message("Again", b"new-%d" % i)).status is SendStatus.SEND_OK
        assert_identical_logs(group)
    finally:
        group.close()


def test_admin_deletes_a_topic_on_a_dledger_group(cluster_factory):
    """Admin.delete_topic asks every member; the followers answer NOT_LEADER (they apply
    the delete from the log) and that is not a failure: the topic is gone everywhere."""
    group = Group(cluster_factory)
    try:
        group.admin.delete_topic("Raft")

        def topics(m: int) -> set[str]:
            frame = group.admin.submit(
                group.admin.async_client.core.invoke(
                    group.c.broker_addr(f"m{m}"), RequestCode.GET_ALL_TOPIC_CONFIG
                )
            ).result(10)
            return set(unpack_body(frame.body) or {})

        for m in group.members:
            wait_for(lambda m=m: "Raft" not in topics(m), 15, f"member {m} applying the delete")
        assert "Raft" not in group.admin.topic_list()
    finally:
        group.close()


def test_sync_flush_send_is_readable_as_soon_as_it_is_answered(cluster_factory):
    """Under sync flush a DLedger send is answered once its entry is committed (fsynced on
    a majority's Raft log) and applied, before the store's own fsync: the Raft log is the
    record a restart re-applies from, so reads must not wait for that fsync. A read capped
    at the store's fsynced end answered NO_NEW_MSG for an acknowledged send."""
    group = Group(cluster_factory, flush_disk_type="sync")
    try:
        with (
            hamq.Producer(group.c.namesrv) as producer,
            hamq.PullConsumer("read-own-writes", group.c.namesrv) as consumer,
        ):
            for i in range(20):
                result = producer.send(Message("Raft", b"m-%d" % i))
                assert result.status is SendStatus.SEND_OK
                got = consumer.pull(result.queue, result.queue_offset, 1)
                assert got.status is PullStatus.FOUND, (i, got)
                assert got.messages[0].body == b"m-%d" % i
    finally:
        group.close()
