"""Break-it tests of the lock quorum (issue 15, seed 004 "锁Quorum"), real processes: a
strict-mode group of a master and two slaves (``test_lock_quorum``'s group), two consumers
played by raw LOCK_BATCH_MQ requests, ``kill -9`` and restarts by PID.

Locks live in memory: a member restarted within a lease forgot what it granted. A's queues
were granted by exactly two of three members (the third was down); if one of those two
restarts and the third comes back, the two of them are a majority that knows nothing of A,
and B would be granted the queues A still holds (A's last answer said so, within its lease)."""

from __future__ import annotations

from helpers import wait_for
from integration.test_lock_quorum import (
    MEMBERS,
    QUEUE_IDS,
    SETTLE_S,
    Locker,
    _alive_replicas,
    _all,
    _owners,
    _start_group,
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
