"""Controller mode (issue 14): every process restarted in turn — the three controller
peers, then the three members, the master among them — under a steady stream of sends;
nothing acknowledged is lost and no queue offset is read with two bodies."""

from __future__ import annotations

import time

import pytest
from controller_group import (
    MEMBERS,
    ControllerGroup,
    assert_nothing_lost,
    start_traffic,
)

from helpers import wait_for


@pytest.mark.slow
@pytest.mark.parametrize("embedded", [False, True], ids=["standalone", "embedded-in-namesrv"])
def test_rolling_restart_of_controllers_and_members_loses_nothing(cluster_factory, embedded):
    """Embedded, each controller restart is a name server restart too."""
    group = ControllerGroup(cluster_factory, controllers=3, embedded=embedded)
    try:
        producer, reader = start_traffic(group)
        for name in [*group.controller_addrs, *MEMBERS]:
            wait_for(lambda: producer.acked_since(time.monotonic() - 1), 30, "steady sends")
            group.c.restart(name)  # SIGTERM, then the same config again
            if name in group.controller_addrs:
                _wait_caught_up(group, name)
                group.wait_routed_everywhere()
            group.master()
            group.wait_full_sync_state_set()
        restarted_at = time.monotonic()
        wait_for(lambda: len(producer.acked_since(restarted_at)) > 30, 30, "sends afterwards")
        assert_nothing_lost(group, producer, reader)
    finally:
        group.close()


def _wait_caught_up(group: ControllerGroup, name: str) -> None:
    """The restarted peer applied what the leader had committed (from its Raft log and
    snapshot, then the leader), so the next restart leaves a majority that knows it all."""
    leader = group.controller_leader()
    committed = group.controller_call(lambda cc: cc.metadata(), [group.controller_addrs[leader]])
    addr = [group.controller_addrs[name]]
    wait_for(
        lambda: (
            group.controller_call(lambda cc: cc.metadata(), addr)["applied_index"]
            >= committed["commit_index"]
        ),
        30,
        f"controller {name} catching up",
    )
