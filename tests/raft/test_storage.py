"""Both stores against one contract, plus the file store's recovery from torn writes: cut
past the checkpoint's committed index (never fsynced), refused at or below it."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from disk_faults import RecordingDisk
from hamq.raft import (
    Checkpoint,
    CorruptLogError,
    Entry,
    FileStorage,
    HardState,
    LogIndexError,
    LogStorage,
    MemoryStorage,
)
from hamq.sim.fs import SimDisk


def entries(start: int, stop: int, term: int = 1) -> list[Entry]:
    return [Entry(i, term, b"e%d" % i) for i in range(start, stop)]


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> LogStorage:
    if request.param == "memory":
        return MemoryStorage()
    return FileStorage(tmp_path / "log", segment_max_bytes=64)


def test_append_and_read(store: LogStorage) -> None:
    assert store.last_index() == -1
    store.append(entries(0, 5))
    assert store.last_index() == 4
    assert store.entry(3) == Entry(3, 1, b"e3")
    assert store.term(-1) == 0 and store.term(4) == 1
    assert store.entries_from(3) == entries(3, 5)


def test_append_replaces_suffix(store: LogStorage) -> None:
    store.append(entries(0, 5))
    store.append(entries(2, 4, term=2))
    assert store.last_index() == 3
    assert [e.term for e in store.entries_from(0)] == [1, 1, 2, 2]


def test_truncate_suffix(store: LogStorage) -> None:
    store.append(entries(0, 6))
    store.truncate_suffix(2)
    assert store.last_index() == 1
    store.append(entries(2, 3, term=3))
    assert store.entry(2).term == 3


def test_bad_input_raises(store: LogStorage) -> None:
    store.append(entries(0, 2))
    with pytest.raises(LogIndexError):
        store.append(entries(5, 6))  # a gap
    with pytest.raises(LogIndexError):
        store.append([Entry(2, 1, b""), Entry(4, 1, b"")])
    with pytest.raises(LogIndexError):
        store.entry(7)
    with pytest.raises(LogIndexError):
        store.truncate_suffix(-1)


def test_hard_state_and_checkpoint(store: LogStorage) -> None:
    assert store.load_hard_state() == HardState()
    assert store.load_checkpoint() == Checkpoint()
    store.save_hard_state(HardState(3, 2))
    store.save_checkpoint(Checkpoint(10, 7))
    assert store.load_hard_state() == HardState(3, 2)
    assert store.load_checkpoint() == Checkpoint(10, 7)


def test_file_store_survives_reopen(tmp_path: Path) -> None:
    store = FileStorage(tmp_path, segment_max_bytes=64)
    store.append(entries(0, 20))
    store.truncate_suffix(15)
    store.save_hard_state(HardState(4, 1))
    store.save_checkpoint(Checkpoint(14, 9))
    store.sync()
    store.close()
    assert len(list(tmp_path.glob("*.log"))) > 1, "small segments should have rolled"
    reopened = FileStorage(tmp_path, segment_max_bytes=64)
    assert reopened.entries_from(0) == entries(0, 15)
    assert reopened.load_hard_state() == HardState(4, 1)
    assert reopened.load_checkpoint() == Checkpoint(14, 9)


def _last_segment(directory: Path) -> Path:
    return sorted(directory.glob("*.log"))[-1]


@pytest.mark.parametrize("cut_bytes", [1, 5, 9, 12])
def test_torn_tail_is_cut_on_open(tmp_path: Path, cut_bytes: int) -> None:
    store = FileStorage(tmp_path)
    store.append(entries(0, 4))
    store.sync()
    store.close()
    segment = _last_segment(tmp_path)
    size = segment.stat().st_size
    os.truncate(segment, size - cut_bytes)  # the last record was only partly written
    reopened = FileStorage(tmp_path)
    assert reopened.entries_from(0) == entries(0, 3)
    reopened.append(entries(3, 5, term=2))  # and the log goes on from there
    reopened.sync()
    reopened.close()
    assert FileStorage(tmp_path).last_index() == 4


def test_garbage_tail_is_cut_on_open(tmp_path: Path) -> None:
    store = FileStorage(tmp_path)
    store.append(entries(0, 3))
    store.sync()
    store.close()
    with open(_last_segment(tmp_path), "ab") as f:
        f.write(b"\x00\x00\x00\x10garbage-not-a-record")
    assert FileStorage(tmp_path).entries_from(0) == entries(0, 3)


def test_flipped_byte_in_last_record_is_a_torn_tail(tmp_path: Path) -> None:
    store = FileStorage(tmp_path)
    store.append(entries(0, 3))
    store.sync()
    store.close()
    segment = _last_segment(tmp_path)
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF
    segment.write_bytes(bytes(data))
    assert FileStorage(tmp_path).last_index() == 1


def _written(tmp_path: Path, count: int, committed: int, term: int = 1) -> list[Path]:
    """A log of ``count`` entries in 3-record segments, fsynced, with a checkpoint saying
    ``committed``; returns its segment files."""
    store = FileStorage(tmp_path, segment_max_bytes=64)
    store.append(entries(0, count, term))
    store.sync()
    store.save_checkpoint(Checkpoint(count - 1, committed))
    store.close()
    return sorted(tmp_path.glob("*.log"))


def test_torn_record_in_an_older_segment_past_the_commit_point_is_cut(tmp_path: Path) -> None:
    """A power loss during a Ready that rolled a segment: the older segment's tail is torn
    and the newer one holds records. Past the committed index nothing was fsynced, so the
    log is cut at the tear and the later segments go."""
    segments = _written(tmp_path, 9, committed=1)
    assert [p.name[:-4].lstrip("0") or "0" for p in segments] == ["0", "3", "6"]
    os.truncate(segments[0], segments[0].stat().st_size - 5)  # index 2 torn
    reopened = FileStorage(tmp_path, segment_max_bytes=64)
    assert reopened.entries_from(0) == entries(0, 2)
    assert sorted(tmp_path.glob("*.log")) == segments[:1]
    reopened.append(entries(2, 5, term=2))
    reopened.sync()
    reopened.close()
    assert [e.term for e in FileStorage(tmp_path, segment_max_bytes=64).entries_from(0)] == [
        1,
        1,
        2,
        2,
        2,
    ]


def test_bad_record_at_or_below_the_commit_point_refuses_to_start(tmp_path: Path) -> None:
    """Index 7 was committed and fsynced (the checkpoint says so): a bad record there is
    damage, not a torn write, even at the end of the last segment."""
    segments = _written(tmp_path, 9, committed=7)
    data = bytearray(segments[-1].read_bytes())
    data[40] ^= 0xFF  # inside index 7, the second record of the last segment
    segments[-1].write_bytes(bytes(data))
    with pytest.raises(
        CorruptLogError,
        match=rf"{segments[-1].name} offset 27 \(index 7\): "
        r"record fails its CRC.*up to 7",
    ):
        FileStorage(tmp_path, segment_max_bytes=64)
    assert segments[-1].read_bytes() == bytes(data), "nothing is cut when refusing"


def test_log_ending_before_the_commit_point_refuses_to_start(tmp_path: Path) -> None:
    segments = _written(tmp_path, 9, committed=8)
    segments[-1].unlink()
    with pytest.raises(CorruptLogError, match=r"ends at index 5.*up to 8"):
        FileStorage(tmp_path, segment_max_bytes=64)


def _torn_rewrite(tmp_path: Path, committed: int) -> None:
    """Entries 0-2 (term 1) and 3-5 (term 2) were on disk; a new leader's entries 3-4
    (term 3) were written over 3-5, and a power loss kept the new records but not the
    cut, so the old record 5 follows them, intact."""
    store = FileStorage(tmp_path)
    store.append(entries(0, 3) + entries(3, 6, term=2))
    store.sync()
    old = _last_segment(tmp_path).read_bytes()
    store.truncate_suffix(3)
    store.append(entries(3, 5, term=3))
    store.save_checkpoint(Checkpoint(4, committed))
    store.close()
    new = _last_segment(tmp_path).read_bytes()
    _last_segment(tmp_path).write_bytes(new + old[len(new) :])


def test_older_term_after_newer_past_the_commit_point_is_cut(tmp_path: Path) -> None:
    _torn_rewrite(tmp_path, committed=2)
    reopened = FileStorage(tmp_path)
    assert [e.term for e in reopened.entries_from(0)] == [1, 1, 1, 3, 3]


def test_older_term_after_newer_at_the_commit_point_refuses_to_start(tmp_path: Path) -> None:
    _torn_rewrite(tmp_path, committed=5)
    with pytest.raises(CorruptLogError, match=r"\(index 5\): term 2 after term 3"):
        FileStorage(tmp_path)


def test_truncate_suffix_is_durable_before_the_rewrite(tmp_path: Path) -> None:
    """The cut reaches the disk (file fsynced, removed segments' directory fsynced) before
    a record is written again at the same offsets."""
    disk = RecordingDisk()
    store = FileStorage(tmp_path, segment_max_bytes=64, disk=disk)
    store.append(entries(0, 9))
    store.sync()
    disk.events.clear()
    store.append(entries(4, 6, term=2))  # cuts at 4, in the second segment
    kept = "00000000000000000003.log"
    assert disk.events == [
        ("unlink", "00000000000000000006.log"),
        ("truncate", kept),
        ("fsync", kept),
        ("fsync_dir", tmp_path.name),
        ("pwrite", kept),
    ]


def test_corrupt_checkpoint_is_an_error(tmp_path: Path) -> None:
    store = FileStorage(tmp_path)
    store.save_checkpoint(Checkpoint(3, 2))
    (tmp_path / "checkpoint").write_bytes(b"\x00\x00\x00\x05\x00\x00\x00\x00xx")
    with pytest.raises(CorruptLogError):
        store.load_checkpoint()


def test_a_cut_after_an_entry_never_takes_that_entry_off_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RaftLog.truncate_after(i) re-emits entry i; the file store must cut after it, not
    rewrite it: a kill between a cut at i and the rewrite would lose a committed entry."""
    store = FileStorage(tmp_path)
    store.append([Entry(i, 1, b"x%d" % i) for i in range(13)])
    store.sync()

    def killed(*args):
        raise SystemExit("kill -9")

    monkeypatch.setattr(os, "pwritev", killed)
    store.append([Entry(10, 1, b"x10")])  # nothing to write: only the cut after 10
    monkeypatch.undo()
    reopened = FileStorage(tmp_path)
    assert reopened.last_index() == 10 and reopened.entry(10).data == b"x10"


def test_an_append_the_disk_had_no_room_for_leaves_the_log_as_it_was():
    """ENOSPC part-way through an append: the entries are not in the log (a retry with the
    same terms would otherwise be taken as already written and skipped), and the retry
    after space comes back writes them."""
    disk = SimDisk(capacity_bytes=1 << 20)
    storage = FileStorage("/raft", 256, disk=disk)
    storage.append([Entry(0, 1, b"a" * 100)])
    storage.sync()
    disk.capacity_bytes = disk.used_bytes() + 150  # room for one record, not two
    batch = [Entry(1, 1, b"b" * 100), Entry(2, 1, b"c" * 100), Entry(3, 1, b"d" * 100)]
    with pytest.raises(OSError):
        storage.append(batch)
    assert storage.last_index() == 0
    disk.capacity_bytes = 1 << 20
    storage.append(batch)
    storage.sync()
    disk.kill()
    reopened = FileStorage("/raft", 256, disk=disk)
    assert [reopened.entry(i).data[:1] for i in range(4)] == [b"a", b"b", b"c", b"d"]


def test_a_segment_a_killed_process_created_is_durable_once_a_later_sync_returns():
    """The process dies after creating a segment whose directory entry was never fsynced;
    the restarted store appends into that segment and syncs (under sync flush a follower
    then acknowledges the entries): a power loss must not take the segment."""
    disk = SimDisk()
    storage = FileStorage("/raft", 64, disk=disk)
    storage.append([Entry(0, 1, b"a" * 40)])
    storage.sync()
    storage.append([Entry(1, 1, b"b" * 10)])  # a second segment, not synced
    disk.kill()
    storage = FileStorage("/raft", 64, disk=disk)
    storage.append([Entry(2, 1, b"c" * 10)])  # still the second segment
    storage.sync()
    disk.power_loss(random.Random(0))
    assert FileStorage("/raft", 64, disk=disk).last_index() == 2
