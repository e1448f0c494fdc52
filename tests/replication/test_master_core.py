"""The sans-IO master HA core: handshake, divergence, flow control, in-sync counting and
every status a waiting send can end with."""
from __future__ import annotations

import pytest

from hamq.replication.master import Diverged, MasterReplication, ReplicaStatus
from hamq.replication.quorum import QuorumConfig

KB = 1024


def core(**quorum) -> MasterReplication:
    return MasterReplication(QuorumConfig(**quorum), window_bytes=64 * KB,
                             transfer_batch_bytes=16 * KB)


def run(done):
    for callback, status in done:
        callback(status)


def test_slave_ahead_of_master_is_refused_clearly():
    m = core()
    with pytest.raises(Diverged, match="diverged"):
        m.handshake("s1", 1, slave_max_offset=500, master_min_offset=0, master_max_offset=400,
                    now_ms=0)
    assert m.slaves == {}


def test_transfer_starts_at_slave_offset_or_master_minimum():
    m = core()
    assert m.handshake("s1", 1, 100, 0, 1000, 0) == 100
    assert m.handshake("s2", 2, 0, 300, 1000, 0) == 300  # master retained nothing below 300


def test_flow_control_window_bounds_unacked_bytes():
    m = core()
    m.handshake("s1", 1, 0, 0, 10 * 64 * KB, 0)
    sent = []
    while (span := m.next_transfer("s1", 10 * 64 * KB)) is not None:
        sent.append(span)
    assert sent[0] == (0, 16 * KB)
    assert sent[-1][1] == 64 * KB  # stops at the window, not at the log end
    run(m.on_ack("s1", 32 * KB, 1))
    assert m.next_transfer("s1", 10 * 64 * KB) == (64 * KB, 80 * KB)


def test_in_sync_counts_only_slaves_within_the_gap():
    m = core(ha_max_gap_not_in_sync=256 * KB)
    m.handshake("s1", 1, 0, 0, 0, 0)
    m.handshake("s2", 2, 0, 0, 0, 0)
    run(m.on_ack("s1", 1000 * KB, 1))
    run(m.on_ack("s2", 700 * KB, 1))
    assert m.in_sync_slave_nums(1000 * KB) == 1
    assert m.in_sync_slave_nums(900 * KB) == 2
    assert m.decide(alive_replicas_in_group=3, master_offset=1000 * KB).in_sync_replicas == 2


def test_waiters_complete_in_offset_order_when_enough_slaves_ack():
    m = core(total_replicas=3, in_sync_replicas=3)
    m.handshake("s1", 1, 0, 0, 0, 0)
    m.handshake("s2", 2, 0, 0, 0, 0)
    results = []
    m.wait_for_acks(100, 3, 0, 1000, lambda s: results.append(("a", s)))
    m.wait_for_acks(200, 3, 0, 1000, lambda s: results.append(("b", s)))
    run(m.on_ack("s1", 200, 1))
    assert results == []  # one slave is not enough for need_ack_nums=3
    run(m.on_ack("s2", 150, 2))
    assert results == [("a", ReplicaStatus.PUT_OK)]
    run(m.on_ack("s2", 200, 3))
    assert results == [("a", ReplicaStatus.PUT_OK), ("b", ReplicaStatus.PUT_OK)]


def test_waiter_past_its_deadline_is_flush_slave_timeout():
    m = core()
    m.handshake("s1", 1, 0, 0, 0, 0)
    results = []
    m.wait_for_acks(100, 2, now_ms=0, timeout_ms=50, callback=results.append)
    run(m.expire_waiters(49))
    assert results == []
    run(m.expire_waiters(50))
    assert results == [ReplicaStatus.FLUSH_SLAVE_TIMEOUT]


def test_losing_the_slaves_a_waiter_needs_is_slave_not_available():
    m = core()
    m.handshake("s1", 1, 0, 0, 0, 0)
    m.handshake("s2", 2, 0, 0, 0, 0)
    results = []
    m.wait_for_acks(100, 3, 0, 1000, lambda s: results.append(("need3", s)))
    m.wait_for_acks(100, 2, 0, 1000, lambda s: results.append(("need2", s)))
    run(m.disconnect("s1"))
    assert results == [("need3", ReplicaStatus.SLAVE_NOT_AVAILABLE)]
    run(m.on_ack("s2", 100, 5))
    assert results[-1] == ("need2", ReplicaStatus.PUT_OK)


def test_silent_slaves_are_reported_for_housekeeping():
    m = core()
    m.handshake("s1", 1, 0, 0, 0, now_ms=0)
    m.handshake("s2", 2, 0, 0, 0, now_ms=0)
    run(m.on_ack("s2", 0, now_ms=15_000))
    assert m.expire_silent(now_ms=20_001, timeout_ms=20_000) == ["s1"]
