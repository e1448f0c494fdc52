"""kill -9 of a broker with ``flush_disk_type = "sync"``: every send answered SEND_OK is
there exactly once after restart, at the offset it was acknowledged with, and the commit
log ends on a record boundary — also when the crash left a partly written record behind."""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import hamq
from hamq import Message
from hamq.errors import HamqError
from hamq.protocol.message import encode_batch, encode_message, encode_record_header
from hamq.store.commitlog import CommitLog

SEGMENT_BYTES = 64 * 1024  # small, so the load crosses several segment rolls
TOPIC = "Crash"
QUEUES = 4
THREADS = 4
MAX_SENDS_PER_THREAD = 3000
ACKS_BEFORE_KILL = 600
LOAD_TIMEOUT_S = 20.0


@dataclass
class Acked:
    records: list[tuple[bytes, int, int, int]] = field(default_factory=list)  # body, q, off, phys
    lock: threading.Lock = field(default_factory=threading.Lock)
    errors: list[BaseException] = field(default_factory=list)


@pytest.fixture
def sync_cluster(cluster_factory):
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(flush_disk_type="sync", mapped_file_size_commitlog=SEGMENT_BYTES)
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic(TOPIC, QUEUES)
    return c


def store_dir(cluster) -> Path:
    return cluster.root / "broker" / "commitlog"


def scan_copy(cluster, tmp_path: Path, name: str) -> tuple[int, int, list]:
    """Open a copy of the broker's commit log (the broker must not be running):
    (valid end, written end, [(offset, record bytes)])."""
    copy = tmp_path / name
    shutil.copytree(store_dir(cluster), copy)
    log = CommitLog(copy, SEGMENT_BYTES)
    try:
        records = [(pos, bytes(raw)) for pos, _, raw in log.iter_records(0)]
        return log.scan_stopped_at, log.written_offset, records
    finally:
        log.close()


def load_then_kill(cluster) -> Acked:
    """Several threads send synchronously (no client retries, so a send is stored at most
    once); the broker is killed with SIGKILL mid-stream; every SEND_OK is recorded."""
    acked = Acked()
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    producer = hamq.Producer(cluster.namesrv, retry_times_when_send_failed=0)

    def worker(tid: int) -> None:
        for i in range(MAX_SENDS_PER_THREAD):
            if time.monotonic() > deadline:
                return
            body = f"t{tid}-{i}:".encode().ljust(200, b"#")
            try:
                result = producer.send(Message(TOPIC, body))
            except HamqError as err:
                acked.errors.append(err)
                return
            if result.status is hamq.SendStatus.SEND_OK:
                with acked.lock:
                    acked.records.append(
                        (
                            body,
                            result.queue.queue_id,
                            result.queue_offset,
                            int(result.msg_id[:16], 16),
                        )
                    )

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(THREADS)]
    try:
        for t in threads:
            t.start()
        while len(acked.records) < ACKS_BEFORE_KILL and time.monotonic() < deadline:
            time.sleep(0.01)
        cluster.procs["broker"].kill9()
        for t in threads:
            t.join(LOAD_TIMEOUT_S)
        assert not any(t.is_alive() for t in threads), "a producer thread hung after the kill"
    finally:
        producer.close()
    assert len(acked.records) >= ACKS_BEFORE_KILL, "load too slow to reach the kill point"
    assert acked.errors, "the kill did not interrupt the load"
    return acked


def assert_all_acked_present(cluster, drain_topic, acked: Acked) -> dict[int, list]:
    got = drain_topic(cluster.namesrv, TOPIC)
    for qid, entries in got.items():
        assert [off for off, _ in entries] == list(range(len(entries))), f"queue {qid} has gaps"
    seen = Counter(body for entries in got.values() for _, body in entries)
    for body, qid, offset, _ in acked.records:
        assert seen[body] == 1, f"acknowledged {body[:12]!r} found {seen[body]} times"
        assert got[qid][offset][1] == body
    return got


def assert_new_sends_work(cluster, got: dict[int, list]) -> list:
    """After recovery each queue continues right after its last recovered message."""
    results = []
    with hamq.Producer(cluster.namesrv) as producer:
        for qid in range(QUEUES):
            mq = hamq.MessageQueue(TOPIC, "broker-a", qid)
            r = producer.send(Message(TOPIC, f"after-{qid}".encode()), mq)
            assert r.status is hamq.SendStatus.SEND_OK
            assert r.queue_offset == len(got[qid])
            results.append(r)
    return results


def test_kill9_loses_no_acknowledged_send(sync_cluster, drain_topic, tmp_path):
    acked = load_then_kill(sync_cluster)
    assert len(list(store_dir(sync_cluster).iterdir())) > 1, "the load never rolled a segment"
    valid_end, _, _ = scan_copy(sync_cluster, tmp_path, "after-kill")
    assert max(phys for *_, phys in acked.records) < valid_end, (
        "an acknowledged record is not intact on disk after kill -9"
    )
    sync_cluster.procs["broker"].start()
    got = assert_all_acked_present(sync_cluster, drain_topic, acked)
    assert_new_sends_work(sync_cluster, got)
    sync_cluster.procs["broker"].stop()
    valid_end, written, _ = scan_copy(sync_cluster, tmp_path, "after-restart")
    assert valid_end == written, "commit log has a torn tail after recovery"


def half_of_last_record(records: list, end: int) -> bytes:
    """The first half of the last record (its header intact, its payload cut)."""
    return records[-1][1][: len(records[-1][1]) // 2]


def header_with_short_payload(records: list, end: int) -> bytes:
    """A well-formed header for the next position, followed by too few payload bytes."""
    payload, crc = encode_batch([encode_message(b"p" * 1000)])
    now = int(time.time() * 1000)
    header = encode_record_header(TOPIC.encode(), 0, len(payload), crc, 1, 10**6, end, now, now)
    return header + payload[:100]


@pytest.mark.parametrize("partial", [half_of_last_record, header_with_short_payload])
def test_partly_written_last_record_is_dropped(sync_cluster, drain_topic, tmp_path, partial):
    acked = load_then_kill(sync_cluster)
    valid_end, written, records = scan_copy(sync_cluster, tmp_path, "after-kill")
    assert valid_end == written
    tail = partial(records, written)
    last = sorted(store_dir(sync_cluster).iterdir())[-1]
    with open(last, "ab") as fh:
        fh.write(tail)
    sync_cluster.procs["broker"].start()
    got = assert_all_acked_present(sync_cluster, drain_topic, acked)
    new = assert_new_sends_work(sync_cluster, got)
    assert int(new[0].msg_id[:16], 16) == written, "the torn tail was not truncated"
    sync_cluster.procs["broker"].stop()
    valid_end, end, records = scan_copy(sync_cluster, tmp_path, "after-restart")
    assert valid_end == end
    assert [pos for pos, _ in records[-QUEUES:]] == [int(r.msg_id[:16], 16) for r in new]
