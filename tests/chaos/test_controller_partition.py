"""Controller mode (issue 14): the master cut off from the controller and the name server
while sends keep coming, some of them straight to it (a producer whose route is stale).
apache/rocketmq #7017 and #6316: a partitioned old master kept acknowledging. Here it may
acknowledge nothing past the point where the new master's epoch starts, and once the cut
heals it follows the new master as a slave, cutting the tail it never had acknowledged."""

from __future__ import annotations

import threading
import time

import pytest
from controller_group import (
    ControllerGroup,
    PinnedSender,
    Reads,
    assert_nothing_lost,
    start_traffic,
)

from helpers import wait_for

PINNED_SENDS_AFTER_ELECTION = 5
PINNED_FIRST = 5_000_000  # pinned bodies never collide with the steady producer's


@pytest.mark.slow
@pytest.mark.parametrize(
    "namesrv", [True, False], ids=["controller-and-namesrv", "controller-only"]
)
def test_master_cut_off_acknowledges_nothing_in_the_new_epoch_and_rejoins_as_slave(
    cluster_factory, namesrv
):
    """Cut from the name server too, the old master drops out of the routes; cut from the
    controller only, it keeps registering as the master there next to the new one."""
    # The controller's role-change notifications reach a member's listen address, which no
    # proxy sits in front of; they only make it re-read its role from the controller,
    # which the cut master cannot reach.
    group = ControllerGroup(cluster_factory)
    try:
        producer, reader = start_traffic(group)
        wait_for(lambda: len(producer.acks) > 50, 30, "steady sends")
        old = group.master()
        old_epoch = group.role(old)["epoch"]
        old_addr = group.c.broker_addr(old)
        pinned = PinnedSender(group.admin, old_addr)
        # what consumers whose routes still name it read there: never anything the new
        # master does not have (reads stop at the confirm offset)
        old_reads = Reads()

        def send_and_read(n: int) -> None:
            pinned.send(n)
            old_reads.record(group.read_member(old_addr, old_reads.next_offsets()))

        group.isolate(old, namesrv)
        n = PINNED_FIRST
        # it keeps taking sends while the controller times it out and elects another
        deadline = time.monotonic() + 30
        new = None
        while new is None and time.monotonic() < deadline:
            send_and_read(n)
            n += 1
            info = group.replica_info_or_none()
            m = group.member_of(info.master_addr) if info else None
            if m not in (None, old):
                new = group.master(other_than=old)
        assert new is not None, "no new master while the old one was cut off"
        new_epoch = group.role(new)["epoch"]
        assert new_epoch > old_epoch
        for _ in range(PINNED_SENDS_AFTER_ELECTION):  # to the deposed master, now
            send_and_read(n)
            n += 1
        old_end_in_cut = group.log_end(old)
        epoch_start = group.epochs(new)[new_epoch]
        late = [a for a in pinned.acks if a.commit_offset >= epoch_start]
        assert not late, (
            f"the cut-off master acknowledged {len(late)} sends past the start of epoch "
            f"{new_epoch} (offset {epoch_start}) on {new}: {[a.body[:13] for a in late[:5]]}"
        )
        assert old_end_in_cut > epoch_start, "the deposed master stored no tail to cut"
        print(
            f"\ncut-off master {old}: {len(pinned.acks)} sends acknowledged before epoch "
            f"{new_epoch} began at {epoch_start} on {new}, {len(pinned.refused)} refused "
            f"({sorted(set(pinned.refused))}); its log reached {old_end_in_cut}; consumers "
            f"read {len(old_reads.seen)} messages there"
        )

        group.heal()
        wait_for(
            lambda: (r := group.role(old)) and r["role"] == "slave" and r["epoch"] == new_epoch,
            30,
            "the old master following the new one",
        )
        acked = len(producer.acks)
        wait_for(lambda: len(producer.acks) > acked + 30, 30, "sends after the heal")
        group.wait_full_sync_state_set()
        assert max(group.epochs(old)) == new_epoch
        # with identical logs at the end, what the old master wrote past the new epoch's
        # start (up to old_end_in_cut) was replaced by the new master's records
        assert_nothing_lost(group, producer, reader, pinned.acks, old_reads)
    finally:
        group.close()


FROZEN_SENDS = 20


@pytest.mark.slow
def test_master_frozen_past_its_heartbeat_timeout_acknowledges_nothing_when_it_wakes(
    cluster_factory,
):
    """A stop-the-world pause (SIGSTOP) longer than the controller's heartbeat timeout:
    the sends that reached the master while it was frozen are read when it wakes, in a
    world with a new master. It acknowledges none of them past the new epoch's start and
    follows the new master."""
    group = ControllerGroup(cluster_factory)
    try:
        producer, reader = start_traffic(group)
        wait_for(lambda: len(producer.acks) > 50, 30, "steady sends")
        old = group.master()
        pinned = PinnedSender(group.admin, group.c.broker_addr(old))
        group.freeze(old)
        queued = list(range(PINNED_FIRST, PINNED_FIRST + FROZEN_SENDS))
        sends = threading.Thread(target=pinned.send_all, args=(queued, 30.0), daemon=True)
        sends.start()  # they wait in the frozen master's socket
        new = group.master(other_than=old)
        new_epoch = group.role(new)["epoch"]
        group.thaw(old)
        sends.join(40)
        assert not sends.is_alive()
        epoch_start = group.epochs(new)[new_epoch]
        late = [a for a in pinned.acks if a.commit_offset >= epoch_start]
        assert not late, (
            f"the woken master acknowledged {len(late)} sends past the start of epoch "
            f"{new_epoch} (offset {epoch_start}) on {new}"
        )
        print(f"\nwoken master {old}: {len(pinned.refused)} of {FROZEN_SENDS} sends refused")
        wait_for(
            lambda: (r := group.role(old)) and r["role"] == "slave" and r["epoch"] == new_epoch,
            30,
            "the woken master following the new one",
        )
        group.wait_full_sync_state_set()
        assert_nothing_lost(group, producer, reader, pinned.acks)
    finally:
        group.close()
