"""Controller mode (issue 14), real processes under a steady stream of sends: the master
killed with kill -9 again and again (a new master within seconds, nothing acknowledged lost,
no queue offset read with two bodies), and the controller's Raft leader killed together
with the master."""

from __future__ import annotations

import statistics
import time

import pytest
from controller_group import (
    ELECTION_TIMEOUT_MS,
    HEARTBEAT_TIMEOUT_MS,
    MEMBERS,
    ControllerGroup,
    SteadyProducer,
    assert_nothing_lost,
    start_traffic,
)

from hamq.cli.bench_timeline import timeline_of
from helpers import wait_for

# the followers' last word from the killed controller leader may predate the kill by a
# Raft heartbeat or so
LAST_CONTACT_SLACK_S = 0.2
KILLS = 3  # in CI; the failover bench (hamq bench failover) does at least 10
FAILOVER_LIMIT_S = 10.0  # a loaded 2-core machine; the bench holds the 2 s target


def _kill_master(
    group: ControllerGroup, producer: SteadyProducer, kill_controller: bool
) -> tuple[float, float]:
    """kill -9 the master (and the controller leader); when (monotonic), and the seconds
    until the first send begun after it is acknowledged (by the new master: the old one is
    dead by then)."""
    wait_for(lambda: len(producer.acks) > 50, 30, "steady sends")
    old = group.master()
    epoch = group.role(old)["epoch"]
    victims = [old]
    if kill_controller:
        victims.append(group.controller_leader())
    for name in victims:
        group.c.procs[name].kill9()
    killed_at = time.monotonic()
    wait_for(lambda: producer.acked_since(killed_at), 40, "a send acknowledged by the new master")
    failover_s = producer.acked_since(killed_at)[0].at - killed_at
    new = group.master(other_than=old)
    assert group.role(new)["epoch"] > epoch, "the new master did not move the epoch on"
    for name in victims:
        group.c.procs[name].start()
    group.wait_routed_everywhere()
    return killed_at, failover_s


@pytest.mark.slow
def test_master_kill9_again_and_again_loses_nothing(cluster_factory, tmp_path):
    """The run's sends are plotted (hamq.plot) to the test's tmp_path: failover.png."""
    group = ControllerGroup(cluster_factory)
    try:
        started = time.monotonic()
        producer, reader = start_traffic(group)
        took = []
        kills = []
        for _ in range(KILLS):
            killed_at, failover_s = _kill_master(group, producer, kill_controller=False)
            took.append(failover_s)
            kills.append(killed_at)
            group.wait_full_sync_state_set()  # or the next kill leaves no one to elect
        timeline = timeline_of(
            [(a.began, a.at) for a in producer.acks], started, str(tmp_path / "failover.png")
        )
        for killed_at, failover_s in zip(kills, took, strict=True):
            timeline.mark("kill -9 master", killed_at)
            timeline.mark("new master acks", killed_at + failover_s)
        timeline.draw(f"chaos: {KILLS} kill -9s of a controller-mode master", "acked sends/s")
        print(
            f"\nmaster kill -9 -> first acknowledged send, {KILLS} kills: "
            f"min {min(took):.2f} s, median {statistics.median(took):.2f} s, "
            f"max {max(took):.2f} s"
        )
        assert_nothing_lost(group, producer, reader)
        assert max(took) < FAILOVER_LIMIT_S, took
    finally:
        group.close()


@pytest.mark.slow
def test_master_restarted_at_once_after_kill9_loses_nothing(cluster_factory):
    """Back (from its log, with the page cache a kill keeps) before the controller's
    heartbeat timeout, the member may find itself still master in its old epoch or a
    slave of a new one; either way nothing acknowledged is lost."""
    group = ControllerGroup(cluster_factory)
    try:
        producer, reader = start_traffic(group)
        for _ in range(KILLS):
            master = group.master()
            group.c.procs[master].kill9()
            group.c.procs[master].start()
            back_at = time.monotonic()
            wait_for(lambda t=back_at: len(producer.acked_since(t)) > 20, 40, "sends afterwards")
            group.master()
            group.wait_full_sync_state_set()
        assert_nothing_lost(group, producer, reader)
    finally:
        group.close()


@pytest.mark.slow
@pytest.mark.parametrize("embedded", [False, True], ids=["standalone", "embedded-in-namesrv"])
def test_controller_leader_and_master_killed_together_lose_nothing(cluster_factory, embedded):
    """apache/rocketmq #7689: the new controller leader has no heartbeats of its own yet
    (they are soft state); it must wait one heartbeat timeout before it judges any member
    dead, then elect from the SyncStateSet, losing no acknowledged send. Embedded, the
    controller leader's process is also a name server."""
    group = ControllerGroup(cluster_factory, controllers=3, embedded=embedded)
    try:
        producer, reader = start_traffic(group)
        old_master = group.master()
        _, took = _kill_master(group, producer, kill_controller=True)
        new_master = group.master()
        assert new_master in MEMBERS and new_master != old_master
        # a controller leader election (>= one election timeout) and then the new leader's
        # wait of one heartbeat timeout come before the new master's; without the wait it
        # would elect as soon as the master's last heartbeat is one timeout old
        waited_s = (ELECTION_TIMEOUT_MS + HEARTBEAT_TIMEOUT_MS) / 1000 - LAST_CONTACT_SLACK_S
        assert took >= waited_s, (took, waited_s)
        print(f"\ncontroller leader + master kill -9 -> first acknowledged send: {took:.2f} s")
        group.wait_full_sync_state_set()
        wait_for(lambda: len(producer.acked_since(time.monotonic() - 1)) > 0, 20, "sends")
        assert_nothing_lost(group, producer, reader)
    finally:
        group.close()
