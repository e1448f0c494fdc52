"""The sans-IO master HA core: sessions, flow control, in-sync counting and
every status a waiting send can end with."""

from __future__ import annotations

import pytest

from hamq.broker.ha.service import StoreRecords
from hamq.config import StoreConfig
from hamq.replication.master import MasterReplication, ReplicaStatus
from hamq.replication.quorum import QuorumConfig
from hamq.store.message_store import MessageStore

KB = 1024


@pytest.fixture
def empty_log(tmp_path) -> StoreRecords:
    """A real, empty message store: every slave attaches at offset 0."""
    return StoreRecords(MessageStore(StoreConfig(store_dir=str(tmp_path), disk_min_free_bytes=1)))


@pytest.fixture
def attach(empty_log):
    def attach_(m: MasterReplication, key, broker_id: int, now_ms: int = 0):
        return m.attach(key, broker_id, 0, None, empty_log, now_ms)

    return attach_


def core(**quorum) -> MasterReplication:
    return MasterReplication(
        QuorumConfig(**quorum), window_bytes=64 * KB, transfer_batch_bytes=16 * KB
    )


def run(done):
    for callback, status in done:
        callback(status)


def ack(m: MasterReplication, key, offset: int, now_ms: int):
    """The slave acks ``offset`` once the master shipped it that far (acks count only as
    far as shipped), acking what it has whenever the window fills."""
    done = []
    while m.slaves[key].sent_offset < offset:
        if m.next_transfer(key, offset, 0) is None:
            done += m.on_ack(key, m.slaves[key].sent_offset, now_ms)
    return done + m.on_ack(key, offset, now_ms)


def test_flow_control_window_bounds_unacked_bytes(attach):
    m = core()
    attach(m, "s1", 1, 0)
    sent = []
    while (span := m.next_transfer("s1", 10 * 64 * KB, 0)) is not None:
        sent.append(span)
    assert sent[0] == (0, 16 * KB)
    assert sent[-1][1] == 64 * KB  # stops at the window, not at the log end
    run(ack(m, "s1", 32 * KB, 1))
    assert m.next_transfer("s1", 10 * 64 * KB, 0) == (64 * KB, 80 * KB)


def test_in_sync_counts_only_slaves_within_the_gap(attach):
    m = core(ha_max_gap_not_in_sync=256 * KB)
    attach(m, "s1", 1, 0)
    attach(m, "s2", 2, 0)
    run(ack(m, "s1", 1000 * KB, 1))
    run(ack(m, "s2", 700 * KB, 1))
    assert m.in_sync_slave_nums(1000 * KB) == 1
    assert m.in_sync_slave_nums(900 * KB) == 2
    assert m.decide(alive_replicas_in_group=3, master_offset=1000 * KB).in_sync_replicas == 2


def test_waiters_complete_in_offset_order_when_enough_slaves_ack(attach):
    m = core(total_replicas=3, in_sync_replicas=3)
    attach(m, "s1", 1, 0)
    attach(m, "s2", 2, 0)
    results = []
    m.wait_for_acks(100, 3, 0, 1000, lambda s: results.append(("a", s)))
    m.wait_for_acks(200, 3, 0, 1000, lambda s: results.append(("b", s)))
    run(ack(m, "s1", 200, 1))
    assert results == []  # one slave is not enough for need_ack_nums=3
    run(ack(m, "s2", 150, 2))
    assert results == [("a", ReplicaStatus.PUT_OK)]
    run(ack(m, "s2", 200, 3))
    assert results == [("a", ReplicaStatus.PUT_OK), ("b", ReplicaStatus.PUT_OK)]


def test_waiter_past_its_deadline_is_flush_slave_timeout(attach):
    m = core()
    attach(m, "s1", 1, 0)
    results = []
    m.wait_for_acks(100, 2, now_ms=0, timeout_ms=50, callback=results.append)
    run(m.expire_waiters(49))
    assert results == []
    run(m.expire_waiters(50))
    assert results == [ReplicaStatus.FLUSH_SLAVE_TIMEOUT]


def test_losing_the_slaves_a_waiter_needs_is_slave_not_available(attach):
    m = core()
    attach(m, "s1", 1, 0)
    attach(m, "s2", 2, 0)
    results = []
    m.wait_for_acks(100, 3, 0, 1000, lambda s: results.append(("need3", s)))
    m.wait_for_acks(100, 2, 0, 1000, lambda s: results.append(("need2", s)))
    run(m.disconnect("s1"))
    assert results == [("need3", ReplicaStatus.SLAVE_NOT_AVAILABLE)]
    run(ack(m, "s2", 100, 5))
    assert results[-1] == ("need2", ReplicaStatus.PUT_OK)


def test_silent_slaves_are_reported_for_housekeeping(attach):
    m = core()
    attach(m, "s1", 1, 0)
    attach(m, "s2", 2, 0)
    run(ack(m, "s2", 0, now_ms=15_000))
    assert m.expire_silent(now_ms=20_001, timeout_ms=20_000) == ["s1"]


def test_a_waiter_needing_more_acks_does_not_hold_back_one_needing_fewer(attach):
    """Defect 7: one deque for all needs made a satisfied need-2 waiter wait behind an
    unsatisfied need-3 one at the head, and time out (FLUSH_SLAVE_TIMEOUT)."""
    m = core(total_replicas=3, in_sync_replicas=3)
    attach(m, "s1", 1)
    attach(m, "s2", 2)
    results = []
    m.wait_for_acks(100, 3, 0, 1000, lambda s: results.append(("need3", s)))
    m.wait_for_acks(200, 2, 0, 1000, lambda s: results.append(("need2", s)))
    m.wait_for_acks(300, 2, 0, 1000, lambda s: results.append(("need2 later", s)))
    run(ack(m, "s1", 250, 1))
    assert results == [("need2", ReplicaStatus.PUT_OK)]
    run(m.expire_waiters(999))
    run(ack(m, "s2", 300, 2))
    assert results[1:] == [("need3", ReplicaStatus.PUT_OK), ("need2 later", ReplicaStatus.PUT_OK)]
    run(m.expire_waiters(1000))
    assert len(results) == 3


def test_a_reconnecting_slave_replaces_its_stale_session(attach):
    """Defect 7: a half-open session of a slave that crashed and came back counted as a
    second in-sync replica, and acked sends the slave no longer had."""
    m = core(total_replicas=3, in_sync_replicas=3)
    attach(m, "old", 1)
    run(ack(m, "old", 500, 1))
    attached = attach(m, "new", 1, now_ms=2)
    assert attached.replaced == ["old"]  # the shell closes that connection
    assert list(m.slaves) == ["new"]
    assert m.in_sync_slave_nums(500) == 1
    results = []
    m.wait_for_acks(500, 2, 2, 1000, results.append)
    assert results == []  # the new session has acked nothing yet
    run(m.on_ack("old", 500, 3))  # late frames of the old session count for nothing
    assert results == []
    run(m.disconnect("old"))  # its close, once the shell sees it, changes nothing
    assert list(m.slaves) == ["new"] and results == []
    run(ack(m, "new", 500, 4))
    assert results == [ReplicaStatus.PUT_OK]


def test_in_sync_counts_broker_ids_not_sessions(attach):
    m = core(total_replicas=3, in_sync_replicas=3)
    attach(m, "a", 1)
    attach(m, "b", 2)
    run(ack(m, "a", 100, 1))
    run(ack(m, "b", 100, 1))
    assert m.in_sync_slave_nums(100) == 2
    attach(m, "c", 2)
    run(ack(m, "c", 100, 2))
    assert m.in_sync_slave_nums(100) == 2
    assert m.decide(alive_replicas_in_group=3, master_offset=100).in_sync_replicas == 3


def test_an_ack_beyond_what_was_sent_counts_only_what_was_sent(attach):
    """A slave holds at most what it was shipped: an ack past that (a broken or foreign
    peer) must not complete a send or make the slave look in sync."""
    m = core(ha_max_gap_not_in_sync=KB)
    attach(m, "s1", 1, 0)
    assert m.next_transfer("s1", 100 * KB, 0) == (0, 16 * KB)
    statuses = []
    m.wait_for_acks(100 * KB, 2, 0, 1000, statuses.append)
    run(m.on_ack("s1", 1 << 62, 1, received_offset=1 << 62))
    assert statuses == []
    assert m.slaves["s1"].ack_offset == m.slaves["s1"].received_offset == 16 * KB
    assert m.in_sync_slave_nums(100 * KB) == 0


def test_bytes_shipped_but_not_acknowledged_complete_no_send(attach):
    """A send waits for the slave's ack, not for the master shipping it: bytes on the wire
    are lost with the master if it dies before the slave has them."""
    m = core(total_replicas=2, in_sync_replicas=2)
    attach(m, "s1", 1, 0)
    while m.next_transfer("s1", 64 * KB, 0) is not None:
        pass
    assert m.slaves["s1"].sent_offset == 64 * KB
    statuses = []
    m.wait_for_acks(32 * KB, 2, 0, 1000, statuses.append)
    run(m.on_ack("s1", 16 * KB, 1))
    assert statuses == []
    run(m.on_ack("s1", 32 * KB, 2))
    assert statuses == [ReplicaStatus.PUT_OK]


def ship_window(m: MasterReplication, key, log_end: int = 1000 * KB) -> int:
    """Ship as far as the window lets the master; returns where it stopped."""
    while m.next_transfer(key, log_end, 0) is not None:
        pass
    return m.slaves[key].sent_offset


def test_a_record_larger_than_the_window_is_shipped_while_the_slave_receives_it(attach):
    """A slave acks only whole records, and a record (a whole producer batch, up to 8 MiB)
    can be larger than the window. Counting the window from the ack, the master stopped at
    64 KiB of a 200 KiB record and the slave never acked it: replication to it stalled for
    good. The window counts what the slave received; quorum and in sync still count acks."""
    m = core(total_replicas=2, in_sync_replicas=2, ha_max_gap_not_in_sync=KB)
    attach(m, "s1", 1, 0)
    record_end = 200 * KB
    statuses = []
    m.wait_for_acks(record_end, 2, 0, 1000, statuses.append)
    while (span := m.next_transfer("s1", record_end, 0)) is not None:
        assert span[1] - m.slaves["s1"].received_offset <= 64 * KB  # the window holds
        # The slave acks each transfer: it holds the bytes, no whole record yet.
        run(m.on_ack("s1", 0, 1, received_offset=span[1]))
        assert statuses == [] and m.in_sync_slave_nums(record_end) == 0
    assert m.slaves["s1"].sent_offset == record_end, "the record's end was never shipped"
    run(m.on_ack("s1", record_end, 2, received_offset=record_end))
    assert statuses == [ReplicaStatus.PUT_OK]
    assert m.in_sync_slave_nums(record_end) == 1


def test_an_ack_without_a_received_offset_counts_as_received_up_to_the_ack(attach):
    m = core()
    attach(m, "s1", 1, 0)
    assert ship_window(m, "s1") == 64 * KB
    run(m.on_ack("s1", 40 * KB, 1))
    assert ship_window(m, "s1") == 40 * KB + 64 * KB
    run(m.on_ack("s1", 40 * KB, 2, received_offset=90 * KB))
    assert ship_window(m, "s1") == 90 * KB + 64 * KB
    run(m.on_ack("s1", 48 * KB, 3))  # a later ack without it: received never goes back
    assert (m.slaves["s1"].ack_offset, m.slaves["s1"].received_offset) == (48 * KB, 90 * KB)
