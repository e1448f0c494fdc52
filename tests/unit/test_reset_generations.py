"""An offset reset reaches the other members (issue 17): members merge offsets never moving
one back, but a ``topic@group`` reset under a newer generation moves them back; an equal
or older generation (a stale copy) still cannot rewind a live group."""

from __future__ import annotations

import pytest

from hamq.errors import InvalidArgument
from hamq.store.metadata import (
    ConsumerOffsetManager,
    DataVersion,
    reset_generations_from_wire,
)

VERSION = DataVersion(0, 1, 1)


def member(tmp_path, name: str) -> ConsumerOffsetManager:
    (tmp_path / name).mkdir(exist_ok=True)
    return ConsumerOffsetManager(tmp_path / name, 1)


def sync(slave: ConsumerOffsetManager, master: ConsumerOffsetManager) -> None:
    """What slave sync sends and takes (GET_ALL_CONSUMER_OFFSET's body and ext)."""
    slave.merge(master.table(), master.data_version, master.reset_generations())


def test_a_reset_moves_a_slave_back_and_a_stale_copy_does_not(tmp_path):
    master, slave = member(tmp_path, "master"), member(tmp_path, "slave")
    master.commit("g", "T", 0, 50, 10)
    master.commit("g", "T", 1, 40, 10)
    sync(slave, master)
    stale = (dict(master.table()["T@g"]), master.reset_generations().copy())
    master.reset("g", "T", {0: 5, 1: 0}, 1000)
    sync(slave, master)
    assert slave.table()["T@g"] == {"0": 5, "1": 0}
    # the consumers go on from the reset; a copy of the reset's own generation taken
    # before their commits cannot rewind them
    slave.commit("g", "T", 0, 6, 1001)
    slave.merge({"T@g": {"0": 5, "1": 0}, "U@h": {"0": 3}}, VERSION, master.reset_generations())
    assert slave.table()["T@g"] == {"0": 6, "1": 0}
    assert slave.query("h", "U", 0) == 3  # groups never reset merge as before
    # a master that restarted from a file older than its reset is still followed on
    slave.merge({"T@g": stale[0]}, VERSION, stale[1])
    assert slave.table()["T@g"] == {"0": 50, "1": 40}


def test_generations_only_grow_and_persist_with_the_offsets(tmp_path):
    master = member(tmp_path, "master")
    master.reset("g", "T", {0: 3}, 1000)
    master.reset("g", "T", {0: 2}, 900)  # a member whose clock is behind the last one's
    generation = master.reset_generations()["T@g"]
    assert generation > 1000  # after the last one, whatever the clock says
    master.persist()
    reopened = ConsumerOffsetManager(tmp_path / "master", 1)
    assert reopened.reset_generations() == {"T@g": generation}
    assert reopened.query("g", "T", 0) == 2
    reopened.delete_topic("T", 2000)
    assert reopened.reset_generations() == {}


def test_a_new_master_continues_from_the_generation_it_took(tmp_path):
    old, new = member(tmp_path, "old"), member(tmp_path, "new")
    old.reset("g", "T", {0: 0}, 5000)
    sync(new, old)
    new.commit("g", "T", 0, 9, 5001)
    new.reset("g", "T", {0: 1}, 10)  # its clock far behind: still a newer generation
    sync(old, new)
    assert old.query("g", "T", 0) == 1


def test_damaged_generations_in_the_file_are_dropped_not_fatal(tmp_path):
    master = member(tmp_path, "master")
    master.commit("g", "T", 0, 4, 10)
    master.persist()
    path = tmp_path / "master" / "consumer_offsets.json"
    path.write_text(path.read_text().replace('"reset_generations": {}', '"reset_generations": [1]'))
    reopened = ConsumerOffsetManager(tmp_path / "master", 1)
    assert reopened.reset_generations() == {} and reopened.query("g", "T", 0) == 4
    reopened.reset("g", "T", {0: 0}, 20)  # usable again
    assert reopened.reset_generations()["T@g"] >= 20


@pytest.mark.parametrize("raw", [[], {"T@g": "1"}, {"T@g": 1.5}, {"T@g": True}, "x"])
def test_bad_generations_from_a_member_are_refused(raw):
    with pytest.raises(InvalidArgument, match="reset_generations"):
        reset_generations_from_wire(raw)


def test_a_member_that_predates_generations_sends_none():
    assert reset_generations_from_wire(None) == {}


def test_a_commit_of_the_old_position_landing_after_the_reset_does_not_stand(tmp_path):
    """A push consumer's commit in flight when the reset ran lands after it; the consumer
    then commits the reset offset again (client/push.py). A slave that synced in between
    must take that move back too."""
    master, slave = member(tmp_path, "master"), member(tmp_path, "slave")
    master.commit("g", "T", 0, 50, 10)
    master.reset("g", "T", {0: 0}, 1000)
    master.commit("g", "T", 0, 50, 1001)  # the old position, sent before the notice
    sync(slave, master)
    master.commit("g", "T", 0, 0, 1002)  # the consumer took the notice
    sync(slave, master)
    assert slave.query("g", "T", 0) == 0
