"""``MessageStore`` on a real directory: reads across segment rolls, pull statuses,
recovery from torn or garbage tails and lost indexes, retention, the disk guard and versioned
metadata (the config loader's refusals are in test_config.py)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from disk_faults import RecordingDisk
from hamq.config import StoreConfig
from hamq.errors import BrokerSystemError, DiskFull
from hamq.protocol.message import decode_records, encode_batch, encode_message
from hamq.store.consume_queue import ENTRY_BYTES
from hamq.store.disk import OS_DISK, Disk
from hamq.store.flush import FlushService
from hamq.store.message_store import GetStatus, MessageStore
from hamq.store.metadata import TopicConfig

SEGMENT_BYTES = 4096


@pytest.fixture
def open_store(tmp_path):
    """Open (or reopen) a store under tmp_path; every store opened is closed at the end."""
    opened: list[MessageStore] = []

    def make(disk: Disk = OS_DISK, **settings) -> MessageStore:
        cfg = StoreConfig(
            store_dir=str(tmp_path / "store"), mapped_file_size_commitlog=SEGMENT_BYTES, **settings
        )
        store = MessageStore(cfg, disk=disk)
        opened.append(store)
        return store

    yield make
    for store in opened:
        if store.commitlog.segments:
            store.close()


def put(store: MessageStore, topic: str, queue_id: int, bodies: list[bytes]) -> int:
    """Append one batch as a producer would send it; returns its base queue offset."""
    payload, crc = encode_batch([encode_message(b) for b in bodies])
    result = store.put_batch(topic, queue_id, payload, len(bodies), crc, 0)
    store.commit()
    return result.base_queue_offset


def fill(
    store: MessageStore, n: int, topic: str = "T", queue_id: int = 0, size: int = 300
) -> list[bytes]:
    bodies = [f"{topic}-{queue_id}-{i}:".encode().ljust(size, b".") for i in range(n)]
    for body in bodies:
        put(store, topic, queue_id, [body])
    return bodies


def read_all(
    store: MessageStore, topic: str = "T", queue_id: int = 0, start: int | None = None
) -> list[tuple[int, bytes]]:
    """(queue offset, body) of every message from ``start`` (default: the queue's min)."""
    offset = store.min_offset(topic, queue_id) if start is None else start
    got = []
    while True:
        r = store.get_messages(topic, queue_id, offset, 32, 1 << 20)
        if r.status is not GetStatus.FOUND:
            return got
        got += decode_records(r.records, offset, lambda h, index, off, props, body: (off, body))
        offset = r.next_begin_offset


def close(store: MessageStore) -> None:
    store.close()


def last_segment(store_dir: Path) -> Path:
    return sorted((store_dir / "commitlog").iterdir())[-1]


def test_put_get_across_segment_rolls_and_reopen(open_store, tmp_path):
    """Records never span segments, reads cross them, and a clean reopen keeps it all."""
    store = open_store()
    bodies = fill(store, 60)
    batch = [b"b1", b"b2", b"b3"]
    assert put(store, "T", 0, batch) == 60
    other = fill(store, 5, topic="U", queue_id=2)
    assert len(store.commitlog.segments) > 3
    assert all(seg.size <= SEGMENT_BYTES for seg in store.commitlog.segments)
    expected = list(enumerate(bodies + batch))
    assert read_all(store) == expected
    assert read_all(store, start=61) == expected[61:]  # a pull starting inside a batch
    close(store)
    store = open_store()
    assert read_all(store) == expected
    assert read_all(store, "U", 2) == list(enumerate(other))
    assert put(store, "T", 0, [b"after"]) == 63


def test_get_statuses(open_store):
    store = open_store(file_reserved_hours=1.0)
    assert store.get_messages("T", 0, 0, 10, 1 << 20).status is GetStatus.NO_MESSAGE_IN_QUEUE
    store.create_queue("T", 1)
    assert store.get_messages("T", 1, 0, 10, 1 << 20).status is GetStatus.NO_MESSAGE_IN_QUEUE
    assert store.get_messages("T", 1, 5, 10, 1 << 20).status is GetStatus.OFFSET_OVERFLOW_BADLY
    fill(store, 40)
    r = store.get_messages("T", 0, 0, 10, 1 << 20)
    assert (r.status, r.message_count, r.next_begin_offset) == (GetStatus.FOUND, 10, 10)
    r = store.get_messages("T", 0, 40, 10, 1 << 20)
    assert (r.status, r.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_ONE, 40)
    r = store.get_messages("T", 0, 41, 10, 1 << 20)
    assert (r.status, r.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 40)
    age_all_but_active(store)
    store.delete_expired()
    lo = store.min_offset("T", 0)
    assert lo > 0
    r = store.get_messages("T", 0, 0, 10, 1 << 20)
    assert (r.status, r.next_begin_offset, r.min_offset) == (GetStatus.OFFSET_TOO_SMALL, lo, lo)


def age_all_but_active(store: MessageStore, hours: float = 2.0) -> None:
    old = time.time() - hours * 3600
    for seg in store.commitlog.segments[:-1]:
        os.utime(seg.path, (old, old))


def test_retention_moves_min_offsets(open_store):
    """Segments older than file_reserved_hours go (never the active one); queue minimums
    follow, and what is left still reads; a queue whose records all went stays at its max."""
    store = open_store(file_reserved_hours=1.0)
    fill(store, 10, topic="Old")
    bodies = fill(store, 50)
    store.delete_expired()  # nothing is old yet
    assert store.commitlog.min_offset == 0
    age_all_but_active(store)
    store.delete_expired()
    assert len(store.commitlog.segments) == 1
    assert store.commitlog.min_offset == store.commitlog.segments[0].start > 0
    lo = store.min_offset("T", 0)
    assert 0 < lo < 50 and store.max_offset("T", 0) == 50
    assert read_all(store) == list(enumerate(bodies))[lo:]
    assert store.min_offset("Old", 0) == store.max_offset("Old", 0) == 10
    close(store)
    store = open_store(file_reserved_hours=1.0)
    assert store.min_offset("T", 0) == lo
    assert store.min_offset("Old", 0) == 10
    assert put(store, "Old", 0, [b"new"]) == 10


def test_recovery_truncates_garbage_tail(open_store, tmp_path):
    store = open_store()
    bodies = fill(store, 30)
    end = store.commitlog.written_offset
    close(store)
    with open(last_segment(tmp_path / "store"), "ab") as fh:
        fh.write(os.urandom(700))
    store = open_store()
    assert store.commitlog.written_offset == end
    assert read_all(store) == list(enumerate(bodies))
    assert put(store, "T", 0, [b"next"]) == 30
    assert read_all(store, start=30) == [(30, b"next")]


def never_fsynced_from(store_dir: Path, offset: int) -> None:
    """Make the checkpoint say what it would had the bytes from ``offset`` on been written
    after it and never fsynced: only then may a power loss tear them (below it, a torn
    record is data the disk lost, and recovery refuses to start)."""
    path = store_dir / "checkpoint"
    checkpoint = json.loads(path.read_bytes())
    for field in ("flushed", "dispatched"):
        checkpoint[field] = min(checkpoint[field], offset)
    path.write_text(json.dumps(checkpoint))


def test_recovery_drops_record_cut_in_the_middle(open_store, tmp_path):
    """The last record lost its second half (a torn write): it is gone after reopen, from
    the log and from its queue, and the next send takes its queue offset."""
    store = open_store()
    bodies = fill(store, 30)
    last_phys = store.queue("T", 0).phys[-1]
    close(store)
    never_fsynced_from(tmp_path / "store", last_phys)
    seg = last_segment(tmp_path / "store")
    cut = last_phys - int(seg.name) + 150
    os.truncate(seg, cut)
    store = open_store()
    assert store.commitlog.written_offset == last_phys
    assert store.max_offset("T", 0) == 29
    assert read_all(store) == list(enumerate(bodies[:29]))
    assert put(store, "T", 0, [b"next"]) == 29
    assert read_all(store)[-1] == (29, b"next")


def test_recovery_rebuilds_lost_consume_queues_and_checkpoint(open_store, tmp_path):
    store = open_store()
    t_bodies = fill(store, 25)
    u_bodies = fill(store, 7, topic="U", queue_id=3)
    put(store, "T", 0, [b"x", b"y"])
    close(store)
    shutil.rmtree(tmp_path / "store" / "consumequeue")
    (tmp_path / "store" / "checkpoint").unlink()
    store = open_store()
    assert read_all(store) == list(enumerate([*t_bodies, b"x", b"y"]))
    assert read_all(store, "U", 3) == list(enumerate(u_bodies))
    assert put(store, "U", 3, [b"z"]) == 7
    assert put(store, "T", 0, [b"z"]) == 27


def test_disk_guard_refuses_writes_with_a_clear_message(open_store):
    free = shutil.disk_usage(os.getcwd()).free
    store = open_store(disk_min_free_bytes=free + 10 * 1024**4)
    payload, crc = encode_batch([encode_message(b"x")])
    with pytest.raises(DiskFull, match=r"disk nearly full.*disk_min_free_bytes"):
        store.put_batch("T", 0, payload, 1, crc, 0)
    assert store.commitlog.written_offset == 0


def test_topic_data_version_steps_and_persists(open_store):
    store = open_store()
    v0 = store.topics.data_version
    store.topics.put(TopicConfig("A", 4, 4), store.clock_ms())
    v1 = store.topics.data_version
    store.topics.put(TopicConfig("B", 2, 2), store.clock_ms())
    v2 = store.topics.data_version
    assert store.topics.delete("A", store.clock_ms())
    v3 = store.topics.data_version
    assert not store.topics.delete("missing", store.clock_ms())
    assert [v.counter for v in (v0, v1, v2, v3)] == [0, 1, 2, 3]
    assert v0 < v1 < v2 < v3
    assert store.topics.data_version == v3
    store.offsets.commit("g", "B", 1, 42, store.clock_ms())
    close(store)
    store = open_store()
    assert store.topics.data_version == v3
    assert set(store.topics.topics) == {"B"}
    assert store.topics.get("B") == TopicConfig("B", 2, 2)
    assert store.offsets.query("g", "B", 1) == 42


def test_torn_tail_never_reuses_queue_offsets(open_store, tmp_path):
    """A queue whose older records expired and whose last record is torn ends up empty:
    it must continue at the torn record's offset, not restart at 0 (offsets already
    handed out, perhaps consumed and committed, are never reused)."""
    store = open_store(file_reserved_hours=1.0)
    fill(store, 12)
    age_all_but_active(store)
    store.delete_expired()
    assert len(store.queue("T", 0)) == 1
    last_phys = store.queue("T", 0).phys[-1]
    close(store)
    never_fsynced_from(tmp_path / "store", last_phys)
    seg = last_segment(tmp_path / "store")
    os.truncate(seg, last_phys - int(seg.name) + 100)
    store = open_store(file_reserved_hours=1.0)
    assert (store.min_offset("T", 0), store.max_offset("T", 0)) == (11, 11)
    assert put(store, "T", 0, [b"next"]) == 11
    close(store)
    store = open_store(file_reserved_hours=1.0)
    assert read_all(store) == [(11, b"next")]


def test_failed_write_is_undone_and_refused_until_disk_check(open_store):
    """ENOSPC in the middle of a group write: the appends of that turn are undone (file
    and queue), later puts are refused with DiskFull, and writes resume after a disk
    check finds room; nothing half-written is ever readable."""
    disk = RecordingDisk()
    store = open_store(disk=disk)
    bodies = fill(store, 3)
    end = store.commitlog.written_offset
    disk.full = True
    payload, crc = encode_batch([encode_message(b"lost")])
    store.put_batch("T", 0, payload, 1, crc, 0)
    with pytest.raises(DiskFull, match="No space left"):
        store.commit()
    disk.full = False
    assert store.commitlog.written_offset == end
    assert (
        os.path.getsize(store.commitlog.segments[-1].path)
        == end - store.commitlog.segments[-1].start
    )
    assert store.max_offset("T", 0) == 3
    with pytest.raises(DiskFull):
        store.put_batch("T", 0, payload, 1, crc, 0)
    store.check_disk()
    assert put(store, "T", 0, [b"again"]) == 3
    assert read_all(store) == list(enumerate([*bodies, b"again"]))


def test_unreadable_metadata_is_set_aside(open_store, tmp_path):
    """A damaged topics file does not stop the store; it is kept as .corrupt."""
    store = open_store()
    store.topics.put(TopicConfig("A"), store.clock_ms())
    close(store)
    (tmp_path / "store" / "topics.json").write_text("{not json")
    store = open_store()
    assert store.topics.topics == {}
    assert (tmp_path / "store" / "topics.corrupt").read_text() == "{not json"


def test_open_fsyncs_every_segment_before_claiming_it_flushed(open_store, tmp_path):
    """A killed broker leaves its writes in the page cache: the reopened log fsyncs them
    before ``flushed_offset`` (and so the next checkpoint) vouches for them."""
    store = open_store()
    fill(store, 40)
    end = store.commitlog.written_offset
    store.commitlog.write_pending()  # no close: the process dies here
    names = sorted(p.name for p in (tmp_path / "store" / "commitlog").iterdir())
    disk = RecordingDisk()
    reopened = open_store(disk=disk)
    assert reopened.commitlog.flushed_offset == reopened.durable_offset == end
    assert set(names) <= set(disk.names("fsync"))


def _tear_middle_segment(tmp_path: Path, store: MessageStore, flushed: int) -> int:
    """Cut the tail of the last-but-one segment, as a power loss that kept the last one
    does, and set the checkpoint's fsynced offset; returns where the torn segment ends."""
    middle = store.commitlog.segments[-2]
    close(store)
    os.truncate(middle.path, middle.size - 100)
    checkpoint = tmp_path / "store" / "checkpoint"
    checkpoint.write_text(
        json.dumps(
            {**json.loads(checkpoint.read_text()), "dispatched": flushed, "flushed": flushed}
        )
    )
    return middle.end - 100


def test_segments_after_a_gap_past_the_fsynced_offset_are_removed(open_store, tmp_path):
    """The checkpoint was saved when the log was fsynced up to the middle segment's start:
    everything after the gap was never fsynced and goes (the file too, so no later roll
    appends to it); the torn record goes; the log continues and survives a restart."""
    store = open_store()
    bodies = fill(store, 40)
    last = store.commitlog.segments[-1].path
    torn_end = _tear_middle_segment(tmp_path, store, store.commitlog.segments[-2].start)
    store = open_store()
    assert not last.exists()
    kept = read_all(store)
    assert kept == list(enumerate(bodies))[: len(kept)]
    assert store.commitlog.written_offset <= torn_end
    assert put(store, "T", 0, [b"after"]) == len(kept)
    close(store)
    assert read_all(open_store()) == [*kept, (len(kept), b"after")]


def test_a_gap_below_the_fsynced_offset_refuses_to_start(open_store, tmp_path):
    """The checkpoint says the whole log was fsynced: a gap is lost data, not a torn
    write, and nothing is dropped."""
    store = open_store()
    fill(store, 40)
    end = store.commitlog.written_offset
    last = store.commitlog.segments[-1].path
    torn_end = _tear_middle_segment(tmp_path, store, end)
    with pytest.raises(
        BrokerSystemError,
        match=rf"{last.name} starts at {int(last.name)}, but "
        rf"the log before it ends at {torn_end}.*{end}",
    ):
        open_store()
    assert last.exists()


def test_sync_flush_fsyncs_writes_nobody_waits_for(open_store):
    """A slave's or a DLedger member's writes under sync flush have no waiter: the group
    commit still fsyncs them within a few of its periods."""
    store = open_store(flush_disk_type="sync")
    log = store.commitlog

    async def write_and_wait() -> None:
        service = FlushService(store)
        service.start()
        try:
            fill(store, 5)
            deadline = time.monotonic() + 5
            while log.flushed_offset < log.written_offset and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        finally:
            await service.stop()

    asyncio.run(write_and_wait())
    assert log.flushed_offset == log.written_offset > 0


def test_sync_flush_serves_no_record_before_it_is_fsynced(open_store):
    """Under sync flush a reader gets only what fsyncs made durable: a record served
    before its fsync could be read, then taken by a power loss (a chaos run's consumers
    acknowledged two messages that a power loss then dropped, their sends unanswered). The
    cap rising wakes held readers."""
    store = open_store(flush_disk_type="sync")
    log = store.commitlog
    woken: list[int] = []
    store.read_cap_listeners.append(lambda: woken.append(store.reads_end))

    async def write_then_read() -> tuple[GetStatus, GetStatus]:
        service = FlushService(store)
        service.start()
        try:
            fill(store, 1)
            assert log.flushed_offset < log.written_offset  # no fsync in this turn
            before = store.get_messages("T", 0, 0, 32, 1 << 20).status
            deadline = time.monotonic() + 5
            while log.flushed_offset < log.written_offset and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return before, store.get_messages("T", 0, 0, 32, 1 << 20).status
        finally:
            await service.stop()

    before, after = asyncio.run(write_then_read())
    assert (before, after) == (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.FOUND)
    assert woken and woken[-1] == log.flushed_offset


def test_async_flush_serves_records_before_their_fsync(open_store):
    """Async flush promises nothing across a power loss: reads are not held back."""
    store = open_store(flush_disk_type="async")
    fill(store, 1)
    assert store.commitlog.flushed_offset < store.commitlog.written_offset
    assert store.get_messages("T", 0, 0, 32, 1 << 20).status is GetStatus.FOUND


def test_sync_flush_behind_a_raft_log_serves_records_before_their_fsync(open_store):
    """DLedger under sync flush: the fsynced Raft log is the record (a restart re-applies
    the store's lost tail) and a send is answered before the store's fsync, so holding
    reads back made an acknowledged send unreadable (NO_NEW_MSG) until the next fsync."""
    store = open_store(flush_disk_type="sync")

    async def write_then_read() -> GetStatus:
        service = FlushService(store, reads_wait_for_fsync=False)
        service.start()
        try:
            fill(store, 1)
            assert store.commitlog.flushed_offset < store.commitlog.written_offset
            return store.get_messages("T", 0, 0, 32, 1 << 20).status
        finally:
            await service.stop()

    assert asyncio.run(write_then_read()) is GetStatus.FOUND


def _names_agree(store: MessageStore) -> bool:
    return all(int(seg.path.name) == seg.start for seg in store.commitlog.segments)


def test_truncate_below_the_retained_minimum_is_refused(open_store, tmp_path):
    """After retention, a cut below the first retained byte is refused before anything
    changes (the records and their queue offsets are gone); a cut at or above it leaves
    every segment named by its start, reaches the checkpoint at once, and reads, restarts
    and appends go on."""
    store = open_store(file_reserved_hours=1.0)
    bodies = fill(store, 40)
    old = time.time() - 2 * 3600
    for seg in store.commitlog.segments[:2]:
        os.utime(seg.path, (old, old))
    store.delete_expired()
    low = store.commitlog.min_offset
    assert low > 0 and len(store.commitlog.segments) >= 2
    retained = read_all(store)
    with pytest.raises(
        BrokerSystemError, match=f"cannot cut the commit log back to 0.*below {low}"
    ):
        store.truncate_to(0)
    assert read_all(store) == retained and _names_agree(store)

    cut = store.queue("T", 0).phys[-8]  # a record boundary in an earlier segment
    store.truncate_to(cut)
    kept = retained[:-8]
    assert read_all(store) == kept and _names_agree(store)
    assert json.loads((tmp_path / "store" / "checkpoint").read_text())["flushed"] <= cut
    close(store)
    store = open_store(file_reserved_hours=1.0)
    assert read_all(store) == kept and _names_agree(store)
    assert put(store, "T", 0, [b"next"]) == len(bodies) - 8

    store.truncate_to(low)  # everything retained goes; the log restarts at its minimum
    assert read_all(store) == [] and _names_agree(store)
    close(store)
    store = open_store(file_reserved_hours=1.0)
    assert store.commitlog.min_offset == store.commitlog.written_offset == low
    assert put(store, "T", 0, [b"again"]) == kept[0][0]
    assert read_all(store) == [(kept[0][0], b"again")]


def test_a_queue_file_write_the_disk_had_no_room_for_leaves_no_half_entry(open_store):
    """ENOSPC part-way through a consume-queue write (a few bytes reach the file): the
    entries are written whole by the next checkpoint, not appended after the partial
    bytes, which would shift every later entry of the file."""
    disk = RecordingDisk()
    store = open_store(disk=disk)
    bodies = fill(store, 3)
    store.flush_consume_queues()
    bodies += [b"x", b"y"]
    put(store, "T", 0, bodies[3:])
    disk.full = True
    with pytest.raises(OSError):
        store.flush_consume_queues()
    disk.full = False
    store.flush_consume_queues()
    close(store)
    queue = store.queue("T", 0).path
    assert os.path.getsize(queue) % ENTRY_BYTES == 0
    assert read_all(open_store()) == list(enumerate(bodies))


def test_a_roll_the_disk_had_no_room_for_undoes_the_turn(open_store):
    """A send rolls the segment, which first writes the turn's earlier appends: ENOSPC
    there undoes them all, queue entries included (an entry left behind would point at
    whatever record is written next at its offset: another queue's message)."""
    disk = RecordingDisk()
    store = open_store(disk=disk)
    bodies = fill(store, 3)
    payload, crc = encode_batch([encode_message(b"b" * 200)])
    store.put_batch("T", 1, payload, 1, crc, 0)  # this turn, not yet written
    disk.full = True
    big, big_crc = encode_batch([encode_message(b"c" * (SEGMENT_BYTES - 300))])
    with pytest.raises(DiskFull, match="No space left"):
        store.put_batch("T", 0, big, 1, big_crc, 0)
    disk.full = False
    store.commit()
    store.check_disk()
    assert store.max_offset("T", 1) == 0
    assert put(store, "T", 0, [b"next"]) == 3
    assert read_all(store) == list(enumerate([*bodies, b"next"]))
    assert read_all(store, "T", 1) == []
