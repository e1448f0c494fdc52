"""The simulated disk keeps written and fsynced data apart, as the simulator's crash
faults need: what these tests pin down is what a store may rely on after each fault."""

from __future__ import annotations

import errno
import random
from pathlib import Path

import pytest

from hamq.sim.fs import SimDisk
from hamq.store.disk import atomic_write

ROOT = Path("/store")


def _disk_with_file() -> tuple[SimDisk, object]:
    disk = SimDisk()
    disk.mkdir(ROOT)
    file = disk.open(ROOT / "log", append=True)
    disk.fsync_dir(ROOT)
    return disk, file


def test_kill_keeps_the_page_cache_and_closes_handles() -> None:
    disk, file = _disk_with_file()
    file.append([b"abc", b"def"])
    disk.kill()
    with pytest.raises(OSError) as err:
        file.append([b"x"])
    assert err.value.errno == errno.EBADF
    assert disk.read_bytes(ROOT / "log") == b"abcdef"


def test_power_loss_keeps_fsynced_data_and_a_prefix_of_the_rest() -> None:
    outcomes = set()
    for seed in range(200):
        disk, file = _disk_with_file()
        file.append([b"synced|"])
        file.fsync()
        file.append([b"first|"])
        file.append([b"second|"])
        disk.power_loss(random.Random(seed))
        data = disk.read_bytes(ROOT / "log")
        assert data.startswith(b"synced|")
        assert (b"synced|first|second|").startswith(data)
        outcomes.add(data)
    assert b"synced|" in outcomes and b"synced|first|second|" in outcomes
    torn = [d for d in outcomes if d not in (b"synced|", b"synced|first|", b"synced|first|second|")]
    assert torn, "some power losses tear the first lost write"


def test_files_persist_out_of_order_across_files() -> None:
    seen = set()
    for seed in range(100):
        disk, a = _disk_with_file()
        b = disk.open(ROOT / "other")
        disk.fsync_dir(ROOT)
        a.append([b"A"])
        b.pwrite([b"B"], 0)
        disk.power_loss(random.Random(seed))
        seen.add((disk.read_bytes(ROOT / "log"), disk.read_bytes(ROOT / "other")))
    assert (b"", b"B") in seen and (b"A", b"") in seen


def test_directory_entries_need_a_directory_fsync() -> None:
    disk = SimDisk()
    disk.mkdir(ROOT)
    file = disk.open(ROOT / "new")
    file.pwrite([b"data"], 0)
    file.fsync()
    disk.power_loss(random.Random(1))
    assert not disk.exists(ROOT / "new"), "a created file is durable only after fsync_dir"
    file = disk.open(ROOT / "new")
    file.pwrite([b"data"], 0)
    file.fsync()
    disk.fsync_dir(ROOT)
    disk.unlink(ROOT / "new")
    disk.power_loss(random.Random(1))
    assert disk.read_bytes(ROOT / "new") == b"data", "an unlink is durable only after fsync_dir"


def test_atomic_write_leaves_old_or_new_content_after_power_loss() -> None:
    for seed in range(100):
        disk = SimDisk()
        disk.mkdir(ROOT)
        atomic_write(disk, ROOT / "checkpoint", b"old-content")
        rng = random.Random(seed)
        if rng.random() < 0.5:
            atomic_write(disk, ROOT / "checkpoint", b"new-content-longer")
        else:  # the crash comes while the temporary file is being written
            tmp = disk.open(ROOT / "checkpoint.tmp")
            tmp.pwrite([b"new-content-longer"], 0)
        disk.power_loss(rng)
        assert disk.read_bytes(ROOT / "checkpoint") in (b"old-content", b"new-content-longer")


def test_a_full_disk_refuses_writes_with_enospc() -> None:
    disk = SimDisk(capacity_bytes=10)
    disk.mkdir(ROOT)
    file = disk.open(ROOT / "log", append=True)
    file.append([b"12345678"])
    with pytest.raises(OSError) as err:
        file.append([b"abc"])
    assert err.value.errno == errno.ENOSPC
    assert disk.read_bytes(ROOT / "log") == b"12345678"
    assert disk.usage(ROOT) == (10, 2)


def test_listdir_and_rmtree() -> None:
    disk, _ = _disk_with_file()
    disk.mkdir(ROOT / "cq" / "TopicA")
    disk.open(ROOT / "cq" / "TopicA" / "0")
    assert disk.listdir(ROOT) == ["cq", "log"]
    assert disk.listdir(ROOT / "cq") == ["TopicA"]
    disk.rmtree(ROOT / "cq" / "TopicA")
    assert disk.listdir(ROOT / "cq") == []
    assert disk.listdir(ROOT / "missing") == []
