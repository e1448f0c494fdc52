"""Attacks on the stores' recovery, on the simulated disk (``hamq.sim.fs``): a failed
fsync, a power loss right after a topic delete, a crash between the steps of a cut or of a
consume-queue rewrite, a failed metadata write. Each test names the promise it checks:
nothing confirmed durable is lost, nothing deleted comes back, nothing is served twice
under one queue offset, and a log that lost confirmed data refuses to start."""

from __future__ import annotations

import asyncio
import errno
import random
import time
from pathlib import Path

import pytest

from hamq.config import StoreConfig
from hamq.errors import BrokerSystemError, DiskFull
from hamq.protocol.message import encode_batch, encode_message
from hamq.raft import Entry, FileStorage
from hamq.sim.fs import SimDisk
from hamq.store.commitlog import CommitLog
from hamq.store.consume_queue import ENTRY_BYTES
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore
from helpers import read_queue

SEGMENT_BYTES = 1024


def _config() -> StoreConfig:
    return StoreConfig(store_dir="/store", mapped_file_size_commitlog=SEGMENT_BYTES)


def _put(store: MessageStore, topic: str, queue_id: int, body: bytes) -> int:
    """Store one message; returns its queue offset."""
    payload, crc = encode_batch([encode_message(body)])
    put = store.put_batch(topic, queue_id, payload, 1, crc, 0)
    store.commit()
    return put.base_queue_offset


def _lose_power(disk: SimDisk, seed: int = 0) -> MessageStore:
    disk.power_loss(random.Random(seed))
    return MessageStore(_config(), disk=disk)


# -- a failed fsync -----------------------------------------------------------------------
def test_a_failed_fsync_of_a_rolled_segment_is_never_reported_durable_later():
    disk = SimDisk()
    log = CommitLog("/log", 100, disk=disk)
    log.append([b"a" * 80], 80)
    log.reserve(80)  # rolls: the first segment waits for the next flush's fsync
    log.append([b"b" * 80], 80)
    log.write_pending()
    disk.fail_fsync(log.segments[0].path)
    with pytest.raises(BrokerSystemError, match="fsync of commit log segment"):
        log.flush()
    log.reserve(80)
    log.append([b"c" * 80], 80)
    # A retried flush would sync only the active segment and claim all 240 bytes: the
    # first segment's failed writes would never reach the disk.
    with pytest.raises(BrokerSystemError):
        log.flush()
    assert log.flushed_offset == 0
    with pytest.raises(BrokerSystemError):
        log.close()
    assert not disk.open_handles


def test_after_a_failed_fsync_the_store_refuses_writes_for_good():
    disk = SimDisk()
    store = MessageStore(_config(), disk=disk)
    _put(store, "T", 0, b"first")
    disk.fail_fsync(store.commitlog.segments[-1].path)
    with pytest.raises(BrokerSystemError):
        store.commitlog.flush()
    store.check_disk()  # a disk with room again must not lift this refusal
    with pytest.raises(DiskFull, match="fsync of commit log segment"):
        _put(store, "T", 0, b"second")


def test_a_failed_raft_log_sync_fails_every_later_sync():
    disk = SimDisk()
    storage = FileStorage("/raft", 64, disk=disk)
    storage.append([Entry(0, 1, b"x" * 40), Entry(1, 1, b"y" * 40)])  # two segments
    disk.fail_fsync(Path("/raft/00000000000000000000.log"))
    with pytest.raises(OSError):
        storage.sync()
    storage.append([Entry(2, 1, b"z" * 40)])
    # A later sync that succeeded would let a checkpoint vouch for entry 0, whose write the
    # failed fsync lost.
    with pytest.raises(OSError) as failure:
        storage.sync()
    assert failure.value.errno == errno.EIO
    disk.power_loss(random.Random(0))
    assert FileStorage("/raft", 64, disk=disk).last_index() == -1  # nothing was confirmed


# -- topic delete and re-create ---------------------------------------------------------------
def test_a_restart_after_a_topic_delete_does_not_bring_its_messages_back():
    disk = SimDisk()
    store = MessageStore(_config(), disk=disk)  # async flush: the log is not fsynced yet
    for i in range(3):
        _put(store, "T", 0, f"old {i}".encode())
    store.delete_topic("T")
    disk.kill()
    store = MessageStore(_config(), disk=disk)
    assert ("T", 0) not in store.queues, "recovery re-dispatched a deleted topic's records"
    assert _put(store, "T", 0, b"new") == 0
    assert read_queue(store, "T") == {0: b"new"}


def test_a_power_loss_after_a_topic_delete_and_re_create_serves_only_the_new_topic():
    for seed in range(10):
        disk = SimDisk()
        store = MessageStore(_config(), disk=disk)
        for i in range(3):
            _put(store, "T", 0, f"old {i}".encode())
        store.commitlog.flush()
        store.flush_consume_queues()
        store.delete_topic("T")
        assert _put(store, "T", 0, b"new") == 0
        store.commitlog.flush()  # what a sync-flush send waits for before its answer
        after = _lose_power(disk, seed)
        assert list(after.queue("T", 0).base) == [0], f"seed {seed}: old entries came back"
        assert read_queue(after, "T") == {0: b"new"}, f"seed {seed}"


# -- a log shorter than its checkpoint --------------------------------------------------------
def _store_with(disk: SimDisk, count: int) -> MessageStore:
    """A store holding ``count`` messages, every one fsynced and in the checkpoint."""
    store = MessageStore(_config(), disk=disk)
    for i in range(count):
        _put(store, "T", 0, f"m{i}".encode().ljust(100, b"."))
    store.commitlog.flush()
    store.flush_consume_queues()
    return store


def test_a_log_that_lost_bytes_its_checkpoint_had_as_fsynced_refuses_to_start():
    disk = SimDisk()
    store = _store_with(disk, 5)
    segment = store.commitlog.segments[-1].path
    disk.kill()
    damaged = disk.open(segment)  # the disk gives back less than it confirmed
    damaged.truncate(damaged.size() - 10)
    damaged.fsync()
    with pytest.raises(BrokerSystemError, match="fsynced"):
        MessageStore(_config(), disk=disk)
    assert disk.open(segment).size() > 0, "refusing must not cut anything"


class _Crash(Exception):
    """The process dies here."""


def test_a_power_loss_right_after_a_cut_recovers_the_kept_prefix(monkeypatch):
    for seed in range(20):
        disk = SimDisk()
        store = _store_with(disk, 10)
        cut = store.queue("T", 0).phys[5]
        truncate = store.commitlog.truncate

        def truncate_then_die(offset: int, truncate=truncate) -> None:
            truncate(offset)
            raise _Crash()

        monkeypatch.setattr(store.commitlog, "truncate", truncate_then_die)
        with pytest.raises(_Crash):
            store.truncate_to(cut)
        after = _lose_power(disk, seed)
        assert sorted(read_queue(after, "T")) == list(range(5)), f"seed {seed}"
        assert _put(after, "T", 0, b"next") == 5


# -- consume-queue rewrite ----------------------------------------------------------------------
def test_a_crash_inside_a_queue_rewrite_never_restarts_its_offsets(monkeypatch):
    """Retention empties a queue: its file is rewritten empty and its ``.min`` file keeps
    where it continues. A crash between the two writes must not leave an empty queue
    without its continuation point (offsets 0.. would be handed out a second time)."""
    import hamq.store.consume_queue as consume_queue

    now_ms = [0]
    disk = SimDisk(clock=lambda: now_ms[0] / 1000)
    config = StoreConfig(
        store_dir="/store", mapped_file_size_commitlog=SEGMENT_BYTES, file_reserved_hours=1.0
    )
    store = MessageStore(config, lambda: now_ms[0], disk=disk)
    for i in range(5):
        _put(store, "T", 0, f"m{i}".encode())
    while len(store.commitlog.segments) < 3:  # T's records end up in old segments only
        _put(store, "U", 0, b"u" * 200)
    store.commitlog.flush()
    store.flush_consume_queues()
    now_ms[0] = 3 * 3600 * 1000  # later than the retention period
    write = consume_queue.atomic_write

    def die_before_min_file(disk_: SimDisk, path: Path, data: bytes) -> None:
        if path.suffix == ".min":
            raise _Crash()
        write(disk_, path, data)

    monkeypatch.setattr(consume_queue, "atomic_write", die_before_min_file)
    with pytest.raises(_Crash):
        store.delete_expired()
    monkeypatch.setattr(consume_queue, "atomic_write", write)
    disk.power_loss(random.Random(0))
    after = MessageStore(config, lambda: now_ms[0], disk=disk)
    assert after.max_offset("T", 0) == 5
    assert _put(after, "T", 0, b"next") == 5


# -- metadata tables ------------------------------------------------------------------------------
def test_a_periodic_offsets_write_that_started_before_a_topic_delete_does_not_undo_it():
    disk = SimDisk()
    store = MessageStore(_config(), disk=disk)
    store.offsets.commit("G", "T", 0, 7, 1)
    periodic = store.offsets.snapshot()  # taken on the loop; its write runs in a worker
    store.delete_topic("T")  # persists the table without T's offsets
    store.offsets.write(periodic)  # the worker gets to it only now
    disk.kill()
    assert MessageStore(_config(), disk=disk).offsets.query("G", "T", 0) is None


def test_a_failed_metadata_write_is_retried_by_the_next_persist():
    disk = SimDisk(capacity_bytes=1 << 20)
    store = MessageStore(_config(), disk=disk)
    store.offsets.commit("G", "T", 0, 7, 1)
    capacity, disk.capacity_bytes = disk.capacity_bytes, disk.used_bytes()
    with pytest.raises(OSError):
        store.offsets.persist()  # ENOSPC
    disk.capacity_bytes = capacity
    store.offsets.persist()  # nothing changed since: the table must still be written
    disk.kill()
    assert MessageStore(_config(), disk=disk).offsets.query("G", "T", 0) == 7


def test_a_failed_consume_queue_fsync_is_never_vouched_for_by_a_checkpoint():
    """The queue file's fsync fails (EIO: its new entries may never reach the disk). No
    later checkpoint may claim them as dispatched, or recovery would not rebuild them
    from the commit log after a power loss."""
    disk = SimDisk()
    store = _store_with(disk, 1)
    for i in range(1, 4):
        _put(store, "T", 0, f"m{i}".encode())
    store.commitlog.flush()
    paths = store.write_consume_queues()
    disk.fail_fsync(store.queue("T", 0).path)
    with pytest.raises(OSError):
        store.sync_files(paths)
    _put(store, "T", 0, b"m4")
    store.commitlog.flush()
    try:
        store.flush_consume_queues()
    except OSError:
        pass  # refusing to checkpoint is one right answer
    after = _lose_power(disk)
    assert sorted(read_queue(after, "T")) == list(range(5))


def test_a_checkpoint_never_vouches_for_queue_entries_another_thread_has_yet_to_fsync():
    """The periodic checkpoint hands its queue files to a worker to fsync; meanwhile a
    checkpoint on the event loop (a topic delete, a cut) must not claim those entries as
    dispatched before they are fsynced too."""
    for seed in range(10):
        disk = SimDisk()
        store = _store_with(disk, 1)
        for i in range(1, 4):
            _put(store, "T", 0, f"m{i}".encode())
        store.commitlog.flush()
        store.write_consume_queues()  # the worker's sync_files has not run yet
        _put(store, "U", 0, b"u")
        store.commitlog.flush()
        store.flush_consume_queues()  # on the loop
        after = _lose_power(disk, seed)
        assert sorted(read_queue(after, "T")) == list(range(4)), f"seed {seed}"


# -- a clean restart ------------------------------------------------------------------------------
def test_a_clean_restart_changes_no_file():
    disk = SimDisk()
    store = MessageStore(_config(), lambda: 1000, disk=disk)
    for i in range(40):
        _put(store, ("T", "U")[i % 2], i % 3, f"m{i}".encode().ljust(90, b"."))
    store.delete_topic("U")
    store.offsets.commit("G", "T", 0, 3, 1)
    store.close()
    before = {name: bytes(inode.data) for name, inode in disk.names.items()}
    for _ in range(2):
        MessageStore(_config(), lambda: 1000, disk=disk).close()
        assert {name: bytes(inode.data) for name, inode in disk.names.items()} == before


def test_a_checkpoint_after_a_failed_queue_write_claims_nothing_unwritten():
    """ENOSPC stops a checkpoint's queue writes part-way: the queue files written before
    the failure still get their fsync before any checkpoint, and no checkpoint claims the
    entries that were not written."""
    for seed in range(10):
        disk = SimDisk(capacity_bytes=(1 << 40) - 1)  # counted; room to spare
        store = _store_with(disk, 1)
        for i in range(1, 4):
            _put(store, "T", 0, f"m{i}".encode())
            _put(store, "U", 0, f"u{i}".encode())
        store.commitlog.flush()
        # the first queue's new entries fit, not the second's
        disk.capacity_bytes = disk.used_bytes() + 3 * ENTRY_BYTES
        with pytest.raises(OSError):
            store.write_consume_queues()
        disk.capacity_bytes = (1 << 40) - 1
        store.write_checkpoint()  # a worker's, from an earlier candidate
        after = _lose_power(disk, seed)
        assert sorted(read_queue(after, "T")) == list(range(4)), f"seed {seed}"
        assert sorted(read_queue(after, "U")) == list(range(3)), f"seed {seed}"


def test_a_sync_flush_whose_fsync_fails_acknowledges_nothing_and_refuses_writes():
    disk = SimDisk()
    store = MessageStore(
        StoreConfig(store_dir="/store", flush_disk_type="sync", sync_flush_timeout_ms=200),
        disk=disk,
    )
    answers: list[bool] = []

    async def send_and_wait() -> None:
        service = FlushService(store)
        service.start()
        try:
            disk.fail_fsync(store.commitlog.segments[-1].path)
            payload, crc = encode_batch([encode_message(b"never durable")])
            put = store.put_batch("T", 0, payload, 1, crc, 0)
            store.commit()
            service.wait_flushed(put.end_offset, answers.append)
            deadline = time.monotonic() + 5
            while not answers and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        finally:
            await service.stop()

    asyncio.run(send_and_wait())
    assert answers == [False]  # FLUSH_DISK_TIMEOUT: never SEND_OK
    with pytest.raises(DiskFull, match="fsync of commit log segment"):
        _put(store, "T", 0, b"next")


def test_a_replicated_batch_the_disk_had_no_room_for_leaves_no_queue_entry_past_the_log():
    master = _store_with(SimDisk(), 0)
    for i in range(6):
        _put(master, "T", i % 2, f"m{i}".encode().ljust(300, b"."))
    shipped = bytes(master.commitlog.read_range(0, master.commitlog.written_offset))
    disk = SimDisk(capacity_bytes=(1 << 40) - 1)
    slave = MessageStore(_config(), disk=disk)
    disk.capacity_bytes = disk.used_bytes() + 700  # the first segment's records do not fit
    with pytest.raises(OSError):
        slave.append_replicated(0, shipped)
    end = slave.commitlog.written_offset
    assert all(cq.max_physical_end <= end for cq in slave.queues.values())
    assert slave.replica_offset == end
