"""Seeded power losses under the Raft file store, on the simulated disk (``hamq.sim.fs``).

Each seed appends, lets a new leader overwrite an uncommitted suffix with a higher term,
and syncs then saves checkpoints (the order the DLedger driver keeps) over small segments,
then loses power. The store must reopen (under a power loss alone nothing committed and
fsynced is lost, so a refusal is a bug) with every entry up to the saved committed index
intact, terms that never go down, and the same log on a second reopen.
"""
from __future__ import annotations

import logging
import random

import pytest

from hamq.raft import Checkpoint, CorruptLogError, Entry, FileStorage
from hamq.sim.fs import SimDisk

SEEDS = 500


def _entries(rng: random.Random, first: int, term: int) -> list[Entry]:
    return [Entry(first + i, term, bytes([rng.randrange(256)]) * rng.randrange(30))
            for i in range(rng.randrange(1, 5))]


def run_seed(seed: int) -> str | None:
    """What went wrong under ``seed``, or None."""
    rng = random.Random(seed)
    disk = SimDisk()
    segment_bytes = rng.choice([64, 128, 400])
    store = FileStorage("/raft", segment_bytes, disk=disk)
    log: list[Entry] = []
    term, committed, saved_committed = 1, -1, -1
    for _ in range(rng.randrange(5, 60)):
        action = rng.random()
        if action < 0.5:
            new = _entries(rng, len(log), term)
            store.append(new)
            log += new
        elif action < 0.65 and len(log) > committed + 1:
            term += 1  # a new leader replaces what is not committed
            new = _entries(rng, rng.randrange(committed + 1, len(log)), term)
            store.append(new)
            log = log[:new[0].index] + new
        elif action < 0.8:
            store.detach_sync()()
            committed = rng.randrange(committed, len(log))
            store.save_checkpoint(Checkpoint(len(log) - 1, committed))
            saved_committed = committed
        else:
            term += 1
    disk.power_loss(rng)
    try:
        recovered = FileStorage("/raft", segment_bytes, disk=disk).entries_from(0)
    except CorruptLogError as err:
        return f"seed {seed}: refused to open after a power loss: {err}"
    if recovered[:saved_committed + 1] != log[:saved_committed + 1]:
        return f"seed {seed}: entries up to committed index {saved_committed} differ"
    terms = [entry.term for entry in recovered]
    if terms != sorted(terms):
        return f"seed {seed}: terms go down: {terms}"
    disk.kill()
    if FileStorage("/raft", segment_bytes, disk=disk).entries_from(0) != recovered:
        return f"seed {seed}: a second reopen reads differently"
    return None


def test_file_store_recovers_a_valid_prefix_after_any_power_loss(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)  # each seed logs its cuts as warnings
    failures = [r for r in map(run_seed, range(SEEDS)) if r is not None]
    assert failures == []
