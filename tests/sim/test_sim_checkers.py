"""Each store-level checker of the simulator can fail: a core or store with a known bug
planted in it makes some seeds fail with that checker's message (issue 10: a checker that
never fails proves nothing)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import msgpack
import pytest

from hamq.broker.dledger import core
from hamq.broker.dledger.wire import KIND_SEND
from hamq.raft import RaftConfig
from hamq.raft.storage import persist
from hamq.sim import run_seed, world
from hamq.store import message_store
from hamq.store.consume_queue import ConsumeQueue
from hamq.store.message_store import PutResult

SEEDS = 100
DEFECT_1_SEED = 1  # these two are kept in regression_seeds.txt
DELETE_BARRIER_SEED = 271


class _Everything:
    """A field list that contains every field."""

    def __contains__(self, name: object) -> bool:
        return True


def _some_seed_fails(check: Callable[[str], bool], seeds: range = range(SEEDS)) -> bool:
    """Whether a seed fails with a failure `check` accepts (stops at the first)."""
    return any(r.failure is not None and check(r.failure) for r in map(run_seed, seeds))


def test_a_claim_past_the_fsynced_offset_is_caught(monkeypatch):
    """The store claims applied bytes a power loss can take: the restart finds less."""
    monkeypatch.setattr(
        core.DLedgerCore,
        "_claimable",
        lambda self, mark, durable_offset: mark[0] <= self.durable_committed_index,
    )
    assert _some_seed_fails(lambda f: "lost data it had fsynced" in f)


def test_the_old_recovery_that_forgot_the_claim_is_caught(monkeypatch):
    """Defect 1: the store's own recovery rewrote its checkpoint without the DLedger claim,
    so every restart re-applied the whole log."""
    monkeypatch.setattr(message_store, "_OWN_FIELDS", _Everything())
    failure = run_seed(DEFECT_1_SEED).failure
    assert failure is not None and "its store claimed" in failure


def test_an_acknowledgement_before_commit_is_caught(monkeypatch):
    """Answering a send when it is proposed, with where the leader expects it to land."""
    propose = core.DLedgerCore.propose

    def eager(self, command, callback):
        propose(self, command, lambda result, err: None)
        meta = msgpack.unpackb(command[1])
        if meta[0] == KIND_SEND:
            callback(
                PutResult(
                    self.store.commitlog.max_offset, self.store.max_offset(meta[1], meta[2]), 0, 0
                ),
                None,
            )

    monkeypatch.setattr(core.DLedgerCore, "propose", eager)
    assert _some_seed_fails(lambda f: "lost acknowledged send" in f)


def test_queues_that_keep_entries_past_a_cut_are_caught(monkeypatch):
    monkeypatch.setattr(ConsumeQueue, "drop_from_physical", lambda self, offset: None)
    assert _some_seed_fails(lambda f: f.startswith("SafetyViolation: queue"))


def test_members_stamping_records_with_their_own_clock_are_caught(monkeypatch):
    """Every member must write the leader's store timestamp, or the bytes differ."""
    apply_command = core.DLedgerCore._apply_command

    def own_clock(self, meta, data, arrived):
        if meta[0] == KIND_SEND:
            meta = [*meta[:6], self.store.clock_ms()]
        return apply_command(self, meta, data, arrived)

    monkeypatch.setattr(core.DLedgerCore, "_apply_command", own_clock)
    assert _some_seed_fails(lambda f: "commit log of nodes" in f)


def test_a_topic_delete_applied_before_the_store_claims_what_precedes_it_is_caught(monkeypatch):
    """After a restart the sends before the delete were applied again to a topic whose
    queues were gone: other queue offsets, other bytes."""
    monkeypatch.setattr(core.DLedgerCore, "_must_wait_for_claim", lambda self, entry: False)
    failure = run_seed(DELETE_BARRIER_SEED).failure
    assert failure is not None and "differ" in failure


DISK_WIPE_SEEDS = (41, 54, 72, 96, 171)  # bug 8 in regression_seeds.txt


def test_a_wiped_member_that_votes_at_once_is_caught(monkeypatch):
    monkeypatch.setattr(world, "RaftConfig", functools.partial(RaftConfig, empty_disk_guard=False))
    for seed in DISK_WIPE_SEEDS:
        failure = run_seed(seed).failure
        assert failure is not None and "lacks committed entry" in failure, (seed, failure)


DISK_FULL_SEEDS = (15, 19)  # bug 9 in regression_seeds.txt


def test_a_failed_raft_log_write_that_escapes_the_core_is_caught(monkeypatch):
    def persist_or_raise(self, cycle):  # the old core: the error leaves the Ready cycle
        persist(self.storage, cycle.ready, checkpoint=False, sync=cycle.fsync)
        return True

    monkeypatch.setattr(core.DLedgerCore, "persist", persist_or_raise)
    for seed in DISK_FULL_SEEDS:
        with pytest.raises(OSError, match="No space left"):
            run_seed(seed)
