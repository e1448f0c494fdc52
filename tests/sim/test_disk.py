"""The simulated disk loses unsynced writes on a crash, keeping at most a prefix."""

from __future__ import annotations

import random

from hamq.raft import Checkpoint, Entry, HardState
from hamq.sim.disk import SimDisk


def test_synced_writes_survive_a_crash() -> None:
    disk = SimDisk()
    disk.save_hard_state(HardState(2, 1))
    disk.append([Entry(0, 2, b"a")])
    disk.sync()
    disk.crash(random.Random(0))
    assert disk.load_hard_state() == HardState(2, 1)
    assert disk.entries_from(0) == [Entry(0, 2, b"a")]


def test_a_crash_keeps_a_prefix_of_unsynced_writes() -> None:
    outcomes = set()
    for seed in range(50):
        disk = SimDisk()
        disk.save_hard_state(HardState(1, 1))
        disk.append([Entry(0, 1, b"a")])
        disk.save_checkpoint(Checkpoint(0, 0))
        kept = disk.crash(random.Random(seed))
        state = (disk.load_hard_state() != HardState(), disk.last_index() == 0,
                 disk.load_checkpoint() != Checkpoint())
        # writes land in order: a later one survives only if every earlier one did
        assert state == tuple(i < kept for i in range(3))
        outcomes.add(kept)
    assert outcomes == {0, 1, 2, 3}
