"""Master–slave HA transport (seed 000), the asyncio shell around ``replication.master``.

The master listens on its HA port; a slave connects, says how much commit log it has
(HA_HANDSHAKE) and then receives raw log ranges (HA_TRANSFER, one-way frames) which it
appends unchanged, answering each write with its ack offset (HA_ACK, also sent as a
heartbeat every ``ha_send_heartbeat_interval_ms``). Sync-master sends wait on the acks
through the core's ordered waiters; no task per message.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from hamq.broker.member_group import MemberGroup
from hamq.config import BrokerConfig
from hamq.errors import HamqError, InSyncReplicasNotEnough
from hamq.net.connection import Connection, connect, response_pieces
from hamq.net.server import Server
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame, require
from hamq.replication.master import (AckCallback, Diverged, HAConnectionState,
                                     MasterReplication, ReplicaStatus)
from hamq.replication.quorum import QuorumConfig
from hamq.store.message_store import MessageStore

log = logging.getLogger(__name__)

_WAITER_SWEEP_S = 0.02
SLAVE_RECONNECT_DELAY_S = 0.5
DIVERGED_RETRY_DELAY_S = 10.0


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def quorum_of(config: BrokerConfig) -> QuorumConfig:
    return QuorumConfig(config.total_replicas, config.in_sync_replicas,
                        config.min_in_sync_replicas, config.enable_auto_in_sync_replicas,
                        config.ha_max_gap_not_in_sync)


class HAMaster:
    def __init__(self, config: BrokerConfig, store: MessageStore, members: MemberGroup) -> None:
        self.config = config
        self.store = store
        self.members = members
        self.core = MasterReplication(quorum_of(config), config.ha_window_bytes,
                                      config.ha_transfer_batch_bytes)
        self.sync = config.broker_role == "sync_master"
        self.server = Server(self)
        self.server.on_connection_closed.append(self._closed)
        self._conns: dict[Connection, int] = {}
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        await self.server.start(self.config.ha_address)
        self._tasks = [asyncio.create_task(self._housekeeping())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        _run(self.core.fail_all())
        await self.server.close()

    # -- the send path --------------------------------------------------------------------
    def check_quorum(self) -> int:
        """Before a send is stored: how many replicas it needs (1 = answer at once), or
        ``InSyncReplicasNotEnough``. Only a sync master waits for slaves."""
        if not self.sync:
            return 1
        decision = self.core.decide(self.members.alive_replicas, self.store.commitlog.max_offset)
        if not decision.enough:
            raise InSyncReplicasNotEnough(
                f"send needs {decision.need_ack_nums} replicas in sync but only "
                f"{decision.in_sync_replicas} are (alive members "
                f"{self.members.alive_replicas}, in-sync slaves "
                f"{decision.in_sync_replicas - 1}; in_sync_replicas="
                f"{self.config.in_sync_replicas}, enable_auto_in_sync_replicas="
                f"{self.config.enable_auto_in_sync_replicas})")
        return decision.need_ack_nums

    def wait_for_acks(self, end_offset: int, need_ack_nums: int, callback: AckCallback) -> None:
        self.core.wait_for_acks(end_offset, need_ack_nums, _now_ms(),
                                self.config.sync_flush_timeout_ms, callback)

    def new_data(self) -> None:
        """After a commit-log write: ship it to every slave with window room."""
        for conn in self._conns:
            self._pump(conn)

    # -- RequestHandler (the HA port) -------------------------------------------------------
    def handle(self, conn: Connection, frame: Frame) -> list | None:
        if frame.code == RequestCode.HA_ACK:
            _run(self.core.on_ack(conn, require(frame.ext, "ack_offset", int), _now_ms()))
            self._pump(conn)
            return None
        if frame.code == RequestCode.HA_HANDSHAKE:
            return self._handshake(conn, frame)
        raise HamqError(f"HA port does not serve request code {frame.code}")

    def after_batch(self) -> None:
        pass

    def _handshake(self, conn: Connection, frame: Frame) -> list:
        broker_id = require(frame.ext, "broker_id", int)
        log_ = self.store.commitlog
        try:
            start = self.core.handshake(conn, broker_id, require(frame.ext, "max_offset", int),
                                        log_.min_offset, log_.max_offset, _now_ms())
        except Diverged as err:
            log.error("refusing slave %d: %s", broker_id, err)
            return response_pieces(frame, ResponseCode.SLAVE_DIVERGED, remark=str(err))
        log.info("slave %d from %s replicates from offset %d", broker_id, conn.peer, start)
        self._conns[conn] = broker_id
        asyncio.get_running_loop().call_soon(self._pump, conn)
        return response_pieces(frame, ext={"start_offset": start})

    def _closed(self, conn: Connection) -> None:
        if self._conns.pop(conn, None) is not None:
            log.warning("slave connection from %s closed", conn.peer)
        _run(self.core.disconnect(conn))

    def _pump(self, conn: Connection) -> None:
        log_ = self.store.commitlog
        while not conn.is_closed:
            span = self.core.next_transfer(conn, log_.written_offset)
            if span is None:
                return
            start, end = span
            conn.oneway(RequestCode.HA_TRANSFER, {"offset": start}, log_.read_range(start, end))

    async def _housekeeping(self) -> None:
        housekeeping_ms = self.config.ha_housekeeping_interval_ms
        while True:
            await asyncio.sleep(_WAITER_SWEEP_S)
            now = _now_ms()
            _run(self.core.expire_waiters(now))
            for conn in self.core.expire_silent(now, housekeeping_ms):
                log.warning("slave %s silent for %d ms; closing", conn.peer, housekeeping_ms)
                conn.close()

    def status(self) -> dict:
        master_offset = self.store.commitlog.max_offset
        return {"role": "master", "in_sync_slaves": self.core.in_sync_slave_nums(master_offset),
                "slaves": [{"broker_id": s.broker_id, "state": s.state.name,
                            "ack_offset": s.ack_offset, "behind_bytes": master_offset - s.ack_offset}
                           for s in self.core.slaves.values()]}


class HASlave:
    """Keeps one connection to the master's HA port and appends what it ships."""

    def __init__(self, config: BrokerConfig, store: MessageStore, members: MemberGroup,
                 on_arrival: Callable[[list[tuple[str, int]]], None]) -> None:
        self.config = config
        self.store = store
        self.members = members
        self.on_arrival = on_arrival
        self.state = HAConnectionState.READY
        self.master_addr: str | None = None
        self.diverged_reason = ""
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self.state = HAConnectionState.SHUTDOWN
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def handle(self, conn: Connection, frame: Frame) -> list | None:
        if frame.code != RequestCode.HA_TRANSFER:
            raise HamqError(f"slave HA connection does not serve request code {frame.code}")
        try:
            arrived = self.store.append_replicated(require(frame.ext, "offset", int), frame.body)
        except HamqError as err:  # a gap or a corrupt record: start over from the log end
            log.error("replication stream from %s rejected: %s; reconnecting", conn.peer,
                      err.message)
            conn.close()
            return None
        self.on_arrival(arrived)
        conn.oneway(RequestCode.HA_ACK, {"ack_offset": self.store.commitlog.max_offset})
        return None

    def after_batch(self) -> None:
        pass

    async def _run(self) -> None:
        while self.state is not HAConnectionState.SHUTDOWN:
            addr = self.members.master_ha_addr
            if addr is None:
                self.state = HAConnectionState.READY
                await asyncio.sleep(SLAVE_RECONNECT_DELAY_S)
                continue
            try:
                await self._session(addr)
            except HamqError as err:
                log.warning("HA session with master %s ended: %s", addr, err.message)
            if self.state is HAConnectionState.SUSPEND:
                await asyncio.sleep(DIVERGED_RETRY_DELAY_S)
            elif self.state is not HAConnectionState.SHUTDOWN:
                self.state = HAConnectionState.READY
                await asyncio.sleep(SLAVE_RECONNECT_DELAY_S)

    async def _session(self, addr: str) -> None:
        conn = await connect(addr, self)
        try:
            self.state = HAConnectionState.HANDSHAKE
            self.master_addr = addr
            frame = await conn.request(RequestCode.HA_HANDSHAKE, {
                "broker_id": self.config.broker_id, "max_offset": self.store.replica_offset})
            if frame.code == ResponseCode.SLAVE_DIVERGED:
                self.state = HAConnectionState.SUSPEND
                self.diverged_reason = frame.remark
                log.error("master %s refused this slave: %s", addr, frame.remark)
                return
            if frame.code != ResponseCode.SUCCESS:
                raise HamqError.for_code(frame.code, frame.remark)
            start = frame.ext["start_offset"]
            if start > self.store.replica_offset:
                log.warning("master keeps no data before %d; restarting this slave's log there",
                            start)
                self.store.reset_log(start)
            self.state = HAConnectionState.TRANSFER
            self.diverged_reason = ""
            interval_s = self.config.ha_send_heartbeat_interval_ms / 1000
            while not conn.is_closed and self.members.master_ha_addr == addr:
                conn.oneway(RequestCode.HA_ACK, {"ack_offset": self.store.commitlog.max_offset})
                try:
                    await asyncio.wait_for(asyncio.shield(conn.closed), interval_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            conn.close()

    def status(self) -> dict:
        return {"role": "slave", "state": self.state.name, "master_ha_addr": self.master_addr,
                "replica_offset": self.store.replica_offset,
                "diverged": self.diverged_reason or None}


def _run(done: list[tuple[AckCallback, ReplicaStatus]]) -> None:
    for callback, status in done:
        callback(status)
