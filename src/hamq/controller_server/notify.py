"""NOTIFY_BROKER_ROLE_CHANGED: after the leader applies an election or an alter of the
SyncStateSet, every member of the group hears the new replica info at once (RocketMQ's
``notifyBrokerRoleChanged``). Oneway and best effort: a member that is down or
unreachable is logged and skipped, never retried here — members also poll their replica
info every ``sync_broker_metadata_period_ms``, which is the safety net."""

from __future__ import annotations

import asyncio
import logging

from hamq.controller.core import GroupChanged
from hamq.controller.events import AlterSyncStateSet, ElectMaster
from hamq.errors import HamqError
from hamq.net.pool import ConnectionPool
from hamq.net.tasks import cancel_all, spawn
from hamq.protocol.codes import RequestCode
from hamq.protocol.controller import ReplicaInfo, role_changed_ext

log = logging.getLogger(__name__)

# A member that does not accept a connection this fast is skipped for this notification.
CONNECT_TIMEOUT_S = 1.0


class RoleNotifier:
    def __init__(self) -> None:
        self.pool = ConnectionPool(connect_timeout_s=CONNECT_TIMEOUT_S)
        self._sending: set[asyncio.Task] = set()

    def notify(self, change: GroupChanged) -> None:
        if change.group is None or not isinstance(change.event, (ElectMaster, AlterSyncStateSet)):
            return
        ext = role_changed_ext(change.key, ReplicaInfo.of_group(change.group))
        for member in change.group.members.values():
            task = spawn(self._send(member.address, ext))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, addr: str, ext: dict) -> None:
        try:
            conn = await self.pool.get(addr)
        except HamqError as err:
            log.info("role change not delivered to %s: %s", addr, err.message)
            return
        conn.oneway(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, ext)

    async def close(self) -> None:
        await cancel_all(list(self._sending))
        await self.pool.close()
