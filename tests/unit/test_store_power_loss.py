"""Seeded power losses under the message store, on the simulated disk (``hamq.sim.fs``).

Each seed appends to two queues across segment rolls, flushes, checkpoints, cuts the log at
a record boundary and kills the process at random, then loses power. The store must reopen
(under a power loss alone it has lost nothing it confirmed, so a refusal is a bug), every
message whose record ends at or below the checkpoint's fsynced offset must read back at
its queue offset, nothing may read back different from what was written there, and a
second reopen must find the same messages.
"""

from __future__ import annotations

import logging
import random

import pytest

from hamq.config import StoreConfig
from hamq.protocol.message import decode_records, encode_batch, encode_message
from hamq.sim.fs import SimDisk
from hamq.store.message_store import GetStatus, MessageStore

SEEDS = 500
QUEUES = 2
Written = dict[tuple[int, int], tuple[bytes, int]]  # (queue, queue offset) -> (body, end)


def read_queue(store: MessageStore, queue_id: int) -> dict[int, bytes]:
    offset, got = store.min_offset("T", queue_id), {}
    while True:
        r = store.get_messages("T", queue_id, offset, 32, 1 << 20)
        if r.status is not GetStatus.FOUND:
            return got
        got.update(
            decode_records(r.records, offset, lambda h, index, off, props, body: (off, body))
        )
        offset = r.next_begin_offset


def _put_some(store: MessageStore, rng: random.Random, written: Written) -> None:
    for _ in range(rng.randrange(1, 4)):
        queue_id = rng.randrange(QUEUES)
        body = f"m{len(written)}".encode().ljust(rng.randrange(10, 300), b".")
        payload, crc = encode_batch([encode_message(body)])
        put = store.put_batch("T", queue_id, payload, 1, crc, 0)
        written[(queue_id, put.base_queue_offset)] = (body, put.end_offset)
    store.commit()


def _cut_somewhere(store: MessageStore, rng: random.Random, written: Written) -> Written:
    queue = store.queues.get(("T", 0))
    if queue is None or not len(queue):
        return written
    cut = queue.phys[rng.randrange(len(queue))]
    store.truncate_to(cut)
    return {key: value for key, value in written.items() if value[1] <= cut}


def run_seed(seed: int) -> str | None:
    """What went wrong under ``seed``, or None."""
    rng = random.Random(seed)
    disk = SimDisk()
    config = StoreConfig(
        store_dir="/store", mapped_file_size_commitlog=rng.choice([1024, 2048, 4096])
    )
    store = MessageStore(config, disk=disk)
    written: Written = {}
    for _ in range(rng.randrange(5, 80)):
        action = rng.random()
        if action < 0.6:
            _put_some(store, rng, written)
        elif action < 0.75:
            store.commitlog.flush()
        elif action < 0.85:
            store.flush_consume_queues()
        elif action < 0.92:
            written = _cut_somewhere(store, rng, written)
        else:
            disk.kill()
            store = MessageStore(config, disk=disk)
    durable = store.read_checkpoint().get("flushed", 0)
    disk.power_loss(rng)
    try:
        store = MessageStore(config, disk=disk)
    except Exception as err:  # noqa: BLE001 - any refusal is the finding
        return f"seed {seed}: refused to open after a power loss: {err!r}"
    got = {queue_id: read_queue(store, queue_id) for queue_id in range(QUEUES)}
    for (queue_id, offset), (body, end) in written.items():
        found = got[queue_id].get(offset)
        if end <= durable and found != body:
            return (
                f"seed {seed}: queue {queue_id} offset {offset} fsynced (ends at {end}, "
                f"checkpoint {durable}) but reads {found!r}"
            )
        if found is not None and found != body:
            return f"seed {seed}: queue {queue_id} offset {offset} reads other bytes"
    disk.kill()
    again = MessageStore(config, disk=disk)
    if {queue_id: read_queue(again, queue_id) for queue_id in range(QUEUES)} != got:
        return f"seed {seed}: a second reopen reads differently"
    return None


def test_store_recovers_a_valid_prefix_after_any_power_loss(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.ERROR)  # each seed logs its cuts as warnings
    failures = [r for r in map(run_seed, range(SEEDS)) if r is not None]
    assert failures == []
