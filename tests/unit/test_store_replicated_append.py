"""A slave appends a transfer's records in one go (one write, each queue's entries at once):
what it stores and indexes must be exactly the master's, however the stream is cut, across
segment rolls, and up to (never past) a corrupt record."""

from __future__ import annotations

import random

import pytest

from hamq.config import StoreConfig
from hamq.errors import CrcMismatch
from hamq.protocol.message import RECORD_HEADER_BYTES, encode_batch, encode_message
from hamq.sim.fs import SimDisk
from hamq.store.message_store import MessageStore
from helpers import read_queue

SEGMENT_BYTES = 4096
QUEUES = [("T", 0), ("T", 1), ("Other", 0)]


def _store() -> MessageStore:
    config = StoreConfig(store_dir="/store", mapped_file_size_commitlog=SEGMENT_BYTES)
    return MessageStore(config, disk=SimDisk())


def _master(rng: random.Random, records: int) -> MessageStore:
    master = _store()
    for i in range(records):
        topic, queue_id = rng.choice(QUEUES)
        count = rng.randrange(1, 4)
        bodies = [f"{i}.{n}".encode().ljust(rng.randrange(1, 600), b".") for n in range(count)]
        payload, crc = encode_batch([encode_message(b) for b in bodies])
        master.put_batch(topic, queue_id, payload, count, crc, 0)
        master.commit()
    return master


def _entries(store: MessageStore) -> dict:
    return {
        key: (list(cq.phys), list(cq.size), list(cq.base), list(cq.count), list(cq.store_ts))
        for key, cq in store.queues.items()
    }


def _same_as(slave: MessageStore, master: MessageStore) -> None:
    end = master.commitlog.written_offset
    assert slave.commitlog.written_offset == end
    assert slave.commitlog.read_range(0, end) == master.commitlog.read_range(0, end)
    assert [s.start for s in slave.commitlog.segments] == [
        s.start for s in master.commitlog.segments
    ]
    assert _entries(slave) == _entries(master)


@pytest.mark.parametrize("seed", range(5))
def test_a_stream_cut_anywhere_is_stored_and_indexed_as_the_master_has_it(seed):
    rng = random.Random(seed)
    master = _master(rng, 60)
    shipped = bytes(master.commitlog.read_range(0, master.commitlog.written_offset))
    assert len(master.commitlog.segments) > 3  # the transfers cross segment rolls
    slave, pos, arrived = _store(), 0, set()
    while pos < len(shipped):
        piece = shipped[pos : pos + rng.choice([1, 7, RECORD_HEADER_BYTES, 900, 5000])]
        arrived |= set(slave.append_replicated(pos, piece))
        pos += len(piece)
    _same_as(slave, master)
    assert arrived == set(master.queues)
    for topic, queue_id in QUEUES:
        assert read_queue(slave, topic, queue_id) == read_queue(master, topic, queue_id)


def test_records_before_a_corrupt_one_are_kept_and_it_is_shipped_again_from_there():
    master = _master(random.Random(7), 12)
    shipped = bytearray(master.commitlog.read_range(0, master.commitlog.written_offset))
    middle = master.queues[("T", 0)].phys[2]
    damaged = bytearray(shipped)
    damaged[middle + RECORD_HEADER_BYTES + 5] ^= 0xFF  # in its topic: the header CRC
    slave = _store()
    with pytest.raises(CrcMismatch, match=f"record at {middle}"):
        slave.append_replicated(0, bytes(damaged))
    assert slave.replica_offset == slave.commitlog.written_offset == middle
    assert all(cq.max_physical_end <= middle for cq in slave.queues.values())
    slave.append_replicated(middle, bytes(shipped[middle:]))
    _same_as(slave, master)


def test_a_corrupt_payload_is_refused_with_the_records_before_it_stored():
    master = _master(random.Random(8), 12)
    shipped = bytearray(master.commitlog.read_range(0, master.commitlog.written_offset))
    record = master.queues[("Other", 0)].phys[1]
    shipped[record + master.queues[("Other", 0)].size[1] - 1] ^= 0xFF  # its last body byte
    slave = _store()
    with pytest.raises(CrcMismatch, match="payload CRC mismatch"):
        slave.append_replicated(0, bytes(shipped[: record + 100]))  # held as a partial record
        slave.append_replicated(record + 100, bytes(shipped[record + 100 :]))
    assert slave.replica_offset == slave.commitlog.written_offset == record


def test_a_topic_created_again_on_the_master_restarts_its_queue_in_the_same_transfer():
    master = _store()
    for body in (b"old-1", b"old-2"):
        payload, crc = encode_batch([encode_message(body)])
        master.put_batch("T", 0, payload, 1, crc, 0)
    master.commit()
    first = master.commitlog.written_offset
    master.delete_topic("T")
    payload, crc = encode_batch([encode_message(b"new")])
    master.put_batch("T", 0, payload, 1, crc, 0)
    master.commit()
    shipped = bytes(master.commitlog.read_range(0, master.commitlog.written_offset))
    slave = _store()
    slave.append_replicated(0, shipped)
    assert read_queue(slave, "T", 0) == {0: b"new"}
    assert list(slave.queues[("T", 0)].phys) == [first]
