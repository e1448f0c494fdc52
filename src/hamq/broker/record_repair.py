"""Damaged commit-log records put back from a replica (RocketMQ checks record CRCs on
recovery, DLedger re-fetches entries from its peers).

Bit rot or a stray write can flip a byte in a closed segment, below what recovery checks.
The store refuses such a record's reads (CRC_MISMATCH, never the damaged bytes) and tells
this service, which asks the group's other members one after another for the record at
that commit-log offset (VIEW_MESSAGE_BY_ID: each checks its own copy's CRCs before it
answers). Replicas hold byte-identical logs, so the copy is checked again against the
offset and size and written back in place; the next read serves it. With no other member
holding it intact (a single broker), the record stays refused: counted, logged, and never
handed out as if it were valid.
"""

from __future__ import annotations

import asyncio
import logging

from hamq.broker.ha.member_group import MemberGroup
from hamq.errors import HamqError
from hamq.net.pool import ConnectionPool
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.store.message_store import MessageStore

log = logging.getLogger(__name__)

REPAIR_TIMEOUT_S = 3.0  # one member's answer


class RecordRepair:
    def __init__(
        self, store: MessageStore, members: MemberGroup, pool: ConnectionPool, own_addr: str
    ) -> None:
        self.store = store
        self.members = members
        self.pool = pool
        self.own_addr = own_addr
        self._tasks: dict[int, asyncio.Task] = {}  # one repair per record at a time
        self._unrepairable: set[int] = set()  # records no member had: logged once each
        self.repaired = 0  # records put back from a member's copy
        store.on_damaged.append(self.damaged)

    def damaged(self, phys: int, size: int) -> None:
        """A read found the record at ``phys`` damaged: repair it unless already under way
        (a repair that found no copy is tried again by the next read)."""
        if phys not in self._tasks:
            self._tasks[phys] = asyncio.get_running_loop().create_task(self._repair(phys))

    async def _repair(self, phys: int) -> None:
        try:
            peers = sorted(set(self.members.broker_addrs.values()) - {self.own_addr})
            for addr in peers:
                try:
                    conn = await self.pool.get(addr)
                    frame = await conn.request(
                        RequestCode.VIEW_MESSAGE_BY_ID,
                        {"physical_offset": phys},
                        timeout_s=REPAIR_TIMEOUT_S,
                    )
                    if frame.code != ResponseCode.SUCCESS:
                        log.warning(
                            "member %s has no intact record at %d: %s", addr, phys, frame.remark
                        )
                        continue
                    if phys in self.store.damaged:  # else a repair before this one did it
                        self.store.repair_record(phys, frame.body)
                        self.repaired += 1
                    return
                except (HamqError, OSError) as err:
                    log.warning("repair of record %d from member %s failed: %s", phys, addr, err)
            if phys not in self._unrepairable:  # each read tries again: one line
                self._unrepairable.add(phys)
                log.error(
                    "no other member (of %d known) holds an intact copy of the damaged "
                    "record at commit-log offset %d: its reads stay refused",
                    len(peers),
                    phys,
                )
        finally:
            del self._tasks[phys]

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
