"""Mirrored-queue policies under the simulator (seed 003): the production reconciler,
the placement driver's checks and the controller's elections over nodes that crash, come
back and are cut off, seeds 0..SEEDS-1 on a process pool; the seeds of the bugs it found;
and mutations of the production rules showing each checker can fail."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

import hamq.controller.decide
import hamq.controller_server.placement as driver
from hamq.replication.sync_state_set import SyncStateSet
from hamq.sim import policy_checkers as checks
from hamq.sim.policy_world import PolicyResult, PolicyWorld, failed_policy_seeds, run_policy_seed
from sim.swarm import chunked_seeds

SEEDS = 500
CHUNKS = 5
# Seeds of bugs found here, fixed: each must pass; the mutation tests below put each bug
# back and these seeds fail again ("replay: python -m hamq.sim --mode policy --seed N").
REGRESSION_SEEDS = {
    57: "F1: REMOVE_BROKER stopped a member elected master after the removal's check",
    202: "F1: the same",
    11: "F3: a placement whose SetTopicGroups never committed stayed writable, untracked",
    21: "F3: the same",
    # F4 (fixed by the driver's c759283; these failed before it, at 70dfafd, then checked
    # every tick): delete + declare again, a retired leftover recorded as the writable group
    265: "F4",
    360: "F4",
    # F5 (found as seed 543): a deposed leader's late DropTopic deleted the topic from its
    # writable group again. The sim's term fence (the driver's) and slow deletes changed
    # every schedule: F1's 75 became 202, F3's 15 and 32 became 11 and 21.
    296: "F5",
}
SCAN = range(200)  # where a mutation must make some seed fail


def _report(failures: list[PolicyResult]) -> str:
    return "\n".join(
        f"seed {r.seed}: {r.failure} (replay: python -m hamq.sim --mode policy --seed {r.seed})"
        for r in failures
    )


@pytest.fixture(scope="module")
def chunk_futures() -> Iterator[list[Future[list[PolicyResult]]]]:
    with chunked_seeds(failed_policy_seeds, SEEDS, CHUNKS) as futures:
        yield futures


@pytest.fixture(autouse=True)
def quiet() -> Iterator[None]:
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_policy_chunk(chunk: int, chunk_futures: list[Future[list[PolicyResult]]]) -> None:
    failures = chunk_futures[chunk].result()
    assert not failures, _report(failures)


def test_regression_seeds() -> None:
    failures = [r for r in map(run_policy_seed, REGRESSION_SEEDS) if not r.ok]
    assert not failures, _report(failures)


def _all_fail(expected: str, seeds: list[int]) -> None:
    """The regression seeds of a bug put back all fail again, as they did before its fix."""
    for seed in seeds:
        result = run_policy_seed(seed)
        assert result.failure is not None and expected in result.failure, _report([result])


def _first_failure(expected: str) -> PolicyResult:
    for seed in SCAN:
        result = run_policy_seed(seed)
        if not result.ok:
            assert result.failure is not None and expected in result.failure, _report([result])
            return result
    raise AssertionError(f"no seed in {SCAN} failed with {expected!r}")


def test_mutation_election_from_outside_the_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller electing any alive member as if synchronised: a mirror that joined at
    the tail (or lags) becomes master, and acknowledged messages are gone."""
    real = hamq.controller.decide.elect

    def elect_any(group, alive, live_info, preferred, unclean):  # type: ignore[no-untyped-def]
        everyone = dataclasses.replace(group, sync_state_set=frozenset(group.members))
        return real(everyone, alive, live_info, preferred, unclean)

    monkeypatch.setattr(hamq.controller.decide, "elect", elect_any)
    _first_failure("is held by no synchronised member")


def test_mutation_set_not_gated_on_need_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tail-joined mirror admitted to the SyncStateSet while consumers still need what it
    never had: elected, it loses acknowledged messages."""
    monkeypatch.setattr(SyncStateSet, "holds_needed", lambda self, broker_id: True)
    _first_failure("is held by no synchronised member")


class StopFirst(PolicyWorld):
    """F1 put back: REMOVE_BROKER (stop, delete the store) before CleanBrokerData."""

    def _remove_member(self, step, seen):  # type: ignore[no-untyped-def]
        key = ("hamq", step.group)
        group = self.state.groups.get(key)
        if group is None or step.broker_id not in group.members:
            return
        if driver.removal_refusal(group, step.broker_id, self.controller_alive(key)):
            raise driver.StepRefused("refused")
        member = self.members.get((step.group, step.broker_id))
        if step.node in seen.alive:
            yield self._delay()
            self._request(step.node)
            if member is not None and not member.removed:
                checks.before_store_deleted(self, member)
                member.removed, member.log = True, []
        yield from super()._remove_member(step, seen)


def test_mutation_stop_before_forgetting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's removal in its old order: its check, then the stop, comes before the
    controller's fence (CleanBrokerData refused for the master of the moment), so a member
    elected in between is stopped and its store deleted."""
    monkeypatch.setattr("hamq.sim.policy_world.PolicyWorld", StopFirst)
    _all_fail("REMOVE_BROKER stopped master", [57, 202])


def test_mutation_untracked_placements_not_collected(monkeypatch: pytest.MonkeyPatch) -> None:
    """F3 put back: a topic created in a group whose SetTopicGroups never committed."""
    real = driver.strays

    def undeclared_only(state, group, held):  # type: ignore[no-untyped-def]
        return driver.Strays(real(state, group, held).undeclared, ())

    monkeypatch.setattr(driver, "strays", undeclared_only)
    _all_fail("is writable in", [11, 21])


def test_mutation_writable_placements_not_recreated(monkeypatch: pytest.MonkeyPatch) -> None:
    """F5 put back: a topic a deposed leader's late delete took from its writable group."""
    monkeypatch.setattr(driver, "unwritable", lambda state, group, perms: ())
    _all_fail("is writable in", [296])


def test_mutation_deleted_topics_not_collected(monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic deleted through the controller (the state only) left in its groups."""
    real = driver.strays

    def untracked_only(state, group, held):  # type: ignore[no-untyped-def]
        return driver.Strays((), real(state, group, held).untracked)

    monkeypatch.setattr(driver, "strays", untracked_only)
    _first_failure("still holds deleted topics")
