"""A slave's log restart (``MessageStore.reset_log``: a tail join at the master's end, a
sync-queue restart below the log's start) crashed at every step, then restarted or
power-lost: the store opens and reads the empty new log, or the old one (its first
segments possibly gone, as retention removes them: the slave then attaches again from
there), never records of one log under the other's offsets; its epochs claim nothing past
the log's end."""

from __future__ import annotations

import random

import pytest

from hamq.config import StoreConfig
from hamq.protocol.message import encode_batch, encode_message
from hamq.sim.fs import ProcessCrash, SimDisk
from hamq.store.message_store import MessageStore
from helpers import read_queue

END = 1 << 62  # past every queue offset


def filled(disk: SimDisk, log_start: int) -> tuple[MessageStore, dict]:
    """A slave's store whose log (of epoch 1) starts at ``log_start``, with 40 messages."""
    config = StoreConfig(store_dir="/store", mapped_file_size_commitlog=2048)
    store = MessageStore(config, lambda: 0, disk=disk)
    if log_start:
        store.reset_log(0, log_start)
    store.epochs.append(1, log_start)
    for i in range(40):
        payload, crc = encode_batch([encode_message(f"m{i}".encode().ljust(100, b"."))])
        store.put_batch("T", i % 2, payload, 1, crc, 0)
        store.commit()
    store.commitlog.flush()
    store.flush_consume_queues()
    before = {q: read_queue(store, "T", q) for q in (0, 1)}
    return store, before


@pytest.mark.parametrize("where", ["tail", "lower"])
@pytest.mark.parametrize("power_loss", [False, True])
def test_a_log_restart_crashed_at_any_step_leaves_the_old_log_or_the_new_one(where, power_loss):
    for steps in range(40):
        disk = SimDisk(clock=lambda: 0.0)
        # tail: a member joins at its master's end; lower: sync-queue restarts it below
        store, before = filled(disk, 0 if where == "tail" else 8192)
        log_start = store.commitlog.min_offset
        start = store.commitlog.max_offset + 4096 if where == "tail" else 4096
        disk.crash_after(steps)
        try:
            store.reset_log(log_start, start)
        except ProcessCrash:
            pass
        else:
            disk.kill()
            break
        finally:
            disk.steps_to_crash = None
        if power_loss:
            disk.power_loss(random.Random(steps))
        else:
            disk.kill()
        store = MessageStore(store.config, lambda: 0, disk=disk)
        found = {q: read_queue(store, "T", q) for q in (0, 1)}
        log_min, log_max = store.commitlog.min_offset, store.commitlog.max_offset
        if (log_min, log_max) == (start, start):  # restarted
            assert found == {0: {}, 1: {}}, (steps, found)
        else:  # the old log, or its end with segments removed (as retention removes them)
            for q, messages in found.items():
                first = min(messages, default=END)
                assert messages == {o: b for o, b in before[q].items() if o >= first}, steps
        for entry in store.epochs.entries():
            assert entry.start_offset <= log_max, (steps, store.epochs.entries(), log_max)
    else:
        raise AssertionError("the restart never finished")
