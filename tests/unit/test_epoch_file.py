"""The epoch file: order it refuses to break, truncations, and what survives a crash.

Runs on the real disk and on the simulated one (``hamq.sim.fs.SimDisk``), whose kills and
power losses must leave the old list or the new one, never a torn file.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import pytest

from hamq.replication.consistent_point import EpochEntry
from hamq.sim.fs import ProcessCrash, SimDisk
from hamq.store.epoch_file import CorruptEpochFileError, EpochFile, EpochOrderError

SIM_PATH = Path("/member/epoch")


def sim_file(disk: SimDisk | None = None) -> tuple[EpochFile, SimDisk]:
    disk = disk or SimDisk()
    disk.mkdir(SIM_PATH.parent)
    return EpochFile(SIM_PATH, disk), disk


def filled(pairs: list[tuple[int, int]]) -> tuple[EpochFile, SimDisk]:
    epochs, disk = sim_file()
    for epoch, start in pairs:
        epochs.append(epoch, start)
    return epochs, disk


def pairs(epochs: EpochFile) -> list[tuple[int, int]]:
    return [(entry.epoch, entry.start_offset) for entry in epochs.entries()]


def test_a_new_file_is_empty():
    epochs, _ = sim_file()
    assert epochs.entries() == () and epochs.last_epoch() == 0
    assert epochs.end_offset_of(1, 100) is None


def test_append_and_end_offsets():
    epochs, _ = filled([(1, 0), (2, 100), (4, 250)])
    assert epochs.last_epoch() == 4
    assert epochs.entries()[1] == EpochEntry(2, 100)
    assert [epochs.end_offset_of(e, 300) for e in (1, 2, 3, 4)] == [100, 250, None, 300]


def test_appending_the_last_entry_again_changes_nothing():
    epochs, _ = filled([(1, 0), (2, 100)])
    epochs.append(2, 100)
    assert pairs(epochs) == [(1, 0), (2, 100)]


def test_an_epoch_with_no_record_may_be_followed_at_the_same_offset():
    epochs, _ = filled([(1, 0), (2, 100), (3, 100)])
    assert epochs.end_offset_of(2, 150) == 100


@pytest.mark.parametrize(
    ("epoch", "start", "why"),
    [
        (1, 200, "cannot follow epoch 2 at offset 100"),  # an older epoch
        (2, 150, "cannot follow epoch 2 at offset 100"),  # the same epoch, another start
        (3, 99, "cannot follow epoch 2 at offset 100"),  # a start below the last one
        (0, 200, "epochs start at 1"),
        (3, -1, "offsets at 0"),
    ],
)
def test_out_of_order_appends_are_refused_and_change_nothing(epoch, start, why):
    epochs, disk = filled([(1, 0), (2, 100)])
    with pytest.raises(EpochOrderError, match=why):
        epochs.append(epoch, start)
    assert pairs(epochs) == [(1, 0), (2, 100)]
    assert pairs(EpochFile(SIM_PATH, disk)) == [(1, 0), (2, 100)]


@pytest.mark.parametrize(
    ("cut", "kept"),
    [
        (300, [(1, 0), (2, 100), (4, 250)]),
        (251, [(1, 0), (2, 100), (4, 250)]),
        (250, [(1, 0), (2, 100)]),  # epoch 4 starts at the cut: it holds nothing any more
        (120, [(1, 0), (2, 100)]),
        (100, [(1, 0)]),
        (0, []),
    ],
)
def test_truncate_suffix_from(cut, kept):
    epochs, disk = filled([(1, 0), (2, 100), (4, 250)])
    epochs.truncate_suffix_from(cut)
    assert pairs(epochs) == kept
    assert pairs(EpochFile(SIM_PATH, disk)) == kept


@pytest.mark.parametrize(
    ("cut", "kept"),
    [
        (0, [(1, 0), (2, 100), (4, 250)]),
        (50, [(1, 50), (2, 100), (4, 250)]),  # epoch 1 now starts at the first kept record
        (100, [(2, 100), (4, 250)]),  # epoch 1 ended at the cut
        (180, [(2, 180), (4, 250)]),
        (900, [(4, 900)]),  # the current epoch always stays
    ],
)
def test_truncate_prefix_to(cut, kept):
    epochs, disk = filled([(1, 0), (2, 100), (4, 250)])
    epochs.truncate_prefix_to(cut)
    assert pairs(epochs) == kept
    assert pairs(EpochFile(SIM_PATH, disk)) == kept


def test_round_trip_on_the_real_disk(tmp_path):
    path = tmp_path / "epoch"
    epochs = EpochFile(path)
    for epoch, start in [(1, 0), (3, 4096), (7, 1 << 40)]:
        epochs.append(epoch, start)
    assert EpochFile(path).entries() == epochs.entries()
    assert path.read_text().splitlines()[1:] == ["1 0", "3 4096", f"7 {1 << 40}"]
    assert [p.name for p in tmp_path.iterdir()] == ["epoch"]  # no temporary file left


def random_change(rng: random.Random, epochs: EpochFile) -> None:
    last = epochs.entries()[-1] if epochs.entries() else EpochEntry(0, 0)
    kind = rng.randrange(3)
    if kind == 0:
        epochs.append(last.epoch + rng.randint(1, 3), last.start_offset + rng.randrange(500))
    elif kind == 1:
        epochs.truncate_suffix_from(rng.randrange(last.start_offset + 2))
    else:
        epochs.truncate_prefix_to(rng.randrange(last.start_offset + 2))


@pytest.mark.parametrize("fault", ["kill", "power_loss"])
def test_a_crash_in_any_step_leaves_the_old_or_the_new_list(fault):
    for seed in range(300):
        rng = random.Random(seed)
        epochs, disk = sim_file()
        for _ in range(rng.randrange(4)):
            random_change(rng, epochs)
        before = epochs.entries()
        crash_at = rng.randrange(6)  # atomic_write takes five steps
        # the same change without a crash, on a copy, says what "the new list" is
        state = rng.getstate()
        mirror, _ = sim_file()
        for entry in before:
            mirror.append(entry.epoch, entry.start_offset)
        random_change(rng, mirror)
        rng.setstate(state)

        disk.crash_after(crash_at)
        try:
            random_change(rng, epochs)
        except ProcessCrash:
            assert epochs.entries() == before, f"seed {seed}: memory changed by a failed write"
        if fault == "kill":
            disk.kill()
        else:
            disk.power_loss(rng)
        reopened = EpochFile(SIM_PATH, disk).entries()
        assert reopened in (before, mirror.entries()), f"seed {seed}: {reopened}"


def test_power_loss_after_a_completed_change_keeps_it():
    for seed in range(100):
        rng = random.Random(seed)
        epochs, disk = sim_file()
        for _ in range(1 + rng.randrange(4)):
            random_change(rng, epochs)
        disk.power_loss(rng)
        assert EpochFile(SIM_PATH, disk).entries() == epochs.entries(), f"seed {seed}"


def write_raw(data: bytes) -> SimDisk:
    _, disk = sim_file()
    file = disk.open(SIM_PATH)
    file.pwrite([data], 0)
    file.close()
    return disk


def valid(body: str) -> bytes:
    return f"hamq-epochs v1 {zlib.crc32(body.encode()):08x}\n{body}".encode()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "not a valid epoch file"),
        (b"\xff\xfe garbage \x00", "not a valid epoch file"),
        (b"1 0\n2 100\n", "not a valid epoch file"),  # no header
        (valid("1 0\n2 100\n").replace(b"100", b"101"), "not a valid epoch file"),  # bit rot
        (valid("1 0\n2 100\n")[:-3], "not a valid epoch file"),  # torn
        (valid("1 0 7\n"), "not a valid epoch file"),
        (valid("one 0\n"), "not a valid epoch file"),
        (valid("1 0\n2 100\n2 200\n"), "cannot follow epoch 2 at offset 100"),
        (valid("2 100\n3 50\n"), "cannot follow epoch 2 at offset 100"),
        (valid("0 0\n"), "epochs start at 1"),
    ],
)
def test_a_damaged_file_is_a_clear_error(data, why):
    disk = write_raw(data)
    with pytest.raises(CorruptEpochFileError, match=why) as refused:
        EpochFile(SIM_PATH, disk)
    assert "removing it makes this member copy its whole log again" in str(refused.value)
    assert disk.read_bytes(SIM_PATH) == data  # refused, not rewritten


def test_removing_a_damaged_file_starts_an_empty_list():
    disk = write_raw(b"garbage")
    disk.unlink(SIM_PATH)
    assert EpochFile(SIM_PATH, disk).entries() == ()
