"""A master's SyncStateSet alters (``ReplicasManager._check_sync_state_set``) against a real
controller peer, with the member's own store, role state and HA master in process: a
refused expand stops counting the joining member for all-ack, and an alter carries the
epochs the HA master holds, so a proposal made from an older set is fenced instead of
applied over the controller's newer one."""

from __future__ import annotations

import asyncio

import pytest

from controller.test_controller_server import CLUSTER, GROUP, _leader, _start_peers
from hamq.broker.ha.member_group import MemberGroup
from hamq.broker.ha.service import HAMaster, HASlave
from hamq.broker.replicas_manager import ReplicasManager
from hamq.broker.role import BrokerRole, RoleState
from hamq.client.controller import ControllerClient
from hamq.clock import monotonic_ms
from hamq.config import BrokerConfig
from hamq.controller.requests import BrokerHeartbeat
from hamq.errors import ControllerRefused
from hamq.net.pool import ConnectionPool
from hamq.protocol.codes import ResponseCode
from hamq.store.message_store import MessageStore
from helpers import free_port


class Member:
    """One member's controller-mode parts, wired as ``broker/server.py`` wires them, with
    no HA network: slaves' progress is given to the HA master's SyncStateSet directly."""

    def __init__(self, controller_addr: str, store_dir: str) -> None:
        self.config = BrokerConfig(
            cluster_name=CLUSTER,
            broker_name=GROUP,
            store_dir=store_dir,
            disk_min_free_bytes=1,
            enable_controller_mode=True,
            controller_addr=(controller_addr,),
            all_ack_in_sync_state_set=True,
            listen=f"127.0.0.1:{free_port()}",
            ha_listen=f"127.0.0.1:{free_port()}",
        )
        self.store = MessageStore(self.config)
        members = MemberGroup(self.config, ConnectionPool())
        self.ha_master = HAMaster(self.config, self.store, members)
        ha_slave = HASlave(self.config, self.store, members, on_arrival=lambda _: None)
        self.role = RoleState(BrokerRole.SLAVE, 0)
        self.manager = ReplicasManager(
            self.config,
            self.store,
            self.role,
            members,
            self.ha_master,
            ha_slave,
            ControllerClient([controller_addr]),
        )
        self.role.services.before_master.append(self.manager.start_epoch)

    async def lead(self) -> None:
        """Take id 1 and win the group's first election."""
        assert await self.manager.take_broker_id() == 1
        await self.manager.refresh()
        assert self.role.is_master and self.ha_master.epoch == 1

    def slave_caught_up(self, broker_id: int) -> None:
        sss = self.ha_master.core.sync_state_set
        assert sss is not None
        sss.on_connect(broker_id, self.store.commitlog.max_offset, monotonic_ms())

    async def close(self) -> None:
        await self.manager.stop()
        self.store.close()


async def _join(client: ControllerClient, broker_id: int, alive: bool) -> None:
    addr = f"127.0.0.1:{free_port()}"
    assert await client.get_next_broker_id(CLUSTER, GROUP) == broker_id
    await client.apply_broker_id(CLUSTER, GROUP, broker_id, addr, f"check-{broker_id}")
    if alive:
        await client.heartbeat(BrokerHeartbeat(CLUSTER, GROUP, broker_id, addr, 0, 0))


def _scenario(cluster_factory, tmp_path, body) -> None:
    (addr,) = _start_peers(cluster_factory(), count=1).values()

    async def run():
        await _leader([addr])
        member = Member(addr, str(tmp_path / "m1"))
        client = ControllerClient([addr])
        try:
            await member.lead()
            await body(member, client)
        finally:
            await client.close()
            await member.close()

    asyncio.run(run())


def test_a_refused_expand_stops_counting_the_joining_member(cluster_factory, tmp_path):
    """Member 2 caught up on the HA side but the controller never heard from it: the
    expand is refused as not alive, and the master must stop counting 2 for all-ack (else
    every all-ack send waits for a member that may never come back)."""

    async def body(member: Member, client: ControllerClient) -> None:
        await _join(client, 2, alive=False)
        member.slave_caught_up(2)
        with pytest.raises(ControllerRefused) as refused:
            await member.manager._check_sync_state_set()
        assert refused.value.code == ResponseCode.CONTROLLER_BROKER_NOT_ALIVE
        assert member.ha_master.sync_state_set == {1}
        assert (await client.get_replica_info(CLUSTER, GROUP)).sync_state_set == {1}

    _scenario(cluster_factory, tmp_path, body)


def test_an_alter_made_from_an_older_set_is_fenced_not_applied(cluster_factory, tmp_path):
    """The controller applied set {1, 2} and the member recorded it (``_take`` does so
    before the role change applies it to the HA master), while the HA master still holds
    {1}: its proposal {1, 3} comes from that older set. Sent with the recorded epoch it
    would replace {1, 2} and drop member 2, which the controller counted in sync; with the
    HA master's epoch it is fenced and the member re-reads its role."""

    async def body(member: Member, client: ControllerClient) -> None:
        await _join(client, 2, alive=True)
        await _join(client, 3, alive=True)
        newer = await client.alter_sync_state_set(CLUSTER, GROUP, 1, 1, [1, 2], 1)
        assert newer == (frozenset({1, 2}), 2)
        member.manager.info = await client.get_replica_info(CLUSTER, GROUP)  # the gap
        member.slave_caught_up(3)
        await member.manager._check_sync_state_set()
        assert (await client.get_replica_info(CLUSTER, GROUP)).sync_state_set == {1, 2}
        assert member.ha_master.sync_state_set >= {1, 2}  # the re-read took the newer set

    _scenario(cluster_factory, tmp_path, body)


def test_a_master_that_lost_records_a_slave_holds_hands_over_to_that_slave(
    cluster_factory, tmp_path
):
    """The HA master found a slave holding records of its own epoch that its log lost (an
    unflushed tail): it stopped acknowledging, and must not stay master of a group that
    can then take no sends. It asks for the election a restarted master asks for, and the
    slave holding the records wins in a new epoch."""

    async def body(member: Member, client: ControllerClient) -> None:
        slave = BrokerHeartbeat(CLUSTER, GROUP, 2, f"127.0.0.1:{free_port()}", 1, 10_000)
        await client.apply_broker_id(CLUSTER, GROUP, 2, slave.address, "check-2")
        await client.heartbeat(slave)
        assert await client.alter_sync_state_set(CLUSTER, GROUP, 1, 1, [1, 2], 1)
        await member.manager.refresh()
        member.ha_master.core.lose_records()
        assert member.ha_master.deposed
        await client.heartbeat(slave)  # reports after the master registered count
        await member.manager._check_sync_state_set()
        info = await client.get_replica_info(CLUSTER, GROUP)
        assert (info.master_id, info.master_addr, info.master_epoch) == (2, slave.address, 2)
        assert not member.role.is_master and member.role.epoch == 2

    _scenario(cluster_factory, tmp_path, body)
