"""The synchronous DLedger core on real files: a failed apply pauses the member and resumes
from the same command once the cause clears (no entry skipped or applied twice), and a
clean restart re-applies nothing."""

from __future__ import annotations

import dataclasses
import errno
import random
from pathlib import Path

import pytest

from hamq.broker.dledger.core import APPLY_RETRY_MS, PERSIST_RETRY_MS, DLedgerCore
from hamq.broker.dledger.wire import KIND_DELETE_TOPIC, KIND_TOPIC, encode_command, encode_entry
from hamq.broker.role import BrokerRole, RoleState
from hamq.broker.topics import TopicService
from hamq.config import StoreConfig
from hamq.errors import NotLeader
from hamq.protocol.message import decode_records, encode_batch, encode_message
from hamq.raft import FileStorage, RaftConfig
from hamq.store.message_store import GetStatus, MessageStore

TICK_MS = 10
ROOMY = dict(disk_min_free_bytes=0, disk_max_used_space_ratio=1.0)


class Member:
    """A one-member group on `root`, driven by hand with a virtual clock."""

    def __init__(self, root: Path, **store_settings) -> None:
        self.config = StoreConfig(
            store_dir=str(root / "store"),
            mapped_file_size_commitlog=1 << 20,
            **{**ROOMY, **store_settings},
        )
        self.store = MessageStore(self.config)
        self.storage = FileStorage(root / "raft")
        self.now_ms = 0
        self.core = DLedgerCore(
            RaftConfig(1, (1,)),
            self.storage,
            self.store,
            TopicService(
                self.store,
                RoleState(BrokerRole.SLAVE, 1),
                default_queue_nums=4,
                auto_create=False,
                on_change=lambda: None,
            ),
            random.Random(1),
            self.now_ms,
            sync_appends=False,
            send=lambda msgs: None,
            on_applied=lambda arrived: None,
            not_leader=NotLeader,
        )
        self.answers: list[tuple[int, object]] = []  # (send number, result or error)

    def run(self, ms: int) -> None:
        for _ in range(ms // TICK_MS):
            self.now_ms += TICK_MS
            self.core.tick(self.now_ms)
            while self.core.run_cycle(self.now_ms):
                pass

    def elect(self) -> None:
        for _ in range(50):
            if self.core.is_leader:
                return
            self.run(100)
        raise AssertionError("a one-member group did not elect itself")

    def send(self, number: int) -> None:
        payload, crc = encode_batch([encode_message(b"m%d" % number)])
        self.core.propose(
            encode_entry("T", 0, 1, crc, 0, 0, payload),
            lambda result, err: self.answers.append((number, result or err)),
        )

    def bodies(self) -> list[tuple[int, bytes]]:
        r = self.store.get_messages("T", 0, 0, 1000, 1 << 24)
        if r.status is not GetStatus.FOUND:
            return []
        return decode_records(r.records, 0, lambda h, index, off, props, body: (off, body))

    def set_store(self, **settings) -> None:
        self.store.config = dataclasses.replace(self.config, **settings)
        self.store.check_disk()

    def flush_raft_log(self) -> None:
        job = self.core.begin_flush()
        self.core.run_flush(job)
        self.core.flush_done(job)

    def checkpoint(self) -> None:
        """What the store's flush services do: fsync, then checkpoint (the claim)."""
        self.flush_raft_log()
        self.store.commitlog.flush()
        self.store.flush_consume_queues()

    def close(self) -> None:
        self.flush_raft_log()
        self.storage.close()
        self.store.close()


@pytest.fixture
def member(tmp_path):
    m = Member(tmp_path)
    m.elect()
    yield m
    m.close()


def test_a_refused_write_pauses_applying_and_a_retry_resumes_at_the_same_entry(member):
    for i in range(3):
        member.send(i)
    member.run(50)
    member.set_store(disk_min_free_bytes=1 << 62)  # the disk guard refuses every write
    for i in range(3, 8):
        member.send(i)
        member.run(TICK_MS)
    status = member.core.status()
    assert "disk nearly full" in status["apply_error"]
    assert status["applied_index"] < status["committed_index"]
    assert [n for n, _ in member.answers] == [0, 1, 2]  # the rest wait for their apply
    member.run(APPLY_RETRY_MS * 2)  # retries while the cause persists change nothing
    assert len(member.bodies()) == 3 and member.core.status()["apply_error"]

    member.set_store(**ROOMY)
    member.run(APPLY_RETRY_MS + TICK_MS)
    assert member.core.status()["apply_error"] == ""
    assert member.bodies() == [(i, b"m%d" % i) for i in range(8)]
    assert sorted(n for n, _ in member.answers) == list(range(8))  # each answered once
    assert [r.base_queue_offset for _, r in sorted(member.answers)] == list(range(8))


def fail_next_log_write(store: MessageStore) -> list[int]:
    """The store's next commit-log write fails with ENOSPC; the list records that it did."""
    real_write = store.commitlog.write_pending
    failures: list[int] = []

    def fail_once() -> None:
        if not failures:
            failures.append(1)
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write()

    store.commitlog.write_pending = fail_once  # type: ignore[method-assign]
    return failures


def test_a_failed_log_write_is_undone_and_applied_again_from_the_last_commit(member):
    member.send(0)
    member.run(50)
    failures = fail_next_log_write(member.store)
    # one entry: a send, a topic change, a send — the failure hits the last write
    member.core.propose(
        encode_command([KIND_TOPIC, "U", 1, 1, 6]),
        lambda result, err: member.answers.append((-1, err)),
    )
    member.send(1)
    member.run(TICK_MS)
    assert failures and member.core.status()["apply_error"]
    member.store.check_disk()  # the store refuses writes until its next disk check
    member.run(APPLY_RETRY_MS + TICK_MS)
    assert member.core.status()["apply_error"] == ""
    assert member.bodies() == [(0, b"m0"), (1, b"m1")]
    assert sorted(n for n, _ in member.answers) == [-1, 0, 1]
    assert "U" in member.store.topics.topics


def test_a_failed_roll_undoes_the_sends_before_it_and_they_are_applied_again(member):
    """A send that rolls the segment writes the entry's earlier sends first: when that
    fails they are undone too, so applying goes back to the last commit (resuming at the
    failed send lost the one before it, which every other member stored)."""
    member.send(0)
    member.run(50)
    record = member.store.commitlog.written_offset
    member.store.commitlog.segment_bytes = record * 5 // 2  # the third send rolls
    failures = fail_next_log_write(member.store)
    member.send(1)
    member.send(2)
    member.run(TICK_MS)
    assert failures and "earlier uncommitted writes" in member.core.status()["apply_error"]
    member.store.check_disk()  # the store refuses writes until its next disk check
    member.run(APPLY_RETRY_MS + TICK_MS)
    assert member.core.status()["apply_error"] == ""
    assert member.bodies() == [(i, b"m%d" % i) for i in range(3)]
    assert [r.base_queue_offset for _, r in sorted(member.answers)] == [0, 1, 2]


def test_a_clean_restart_reapplies_nothing(tmp_path):
    m = Member(tmp_path)
    m.elect()
    for i in range(20):
        m.send(i)
        m.run(TICK_MS)
    applied = m.core.applied_index
    m.close()
    again = Member(tmp_path)
    assert again.core.recovery.applied_index == applied
    assert again.core.recovery.cut_bytes == 0
    assert again.bodies() == [(i, b"m%d" % i) for i in range(20)]
    again.close()


def test_a_topic_delete_waits_until_the_store_claims_every_entry_before_it(member):
    """Applied earlier, a restart would apply the sends before it again to a topic whose
    queues are gone (other queue offsets, other bytes than the other members')."""
    for i in range(3):
        member.send(i)
    member.core.propose(
        encode_command([KIND_DELETE_TOPIC, "T"]),
        lambda result, err: member.answers.append((-1, err)),
        alone=True,
    )
    member.run(100)
    assert member.core.status()["waiting_for_claim"] > 0
    assert len(member.bodies()) == 3 and -1 not in dict(member.answers)
    member.checkpoint()
    member.run(TICK_MS)
    assert member.core.status()["waiting_for_claim"] == -1
    assert member.bodies() == [] and dict(member.answers)[-1] is None


def test_a_failed_raft_log_write_is_written_again_and_nothing_waits_for_a_restart(tmp_path):
    """A full disk fails the Raft log's append too: the member must not wedge (the next
    Ready on top of the unwritten one) but write the same Ready again until it succeeds."""
    member = Member(tmp_path)
    member.elect()
    member.send(0)
    member.run(50)
    real_append = member.storage.append
    failures = []

    def fail_twice(entries) -> None:
        if len(failures) < 2:
            failures.append(1)
            raise OSError(errno.ENOSPC, "No space left on device")
        real_append(entries)

    member.storage.append = fail_twice  # type: ignore[method-assign]
    member.send(1)
    member.run(TICK_MS)
    assert "No space left" in member.core.status()["persist_error"]
    member.send(2)
    member.run(PERSIST_RETRY_MS + TICK_MS)  # the first retry fails as well
    assert len(failures) == 2 and [n for n, _ in member.answers] == [0]
    member.run(PERSIST_RETRY_MS + TICK_MS)
    assert member.core.status()["persist_error"] == ""
    assert member.bodies() == [(i, b"m%d" % i) for i in range(3)]
    assert sorted(n for n, _ in member.answers) == [0, 1, 2]
    member.close()
    again = Member(tmp_path)
    assert again.bodies() == [(i, b"m%d" % i) for i in range(3)]
    again.close()
