"""Master-slave mode (issue 13 item 1): a running broker switches slave -> master -> slave
in place, with its real services. The DLedger test (test_role_change.py) runs no master
service; here every one of them (HA master, delay delivery, transaction check-back, pop
revive) and both slave services (HA client, slave sync) stop and start again without a
restart, none fails, writes follow the role, and the name server routes the member as
brokerId 0 only while it is master. In process (one event loop), with a real name
server; nothing triggers a master-slave role change yet (seeds 001 and 004 bring that),
so the test asks the role state directly."""
from __future__ import annotations

import asyncio
import socket

import pytest

from hamq.broker.ha.member_group import MASTER_ID
from hamq.broker.role import BrokerRole
from hamq.broker.server import Broker
from hamq.config import BrokerConfig, NamesrvConfig
from hamq.errors import NoPermission
from hamq.namesrv.server import serve_namesrv
from helpers import free_port

MASTER_SERVICES = ["delay_delivery", "ha_master", "pop_revive", "transaction_check"]
SLAVE_SERVICES = ["ha_client", "slave_sync"]
WAIT_S = 20.0


def accepts(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return False
    return True


async def registered_ids(broker: Broker) -> dict[int, str]:
    """The group as the name server has it, once it holds this broker."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while True:
        await broker.members.sync_once()
        if broker.members.broker_addrs:
            return broker.members.broker_addrs
        assert asyncio.get_running_loop().time() < deadline, "name server never held us"
        await asyncio.sleep(0.05)


async def until_registered_as(broker: Broker, broker_id: int) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while (await registered_ids(broker)) != {broker_id: broker.config.listen}:
        assert asyncio.get_running_loop().time() < deadline, \
            f"not registered as {broker_id}: {broker.members.broker_addrs}"
        await asyncio.sleep(0.05)


def test_a_broker_switches_its_services_in_place(tmp_path):
    async def scenario() -> None:
        stop_namesrv = asyncio.Event()
        namesrv = NamesrvConfig(listen=f"127.0.0.1:{free_port()}",
                                data_dir=str(tmp_path / "namesrv"))
        namesrv_task = asyncio.create_task(serve_namesrv(namesrv, stop_namesrv))
        deadline = asyncio.get_running_loop().time() + WAIT_S
        while not accepts(namesrv.listen):
            assert asyncio.get_running_loop().time() < deadline, "name server not up"
            await asyncio.sleep(0.01)
        broker = Broker(BrokerConfig(
            store_dir=str(tmp_path / "broker"), broker_name="g", broker_id=1,
            broker_role="slave", listen=f"127.0.0.1:{free_port()}",
            ha_listen=f"127.0.0.1:{free_port()}", namesrv=(namesrv.listen,),
            transaction_check_interval_ms=200, revive_interval_ms=200))
        await broker.start()
        try:
            def role() -> dict:
                return broker.runtime_info()["role"]

            assert role()["services"] == SLAVE_SERVICES and role()["errors"] == {}
            await until_registered_as(broker, 1)
            with pytest.raises(NoPermission):
                broker.topics.create("T", 1, 1, 6)
            assert not accepts(broker.config.ha_address)

            for cycle in (1, 2):
                assert await broker.role.change(BrokerRole.MASTER, broker.config.listen)
                info = role()
                assert info["role"] == "master" and info["epoch"] == cycle
                assert info["services"] == MASTER_SERVICES and info["errors"] == {}
                assert broker.runtime_info()["broker_id"] == MASTER_ID
                assert broker.runtime_info()["ha"]["role"] == "master"
                assert accepts(broker.config.ha_address)  # the HA master listens again
                if cycle == 1:
                    broker.topics.create("T", 1, 1, 6)  # writes are the master's
                broker.topics.for_write("T", 0)
                await until_registered_as(broker, MASTER_ID)

                assert await broker.role.change(BrokerRole.SLAVE, None)
                info = role()
                assert info["role"] == "slave" and info["epoch"] == cycle
                assert info["services"] == SLAVE_SERVICES and info["errors"] == {}
                assert info["changes"] == 2 * cycle
                with pytest.raises(NoPermission):
                    broker.topics.for_write("T", 0)
                assert not accepts(broker.config.ha_address)
                await until_registered_as(broker, 1)
        finally:
            await broker.stop()
            stop_namesrv.set()
            await namesrv_task
        assert broker.role.running == set()

    asyncio.run(asyncio.wait_for(scenario(), 120))
