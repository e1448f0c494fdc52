"""The master–slave replication core under the simulator (seed 000): an acknowledged send
under needAckNums = k is held by k members, across hung and crashed slaves and broken
connections; and the checker does catch a core that acknowledges too early."""
from __future__ import annotations

import pytest

from hamq.replication.master import HAConnectionState, MasterReplication
from hamq.sim.master_slave import run_master_slave_seed

SEEDS = 400


@pytest.mark.parametrize("chunk", range(4))
def test_master_slave_seeds(chunk: int) -> None:
    per = SEEDS // 4
    failures = [r for r in (run_master_slave_seed(s) for s in range(chunk * per,
                                                                     (chunk + 1) * per))
                if not r.ok]
    assert not failures, "\n".join(
        f"seed {r.seed}: {r.failure} (replay: python -m hamq.sim --mode master-slave "
        f"--seed {r.seed})" for r in failures)


def test_same_seed_same_run() -> None:
    assert run_master_slave_seed(17) == run_master_slave_seed(17)


def test_checker_catches_acks_counted_before_the_slave_has_the_bytes(monkeypatch) -> None:
    def acked_by_sent(self, offset):  # the bug: count what was shipped, not what was acked
        return sum(1 for s in self.slaves.values()
                   if s.state is HAConnectionState.TRANSFER and s.sent_offset >= offset)

    monkeypatch.setattr(MasterReplication, "_acked_by", acked_by_sent)
    results = [run_master_slave_seed(s) for s in range(60)]
    assert any(not r.ok and "only" in r.failure for r in results)
