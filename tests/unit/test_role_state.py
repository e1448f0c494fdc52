"""The role state (broker/role.py): the services that follow a member's role start and stop
in the documented order, concurrent changes are serialised so master and slave services
never run together, a failing service is reported without stopping the others, and the
HA master and client (real objects) run again after a stop."""

from __future__ import annotations

import asyncio
import zlib

import pytest

from hamq.broker.ha.member_group import MASTER_ID, MemberGroup
from hamq.broker.ha.service import HAMaster, HASlave
from hamq.broker.role import BrokerRole, RoleService, RoleServices, RoleState
from hamq.broker.topics import TopicService
from hamq.config import BrokerConfig
from hamq.net.pool import ConnectionPool
from hamq.protocol.message import encode_message
from hamq.store.message_store import MessageStore
from helpers import free_port

MASTER = ["ha_master", "delay_delivery", "transaction_check", "pop_revive"]
SLAVE = ["ha_client", "slave_sync"]
WAIT_S = 10.0


class Recorder:
    """Listeners of the role state that record each call with the role and epoch seen
    then, and which services run; ``fail`` names (service, action) that raise."""

    def __init__(self, role: RoleState, yields: int = 0) -> None:
        self.role = role
        self.yields = yields  # event-loop turns each start/stop takes
        self.calls: list[tuple[str, str, str, int]] = []
        self.running: set[str] = set()
        self.fail: set[tuple[str, str]] = set()
        self.overlaps: list[set[str]] = []  # master and slave services seen running together
        role.services = RoleServices(
            master=[self._service(name) for name in MASTER],
            slave=[self._service(name) for name in SLAVE],
            after_change=[
                lambda: self.calls.append(
                    ("register", str(role.registered_id), role.role.value, role.epoch)
                )
            ],
        )

    def _service(self, name: str) -> RoleService:
        async def act(action: str) -> None:
            for _ in range(self.yields):
                await asyncio.sleep(0)
            self.calls.append((action, name, self.role.role.value, self.role.epoch))
            if (name, action) in self.fail:
                raise RuntimeError(f"{name} cannot {action}")
            (self.running.add if action == "start" else self.running.discard)(name)
            if self.running & set(MASTER) and self.running & set(SLAVE):
                self.overlaps.append(set(self.running))

        return RoleService(name, lambda: act("start"), lambda: act("stop"))


def run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, WAIT_S))


def test_services_follow_the_role_in_the_documented_order():
    async def scenario() -> None:
        role = RoleState(BrokerRole.MASTER, 2, "127.0.0.1:1")
        rec = Recorder(role)
        await role.start()
        assert rec.calls == [("start", name, "master", 0) for name in MASTER]
        rec.calls.clear()

        assert await role.change(BrokerRole.SLAVE, "127.0.0.1:2")
        # the role flips first (writes refused), master services stop in reverse, then
        # the slave's start, then re-registration under the member's own id
        assert rec.calls == [("stop", name, "slave", 0) for name in reversed(MASTER)] + [
            ("start", name, "slave", 0) for name in SLAVE
        ] + [("register", "2", "slave", 0)]
        assert role.info() == {
            "role": "slave",
            "epoch": 0,
            "broker_id": 2,
            "master_addr": "127.0.0.1:2",
            "services": sorted(SLAVE),
            "changes": 1,
            "errors": {},
        }
        rec.calls.clear()

        assert await role.change(BrokerRole.MASTER, "127.0.0.1:1")
        # the slave's services stop while still a slave; then the epoch moves on and the
        # role flips; the master's services start; registration as brokerId 0 comes last
        assert rec.calls == [("stop", name, "slave", 0) for name in reversed(SLAVE)] + [
            ("start", name, "master", 1) for name in MASTER
        ] + [("register", str(MASTER_ID), "master", 1)]
        assert role.info()["services"] == sorted(MASTER)
        assert role.changes == 2

        rec.calls.clear()
        assert not await role.change(BrokerRole.MASTER, "127.0.0.1:1")  # already master
        assert rec.calls == [] and role.changes == 2

        await role.stop()
        assert rec.running == set() and role.info()["services"] == []

    run(scenario())


def test_an_authority_gives_the_new_masters_epoch():
    async def scenario() -> None:
        role = RoleState(BrokerRole.SLAVE, 1)
        Recorder(role)
        await role.change(BrokerRole.MASTER, "a", epoch=7)  # DLedger: the Raft term
        assert role.epoch == 7
        # elected again in a newer term without a step-down seen in between: no change of
        # role, but the epoch follows the term (an older term never moves it back)
        assert not await role.change(BrokerRole.MASTER, "a", epoch=9)
        assert not await role.change(BrokerRole.MASTER, "a", epoch=8)
        assert role.epoch == 9 and role.changes == 1
        await role.change(BrokerRole.SLAVE, "b")
        await role.change(BrokerRole.MASTER, "a")
        assert role.epoch == 10

    run(scenario())


def test_controller_epochs_slaves_record_them_and_lower_ones_are_refused():
    """Controller mode: a slave records the epoch of the master it follows, a change from
    an older epoch is refused, and the new epoch is recorded (``before_master``) after the
    slave's services stopped and before the role flips; a failing record keeps the slave."""

    async def scenario() -> None:
        role = RoleState(BrokerRole.SLAVE, 2)
        rec = Recorder(role)
        recorded: list[tuple[int, str, list[str]]] = []

        def record(epoch: int) -> None:
            recorded.append((epoch, role.role.value, sorted(rec.running)))
            if epoch == 13:
                raise OSError("disk full")

        role.services.before_master.append(record)
        await role.start()
        assert await role.change(BrokerRole.SLAVE, "m1", epoch=5) is False  # same role
        assert (role.epoch, role.master_addr) == (5, "m1")
        assert not await role.change(BrokerRole.MASTER, "me", epoch=4)  # older: refused
        assert not role.is_master and recorded == []
        assert not await role.change(BrokerRole.SLAVE, None, epoch=6)  # deposed: nobody
        assert (role.epoch, role.master_addr) == (6, None)

        assert await role.change(BrokerRole.MASTER, "me", epoch=7)
        assert recorded == [(7, "slave", [])]  # slave services stopped, not flipped yet
        assert role.epoch == 7 and role.registered_id == MASTER_ID
        assert not await role.change(BrokerRole.MASTER, "me", epoch=9)  # elected again
        assert recorded[-1] == (9, "master", sorted(MASTER)) and role.epoch == 9
        assert not await role.change(BrokerRole.SLAVE, "m3", epoch=8)  # a late notification
        assert role.is_master

        assert await role.change(BrokerRole.SLAVE, "m3", epoch=12)
        assert (role.epoch, role.master_addr, role.registered_id) == (12, "m3", 2)
        with pytest.raises(OSError, match="disk full"):  # the change fails, not the member
            await role.change(BrokerRole.MASTER, "me", epoch=13)
        assert not role.is_master and role.epoch == 12
        assert rec.running == set(SLAVE)  # still a slave, its services running again

    run(scenario())


def test_concurrent_changes_are_serialised():
    async def scenario() -> None:
        role = RoleState(BrokerRole.MASTER, 1, "a")
        rec = Recorder(role, yields=3)  # every start and stop gives the loop away
        await role.start()
        changes = [
            role.change(BrokerRole.SLAVE, "b"),
            role.change(BrokerRole.MASTER, "a"),
            role.change(BrokerRole.SLAVE, "b"),
            role.change(BrokerRole.SLAVE, "b"),
        ]
        assert await asyncio.gather(*changes) == [True, True, True, False]
        assert rec.overlaps == []  # never master and slave services at once
        assert role.info()["role"] == "slave" and role.changes == 3
        assert rec.running == set(SLAVE) == set(role.running)
        # each change ran whole before the next began
        actions = [(action, name) for action, name, _, _ in rec.calls if action != "register"]
        cycle_to_slave = [("stop", n) for n in reversed(MASTER)] + [("start", n) for n in SLAVE]
        cycle_to_master = [("stop", n) for n in reversed(SLAVE)] + [("start", n) for n in MASTER]
        start = [("start", n) for n in MASTER]
        assert actions == start + cycle_to_slave + cycle_to_master + cycle_to_slave

    run(scenario())


def test_a_failing_service_is_reported_and_the_others_go_on():
    async def scenario() -> None:
        role = RoleState(BrokerRole.MASTER, 1, "a")
        rec = Recorder(role)
        rec.fail = {("delay_delivery", "stop"), ("ha_client", "start")}
        await role.start()
        await role.change(BrokerRole.SLAVE, "b")
        info = role.info()
        assert info["role"] == "slave" and info["changes"] == 1
        # the others stopped and started; the failed stop still counts as running, the
        # failed start does not, and both are in the runtime info
        assert info["services"] == ["delay_delivery", "slave_sync"]
        assert set(info["errors"]) == {"delay_delivery", "ha_client"}
        assert "stop failed" in info["errors"]["delay_delivery"]
        assert ("register", "1", "slave", 0) in rec.calls

        rec.fail.clear()
        await role.change(BrokerRole.MASTER, "a")  # stops delay delivery again, then starts it
        info = role.info()
        assert info["services"] == sorted(MASTER) and rec.running == set(MASTER)
        assert set(info["errors"]) == {"ha_client"}  # until it next starts cleanly
        await role.change(BrokerRole.SLAVE, "b")
        assert role.info()["errors"] == {} and rec.running == set(SLAVE)

    run(scenario())


def test_ha_master_and_client_run_again_after_a_stop(tmp_path):
    """A member that changes role twice stops and starts its HA master and HA client
    again; each time the slave catches up with what the master wrote meanwhile."""

    async def scenario() -> None:
        master_cfg = BrokerConfig(
            store_dir=str(tmp_path / "m"),
            listen=f"127.0.0.1:{free_port()}",
            ha_listen=f"127.0.0.1:{free_port()}",
        )
        slave_cfg = BrokerConfig(
            store_dir=str(tmp_path / "s"),
            broker_id=1,
            broker_role="slave",
            listen=f"127.0.0.1:{free_port()}",
        )
        master_store, slave_store = MessageStore(master_cfg), MessageStore(slave_cfg)
        topics = TopicService(
            master_store,
            RoleState(BrokerRole.MASTER, 0),
            default_queue_nums=1,
            auto_create=False,
            on_change=lambda: None,
        )
        topics.create("T", 1, 1, 6, notify=False)
        pool = ConnectionPool()
        slave_members = MemberGroup(slave_cfg, pool)
        slave_members.ha_addrs = {MASTER_ID: master_cfg.ha_address}
        ha_master = HAMaster(master_cfg, master_store, MemberGroup(master_cfg, pool))
        ha_slave = HASlave(slave_cfg, slave_store, slave_members, lambda arrived: None)
        try:
            for round_ in range(3):
                await ha_master.start()
                ha_slave.start()
                payload = encode_message(b"round %d" % round_)
                master_store.put_batch("T", 0, payload, 1, zlib.crc32(payload), 0)
                master_store.commit()
                ha_master.new_data()
                end = master_store.commitlog.max_offset
                while slave_store.commitlog.max_offset < end:
                    await asyncio.sleep(0.01)
                assert ha_slave.status()["state"] == "TRANSFER"
                await ha_slave.stop()
                await ha_master.stop()
            assert slave_store.commitlog.max_offset == master_store.commitlog.max_offset
        finally:
            await ha_slave.stop()
            await ha_master.stop()
            await pool.close()
            master_store.close()
            slave_store.close()

    run(scenario())
