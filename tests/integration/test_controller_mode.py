"""Issue 14 scope 2: brokers in controller mode, as real processes (the controller embedded
in the name server, the recommended deployment).

A group of three elects a master on its first registrations, writes go to it and both
slaves replicate; an admin election moves mastership and the old master follows the new
one; a restarted member keeps the broker id the controller gave it; ``kill -9`` of the
master makes a SyncStateSet member master, which takes sends, and the old master comes
back as its slave. The heavy scenarios (partitions, losses under load) are the chaos
tests'."""

from __future__ import annotations

import json

import pytest

import hamq
from hamq import Message, SendStatus
from hamq.broker.broker_metadata import FILE_NAME
from hamq.client.controller import ControllerClient
from hamq.errors import HamqError
from hamq.protocol.codes import RequestCode
from hamq.protocol.controller import role_changed_ext
from helpers import wait_for

CLUSTER = "TestCluster"
GROUP = "cm"
TOPIC = "Cm"
MEMBERS = ("m1", "m2", "m3")
SETTLE_S = 30.0  # an election and the re-registrations after it, on a loaded machine

MEMBER_SETTINGS = {
    "broker_name": GROUP,
    "enable_controller_mode": True,
    "all_ack_in_sync_state_set": True,
    "controller_heartbeat_interval_ms": 300,
    "sync_broker_metadata_period_ms": 500,
    "check_sync_state_set_period_ms": 300,
    "ha_send_heartbeat_interval_ms": 200,
    "slave_sync_interval_ms": 500,
    "sync_broker_member_group_period_ms": 300,
    "broker_heartbeat_interval_ms": 300,
}


class ControllerModeGroup:
    """A name server with the controller embedded, and the three members of one group."""

    def __init__(self, cluster_factory, **namesrv_settings) -> None:
        self.c = cluster_factory()
        self.c.start_namesrv(
            enable_controller_in_namesrv=True,
            scan_not_active_broker_interval_ms=300,
            **{"broker_not_active_timeout_ms": 2000, **namesrv_settings},
        )
        for m in MEMBERS:
            self.c.start_broker(m, controller_addr=self.c.namesrv_addrs, **MEMBER_SETTINGS)
        self.admin = hamq.Admin(self.c.namesrv)

    def close(self) -> None:
        self.admin.close()

    def addr(self, m: str) -> str:
        return self.c.broker_addr(m)

    def member_of(self, addr: str | None) -> str | None:
        return next((m for m in MEMBERS if self.addr(m) == addr), None)

    def info(self, m: str) -> dict | None:
        try:
            return self.admin.broker_runtime_info(self.addr(m))
        except HamqError:
            return None

    def controller(self, call):
        async def run():
            client = ControllerClient(self.c.namesrv_addrs)
            try:
                return await call(client)
            finally:
                await client.close()

        return self.admin.submit(run()).result(30)

    def replica_info(self):
        try:
            return self.controller(lambda cc: cc.get_replica_info(CLUSTER, GROUP))
        except HamqError:
            return None

    def master(self, other_than: str | None = None) -> str:
        """The member the controller made master, once it serves as master at the
        controller's epoch and the name server routes it as brokerId 0."""

        def find():
            info = self.replica_info()
            m = self.member_of(info.master_addr) if info else None
            if m is None or m == other_than or not self.c.procs[m].alive():
                return None
            runtime = self.info(m)
            if not runtime or runtime["role"]["role"] != "master":
                return None
            if runtime["role"]["epoch"] != info.master_epoch:
                return None
            routed = self.admin.master_addrs().get(GROUP)
            return m if routed == self.addr(m) else None

        return wait_for(find, SETTLE_S, "a master serving at the controller's epoch")

    def following(self, m: str, master: str) -> dict | None:
        """``m``'s runtime info once it is a slave attached to ``master``'s HA port."""
        runtime = self.info(m)
        if not runtime or runtime["role"]["role"] != "slave":
            return None
        if runtime["role"]["master_addr"] != self.addr(master):
            return None
        return runtime if runtime["ha"].get("state") == "TRANSFER" else None

    def caught_up(self, master: str) -> bool:
        """Every live slave follows ``master`` and holds its whole log."""
        end = (self.info(master) or {}).get("commitlog_max_offset")
        for m in MEMBERS:
            if m == master or not self.c.procs[m].alive():
                continue
            runtime = self.following(m, master)
            if not runtime or runtime["commitlog_max_offset"] != end:
                return False
        return end is not None

    def sync_state_set(self) -> set[str]:
        info = self.replica_info()
        if info is None:
            return set()
        ids = dict(info.members)
        return {self.member_of(ids[i]) for i in info.sync_state_set}

    def send(self, producer, n: int, tag: str) -> list:
        """``n`` sends, each retried until acknowledged (a role change may refuse some)."""

        def one(i: int):
            try:
                result = producer.send(Message(TOPIC, f"{tag}-{i}".encode()))
            except HamqError:
                return None
            return result if result.status is SendStatus.SEND_OK else None

        return [wait_for(lambda i=i: one(i), SETTLE_S, f"send {tag}-{i}") for i in range(n)]


@pytest.fixture
def group(cluster_factory):
    g = ControllerModeGroup(cluster_factory)
    yield g
    g.close()


def _ready(group: ControllerModeGroup) -> str:
    """The first master, the topic on every member, every member in the SyncStateSet."""
    master = group.master()
    group.admin.create_topic(TOPIC, 2)
    wait_for(lambda: group.sync_state_set() == set(MEMBERS), SETTLE_S, "a full SyncStateSet")
    return master


def test_first_election_admin_election_and_restart_keep_ids(group, hamq_cli):
    master = _ready(group)
    ids = {m: group.info(m)["controller"]["broker_id"] for m in MEMBERS}
    assert sorted(ids.values()) == [1, 2, 3], ids
    info = group.replica_info()
    assert info.master_id == ids[master] and info.master_epoch >= 1
    for m in MEMBERS:  # runtime info tells the controller's view
        controller = group.info(m)["controller"]
        assert controller["master_id"] == ids[master], (m, controller)
        assert controller["sync_state_set"] == [1, 2, 3], (m, controller)
    assert group.info(master)["controller"]["confirm_offset"] is not None
    status = hamq_cli("cluster", "status", "--namesrv", group.c.namesrv)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert len(lines) == 3 and all("sync_state_set=[1, 2, 3]@" in line for line in lines)
    assert f"id=0 {group.addr(master)}" in status.stdout
    assert f"controller_id={ids[master]} " in status.stdout
    with hamq.Admin(group.c.namesrv) as admin:  # the slaves' NO_PERMISSION is no failure
        admin.create_topic("Doomed", 1)
        admin.delete_topic("Doomed")
        assert "Doomed" not in admin.topic_list()

    with hamq.Producer(group.c.namesrv) as producer:
        sent = group.send(producer, 20, "first")
        assert {r.queue.broker_name for r in sent} == {GROUP}
        wait_for(lambda: group.caught_up(master), SETTLE_S, "both slaves holding the log")

        # an admin election moves mastership; the old master follows the new one
        target = next(m for m in MEMBERS if m != master)
        elected = group.controller(lambda cc: cc.elect_master(CLUSTER, GROUP, ids[target], "admin"))
        assert elected.master_id == ids[target]
        assert elected.master_epoch == info.master_epoch + 1
        assert group.master(other_than=master) == target
        old = wait_for(lambda: group.following(master, target), SETTLE_S, "old master follows")
        assert old["role"]["epoch"] == elected.master_epoch
        assert old["controller"]["broker_id"] == ids[master]  # registered under its own id
        group.send(producer, 20, "second")
        wait_for(lambda: group.caught_up(target), SETTLE_S, "the old master holding the log")

    # a late notification of the older epoch is ignored; another group's is refused
    _notify(group, master, (CLUSTER, GROUP), info)
    log = group.c.procs[master].log_path
    stale = f"ignored replica info of epochs ({info.master_epoch}, {info.sync_state_set_epoch})"
    wait_for(lambda: stale in log.read_text(), SETTLE_S, "the stale notification ignored")
    assert group.following(master, target), "a stale notification moved the role back"
    with pytest.raises(HamqError, match="role change of group TestCluster/other"):
        _notify(group, master, (CLUSTER, "other"), elected)

    # a restart keeps the broker id the controller gave (the file in its store directory)
    restarted = next(m for m in MEMBERS if m != target)
    saved = json.loads((group.c.root / restarted / FILE_NAME).read_text())
    assert saved["broker_id"] == ids[restarted] and saved["state"] == "applied"
    group.c.restart(restarted)
    back = wait_for(lambda: group.following(restarted, target), SETTLE_S, "rejoined as slave")
    assert back["controller"]["broker_id"] == ids[restarted]
    assert sorted(i for i, _ in group.replica_info().members) == [1, 2, 3]

    # with its id granted, a member starts while the controller is down (the name server
    # it is embedded in), and registers and follows the master once it is back
    group.c.procs["namesrv"].stop()
    group.c.restart(restarted)
    assert group.info(restarted)["controller"]["last_error"].startswith("registration")
    group.c.procs["namesrv"].start()
    back = wait_for(lambda: group.following(restarted, target), SETTLE_S, "rejoined later")
    assert back["controller"]["broker_id"] == ids[restarted]
    assert group.master() == target

    # a store directory claiming that id with another register check code is refused
    (group.c.root / "m4").mkdir()
    (group.c.root / "m4" / FILE_NAME).write_text(
        json.dumps({**saved, "register_check_code": "not-the-owners"})
    )
    with pytest.raises(RuntimeError, match=f"gives broker id {ids[restarted]} of {GROUP} to"):
        group.c.start_broker("m4", controller_addr=group.c.namesrv_addrs, **MEMBER_SETTINGS)
    assert sorted(i for i, _ in group.replica_info().members) == [1, 2, 3]


def _notify(group: ControllerModeGroup, m: str, key: tuple[str, str], info) -> None:
    """NOTIFY_BROKER_ROLE_CHANGED to ``m`` as the controller sends it (answered here, so
    a refusal shows)."""
    invoke = group.admin.async_client.core.invoke
    code, ext = RequestCode.NOTIFY_BROKER_ROLE_CHANGED, role_changed_ext(key, info)
    group.admin.submit(invoke(group.addr(m), code, ext)).result(10)


def test_kill_9_of_the_master_elects_a_sync_state_set_member(group):
    master = _ready(group)
    with hamq.Producer(group.c.namesrv) as producer:
        group.send(producer, 20, "before")
        wait_for(lambda: group.caught_up(master), SETTLE_S, "both slaves holding the log")
        before = group.replica_info()
        candidates = group.sync_state_set() - {master}
        group.c.procs[master].kill9()

        successor = group.master(other_than=master)
        assert successor in candidates
        after = group.replica_info()
        assert after.master_epoch > before.master_epoch
        assert group.send(producer, 20, "after")[-1].queue.broker_name == GROUP

        group.c.procs[master].start()  # the old master comes back as the successor's slave
        back = wait_for(lambda: group.following(master, successor), SETTLE_S, "old master back")
        assert back["role"]["epoch"] >= after.master_epoch
        group.send(producer, 5, "last")
        wait_for(lambda: group.caught_up(successor), SETTLE_S, "every member holding the log")
