"""Master-slave mode (issue 13 item 1): a running broker switches slave -> master -> slave
in place, with its real services. The DLedger test (test_role_change.py) runs no master
service; here every one of them (HA master, delay delivery, transaction check-back, pop
revive) and both slave services (HA client, slave sync) stop and start again without a
restart, none fails, writes follow the role, and the name server routes the member as
brokerId 0 only while it is master. In process (one event loop), with a real name
server; nothing triggers a master-slave role change yet (seeds 001 and 004 bring that),
so the tests ask the role state directly: one broker alone, then two that hand mastership
to each other under sends, the slave following the new master each time."""

from __future__ import annotations

import asyncio

import pytest

from hamq.broker.ha.member_group import MASTER_ID
from hamq.broker.role import BrokerRole
from hamq.broker.server import Broker
from hamq.client.consumer import AsyncPullConsumer
from hamq.client.message import Message
from hamq.client.producer import AsyncProducer
from hamq.config import BrokerConfig, NamesrvConfig
from hamq.errors import NoPermission
from hamq.namesrv.server import serve_namesrv
from hamq.protocol.codes import RequestCode
from helpers import accepts, free_port, read_queue

MASTER_SERVICES = ["delay_delivery", "ha_master", "pop_revive", "transaction_check"]
SLAVE_SERVICES = ["ha_client", "slave_sync"]
WAIT_S = 20.0


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
        assert asyncio.get_running_loop().time() < deadline, (
            f"not registered as {broker_id}: {broker.members.broker_addrs}"
        )
        await asyncio.sleep(0.05)


async def until(predicate, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.01)


async def start_namesrv(tmp_path) -> tuple[NamesrvConfig, asyncio.Event, asyncio.Task]:
    stop = asyncio.Event()
    config = NamesrvConfig(listen=f"127.0.0.1:{free_port()}", data_dir=str(tmp_path / "ns"))
    task = asyncio.create_task(serve_namesrv(config, stop))
    await until(lambda: accepts(config.listen), "name server up")
    return config, stop, task


def slave_broker(tmp_path, namesrv: NamesrvConfig, broker_id: int, **settings) -> Broker:
    """A member of group "g" (a slave unless ``settings`` say otherwise)."""
    defaults = {
        "store_dir": str(tmp_path / f"broker{broker_id}"),
        "broker_name": "g",
        "broker_id": broker_id,
        "broker_role": "slave",
        "listen": f"127.0.0.1:{free_port()}",
        "ha_listen": f"127.0.0.1:{free_port()}",
        "namesrv": (namesrv.listen,),
        "transaction_check_interval_ms": 200,
        "revive_interval_ms": 200,
        "sync_broker_member_group_period_ms": 200,
        "slave_sync_interval_ms": 200,
    }
    return Broker(BrokerConfig(**(defaults | settings)))


def test_a_broker_switches_its_services_in_place(tmp_path):
    async def scenario() -> None:
        namesrv, stop_namesrv, namesrv_task = await start_namesrv(tmp_path)
        broker = slave_broker(tmp_path, namesrv, 1)
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
                assert broker.runtime_info()["broker_role"] == "sync_master"  # as promoted
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
                assert broker.runtime_info()["broker_role"] == "slave"
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


def test_two_members_hand_mastership_to_each_other_under_sends(tmp_path):
    """Each hand-over stops writes on the master, lets the slave catch up, then promotes
    it (with no controller yet, whoever switches picks an in-sync slave); the old master's
    HA client then follows the new one. Every acknowledged send ends up on both."""

    async def scenario() -> None:
        namesrv, stop_namesrv, namesrv_task = await start_namesrv(tmp_path)
        a, b = slave_broker(tmp_path, namesrv, 1), slave_broker(tmp_path, namesrv, 2)
        producer = AsyncProducer(namesrv.listen, "p", send_timeout_s=3.0)
        acked: list[bytes] = []
        try:
            await a.start()
            await b.start()
            await a.role.change(BrokerRole.MASTER, a.config.listen)
            a.topics.create("T", 1, 1, 6)
            await producer.start()
            master, slave = a, b
            for round_ in range(3):
                await until(
                    lambda s=slave: s.runtime_info()["ha"]["state"] == "TRANSFER",
                    f"round {round_}: the slave attached to the new master",
                )
                for i in range(20):
                    body = b"round %d message %d" % (round_, i)
                    await producer.send(Message("T", body))
                    acked.append(body)
                # hand over: writes stop, the slave catches up, then it is promoted
                await master.role.change(BrokerRole.SLAVE, slave.config.listen)
                end = master.store.commitlog.max_offset
                await until(
                    lambda s=slave, e=end: s.store.commitlog.max_offset == e,
                    f"round {round_}: the slave caught up",
                )
                await slave.role.change(BrokerRole.MASTER, slave.config.listen)
                master, slave = slave, master
                assert master.runtime_info()["role"]["services"] == MASTER_SERVICES
                assert slave.runtime_info()["role"]["services"] == SLAVE_SERVICES
            await until(
                lambda: a.store.commitlog.max_offset == b.store.commitlog.max_offset,
                "both logs equal",
            )
            for member in (a, b):
                assert sorted(read_queue(member.store, "T").values()) == sorted(acked)
                assert member.runtime_info()["role"]["errors"] == {}
            assert a.role.changes == 4 and b.role.changes == 3
        finally:
            await producer.close()
            await a.stop()
            await b.stop()
            stop_namesrv.set()
            await namesrv_task

    asyncio.run(asyncio.wait_for(scenario(), 180))


def test_a_master_turned_slave_refuses_a_send_back(tmp_path):
    """A consumer whose route predates the change hands a message back to the old master:
    the retry topic already exists, so only the role stops the copy being written into the
    log the new master replicates into."""

    async def scenario() -> None:
        namesrv, stop_namesrv, namesrv_task = await start_namesrv(tmp_path)
        broker = slave_broker(tmp_path, namesrv, 1)
        consumer = AsyncPullConsumer("cg", namesrv.listen)
        await broker.start()
        try:
            await broker.role.change(BrokerRole.MASTER, broker.config.listen)
            broker.topics.create("T", 1, 1, 6)
            broker.topics.create("%RETRY%cg", 1, 1, 6)
            producer = AsyncProducer(namesrv.listen, "p", send_timeout_s=3.0)
            await producer.start()
            try:
                await producer.send(Message("T", b"m"))
            finally:
                await producer.close()
            await broker.role.change(BrokerRole.SLAVE, None)
            end = broker.store.commitlog.max_offset
            send_back = {
                "group": "cg",
                "topic": "T",
                "queue_id": 0,
                "queue_offset": 0,
                "delay_level": 0,
                "max_reconsume_times": 16,
            }
            with pytest.raises(NoPermission):
                await consumer.core.invoke(
                    broker.config.listen, RequestCode.CONSUMER_SEND_MSG_BACK, send_back
                )
            assert broker.store.commitlog.max_offset == end
        finally:
            await consumer.close()
            await broker.stop()
            stop_namesrv.set()
            await namesrv_task

    asyncio.run(asyncio.wait_for(scenario(), 120))
