"""What a broker knows about its own group: alive members (for RIP-34's
``aliveReplicaNumInGroup``) and the master's HA address (for slaves). Kept fresh by a
periodic GET_BROKER_MEMBER_GROUP and by the name server's reverse notification."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from hamq.config import BrokerConfig
from hamq.errors import HamqError
from hamq.net.connection import Connection, response_pieces
from hamq.net.pool import ConnectionPool
from hamq.net.tasks import cancel_all
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, unpack_body

log = logging.getLogger(__name__)

MASTER_ID = 0


class MemberGroup:
    def __init__(self, config: BrokerConfig, pool: ConnectionPool) -> None:
        self.config = config
        self.pool = pool
        self.broker_addrs: dict[int, str] = {}
        self.ha_addrs: dict[int, str] = {}
        self.synced = False
        self.on_change: list[Callable[[], None]] = []
        self._task: asyncio.Task | None = None

    @property
    def alive_replicas(self) -> int:
        """Members the name server holds alive; before the first answer, the configured
        ``total_replicas`` (not lowered on a guess)."""
        return max(1, len(self.broker_addrs)) if self.synced else self.config.total_replicas

    @property
    def master_ha_addr(self) -> str | None:
        return self.ha_addrs.get(MASTER_ID)

    def start(self) -> None:
        self._task = asyncio.create_task(self._sync_loop())

    async def stop(self) -> None:
        await cancel_all([self._task])

    def handle_notification(self, conn: Connection, frame: Frame) -> list | None:
        """NOTIFY_MIN_BROKER_ID_CHANGE from a name server: the group changed."""
        self._apply(unpack_body(frame.body) or {})
        return None if frame.is_oneway else response_pieces(frame)

    async def sync_once(self) -> None:
        c = self.config
        for addr in c.namesrv:
            try:
                conn = await self.pool.get(addr)
                frame = await conn.request(RequestCode.GET_BROKER_MEMBER_GROUP,
                                           {"cluster_name": c.cluster_name,
                                            "broker_name": c.broker_name}, timeout_s=2.0)
            except HamqError as err:
                log.debug("member group from %s: %s", addr, err.message)
                continue
            if frame.code == 0:
                self._apply(unpack_body(frame.body) or {})
                return

    async def _sync_loop(self) -> None:
        while True:
            await self.sync_once()
            await asyncio.sleep(self.config.sync_broker_member_group_period_ms / 1000)

    def _apply(self, group: dict) -> None:
        addrs = {int(k): v for k, v in (group.get("broker_addrs") or {}).items()}
        ha = {int(k): v for k, v in (group.get("ha_addrs") or {}).items()}
        changed = addrs != self.broker_addrs or ha != self.ha_addrs or not self.synced
        self.broker_addrs, self.ha_addrs, self.synced = addrs, ha, True
        if changed:
            log.info("broker group %s members now %s", self.config.broker_name, addrs)
            for callback in self.on_change:
                callback()
