"""Controller mode (issue 14): a slave that falls behind for longer than
``ha_max_time_slave_not_catchup_ms`` leaves the SyncStateSet, so when the master dies it is
not elected (apache/rocketmq #5663, #6662: a slave elected while behind); with
``enable_elect_unclean_master`` it is, and exactly the acknowledged messages it never had
are lost.

The slave is frozen (SIGSTOP) to fall behind; the other slave is killed so that the lagging
one is the only candidate left; the master is frozen to die for the controller while the
lagging slave, thawed, is alive but cannot catch up from it."""

from __future__ import annotations

import time

import pytest
from controller_group import (
    HEARTBEAT_TIMEOUT_MS,
    MEMBERS,
    ControllerGroup,
    SteadyProducer,
    read_all,
)

from helpers import wait_for

NOT_CAUGHT_UP_MS = 1000  # ha_max_time_slave_not_catchup_ms for this test (15 s by default)
NO_ELECTION_WINDOW_S = 3 * HEARTBEAT_TIMEOUT_MS / 1000
# A frozen slave's socket still takes what the master ships until the window is full, and
# the slave reads it once thawed: a small window keeps most of the master's last sends out
# of its reach.
WINDOW = {"ha_window_bytes": 16 * 1024, "ha_transfer_batch_bytes": 4 * 1024}
SENDS_THE_MASTER_ALONE_HOLDS = 100  # about 30 fit in the window


@pytest.mark.slow
@pytest.mark.parametrize("unclean", [False, True], ids=["clean", "unclean"])
def test_lagging_slave_leaves_the_sync_state_set_and_is_elected_only_unclean(
    cluster_factory, unclean
):
    group = ControllerGroup(
        cluster_factory,
        controller_settings={"enable_elect_unclean_master": unclean},
        ha_max_time_slave_not_catchup_ms=NOT_CAUGHT_UP_MS,
        **WINDOW,
    )
    try:
        producer = SteadyProducer(group.c.namesrv)
        producer.start()
        wait_for(lambda: len(producer.acks) > 50, 30, "steady sends")
        master = group.master()
        lagging, other = sorted(m for m in MEMBERS if m != master)
        group.freeze(lagging)
        frozen_at = time.monotonic()
        wait_for(
            lambda: group.sync_state_set() == {master, other}, 20, f"{lagging} leaving the set"
        )
        group.c.procs[other].kill9()
        wait_for(lambda: group.sync_state_set() == {master}, 20, f"{other} leaving the set")
        shrunk_at = time.monotonic()
        wait_for(
            lambda: len(producer.acked_since(shrunk_at)) > SENDS_THE_MASTER_ALONE_HOLDS,
            30,
            "sends the master alone holds",
        )
        producer.finish()

        group.freeze(master)  # dead to the controller; the lagging slave cannot copy from it
        group.thaw(lagging)
        master_id = group.replica_info().master_id
        if not unclean:
            deadline = time.monotonic() + NO_ELECTION_WINDOW_S
            while time.monotonic() < deadline:  # nothing may happen: watch for a while
                info = group.replica_info()
                assert info.master_id in (None, master_id), f"{lagging} was elected: {info}"
                assert group.role(lagging)["role"] == "slave"
                time.sleep(0.2)
            return

        assert group.master(other_than=master) == lagging
        epoch = group.role(lagging)["epoch"]
        epoch_start = group.epochs(lagging)[epoch]
        group.c.procs[master].kill9()
        before = [a for a in producer.acks if a.at < frozen_at]
        assert all(a.commit_offset < epoch_start for a in before), (
            "a send acknowledged while the lagging slave was in the set is past its log end"
        )
        lost_expected = [a for a in producer.acks if a.commit_offset >= epoch_start]
        stored = read_all(group.c.namesrv)
        lost = [a for a in producer.acks if stored.get((a.queue_id, a.queue_offset)) != a.body]
        print(
            f"\nunclean election of {lagging}: {len(lost)} acknowledged sends lost, commit "
            f"offsets {lost[0].commit_offset}..{lost[-1].commit_offset} (its log ended at "
            f"{epoch_start})"
            if lost
            else "\nunclean election lost nothing"
        )
        assert lost_expected, "the master acknowledged nothing the lagging slave lacked"
        assert [a.body for a in lost] == [a.body for a in lost_expected], (
            "what the unclean election lost is not exactly what the elected slave never had"
        )
    finally:
        group.close()
