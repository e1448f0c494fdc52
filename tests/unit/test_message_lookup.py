"""The message browser's reads on a store, without a server: a msg id's record is read
only where one starts and checks out, and a key scan's plan stops at max_scan per queue."""

from __future__ import annotations

import os

import pytest

from hamq.broker.message_lookup import DetachedReader, MessageLookup, scan_for_key, scan_plan
from hamq.client.message import Message
from hamq.config import StoreConfig
from hamq.errors import QueryNotFound
from hamq.protocol.message import encode_batch, offset_msg_id, parse_record_header
from hamq.store.message_store import MessageStore


@pytest.fixture
def store(tmp_path):
    store = MessageStore(StoreConfig(store_dir=str(tmp_path / "store"), disk_min_free_bytes=1))
    yield store
    store.close()


def put(store: MessageStore, queue_id: int, *keys: str) -> int:
    payload, crc = encode_batch([Message("T", b"x", keys=k).encode() for k in keys])
    phys = store.put_batch("T", queue_id, payload, len(keys), crc, 0).physical_offset
    store.commit()
    return phys


def test_a_record_is_read_only_where_it_starts_and_checks_out(store):
    lookup = MessageLookup(store, topics=None)  # type: ignore[arg-type] (not used here)
    first, second = put(store, 0, "a"), put(store, 0, "b")
    for phys in (first, second):
        assert parse_record_header(lookup.record_at(phys)).physical_offset == phys
    for offset in (first + 1, second - 1, store.commitlog.max_offset, -1, 10**12):
        with pytest.raises(QueryNotFound):
            lookup.record_at(offset)
    segment = store.commitlog.segments[0]
    end = segment.end - segment.start
    with open(segment.path, "r+b") as f:  # the last byte of the second record's payload
        f.seek(end - 1)
        byte = f.read(1)
        f.seek(end - 1)
        f.write(bytes([byte[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())
    with pytest.raises(QueryNotFound, match="payload CRC"):
        lookup.record_at(second)
    assert lookup.record_at(first)  # its neighbour is untouched


def test_key_scan_looks_at_most_max_scan_messages_per_queue_newest_first(store):
    batch = put(store, 0, "old", "k", "other")  # one record, three messages
    newest = put(store, 0, "k")
    put(store, 1, "k")

    def scan(max_scan: int) -> tuple[list[str], bool]:
        plan = scan_plan(store, "T", max_scan)
        reader = DetachedReader(store.commitlog, plan.queues)
        try:
            found = scan_for_key(reader, plan, "T", "k")
        finally:
            reader.close()
        return found.msg_ids, plan.truncated

    ids, truncated = scan(10)
    assert sorted(ids) == sorted([offset_msg_id(batch, 1), offset_msg_id(newest, 0), ids[-1]])
    assert not truncated
    # two messages of queue 0: the newest record and the batch's last message only
    ids, truncated = scan(2)
    assert offset_msg_id(newest, 0) in ids and offset_msg_id(batch, 1) not in ids
    assert truncated
    ids, _ = scan(3)  # the batch's last two messages now: its "k" is one of them
    assert offset_msg_id(batch, 1) in ids
    assert scan_plan(store, "NoSuchTopic", 10).queues == []
