"""Controller mode: a master that loses power and is back before the controller's heartbeat
timeout never continues its epoch (issue 14; Kafka's and RocketMQ's rule).

With async flush a power loss takes the master's unflushed tail, which the SyncStateSet
members hold and acknowledged (``all_ack_in_sync_state_set``). Had the restarted master
gone on in its old epoch, it would write new records at those offsets and its slaves,
reattaching, would cut the acknowledged ones (the consistent point is the smaller end of
that epoch). Instead it asks for an election ("restart"): the member with the most data
wins, in a new epoch, and every acknowledged message stays readable byte for byte.
"""

from __future__ import annotations

import pytest

import hamq
from helpers import wait_for
from integration.test_controller_mode import (
    GROUP,
    MEMBER_SETTINGS,
    MEMBERS,
    SETTLE_S,
    TOPIC,
    ControllerModeGroup,
)

LOST_ACKS = 5  # acknowledged messages whose bytes the power loss takes from the master


@pytest.fixture
def group(cluster_factory, monkeypatch):
    # The master never fsyncs its log during the test (async flush, a long interval), so
    # cutting its tail after a kill -9 leaves exactly what a power loss could; the
    # controller's heartbeat timeout is long enough that the master restarts before it.
    monkeypatch.setitem(MEMBER_SETTINGS, "flush_interval_commitlog_ms", 600_000)
    g = ControllerModeGroup(cluster_factory, controller_heartbeat_timeout_ms=120_000)
    yield g
    g.close()


def _lose_unflushed_tail(group: ControllerModeGroup, m: str, from_offset: int) -> int:
    """Cut ``m``'s commit log (it is dead) at ``from_offset``: the page cache a power loss
    drops, as the last segment's file is what the disk kept. Returns the bytes cut."""
    segments = sorted((group.c.root / m / "commitlog").iterdir())
    last = segments[-1]
    start, size = int(last.name), last.stat().st_size
    assert start <= from_offset < start + size, (last, from_offset)
    with last.open("r+b") as f:
        f.truncate(from_offset - start)
    return start + size - from_offset


def test_master_back_after_power_loss_begins_a_new_epoch_and_loses_no_ack(group, drain_topic):
    master = group.master()
    group.admin.create_topic(TOPIC, 2)
    wait_for(lambda: group.sync_state_set() == set(MEMBERS), SETTLE_S, "a full SyncStateSet")
    with hamq.Producer(group.c.namesrv) as producer:
        acked = group.send(producer, 30, "before")
        wait_for(lambda: group.caught_up(master), SETTLE_S, "both slaves holding the log")
        before = group.replica_info()
        assert group.member_of(before.master_addr) == master

        group.c.procs[master].kill9()
        cut = _lose_unflushed_tail(group, master, int(acked[-LOST_ACKS].msg_id[:16], 16))
        assert cut > 0
        group.c.procs[master].start()  # long before the controller would miss it

        new_master = group.master()
        after = group.replica_info()
        assert after.master_epoch > before.master_epoch, (before, after)
        # a slave held what the restarted master lost, so it has the most data and wins
        assert new_master != master, "the member that lost acknowledged records was elected"
        runtime = group.info(master)["role"]
        assert runtime["role"] == "slave" and runtime["epoch"] == after.master_epoch
        acked += group.send(producer, 20, "after")
        wait_for(lambda: group.caught_up(new_master), SETTLE_S, "every member holding the log")

    stored = {
        (queue_id, offset): body
        for queue_id, entries in drain_topic(group.c.namesrv, TOPIC).items()
        for offset, body in entries
    }
    sent = [f"before-{i}".encode() for i in range(30)] + [f"after-{i}".encode() for i in range(20)]
    lost = [
        (body, r.queue.queue_id, r.queue_offset)
        for body, r in zip(sent, acked, strict=True)
        if stored.get((r.queue.queue_id, r.queue_offset)) != body
    ]
    assert not lost, f"acknowledged messages lost or changed: {lost}"
    assert len(stored) == len(acked), "a message read that was never acknowledged"
    assert {r.queue.broker_name for r in acked} == {GROUP}
