"""Seeded power losses under the Raft file store, on the simulated disk (``hamq.sim.fs``).

Each seed appends, lets a new leader overwrite an uncommitted suffix with a higher term,
and syncs then saves checkpoints (the order the DLedger driver keeps) over small segments;
the process crashes now and then, between steps or at any write, fsync, creation, removal
or rename inside one (``SimDisk.crash_after``), and restarts after a kill or a power loss
with every entry a returned sync covered; at the end it loses power. The store must reopen
(under a crash or a power loss alone nothing committed and fsynced is lost, so a refusal
is a bug) with every entry up to the saved committed index intact, terms that never go
down, and the same log on a second reopen.
"""

from __future__ import annotations

import logging
import random

import pytest

from hamq.raft import Checkpoint, CorruptLogError, Entry, FileStorage
from hamq.sim.fs import ProcessCrash, SimDisk

SEEDS = 500


def _entries(rng: random.Random, first: int, term: int) -> list[Entry]:
    return [
        Entry(first + i, term, bytes([rng.randrange(256)]) * rng.randrange(30))
        for i in range(rng.randrange(1, 5))
    ]


def run_seed(seed: int) -> str | None:
    """What went wrong under ``seed``, or None."""
    rng = random.Random(seed)
    disk = SimDisk()
    segment_bytes = rng.choice([64, 128, 400])
    store = FileStorage("/raft", segment_bytes, disk=disk)
    log: list[Entry] = []
    # synced: entries a returned sync made durable (a follower acknowledges them)
    term, committed, saved_committed, synced = 1, -1, -1, 0
    for _ in range(rng.randrange(5, 60)):
        action = rng.random()
        if rng.random() < 0.1:
            disk.crash_after(rng.randrange(8))
        try:
            if action < 0.5:
                new = _entries(rng, len(log), term)
                store.append(new)
                log += new
            elif action < 0.65 and len(log) > committed + 1:
                term += 1  # a new leader replaces what is not committed
                new = _entries(rng, rng.randrange(committed + 1, len(log)), term)
                synced = min(synced, new[0].index)
                store.append(new)
                log = log[: new[0].index] + new
            elif action < 0.8:
                store.detach_sync()()
                synced = len(log)
                committed = rng.randrange(committed, len(log))
                store.save_checkpoint(Checkpoint(len(log) - 1, committed))
                saved_committed = committed
            elif action < 0.9:
                term += 1
            else:
                raise ProcessCrash("killed between two steps")
        except ProcessCrash:
            if rng.random() < 0.5:
                disk.power_loss(rng)
            else:
                disk.kill()
            try:
                store = FileStorage("/raft", segment_bytes, disk=disk)
            except CorruptLogError as err:
                return f"seed {seed}: refused to open after a crash: {err}"
            recovered = store.entries_from(0)
            if recovered[:synced] != log[:synced]:
                return f"seed {seed}: entries a sync returned for were lost by a crash"
            log, synced = recovered, len(recovered)  # the reopen synced what it found
            term += 1
        else:
            disk.steps_to_crash = None
    disk.power_loss(rng)
    try:
        recovered = FileStorage("/raft", segment_bytes, disk=disk).entries_from(0)
    except CorruptLogError as err:
        return f"seed {seed}: refused to open after a power loss: {err}"
    if recovered[: max(saved_committed + 1, synced)] != log[: max(saved_committed + 1, synced)]:
        return (
            f"seed {seed}: entries up to committed index {saved_committed} or synced "
            f"{synced} differ"
        )
    terms = [entry.term for entry in recovered]
    if terms != sorted(terms):
        return f"seed {seed}: terms go down: {terms}"
    disk.kill()
    if FileStorage("/raft", segment_bytes, disk=disk).entries_from(0) != recovered:
        return f"seed {seed}: a second reopen reads differently"
    return None


def test_file_store_recovers_a_valid_prefix_after_any_power_loss(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)  # each seed logs its cuts as warnings
    failures = [r for r in map(run_seed, range(SEEDS)) if r is not None]
    assert failures == []
