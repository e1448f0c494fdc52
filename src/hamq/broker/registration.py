"""Keeping the name servers informed: a full REGISTER_BROKER at start, on topic changes and
every ``register_broker_interval_ms``; a lightweight BROKER_HEARTBEAT every
``broker_heartbeat_interval_ms`` (seed 004); UNREGISTER_BROKER at shutdown. Every name
server is told independently (RocketMQ's model: they never talk to each other)."""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import asdict

from hamq.broker.role import RoleState
from hamq.config import BrokerConfig
from hamq.errors import HamqError
from hamq.net.pool import ConnectionPool
from hamq.net.tasks import PeriodicTask
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import pack_body
from hamq.store.metadata import TopicConfigManager

log = logging.getLogger(__name__)


class NamesrvRegistration:
    def __init__(
        self,
        config: BrokerConfig,
        topics: TopicConfigManager,
        pool: ConnectionPool,
        role: RoleState,
    ) -> None:
        self.config = config
        self.topics = topics
        self.pool = pool
        self.role = role  # the id registered follows it: 0 while this member is the master
        # Name servers that refused the last registration: a fellow member still holds
        # our id (DLedger: the old leader has not gone silent yet), so it is asked again
        # at the next heartbeat rather than in register_broker_interval_ms.
        self._refused: set[str] = set()
        self._rounds = [
            PeriodicTask(
                f"heartbeat to name server {addr}",
                config.broker_heartbeat_interval_ms / 1000,
                functools.partial(self._heartbeat, addr),
            )
            for addr in config.namesrv
        ]
        # a full registration every interval, and at once when asked (request_register)
        self._rounds.append(
            PeriodicTask(
                "registration with the name servers",
                config.register_broker_interval_ms / 1000,
                self._register_all,
                (),
            )
        )

    @property
    def identity(self) -> dict:
        c = self.config
        return {
            "cluster_name": c.cluster_name,
            "broker_name": c.broker_name,
            "broker_id": self.role.registered_id,
            "broker_addr": c.listen,
        }

    def request_register(self) -> None:
        self._rounds[-1].wake()

    async def start(self) -> None:
        await self._register_all()
        for task in self._rounds:
            task.start()

    async def stop(self) -> None:
        await asyncio.gather(*(task.stop() for task in self._rounds))
        await asyncio.gather(
            *(
                self._call(addr, RequestCode.UNREGISTER_BROKER, self.identity)
                for addr in self.config.namesrv
            ),
            return_exceptions=True,
        )

    async def _register_all(self) -> None:
        await asyncio.gather(*(self._register(addr) for addr in self.config.namesrv))

    async def _heartbeat(self, addr: str) -> None:
        if addr in self._refused:
            await self._register(addr)
            return
        code = await self._call(addr, RequestCode.BROKER_HEARTBEAT, self.identity)
        if code == ResponseCode.BROKER_NOT_FOUND:  # name server restarted or expired us
            await self._register(addr)

    async def _register(self, addr: str) -> None:
        ext = dict(self.identity, ha_addr=self.config.ha_address)
        if self.config.broker_not_active_timeout_ms:
            ext["heartbeat_timeout_ms"] = self.config.broker_not_active_timeout_ms
        body = pack_body(
            {
                "topic_configs": {
                    name: {
                        "read_queue_nums": t.read_queue_nums,
                        "write_queue_nums": t.write_queue_nums,
                        "perm": t.perm,
                    }
                    for name, t in self.topics.topics.items()
                },
                "data_version": asdict(self.topics.data_version),
            }
        )
        code = await self._call(addr, RequestCode.REGISTER_BROKER, ext, body)
        if code == ResponseCode.NO_PERMISSION:
            self._refused.add(addr)
        else:
            self._refused.discard(addr)

    async def _call(self, addr: str, code: int, ext: dict, body: bytes = b"") -> int | None:
        """The response code, or None; never raises, so the loops keep running."""
        try:
            conn = await self.pool.get(addr)
            frame = await conn.request(code, ext, body, timeout_s=3.0)
        except HamqError as err:
            log.warning("name server %s: %s", addr, err.message)
            return None
        if frame.code not in (ResponseCode.SUCCESS, ResponseCode.BROKER_NOT_FOUND):
            # e.g. another live member holds this broker id: the name server refuses us
            log.warning("name server %s refused %s: %s", addr, RequestCode(code).name, frame.remark)
        return frame.code
