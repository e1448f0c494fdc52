"""DataVersion steps of consumer offsets and delay progress, and pre-online's merge by
DataVersion (seed 004): the newer table is kept, and an offset never moves back."""

from __future__ import annotations

import pytest

from hamq.broker.pre_online import merge_if_not_older
from hamq.errors import InvalidArgument
from hamq.store.delay_offset import DelayOffsetManager
from hamq.store.metadata import ConsumerOffsetManager, DataVersion


def offsets(tmp_path, name: str, step: int) -> ConsumerOffsetManager:
    manager = ConsumerOffsetManager(tmp_path / name, 1)
    manager.version_step = step
    return manager


def test_consumer_offsets_version_steps_every_n_commits_and_persists(tmp_path):
    (tmp_path / "a").mkdir()
    a = offsets(tmp_path, "a", 10)
    assert a.data_version.state_version == 0  # comparable across members
    for i in range(25):
        a.commit("g", "T", 0, i + 1, 100 + i)
    assert a.data_version.counter == 2  # stepped at the 10th and the 20th commit
    assert a.data_version.timestamp_ms == 119  # the 20th commit's time
    a.persist()
    reloaded = offsets(tmp_path, "a", 10)
    assert reloaded.data_version == a.data_version
    assert reloaded.query("g", "T", 0) == 25


def test_delay_progress_version_steps_every_n_changes(tmp_path):
    progress = DelayOffsetManager(tmp_path, 1)
    progress.version_step = 3
    for offset in range(1, 8):
        progress.set_delay_offset(2, offset, offset)
    assert progress.data_version == DataVersion(0, 2, 6)


def test_an_older_table_is_not_taken(tmp_path):
    for name in ("master", "slave"):
        (tmp_path / name).mkdir()
    master = offsets(tmp_path, "master", 2)
    for offset in (1, 2, 3, 4):  # two steps
        master.commit("g", "T", 0, offset, 10)
    theirs = {"T@g": {"0": 9, "1": 5}}
    assert not merge_if_not_older(master, theirs, DataVersion(0, 1, 99))
    assert master.query("g", "T", 0) == 4 and master.query("g", "T", 1) is None
    assert master.data_version == DataVersion(0, 2, 10)


def test_a_newer_or_equal_table_is_taken_and_no_offset_moves_back(tmp_path):
    (tmp_path / "master").mkdir()
    master = offsets(tmp_path, "master", 2)
    master.commit("g", "T", 0, 7, 10)
    master.commit("g", "T", 1, 3, 10)  # steps to counter 1
    equal = master.data_version
    assert merge_if_not_older(master, {"T@g": {"1": 4}}, equal)
    assert master.query("g", "T", 1) == 4 and master.data_version == equal
    newer = DataVersion(0, 5, 50)
    # the acting slave never saw the master's last commit of queue 0 (7): kept
    assert merge_if_not_older(master, {"T@g": {"0": 6, "2": 11}, "U@h": {"0": 1}}, newer)
    assert master.table() == {"T@g": {"0": 7, "1": 4, "2": 11}, "U@h": {"0": 1}}
    assert master.data_version == newer  # now at least as new as what it took


def test_delay_progress_merge_by_version(tmp_path):
    mine = DelayOffsetManager(tmp_path / "m", 1)
    mine.set_delay_offset(3, 5, 1)  # step 1: counter 1
    theirs = {"delay_offsets": {"3": 9}}
    assert not merge_if_not_older(mine, theirs, DataVersion(0, 0, 1))
    assert mine.delay_offset(3) == 5
    assert merge_if_not_older(mine, theirs, DataVersion(0, 4, 2))
    assert mine.delay_offset(3) == 9 and mine.data_version == DataVersion(0, 4, 2)


def test_data_version_from_the_wire():
    assert DataVersion.from_wire(None) == DataVersion()  # a member from before versions
    assert DataVersion.from_wire(
        {"state_version": 0, "counter": 3, "timestamp_ms": 9}
    ) == DataVersion(0, 3, 9)
    for bad in ("x", {"counter": 1}, {"state_version": 0, "counter": "1", "timestamp_ms": 0}):
        with pytest.raises(InvalidArgument):
            DataVersion.from_wire(bad)


def test_a_table_never_changed_is_the_oldest(tmp_path):
    """A master killed before it persisted its offsets starts with an empty table: it must
    not look newer than a member that has them (an initial timestamp of its start did)."""
    (tmp_path / "master").mkdir()
    fresh = offsets(tmp_path, "master", 500)
    assert fresh.data_version == DataVersion(0, 0, 0)
    member = DelayOffsetManager(tmp_path / "member", 5)
    assert member.data_version == DataVersion(0, 0, 0)
    # fewer commits than a step on the acting member: its version is unchanged too
    assert merge_if_not_older(fresh, {"T@g": {"0": 30}}, DataVersion(0, 0, 0))
    assert fresh.query("g", "T", 0) == 30
