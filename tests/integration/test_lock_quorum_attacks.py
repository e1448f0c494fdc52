"""Break-it tests of the lock quorum (issue 15, seed 004 "锁Quorum"), real processes: a
strict-mode group of a master and two slaves (``test_lock_quorum``'s group), two consumers
played by raw LOCK_BATCH_MQ requests, ``kill -9`` and restarts by PID.

Locks live in memory: a member restarted within a lease forgot what it granted. A's queues
were granted by exactly two of three members (the third was down); if one of those two
restarts and the third comes back, the two of them are a majority that knows nothing of A,
and B would be granted the queues A still holds (A's last answer said so, within its lease)."""

from __future__ import annotations

import os
import signal
import threading
import time
from itertools import pairwise

import hamq
from helpers import wait_for
from integration.orderly_consumer import FAST_ORDERLY
from integration.test_lock_quorum import (
    GROUP,
    LEASE_MS,
    MEMBERS,
    QUEUE_IDS,
    SETTLE_S,
    TOPIC,
    Locker,
    _alive_replicas,
    _all,
    _owners,
    _start_group,
    send_keys,
)

LONG_LEASE_MS = 20_000  # longer than restarting two members takes on a slow machine


def test_members_restarted_within_a_lease_lend_no_second_majority(cluster_factory, raw_conn):
    c = _start_group(cluster_factory, raw_conn, strict=True, lease_ms=LONG_LEASE_MS)
    a, b = Locker("client-a", raw_conn), Locker("client-b", raw_conn)
    m, s1, s2 = (c.broker_addr(x) for x in MEMBERS)
    for member in (m, s1, s2):
        a.join(member)
    c.procs["s2"].kill9()
    wait_for(lambda: _alive_replicas(c, "m") == 2, SETTLE_S, "m to see s2 gone")
    assert a.lock(m) == QUEUE_IDS  # granted by m and s1: a majority of three
    assert _owners(c, "s1") == _all("client-a")

    # within A's lease: s1 restarts (forgetting A) and s2 comes back
    c.procs["s1"].kill9()
    c.procs["s1"].start()
    c.procs["s2"].start()
    for x in MEMBERS:
        wait_for(lambda x=x: _alive_replicas(c, x) == 3, SETTLE_S, f"{x} to see its group")
    b.join(s1)
    b.join(s2)
    assert _owners(c, "m") == _all("client-a"), "A's lease ran out: nothing to test"
    held_by_b = b.lock(s1)
    assert held_by_b == set(), f"B granted {held_by_b} while A holds them on m (within its lease)"
    assert not _owners(c, "s1") and not _owners(c, "s2")

    # once a lease has passed since they started, the restarted members grant again
    a.join(s1)
    a.join(s2)
    wait_for(
        lambda: a.lock(m) == QUEUE_IDS and all(_owners(c, x) == _all("client-a") for x in MEMBERS),
        2 * LONG_LEASE_MS / 1000,
        "every member to grant A",
    )
    assert b.lock(s2) == set()


def test_two_ordered_push_consumers_never_consume_one_queue_at_once(cluster_factory, raw_conn):
    """Two real ordered push consumers of one group in strict mode, through the master's
    kill -9, a slave frozen (SIGSTOP: forwarded locks to it time out, grants partial) and
    the master's return through pre-online. Every listener call is timed per queue: two
    clients' calls on one queue never overlap, and each key is consumed in order."""
    c = _start_group(cluster_factory, raw_conn, strict=True, skip_pre_online=False)
    keys = [f"key{k}" for k in range(8)]
    rounds = 80
    send_keys(c, keys, rounds)
    calls: list[tuple[int, str, float, float, list[str]]] = []  # queue, client, start, end
    guard = threading.Lock()

    def listener_of(client: str):
        def listener(messages):
            start = time.monotonic()
            time.sleep(0.1 * len(messages))  # consumption spans the whole test
            with guard:
                calls.append(
                    (
                        messages[0].queue_id,
                        client,
                        start,
                        time.monotonic(),
                        [m.body.decode() for m in messages],
                    )
                )
            return hamq.ConsumeOrderlyStatus.SUCCESS

        return listener

    consumers = []
    for name in ("one", "two"):
        consumer = hamq.PushConsumer(
            GROUP,
            c.namesrv,
            consume_from_where="first",
            poll_name_server_interval_s=1.0,
            client_id=f"consumer-{name}",
            **FAST_ORDERLY,
        )
        consumer.subscribe(TOPIC, "*")
        consumer.register_message_listener(listener_of(name), orderly=True)
        consumer.start()
        consumers.append(consumer)
    s2 = c.procs["s2"]
    try:
        wait_for(lambda: len(calls) >= 10, SETTLE_S, "consumption to start")
        c.procs["m"].kill9()
        wait_for(lambda: _alive_replicas(c, "s1") == 2, SETTLE_S, "s1 to see the master gone")
        os.kill(s2.pid, signal.SIGSTOP)
        time.sleep(LEASE_MS / 1000)  # a lease with grants partial: locks fall short
        os.kill(s2.pid, signal.SIGCONT)
        c.procs["m"].start()  # pre-online, then registered
        with hamq.Admin(c.namesrv) as admin:
            master = c.broker_addr("m")
            wait_for(lambda: master in admin.master_addrs().values(), SETTLE_S, "m back")
        back_at = time.monotonic()
        # distinct messages: a lapse repeats a stretch, and counting repeats ended the wait
        # with a key's last messages not consumed yet
        consumed = lambda: len({body for *_, bodies in list(calls) for body in bodies})  # noqa: E731
        wait_for(lambda: consumed() >= rounds * len(keys), 90, "every message consumed")
    finally:
        os.kill(s2.pid, signal.SIGCONT)
        for consumer in consumers:
            consumer.shutdown()
    assert max(end for _, _, _, end, _ in calls) > back_at, "all consumed before m returned"
    assert {client for _, client, *_ in calls} == {"one", "two"}
    by_queue: dict[int, list] = {}
    for queue, client, start, end, _ in calls:
        by_queue.setdefault(queue, []).append((start, end, client))
    for queue, spans in by_queue.items():
        busy_until, busy = 0.0, ""
        for start, end, client in sorted(spans):
            assert client == busy or start >= busy_until, f"queue {queue}: {busy}, {client}"
            if end > busy_until:
                busy_until, busy = end, client
    seen: dict[str, list[int]] = {}
    for *_, bodies in sorted(calls, key=lambda call: call[2]):
        for body in bodies:
            key, seq = body.split()
            seen.setdefault(key, []).append(int(seq))
    for key in keys:  # in order, none skipped; a lapse may only repeat a stretch
        seqs = seen[key]
        assert set(seqs) == set(range(rounds)), key
        assert all(b <= a + 1 for a, b in pairwise(seqs)), (key, seqs)
