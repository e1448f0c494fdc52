"""Controller mode: NOTIFY_BROKER_ROLE_CHANGED is one-way and unauthenticated (as in
RocketMQ), so anyone who reaches a member's listen port can send one. A member must not
take its content as the controller's word: a stranger's frame naming a far newer epoch
would otherwise depose the master, make a slave follow the stranger's address, or shrink
the master's SyncStateSet to itself (acks with no slave), and the epoch it named would
make the member ignore every true answer of the controller from then on. A notification
is only a hint to re-read the replica info from the controller; these tests send hostile
ones to real members and check that the group goes on as the controller says.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

import hamq
from helpers import wait_for
from integration.test_controller_mode import (
    MEMBER_SETTINGS,
    MEMBERS,
    SETTLE_S,
    ControllerModeGroup,
    _notify,
    _ready,
)

CLUSTER_KEY = ("TestCluster", "cm")
ATTACKER = "127.0.0.1:1"  # nothing listens there
OBSERVE_S = 3.0  # several replica-info polls (500 ms) and role changes (ms) long
REREAD_LOG = "role-change notification: re-reading the replica info from the controller"


@pytest.fixture
def group(cluster_factory):
    g = ControllerModeGroup(cluster_factory)
    yield g
    g.close()


def _as_the_controller_says(group: ControllerModeGroup, master: str, truth) -> None:
    """Every member serves in the role and epoch the controller gave it and shows the
    controller's replica info."""
    ids = {addr: i for i, addr in truth.members}
    for m in MEMBERS:
        runtime = group.info(m)
        assert runtime is not None, m
        role, controller = runtime["role"], runtime["controller"]
        assert role["role"] == ("master" if m == master else "slave"), (m, role)
        assert role["epoch"] == truth.master_epoch, (m, role)
        assert role["master_addr"] == group.addr(master), (m, role)
        assert controller["master_id"] == ids[group.addr(master)], (m, controller)
        assert controller["master_epoch"] == truth.master_epoch, (m, controller)
        assert controller["sync_state_set"] == sorted(truth.sync_state_set), (m, controller)


def test_a_strangers_role_change_notifications_change_nothing(group):
    master = _ready(group)
    truth = group.replica_info()
    ids = {group.member_of(addr): i for i, addr in truth.members}
    slaves = [m for m in MEMBERS if m != master]
    forged_epoch = truth.master_epoch + 1000
    hostile = {
        # the master told it is deposed in favour of the stranger
        master: replace(truth, master_id=ids[slaves[0]], master_addr=ATTACKER),
        # a slave told to follow the stranger
        slaves[0]: replace(truth, master_id=ids[slaves[1]], master_addr=ATTACKER),
        # a slave told there is no master (it would ask for an election)
        slaves[1]: replace(truth, master_id=None, master_addr=None),
    }
    for m, info in hostile.items():
        _notify(group, m, CLUSTER_KEY, replace(info, master_epoch=forged_epoch))
    # the master told it leads a newer epoch with a SyncStateSet of itself alone
    shrunk = replace(
        truth,
        master_epoch=forged_epoch,
        sync_state_set=frozenset({ids[master]}),
        sync_state_set_epoch=truth.sync_state_set_epoch + 1000,
    )
    _notify(group, master, CLUSTER_KEY, shrunk)

    deadline = time.monotonic() + OBSERVE_S
    while time.monotonic() < deadline:
        _as_the_controller_says(group, master, truth)
        time.sleep(0.1)
    for m in MEMBERS:  # each notification was taken as a hint to ask the controller
        log = group.c.procs[m].log_path
        wait_for(lambda log=log: REREAD_LOG in log.read_text(), SETTLE_S, f"{m} re-read")
    assert group.replica_info() == truth  # nobody asked for an election
    with hamq.Producer(group.c.namesrv) as producer:
        sent = group.send(producer, 10, "after")
        assert all(r.queue.broker_name == "cm" for r in sent)
    wait_for(lambda: group.caught_up(master), SETTLE_S, "both slaves holding the log")


def test_a_second_broker_on_a_members_store_directory_is_refused(group):
    """Its broker metadata would give it the member's id and register check code, so the
    controller would grant it the id: two processes writing one log, both master when
    that id is elected. The store directory is locked by the broker that opened it."""
    master = _ready(group)
    truth = group.replica_info()
    slave = next(m for m in MEMBERS if m != master)
    twin_settings = {**MEMBER_SETTINGS, "store_dir": str(group.c.root / slave)}
    with pytest.raises(RuntimeError, match="is in use by another broker"):
        group.c.start_broker("twin", controller_addr=group.c.namesrv_addrs, **twin_settings)
    assert group.replica_info() == truth
    _as_the_controller_says(group, master, truth)
