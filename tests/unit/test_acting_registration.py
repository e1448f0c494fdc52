"""A member's registration (``broker/registration.py``) against a real name server
processor on a loopback port: the body carries ``enable_acting_master``, and an isolated
member (pre-online) sends neither REGISTER_BROKER nor BROKER_HEARTBEAT until
``go_online()``, which registers it at once; a bad ``enable_acting_master`` is refused."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest

from hamq.broker.registration import NamesrvRegistration
from hamq.broker.role import BrokerRole, RoleState
from hamq.config import BrokerConfig, NamesrvConfig
from hamq.errors import InvalidArgument, SystemBusy
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


class Silenced(Recording):
    """A name server that can be made to refuse everything (as one the member cannot
    reach, or that no longer holds it)."""

    silent = False
    mute = False  # answers nothing at all: the member's requests time out

    def handle(self, conn: Connection, frame: Frame) -> list | None:
        if self.mute:
            return None
        if self.silent:
            raise SystemBusy("silenced by the test")
        return super().handle(conn, frame)


LEASE_MS = 300  # the name server's liveness timeout in the lease tests


@contextlib.asynccontextmanager
async def watched_master(tmp_path, lapsed):
    """A name server that can be silenced, holding members for LEASE_MS (far below the
    10 s default), and a master registering with it whose lease is watched by
    ``lapsed(reg)``; all closed at the end."""
    ns_addr = f"127.0.0.1:{free_port()}"
    processor = Silenced(NamesrvConfig(listen=ns_addr, broker_not_active_timeout_ms=LEASE_MS))
    server = Server(processor)
    await server.start(ns_addr)
    config = BrokerConfig(
        listen=f"127.0.0.1:{free_port()}",
        namesrv=(ns_addr,),
        enable_slave_acting_master=True,
        broker_heartbeat_interval_ms=HEARTBEAT_MS,
    )
    reg = NamesrvRegistration(
        config, TopicConfigManager(tmp_path, 0), ConnectionPool(), RoleState(BrokerRole.MASTER, 0)
    )
    reg.watch_lease(lambda: lapsed(reg))
    try:
        await reg.start()
        yield processor, reg
    finally:
        await reg.stop()
        await reg.pool.close()
        await server.close()


def test_a_master_whose_lease_lapsed_isolates_itself_until_it_goes_online(tmp_path):
    """The lease ends with the liveness timeout the name server holds the master by: then
    the master is told once, and sends nothing until go_online, which starts a fresh
    lease."""
    told: list[bool] = []

    def lapsed(reg: NamesrvRegistration) -> None:  # as the broker's: pre-online again
        told.append(reg.lease_lapsed())
        reg.isolated = True

    async def scenario() -> None:
        async with watched_master(tmp_path, lapsed) as (processor, reg):
            await asyncio.sleep(3 * LEASE_MS / 1000)  # heartbeats keep renewing it
            assert not reg.lease_lapsed() and not told
            processor.silent = True
            await until(lambda: told, WAIT_S, "the lapse")
            assert told == [True] and reg.isolated
            processor.silent = False
            processor.codes.clear()
            await asyncio.sleep(10 * HEARTBEAT_MS / 1000)
            assert processor.codes == [] and told == [True]  # isolated: nothing sent
            await reg.go_online()
            assert processor.codes == [RequestCode.REGISTER_BROKER]
            assert not reg.lease_lapsed() and not reg.isolated

    asyncio.run(asyncio.wait_for(scenario(), WAIT_S * 2))


def test_a_lapse_that_does_not_isolate_is_logged_once(tmp_path, caplog):
    """A master without pre-online (skip_pre_online) is not isolated by a lapse: it keeps
    trying every name server each heartbeat, and is told each time, but the lapse is
    logged once (it logged an error per name server per heartbeat, saying it was
    isolated), and once more after a renewal and a second lapse."""
    told: list[bool] = []

    async def scenario() -> None:
        async with watched_master(tmp_path, lambda reg: told.append(True)) as (processor, reg):
            for _ in range(2):
                await asyncio.sleep(3 * LEASE_MS / 1000)
                assert not reg.lease_lapsed()
                processor.silent = True
                await until(lambda: len(told) >= 5, WAIT_S, "five rounds past the lapse")
                processor.silent = False
                await until(lambda: not reg.lease_lapsed(), WAIT_S, "the renewal")
                told.clear()

    with caplog.at_level(logging.ERROR, logger="hamq.broker.registration"):
        asyncio.run(asyncio.wait_for(scenario(), WAIT_S * 2))
    lines = [r.getMessage() for r in caplog.records if "liveness timeout" in r.getMessage()]
    assert len(lines) == 2, lines
    assert all("write nothing until one holds it again" in line for line in lines), lines


def test_a_lapse_is_seen_when_the_lease_ends_though_the_heartbeat_hangs(tmp_path):
    """A name server that stops answering (a partition that drops packets: the heartbeat
    waits its whole 3 s request timeout) must not delay the lapse past the lease: the
    member is told once the lease ends (LEASE_MS after the last accepted heartbeat was
    sent), not at the start of the next heartbeat round. An acting member told late acts
    beside the member the name servers made act instead."""
    told: list[float] = []

    async def scenario() -> None:
        async with watched_master(tmp_path, lambda reg: told.append(time.monotonic())) as (
            processor,
            reg,
        ):
            await asyncio.sleep(3 * LEASE_MS / 1000)
            assert not reg.lease_lapsed()
            processor.mute = True
            muted_at = time.monotonic()
            await until(lambda: told, WAIT_S, "the lapse")
            assert told[0] - muted_at < 2.0, f"told {told[0] - muted_at:.2f} s after the mute"

    asyncio.run(asyncio.wait_for(scenario(), WAIT_S * 2))
