"""Behaviour issue 13's refactor changed by accident (a review comparing it with the code
before): each test holds what the code did before the refactor.

In process (one event loop), with a real name server and real brokers, like
test_role_services.py; written against names that exist before and after the refactor,
so it runs on both."""

from __future__ import annotations

import asyncio

from hamq.broker.server import Broker
from hamq.client.message import Message
from hamq.client.producer import AsyncProducer
from hamq.config import BrokerConfig, NamesrvConfig
from hamq.errors import HamqError
from hamq.namesrv.server import serve_namesrv
from helpers import accepts, free_port, read_queue, until

try:
    from hamq.broker.ha.service import HAMaster
except ImportError:  # before the refactor's layout
    from hamq.broker.ha import HAMaster

WAIT_S = 20.0


def member(tmp_path, namesrv: NamesrvConfig, broker_id: int, role: str) -> Broker:
    return Broker(
        BrokerConfig(
            store_dir=str(tmp_path / f"broker{broker_id}"),
            broker_name="g",
            broker_id=broker_id,
            broker_role=role,
            listen=f"127.0.0.1:{free_port()}",
            ha_listen=f"127.0.0.1:{free_port()}",
            namesrv=(namesrv.listen,),
            sync_broker_member_group_period_ms=200,
            slave_sync_interval_ms=200,
        )
    )


def test_a_send_acknowledged_while_an_async_master_stops_is_on_its_slave(tmp_path, monkeypatch):
    """A master's clean stop closes its client port before its HA master, so every send it
    acknowledged until then is shipped to the slave (the HA master stopping first, the
    sends still taken meanwhile were acknowledged and never left the master). The probe
    send is made just after the HA master stopped: refused or on the slave, never only
    acknowledged."""
    acked: list[bytes] = []
    stopped_ha: list[HAMaster] = []
    probe_at: Broker | None = None  # the master, once created
    producer: AsyncProducer | None = None
    stop_ha = HAMaster.stop

    async def stop_then_probe(self: HAMaster) -> None:
        await stop_ha(self)
        stopped_ha.append(self)
        if self is probe_at.ha_master:
            try:
                await producer.send(Message("T", b"sent as the HA master stopped"))
                acked.append(b"sent as the HA master stopped")
            except HamqError:
                pass  # refused: the master no longer takes sends

    monkeypatch.setattr(HAMaster, "stop", stop_then_probe)

    async def scenario() -> None:
        nonlocal probe_at, producer
        stop_namesrv = asyncio.Event()
        namesrv = NamesrvConfig(listen=f"127.0.0.1:{free_port()}", data_dir=str(tmp_path / "ns"))
        namesrv_task = asyncio.create_task(serve_namesrv(namesrv, stop_namesrv))
        master = probe_at = member(tmp_path, namesrv, 0, "async_master")
        slave = member(tmp_path, namesrv, 1, "slave")
        producer = AsyncProducer(namesrv.listen, "p", send_timeout_s=2.0)
        master_stopped = False
        try:
            await until(lambda: accepts(namesrv.listen), WAIT_S, "name server up")
            await master.start()
            await slave.start()
            master.topics.create("T", 1, 1, 6)
            await until(
                lambda: slave.runtime_info()["ha"].get("state") == "TRANSFER",
                WAIT_S,
                "slave attached",
            )
            await producer.start()
            for i in range(10):
                body = b"message %d" % i
                await producer.send(Message("T", body))
                acked.append(body)
            await master.stop()
            master_stopped = True
            assert master.ha_master in stopped_ha
            await until(
                lambda: set(acked) <= {bytes(b) for b in read_queue(slave.store, "T").values()},
                WAIT_S,
                f"every acknowledged send on the slave: {acked}",
            )
        finally:
            await producer.close()
            if not master_stopped:
                await master.stop()
            await slave.stop()
            stop_namesrv.set()
            await namesrv_task

    asyncio.run(asyncio.wait_for(scenario(), 120))
