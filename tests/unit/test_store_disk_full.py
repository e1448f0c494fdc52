"""A store on a disk that really fills (its free-space guard off): a write that fails undoes
exactly what was not written, every time, so the retry stores each message once and at the
queue offset every other member gives it (both bugs the DLedger simulator found this way)."""

from __future__ import annotations

import errno

import pytest

from hamq.config import StoreConfig
from hamq.protocol.message import encode_batch, encode_message
from hamq.sim.fs import SimDisk
from hamq.store.message_store import MessageStore, WritesUndone
from helpers import read_queue

SEGMENT_BYTES = 2048
ROOM_BYTES = 1 << 20


def _store(disk: SimDisk) -> MessageStore:
    config = StoreConfig(
        store_dir="/store",
        mapped_file_size_commitlog=SEGMENT_BYTES,
        disk_min_free_bytes=0,
        disk_max_used_space_ratio=1.0,
    )
    return MessageStore(config, disk=disk)


def _put_uncommitted(store: MessageStore, queue_id: int, body: bytes) -> int:
    """One send of this turn, not yet written (``commit`` writes the turn)."""
    payload, crc = encode_batch([encode_message(body)])
    return store.put_batch("T", queue_id, payload, 1, crc, 0).base_queue_offset


def _fill_disk(disk: SimDisk) -> None:
    disk.capacity_bytes = disk.used_bytes()


def _free_disk(store: MessageStore, disk: SimDisk) -> None:
    disk.capacity_bytes = disk.used_bytes() + ROOM_BYTES
    store.check_disk()  # the store refuses writes until its next disk check finds room


def test_undoing_a_new_queues_only_send_on_a_full_disk_writes_nothing():
    """The undo of a failed commit drops the queue entries of the turn; a queue they were
    all of is emptied, and must not need a file written for that (the disk is full): the
    entries stayed, and the retry appended the same send again at queue offset 1."""
    disk = SimDisk(capacity_bytes=ROOM_BYTES)
    store = _store(disk)
    assert _put_uncommitted(store, 0, b"first") == 0
    _fill_disk(disk)
    with pytest.raises(WritesUndone, match="No space left"):
        store.commit()
    assert store.max_offset("T", 0) == 0
    _free_disk(store, disk)
    assert _put_uncommitted(store, 0, b"first") == 0
    store.commit()
    assert read_queue(store, "T", 0) == {0: b"first"}
    store.flush_consume_queues()
    assert read_queue(_store(disk), "T", 0) == {0: b"first"}  # and so after a restart


def test_a_roll_that_fails_to_write_the_turn_says_its_earlier_sends_were_undone():
    """A send that rolls the segment writes the turn's earlier sends first: ENOSPC there
    undoes them too, and the error must say so (DLedger goes back to its last commit; a
    bare error read as "only this send failed" counted them as stored)."""
    disk = SimDisk(capacity_bytes=ROOM_BYTES)
    store = _store(disk)
    assert _put_uncommitted(store, 1, b"earlier") == 0
    _fill_disk(disk)
    with pytest.raises(WritesUndone, match="earlier uncommitted writes were undone"):
        _put_uncommitted(store, 0, b"r" * SEGMENT_BYTES)
    store.commit()  # nothing of the turn is left to write
    assert store.max_offset("T", 1) == 0 and store.max_offset("T", 0) == 0
    _free_disk(store, disk)
    assert _put_uncommitted(store, 1, b"earlier") == 0
    assert _put_uncommitted(store, 0, b"r" * SEGMENT_BYTES) == 0
    store.commit()
    assert read_queue(store, "T", 1) == {0: b"earlier"}
    assert read_queue(store, "T", 0) == {0: b"r" * SEGMENT_BYTES}


def test_a_roll_whose_new_segment_cannot_be_created_undoes_what_it_wrote(monkeypatch):
    """The roll wrote the turn's earlier sends before its new segment failed: they go too,
    as the error says (DLedger applies them again from its last commit: had they stayed,
    that member's log would hold them twice and its queue offsets differ from the rest)."""
    disk = SimDisk(capacity_bytes=ROOM_BYTES)
    store = _store(disk)
    _put_uncommitted(store, 1, b"earlier")
    store.commit()
    _put_uncommitted(store, 1, b"this turn")
    open_file = disk.open

    def no_new_segment(path, create=True, append=False):
        if path.parent.name == "commitlog" and not disk.exists(path):
            raise OSError(errno.ENOSPC, "No space left on device (no inode left)")
        return open_file(path, create, append)

    monkeypatch.setattr(disk, "open", no_new_segment)
    with pytest.raises(WritesUndone, match="no inode left"):
        _put_uncommitted(store, 0, b"r" * SEGMENT_BYTES)
    monkeypatch.setattr(disk, "open", open_file)
    store.check_disk()
    assert _put_uncommitted(store, 1, b"this turn") == 1
    store.commit()
    assert read_queue(store, "T", 1) == {0: b"earlier", 1: b"this turn"}
    assert store.commitlog.written_offset == sum(store.queue("T", 1).size)  # each once
