"""Master–slave replication under the simulator (seed 000), on the production stores and
HA cores of both sides: seeds 0..SEEDS-1 over a process pool, the regression seeds, and a
mutation per checker showing that it fails when the code it guards is broken."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from hamq.replication.master import HAConnectionState, MasterReplication, Probe
from hamq.sim.master_slave import (
    MasterSlaveResult,
    failed_master_slave_seeds,
    run_master_slave_seed,
)
from hamq.store.commitlog import CommitLog
from hamq.store.message_store import MessageStore
from sim.swarm import chunked_seeds

SEEDS = 1200
CHUNKS = 8
MUTATION_SEEDS = 200  # each mutation below is caught within this many seeds
REGRESSION_FILE = Path(__file__).with_name("regression_seeds.txt")
REGRESSION_PREFIX = "#ms "


def _regression_seeds(bug: str = "") -> list[int]:
    """Master–slave lines of regression_seeds.txt: ``#ms <seed>  <what broke>`` (a comment
    to the Raft replay, which reads the same file); only ``bug``'s when given."""
    return [
        int(fields[0])
        for line in REGRESSION_FILE.read_text().splitlines()
        if line.startswith(REGRESSION_PREFIX)
        for fields in [line[len(REGRESSION_PREFIX) :].split(maxsplit=1)]
        if fields[1].startswith(bug)
    ]


@pytest.fixture(scope="module")
def chunk_futures() -> Iterator[list[Future[list[MasterSlaveResult]]]]:
    with chunked_seeds(failed_master_slave_seeds, SEEDS, CHUNKS) as futures:
        yield futures


@pytest.fixture(autouse=True)
def quiet_stores():
    """Recovery and cuts log loudly, as they should; thousands of them here are noise."""
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_master_slave_chunk(
    chunk: int, chunk_futures: list[Future[list[MasterSlaveResult]]]
) -> None:
    failures = chunk_futures[chunk].result()
    assert not failures, "\n".join(
        f"seed {r.seed}: {r.failure} (replay: python -m hamq.sim --mode master-slave "
        f"--seed {r.seed})"
        for r in failures
    )


def test_same_seed_same_run() -> None:
    assert run_master_slave_seed(17) == run_master_slave_seed(17)


def test_seeds_exercise_the_faults_they_check() -> None:
    results = [run_master_slave_seed(s) for s in range(40)]
    assert sum(r.crashes for r in results) > 40
    assert sum(r.cuts for r in results) > 5  # slaves cut a tail their master lost
    assert sum(r.acked for r in results) > 40 * 50
    assert sum(r.large_records for r in results) > 40  # records larger than the HA window


@pytest.mark.parametrize("seed", _regression_seeds())
def test_regression_seed(seed: int) -> None:
    result = run_master_slave_seed(seed)
    assert result.ok, result.failure


def _first_failure(match: str) -> MasterSlaveResult:
    for seed in range(MUTATION_SEEDS):
        result = run_master_slave_seed(seed)
        if not result.ok:
            assert match in result.failure, result.failure
            return result
    pytest.fail(f"no seed of {MUTATION_SEEDS} caught the mutation")


def _compare_offsets_only(monkeypatch) -> None:
    """Defect 2 back: the handshake checks where records are, not what they hold."""
    monkeypatch.setattr(Probe, "__eq__", lambda a, b: isinstance(b, Probe) and a.offset == b.offset)


def test_divergence_checker_catches_a_handshake_without_content_check(monkeypatch) -> None:
    _compare_offsets_only(monkeypatch)
    _first_failure("diverged from its master")


def test_regression_seeds_reproduce_defect_2(monkeypatch) -> None:
    _compare_offsets_only(monkeypatch)
    for seed in _regression_seeds("bug 4:"):
        result = run_master_slave_seed(seed)
        assert not result.ok and "diverged" in result.failure, seed


def test_held_checker_catches_acks_counted_before_the_slave_has_the_bytes(monkeypatch) -> None:
    def acked_by_sent(self, offset):  # the bug: count what was shipped, not what was acked
        return sum(
            1
            for s in self.slaves.values()
            if s.state is HAConnectionState.TRANSFER and s.sent_offset >= offset
        )

    monkeypatch.setattr(MasterReplication, "_acked_by", acked_by_sent)
    _first_failure("members hold it")


def test_catch_up_checker_catches_a_window_counted_in_whole_records(monkeypatch) -> None:
    """The window counted from the slave's ack (whole records only), not from what it
    received: a record larger than the window stops the slave's stream for good."""
    on_ack = MasterReplication.on_ack

    def whole_records_only(self, key, ack_offset, now_ms, received_offset=None, log_start=None):
        return on_ack(self, key, ack_offset, now_ms, log_start=log_start)

    monkeypatch.setattr(MasterReplication, "on_ack", whole_records_only)
    _first_failure("holds the log up to")


def test_queue_checker_catches_a_cut_that_keeps_queue_entries(monkeypatch) -> None:
    monkeypatch.setattr(
        MessageStore, "truncate_to", lambda self, offset: self.commitlog.truncate(offset)
    )
    _first_failure("queue")


def test_readable_checker_catches_a_sync_flush_that_never_fsyncs(monkeypatch) -> None:
    monkeypatch.setattr(CommitLog, "flush", lambda self: self.flushed_offset)
    _first_failure("lost or changed after recovery")


def test_regression_seeds_reproduce_bug_7(monkeypatch) -> None:
    """Retention whose segment removals a power loss can undo fails every bug 7 seed."""
    removes = CommitLog.delete_segments_before

    def unsynced_removal(self, mtime_s):
        fsync_dir, self.disk.fsync_dir = self.disk.fsync_dir, lambda path: None
        try:
            return removes(self, mtime_s)
        finally:
            self.disk.fsync_dir = fsync_dir

    monkeypatch.setattr(CommitLog, "delete_segments_before", unsynced_removal)
    for seed in _regression_seeds("bug 7:"):
        assert not run_master_slave_seed(seed).ok, seed
