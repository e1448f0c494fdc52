"""A slave's ack under each flush type (bug A of issue 14): under sync flush it vouches for
fsynced whole records only, since the master counts it as this member holding them (all-ack,
quorum) and a power loss keeps only what was fsynced; the window's received offset never
waits for an fsync; one fsync wait at a time (group commit). Under async flush it vouches
for written records, as before."""

from __future__ import annotations

import random

from hamq.broker.ha.service import MasterLink, SlaveLink
from hamq.config import StoreConfig
from hamq.protocol.message import encode_batch, encode_message
from hamq.replication.master import MasterReplication, ReplicaStatus
from hamq.replication.quorum import QuorumConfig
from hamq.sim.fs import SimDisk
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore

KEY = "session"


def open_store(disk: SimDisk, flush_disk_type: str) -> MessageStore:
    config = StoreConfig(
        store_dir="/store",
        disk_min_free_bytes=1,
        mapped_file_size_commitlog=64 * 1024,
        flush_disk_type=flush_disk_type,
    )
    return MessageStore(config, disk=disk)


def put(store: MessageStore, n: int) -> int:
    for i in range(n):
        payload, crc = encode_batch([encode_message(b"m%d" % i * 20)])
        end = store.put_batch("T", 0, payload, 1, crc, born_timestamp_ms=i).end_offset
    store.commit()
    return end


def attach(master: MessageStore, slave: MessageStore) -> tuple[MasterLink, SlaveLink]:
    m = MasterLink(MasterReplication(QuorumConfig(2, 2, 2, False), 1 << 20, 1 << 16), master)
    s = SlaveLink(slave, broker_id=1)
    request = s.begin()
    while request is not None:
        reply, _ = m.handshake(KEY, request, now_ms=0)
        request = s.on_handshake_reply(reply)
    return m, s


def ship(m: MasterLink, s: SlaveLink) -> None:
    for offset, data in m.transfers(KEY, 0):
        s.on_transfer(offset, data)


def test_sync_flush_slave_acks_only_what_it_fsynced() -> None:
    master = open_store(SimDisk(), "sync")
    slave_disk = SimDisk()
    slave = open_store(slave_disk, "sync")
    m, s = attach(master, slave)
    end = put(master, 5)
    acked: list[ReplicaStatus] = []
    m.core.wait_for_acks(end, 2, 0, 10_000, acked.append)
    ship(m, s)

    ack = s.ack()  # the window moves at once
    assert ack == {"ack_offset": 0, "received_offset": end, "log_start": 0}
    assert not m.on_ack(KEY, ack, now_ms=1) and not acked  # the send waits for the fsync
    assert s.flush_target() == end
    put(master, 3)
    ship(m, s)
    assert s.flush_target() is None  # one fsync wait at a time: the next covers these
    slave.commitlog.flush()
    s.flushed()
    later_end = slave.commitlog.max_offset
    assert s.ack()["ack_offset"] == later_end > end
    assert s.flush_target() is None  # nothing left unfsynced
    for callback, status in m.on_ack(KEY, s.ack(), now_ms=2):
        callback(status)
    assert acked == [ReplicaStatus.PUT_OK]

    put(master, 2)
    ship(m, s)  # written, not fsynced: a power loss may take it
    promised = s.ack_offset
    assert promised == later_end < slave.commitlog.max_offset
    for seed in range(20):
        slave_disk.power_loss(random.Random(seed))
        assert open_store(slave_disk, "sync").commitlog.max_offset >= promised


def test_async_flush_slave_acks_what_it_wrote() -> None:
    master, slave = open_store(SimDisk(), "async"), open_store(SimDisk(), "async")
    m, s = attach(master, slave)
    end = put(master, 5)
    ship(m, s)
    assert s.ack() == {"ack_offset": end, "received_offset": end, "log_start": 0}
    assert s.flush_target() is None


def test_a_cut_ends_the_flush_waits_past_the_new_log_end() -> None:
    """A slave's pending fsync wait past the offset its log is cut back to (it attached to a
    master lacking that tail) ends as not durable at once; it would otherwise hold every
    later wait of the group commit behind it until it timed out."""
    store = open_store(SimDisk(), "sync")
    first = put(store, 1)
    end = put(store, 4)
    flush = FlushService(store)
    kept: list[bool] = []
    cut: list[bool] = []
    flush.wait_flushed(first, kept.append)
    flush.wait_flushed(end, cut.append)
    store.reset_log(first, first)
    assert cut == [False] and kept == []


def test_a_cut_lowers_the_fsynced_end_readers_stop_at() -> None:
    """Under sync flush readers stop at the fsynced end. A cut takes that end back with
    the log: the bytes then written where the cut ones were are not fsynced, and must not
    be served before they are (a power loss would take them after a consumer saw them)."""
    store = open_store(SimDisk(), "sync")
    first = put(store, 1)
    end = put(store, 4)
    store.commitlog.flush()
    flush = FlushService(store)
    store.set_durable_cap(end)
    store.reset_log(first, first)
    assert store.reads_end == first
    put(store, 3)  # not fsynced
    got = store.get_messages("T", 0, 0, 32, 1 << 20)
    assert got.message_count == 1, "served a record written after the cut, before its fsync"
    assert flush.caps_reads
