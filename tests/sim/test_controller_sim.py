"""Controller mode under the simulator (seed 001): controller peers (``ControllerCore``), a
group of three members on the production HA cores and stores, and clients, over seeds
0..SEEDS-1 on a process pool (but for the seeds of bugs still open); the regression seeds;
and mutations of the production rules showing the checkers catch a broken one."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Set
from concurrent.futures import Future
from pathlib import Path

import pytest

import hamq.controller.decide
from hamq.broker.ha.service import SlaveLink
from hamq.controller.elect import BrokerLiveInfo, ElectResult
from hamq.controller.state import BrokerGroup
from hamq.replication.master import MasterReplication
from hamq.replication.sync_state_set import SyncStateSet
from hamq.sim.controller_world import (
    ControllerResult,
    failed_controller_seeds,
    run_controller_seed,
)
from hamq.store.message_store import MessageStore
from sim.swarm import chunked_seeds

SEEDS = 2000
CHUNKS = 10
REGRESSION_FILE = Path(__file__).with_name("regression_seeds.txt")


def _listed(prefix: str) -> dict[int, str]:
    """Controller-mode lines of regression_seeds.txt: ``<prefix> <seed>  <what broke>``."""
    listed = {}
    for line in REGRESSION_FILE.read_text().splitlines():
        if line.startswith(prefix + " "):
            seed, _, why = line[len(prefix) + 1 :].strip().partition(" ")
            listed[int(seed)] = why.strip()
    return listed


REGRESSION_SEEDS = _listed("#cm")  # bugs fixed: must pass
OPEN_SEEDS = _listed("#cm-open")  # bugs not fixed yet (none now): the swarm lets them fail


def _report(failures: list[ControllerResult]) -> str:
    return "\n".join(
        f"seed {r.seed}: {r.failure} (replay: python -m hamq.sim --mode controller --seed {r.seed})"
        for r in failures
    )


@pytest.fixture(scope="module")
def chunk_futures() -> Iterator[list[Future[list[ControllerResult]]]]:
    with chunked_seeds(failed_controller_seeds, SEEDS, CHUNKS) as futures:
        yield futures


@pytest.fixture(autouse=True)
def quiet_stores():
    """Recovery, cuts and elections log loudly, as they should; here they are noise."""
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_controller_chunk(chunk: int, chunk_futures: list[Future[list[ControllerResult]]]) -> None:
    failures = [r for r in chunk_futures[chunk].result() if r.seed not in OPEN_SEEDS]
    assert not failures, _report(failures)


def test_regression_seeds() -> None:
    failures = [r for r in map(run_controller_seed, REGRESSION_SEEDS) if not r.ok]
    assert not failures, _report(failures)


def test_bug_a_slave_acks_only_fsynced_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug A (see regression_seeds.txt): its seeds pass, and fail again with acknowledged
    messages lost once a slave under sync flush acks what it wrote but did not fsync."""
    bug_a = [seed for seed, why in REGRESSION_SEEDS.items() if why.startswith("bug A")]
    assert bug_a
    failures = [r for r in map(run_controller_seed, bug_a) if not r.ok]
    assert not failures, _report(failures)
    monkeypatch.setattr(
        SlaveLink, "ack_offset", property(lambda self: self.store.commitlog.max_offset)
    )
    failures = [r for r in map(run_controller_seed, bug_a) if not r.ok]
    assert failures and all("acknowledged message" in (r.failure or "") for r in failures), _report(
        failures
    )


def test_same_seed_same_run() -> None:
    assert run_controller_seed(11) == run_controller_seed(11)


def test_seeds_exercise_the_faults_they_check() -> None:
    results = [run_controller_seed(s) for s in range(40)]
    assert all(r.ok for r in results), _report([r for r in results if not r.ok])
    assert sum(r.crashes for r in results) > 40
    assert sum(r.partitions for r in results) > 20
    assert sum(r.elections > 1 for r in results) > 8  # failovers, not only first elections
    assert sum(r.cuts for r in results) > 0  # a member cut a tail its new master lacks
    assert sum(r.read for r in results) > 1000
    assert sum(r.acked for r in results) > 1000


def _failures(count: int) -> list[ControllerResult]:
    """Seeds 0..count-1 that fail (each mutation below is caught well within its count)."""
    return [r for r in map(run_controller_seed, range(count)) if not r.ok]


def test_checker_catches_election_outside_the_sync_state_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The election rule broken: any alive member may win, the SyncStateSet ignored (as
    with enable_elect_unclean_master, but unannounced)."""

    def elect_any_alive(
        group: BrokerGroup,
        alive: Set[int],
        live_info: dict[int, BrokerLiveInfo],
        preferred_id: int | None,
        enable_elect_unclean_master: bool,
    ) -> ElectResult | None:
        candidates = sorted(group.members.keys() & alive)
        if not candidates:
            return None
        if group.master_id in candidates and preferred_id in (None, group.master_id):
            return ElectResult(group.master_id, unclean=False)
        return ElectResult(preferred_id if preferred_id in candidates else candidates[0], False)

    monkeypatch.setattr(hamq.controller.decide, "elect", elect_any_alive)
    failures = _failures(60)
    assert any("acknowledged message" in (r.failure or "") for r in failures), _report(failures)


def test_checker_catches_an_all_ack_that_waits_for_no_member(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """All-ack broken: a send completes before the members of its SyncStateSet hold it."""
    monkeypatch.setattr(MasterReplication, "_all_acked", lambda self: float("inf"))
    failures = _failures(40)
    assert any("acknowledged message" in (r.failure or "") for r in failures), _report(failures)


def test_checker_catches_reads_past_the_confirm_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The read cap broken: consumers read a member's whole log, past the confirm offset."""
    monkeypatch.setattr(MessageStore, "set_read_cap", lambda self, offset: None)
    failures = _failures(120)
    assert any("consumer read was truncated" in (r.failure or "") for r in failures), _report(
        failures
    )


def test_checker_catches_an_unsynchronised_member_in_the_sync_state_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Synchronised gating off (seed 003): a member that joined at the tail, lacking
    records no consumer has consumed, enters the SyncStateSet once caught up."""
    monkeypatch.setattr(SyncStateSet, "holds_needed", lambda self, broker_id: True)
    failures = _failures(20)
    assert any("above the need offset" in (r.failure or "") for r in failures), _report(failures)
