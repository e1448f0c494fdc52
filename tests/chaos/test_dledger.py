"""A DLedger (Raft) broker group of three real processes: leader failover with kill -9,
a leader cut off by a partition, leadership transfer, and identical logs everywhere."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import hamq
from hamq import Message, SendStatus
from hamq.client.consumer import PullStatus
from hamq.errors import HamqError

from helpers import free_port, wait_for

from faultproxy import FaultProxy  # noqa: E402 (tests/chaos is on sys.path via conftest)

MEMBERS = (1, 2, 3)


class Group:
    """Three members whose Raft links all go through their own FaultProxy."""

    def __init__(self, cluster_factory) -> None:
        self.c = cluster_factory()
        self.c.start_namesrv(scan_not_active_broker_interval_ms=500,
                             broker_not_active_timeout_ms=3000)
        raft = {m: f"127.0.0.1:{free_port()}" for m in MEMBERS}
        self.proxies = {(a, b): FaultProxy(raft[b]) for a in MEMBERS for b in MEMBERS if a != b}
        for m in MEMBERS:
            peers = [f"{p}@{raft[p] if p == m else self.proxies[(m, p)].address}"
                     for p in MEMBERS]
            self.c.start_broker(f"m{m}", broker_name="dl", broker_id=m,
                                replication_mode="dledger", dledger_self_id=m,
                                dledger_peers=peers)
        self.admin = hamq.Admin(self.c.namesrv)
        self.leader()  # an election happened, and the leader is routed as brokerId 0:
        wait_for(lambda: "dl" in self.admin.master_addrs(), 15, "the leader's registration")
        self.admin.create_topic("Raft", 2)

    def leader(self, timeout_s: float = 15.0) -> int:
        def find():
            for m in MEMBERS:
                proc = self.c.procs[f"m{m}"]
                if not proc.alive():
                    continue
                try:
                    ha = self.admin.broker_runtime_info(self.c.broker_addr(f"m{m}"))["ha"]
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
    wait_for(lambda: any(t > killed_at for t in producer.acked.values()), 30,
             "a send acknowledged by the new leader")
    failover_s = min(t for t in producer.acked.values() if t > killed_at) - killed_at
    wait_for(lambda: sum(t > killed_at for t in producer.acked.values()) > 100, 30,
             "steady sends after failover")
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
    group.isolate(old)
    cut_at = time.monotonic()
    # Sends still routed to the cut-off leader must not be acknowledged by it.
    with hamq.Producer(group.c.namesrv, send_timeout_s=1.0,
                       retry_times_when_send_failed=0) as producer:
        mq = hamq.MessageQueue("Raft", "dl", 0)
        outcomes = []
        while time.monotonic() - cut_at < 3.0:
            route = producer.core.routes.get("Raft")
            try:
                r = producer.send(Message("Raft", b"partitioned"), mq)
                outcomes.append((route.master_addr("dl") if route else None, r.status))
            except HamqError as err:
                outcomes.append((None, type(err).__name__))
    assert not any(addr == old_addr and status is SendStatus.SEND_OK
                   for addr, status in outcomes), outcomes
    new = group.leader(timeout_s=20)
    assert new != old
    # Healed, the old leader follows the new one and catches up.
    for proxy in group.proxies.values():
        proxy.unblock()
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
    def logs_equal():
        ends = {m: group.admin.broker_runtime_info(group.c.broker_addr(f"m{m}"))[
            "commitlog_max_offset"] for m in MEMBERS}
        return len(set(ends.values())) == 1 and ends
    wait_for(logs_equal, 20, "every member to apply the same log")
    group.c.stop_all()
    logs = {m: b"".join(p.read_bytes() for p in sorted(
        Path(group.c.root / f"m{m}" / "commitlog").iterdir())) for m in MEMBERS}
    assert logs[1] == logs[2] == logs[3], "members' commit logs differ"
