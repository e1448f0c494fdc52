"""An acting master's transaction decisions, handed to the other members of its group before
END_TRANSACTION is answered (hamq's PUT_TRANSACTION_DECISIONS, 915; RocketMQ has none).

The decision has no op record (an acting master never appends to its log), so only the
member that took it knows it. Killed (kill -9) after answering, it would take the decision
with it: the next acting member's check-back, or the returning master's if the killed one
is not back for pre-online, would ask the producer again and a COMMIT would put the message
a second time. Each member keeps what it is given in its own decisions file, read back when
its transaction services start (acting, or master), and hands it on at pre-online.

A member that does not answer in time is passed over (logged): the decision stands, it is
only the duplicate guard that is weaker while that member is away.
"""

from __future__ import annotations

import asyncio
import logging

from hamq.broker.ha.member_group import MemberGroup
from hamq.broker.transaction.decisions import Decision
from hamq.errors import HamqError
from hamq.net.pool import ConnectionPool
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import pack_body

log = logging.getLogger(__name__)

SHARE_TIMEOUT_S = 3.0


class DecisionShare:
    def __init__(self, members: MemberGroup, pool: ConnectionPool, own_id: int) -> None:
        self.members = members
        self.pool = pool
        self.own_id = own_id

    async def share(self, decided: dict[str, Decision]) -> None:
        """Hand ``decided`` (``TransactionDecisions.shared``) to every other member the
        name servers hold alive; returns once each answered or was passed over."""
        body = pack_body(decided)
        others = [a for i, a in self.members.broker_addrs.items() if i != self.own_id]
        await asyncio.gather(*(self._put(addr, body) for addr in others))

    async def _put(self, addr: str, body: bytes) -> None:
        try:
            conn = await self.pool.get(addr)
            frame = await conn.request(
                RequestCode.PUT_TRANSACTION_DECISIONS, {}, body, timeout_s=SHARE_TIMEOUT_S
            )
        except (HamqError, OSError) as err:
            log.warning("transaction decision not handed to member %s: %s", addr, err)
            return
        if frame.code != ResponseCode.SUCCESS:
            log.warning("member %s refused a transaction decision: %s", addr, frame.remark)
