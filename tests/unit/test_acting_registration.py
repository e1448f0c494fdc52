"""A member's registration (``broker/registration.py``) against a real name server
processor on a loopback port: the body carries ``enable_acting_master``, and an isolated
member (pre-online) sends neither REGISTER_BROKER nor BROKER_HEARTBEAT until
``go_online()``, which registers it at once; a bad ``enable_acting_master`` is refused."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from hamq.broker.registration import NamesrvRegistration
from hamq.broker.role import BrokerRole, RoleState
from hamq.config import BrokerConfig, NamesrvConfig
from hamq.errors import InvalidArgument
from hamq.namesrv.requests import registration
from hamq.namesrv.server import NamesrvProcessor
from hamq.net.connection import Connection
from hamq.net.pool import ConnectionPool
from hamq.net.server import Server
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, pack_body
from hamq.store.metadata import TopicConfigManager
from helpers import free_port, until

HEARTBEAT_MS = 50
WAIT_S = 10.0


class Recording(NamesrvProcessor):
    """The name server's processor, recording the request codes it served."""

    def __init__(self, config: NamesrvConfig) -> None:
        super().__init__(config)
        self.codes: list[int] = []

    def handle(self, conn: Connection, frame: Frame) -> list | None:
        self.codes.append(frame.code)
        return super().handle(conn, frame)


@contextlib.asynccontextmanager
async def isolated_member(tmp_path):
    """A recording name server on a loopback port and an isolated slave registering with
    it (heartbeats every HEARTBEAT_MS), both closed at the end."""
    ns_addr = f"127.0.0.1:{free_port()}"
    processor = Recording(NamesrvConfig(listen=ns_addr, support_acting_master=True))
    server = Server(processor)
    await server.start(ns_addr)
    config = BrokerConfig(
        broker_name="broker-a",
        broker_id=1,
        broker_role="slave",
        listen=f"127.0.0.1:{free_port()}",
        namesrv=(ns_addr,),
        enable_slave_acting_master=True,
        broker_heartbeat_interval_ms=HEARTBEAT_MS,
    )
    reg = NamesrvRegistration(
        config, TopicConfigManager(tmp_path, 0), ConnectionPool(), RoleState(BrokerRole.SLAVE, 1)
    )
    reg.isolated = True
    try:
        yield processor, reg
    finally:
        await reg.pool.close()
        await server.close()


def test_isolated_member_is_unseen_until_it_goes_online(tmp_path):
    async def scenario() -> None:
        async with isolated_member(tmp_path) as (processor, reg):
            await reg.start()
            # ten heartbeat periods: not one request reaches the name server
            await asyncio.sleep(10 * HEARTBEAT_MS / 1000)
            assert processor.codes == [] and processor.routes.live == {}
            await reg.go_online()
            assert processor.codes == [RequestCode.REGISTER_BROKER]  # at once
            assert processor.routes.live[reg.config.listen].enable_acting_master
            await until(
                lambda: RequestCode.BROKER_HEARTBEAT in processor.codes,
                WAIT_S,
                "heartbeats once online",
            )
            await reg.stop()
            assert processor.routes.live == {}  # unregistered at its stop

    asyncio.run(asyncio.wait_for(scenario(), WAIT_S * 2))


def test_an_isolated_member_that_stops_sends_nothing(tmp_path):
    async def scenario() -> None:
        async with isolated_member(tmp_path) as (processor, reg):
            await reg.start()
            await reg.stop()
            assert processor.codes == []

    asyncio.run(asyncio.wait_for(scenario(), WAIT_S))


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_bad_enable_acting_master_is_refused(value):
    ext = {
        "cluster_name": "C",
        "broker_name": "broker-a",
        "broker_id": 1,
        "broker_addr": "127.0.0.1:10911",
    }
    body = pack_body({"enable_acting_master": value})
    with pytest.raises(InvalidArgument, match="enable_acting_master"):
        registration(Frame(RequestCode.REGISTER_BROKER, 1, ext=ext, body=body))
    assert not registration(Frame(RequestCode.REGISTER_BROKER, 1, ext=ext)).enable_acting_master
