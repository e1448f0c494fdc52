"""The pull path's store cost with checked reads of closed segments (issue 18), in process
and without a network, so the check's price is not lost in socket noise: N messages (batches
of B, S bytes each) written with ``put_batch``, then ``MessageStore.get_messages`` over every
queue (32 messages a call), CPU time, best of 5 — while running, after a reopen (segments
opened from disk are checked on every read until sealed) and after the broker's scrub has
checked and sealed them.

    python bench/store_read.py DIR BATCH SIZE N LABEL
"""

from __future__ import annotations

import shutil
import sys
import time

from hamq.broker.scrub import _check_chunk
from hamq.config import StoreConfig
from hamq.protocol.message import encode_batch, encode_message
from hamq.store.message_store import MessageStore

QUEUES = 4
SEGMENT_BYTES = 16 * 1024 * 1024
ROUNDS = 5


def read_all(store: MessageStore) -> tuple[int, float]:
    """(messages read, best CPU seconds) over ``ROUNDS`` full reads of every queue."""
    best = float("inf")
    got = 0
    for _ in range(ROUNDS):
        started, got = time.process_time(), 0
        for queue in range(QUEUES):
            offset = 0
            while True:
                found = store.get_messages("BenchTopic", queue, offset, 32, 4 << 20)
                if found.status.name != "FOUND":
                    break
                got += found.message_count
                offset = found.next_begin_offset
        best = min(best, time.process_time() - started)
    return got, best


def scrub(store: MessageStore) -> float:
    """What the broker's scrub does to segments opened from disk: check each record, seal."""
    started = time.process_time()
    log = store.commitlog
    for seg in log.segments[:-1]:
        mtime, pos = log.disk.mtime(seg.path), seg.start
        while pos < seg.end:
            checked = _check_chunk(seg.file.dup(), seg.start, pos, seg.end)
            assert not checked.damaged and not checked.unreadable
            pos = checked.next_pos
        assert log.seal(seg, mtime)
    return time.process_time() - started


def main(directory: str, batch: int, size: int, count: int, label: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    config = StoreConfig(
        store_dir=directory, mapped_file_size_commitlog=SEGMENT_BYTES, disk_min_free_bytes=1
    )
    store = MessageStore(config)
    payload, crc = encode_batch([encode_message(b"x" * size)] * batch)
    for i in range(count // batch):
        store.put_batch("BenchTopic", i % QUEUES, payload, batch, crc, 1)
        if i % 64 == 0:
            store.commit()
    store.commit()
    got, best = read_all(store)
    closed = len(store.commitlog.segments) - 1
    print(f"{label} running: {got} msgs {best * 1000:.1f} ms ({closed} closed)")
    store.close()
    store = MessageStore(config)
    try:
        got, best = read_all(store)
        print(f"{label} reopened: {got} msgs {best * 1000:.1f} ms")
        took = scrub(store)
        got, best = read_all(store)
        print(
            f"{label} reopened+scrubbed: {got} msgs {best * 1000:.1f} ms"
            f" (scrub {took * 1000:.0f} ms CPU)"
        )
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
