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

import shutil
import time
from dataclasses import replace

import pytest

import hamq
from hamq.broker.ha.member_group import MemberGroup
from hamq.config import BrokerConfig
from hamq.errors import ControllerRefused, InvalidArgument
from hamq.net.pool import ConnectionPool
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.controller import role_changed_ext
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


def _agrees(group: ControllerModeGroup, master: str, truth) -> bool:
    try:
        _as_the_controller_says(group, master, truth)
    except AssertionError:
        return False
    return True


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
    # a malformed one is refused as such, not taken for an internal error
    invoke = group.admin.async_client.core.invoke
    malformed = {**role_changed_ext(CLUSTER_KEY, truth), "master_epoch": "1001", "members": 7}
    code = RequestCode.NOTIFY_BROKER_ROLE_CHANGED
    with pytest.raises(InvalidArgument):
        group.admin.submit(invoke(group.addr(master), code, malformed)).result(10)

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


def test_a_member_cleaned_while_alive_never_takes_the_mastership_of_its_ids_new_owner(group):
    """CLEAN_BROKER_DATA of a living slave frees its id, and the controller gives the
    highest free id to the next member that asks: two processes then hold one id. When
    the controller names that id master, only the member at the named address may lead;
    the cleaned one (which still believes the id is its own) must not become a second
    master of the epoch."""
    master = _ready(group)
    ids = {group.member_of(addr): i for i, addr in group.replica_info().members}
    if ids[master] == max(ids.values()):  # the freed id must be the highest to be reused
        other = next(m for m in MEMBERS if m != master)
        group.controller(lambda cc: cc.elect_master(*CLUSTER_KEY, ids[other], "admin"))
        master = group.master(other_than=master)
    cleaned = max((m for m in MEMBERS if m != master), key=ids.get)
    group.controller(
        lambda cc: cc.clean_broker_data(*CLUSTER_KEY, [ids[cleaned]], clean_living_broker=True)
    )
    group.c.start_broker("m4", controller_addr=group.c.namesrv_addrs, **MEMBER_SETTINGS)
    assert group.info("m4")["controller"]["broker_id"] == ids[cleaned]

    def m4_electable():
        info = group.replica_info()
        return info and dict(info.members).get(ids[cleaned]) == group.c.broker_addr("m4")

    wait_for(m4_electable, SETTLE_S, "the new owner of the id registered")
    wait_for(
        lambda: ids[cleaned] in group.replica_info().sync_state_set,
        SETTLE_S,
        "the id back in the SyncStateSet",
    )
    elected = group.controller(lambda cc: cc.elect_master(*CLUSTER_KEY, ids[cleaned], "admin"))
    assert elected.master_addr == group.c.broker_addr("m4")
    wait_for(
        lambda: (group.info("m4") or {}).get("role", {}).get("role") == "master",
        SETTLE_S,
        "the id's new owner leading",
    )
    wait_for(
        lambda: group.info(cleaned)["role"]["epoch"] == elected.master_epoch,
        SETTLE_S,
        "the cleaned member hearing of the new epoch",
    )
    deadline = time.monotonic() + OBSERVE_S
    while time.monotonic() < deadline:
        role = group.info(cleaned)["role"]
        assert (role["role"], role["master_addr"]) == ("slave", elected.master_addr), role
        time.sleep(0.1)
    assert "the id is another member's now" in group.info(cleaned)["controller"]["last_error"]


def test_the_group_goes_on_while_the_controller_is_away_and_keeps_its_master(group):
    """With every controller peer down (here the one name server it is embedded in) the
    master keeps taking sends, all-acked by its SyncStateSet, and the slaves keep
    copying: the controller decides roles, it is not on the data path. When it comes
    back it waits for heartbeats before judging anyone dead (#7689's lesson), so the
    same master goes on in the same epoch."""
    master = _ready(group)
    truth = group.replica_info()
    with hamq.Producer(group.c.namesrv) as producer:
        group.send(producer, 5, "before")  # the route is cached from here
        group.c.procs["namesrv"].stop()
        deadline = time.monotonic() + OBSERVE_S  # many heartbeat intervals (300 ms)
        sent = 0
        while time.monotonic() < deadline:
            group.send(producer, 1, f"away-{sent}")
            sent += 1
        wait_for(lambda: group.caught_up(master), SETTLE_S, "slaves copying while it is away")
        for m in MEMBERS:  # each has missed it (a poll gives up after its retries)
            wait_for(
                lambda m=m: group.info(m)["controller"]["last_error"],
                SETTLE_S,
                f"{m} missing the controller",
            )
        group.send(producer, 5, "still")
        group.c.procs["namesrv"].start()
        group.send(producer, 5, "after")
    wait_for(lambda: group.replica_info() is not None, SETTLE_S, "the controller back")
    deadline = time.monotonic() + OBSERVE_S
    while time.monotonic() < deadline:
        assert group.replica_info() == truth
        _as_the_controller_says(group, master, truth)
        time.sleep(0.1)


def test_a_strangers_registration_cannot_move_a_members_address(group):
    """CONTROLLER_REGISTER_BROKER from anyone: without the member's register check code
    (which only the member holds) an address change is refused, so a stranger cannot
    point the master's id at its own address and make the group follow it."""
    master = _ready(group)
    truth = group.replica_info()
    with pytest.raises(ControllerRefused, match="register check code") as refused:
        group.controller(
            lambda cc: cc.register_broker(*CLUSTER_KEY, truth.master_id, ATTACKER, 0, 0, "guess")
        )
    assert refused.value.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID
    deadline = time.monotonic() + OBSERVE_S
    while time.monotonic() < deadline:
        assert group.replica_info() == truth
        _as_the_controller_says(group, master, truth)
        time.sleep(0.1)
    with hamq.Producer(group.c.namesrv) as producer:
        group.send(producer, 5, "after")


def test_a_restarted_name_server_does_not_take_the_masters_ha_address_from_slaves():
    """A name server restarted (here with the controller embedded in it) hears from a
    slave before the master: its member group lacks the master. Dropping the master's HA
    address closed the slaves' sessions and the master shrank its SyncStateSet at every
    name server restart; the controller's master is still there, so its address stays."""
    config = BrokerConfig(
        broker_name="cm",
        broker_id=2,
        listen="127.0.0.1:10002",
        namesrv=("127.0.0.1:9876",),
        enable_controller_mode=True,
        controller_addr=("127.0.0.1:9876",),
    )
    members = MemberGroup(config, ConnectionPool())
    members.set_own_id(2)
    members.follow_controller("127.0.0.1:10001")
    whole = {
        "broker_addrs": {"0": "127.0.0.1:10001", "2": "127.0.0.1:10002"},
        "ha_addrs": {"0": "127.0.0.1:20001", "2": "127.0.0.1:20002"},
    }
    members._take("127.0.0.1:9876", whole)
    members._reconcile()
    assert members.master_ha_addr == "127.0.0.1:20001"
    restarted = {"broker_addrs": {"2": "127.0.0.1:10002"}, "ha_addrs": {"2": "127.0.0.1:20002"}}
    members._take("127.0.0.1:9876", restarted)
    members._reconcile()
    assert members.broker_addrs == {2: "127.0.0.1:10002"}
    assert members.master_ha_addr == "127.0.0.1:20001"
    members.follow_controller("127.0.0.1:10003")  # another master: its own address only
    assert members.master_ha_addr is None


def test_a_controller_that_lost_its_state_lets_the_group_lead_again_in_newer_epochs(group):
    """Every controller peer's data lost (one embedded peer here, its data dir wiped):
    members are refused "not known", apply their ids again with their register check
    codes and register; the group created again has no master, and its first election
    counts past the epochs the members report, so no member sees an epoch go backwards
    and the group takes sends again."""
    master = _ready(group)
    before = group.replica_info()
    with hamq.Producer(group.c.namesrv) as producer:
        group.send(producer, 5, "before")
        other = next(i for i, _ in before.members if i != before.master_id)
        group.controller(lambda cc: cc.elect_master(*CLUSTER_KEY, other, "admin"))
        group.master(other_than=master)
        old_epoch = group.replica_info().master_epoch
        assert old_epoch > before.master_epoch
        namesrv = group.c.procs["namesrv"]
        namesrv.stop()
        shutil.rmtree(group.c.root / "namesrv" / "controller")
        namesrv.start()
        wait_for(
            lambda: (group.replica_info() or before).master_epoch > old_epoch,
            SETTLE_S,
            "a master in an epoch past the lost ones",
        )
        group.master()
        group.send(producer, 5, "after")
