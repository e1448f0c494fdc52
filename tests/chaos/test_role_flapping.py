"""Issue 13 review: DLedger leadership that moves faster than the role changes it drives.

Each transfer is asked of the member Raft just made leader, without waiting for the role
change, the re-registration or the route that follow the one before; then the leader is
frozen (SIGSTOP) until another member is elected, then thawed: it comes back believing
it leads.
Afterwards the role state must have caught up with Raft on every member (one master, at
the leader's term, registered as brokerId 0; no service error), no two members may have
been master in one epoch, and no acknowledged send may be lost or repeated."""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest

from hamq.errors import HamqError
from hamq.protocol.codes import RequestCode
from helpers import wait_for

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from test_dledger import Group, SteadyProducer, _invoke, assert_identical_logs, consume_all
from test_role_change import RoleWatch

TRANSFERS = 8
NEW_LEADER_WITHIN_S = 15.0  # election timeout 1 s, on a loaded machine


@pytest.mark.slow
@pytest.mark.parametrize("flush_disk_type", ["async", "sync"])
def test_leadership_flapping_and_a_frozen_leader_leave_one_master(cluster_factory, flush_disk_type):
    group = Group(cluster_factory, flush_disk_type=flush_disk_type)
    try:
        watch = RoleWatch(group)
        producer = SteadyProducer(group.c.namesrv)
        producer.start()
        try:
            wait_for(lambda: len(producer.acked) > 30, 30, "steady sends")
            leader = group.leader()
            for _ in range(TRANSFERS):
                target = group.members[(group.members.index(leader) + 1) % len(group.members)]
                _invoke(
                    group, leader, RequestCode.DLEDGER_TRANSFER_LEADERSHIP, {"member_id": target}
                )
                wait_for(lambda t=target: _leads(group, t), 15, f"member {target} leading")
                watch.sample()
                leader = target
            frozen = group.c.procs[f"m{leader}"]
            others = [m for m in group.members if m != leader]
            os.kill(frozen.pid, signal.SIGSTOP)
            try:
                wait_for(
                    lambda: any(_leads(group, m) for m in others),
                    NEW_LEADER_WITHIN_S,
                    "a leader elected while the old one is frozen",
                )
                watch.sample()
            finally:
                os.kill(frozen.pid, signal.SIGCONT)
            leader = group.leader()
            settled = watch.wait_settled(leader)
            term = group.info(leader)["ha"]["term"]
            assert settled[leader]["epoch"] == term, (settled, term)
            assert all(not r["errors"] for r in settled.values()), settled
            acked = len(producer.acked)
            wait_for(lambda: len(producer.acked) > acked + 30, 30, "sends after the flapping")
        finally:
            producer.stop_flag.set()
            producer.join(10)
        split = {e: ms for e, ms in watch.masters_by_epoch.items() if len(ms) > 1}
        assert not split, f"two members were master in one epoch: {split}"
        bodies = Counter(consume_all(group.c.namesrv))
        assert set(producer.acked) <= set(bodies), "an acknowledged message was lost"
        repeated = sorted(b for b in producer.acked if bodies[b] > 1)
        assert not repeated, f"acknowledged messages repeat: {repeated[:5]}"
        assert_identical_logs(group)
    finally:
        group.close()


def _leads(group: Group, m: int) -> bool:
    """Raft made ``m`` the leader (its role change may not have run yet)."""
    try:
        return group.info(m)["ha"]["is_leader"]
    except HamqError:
        return False
