"""Lock quorum (seed 004, RIP-32 ``lockInStrictMode``): a queue lock that holds across an
acting-master period and the master's return.

With a slave acting as master, ordered consumers lock through it; when the master comes
back (with no locks: they live in memory) a second consumer may lock the same queue there
while the first still holds it on the slave, and both consume it. In strict mode the member
a client asks locks the queues itself and forwards the request, marked
``only_this_broker``, to the other members of its group at once; a queue is locked only
when a majority of the group granted it (``locks.lock_quorum``). Any two majorities share a
member, and a member holds a queue for one client at a time, so two clients never both
reach one. Unlocks are forwarded the same way. Forwarded requests carry the mark, so they
are never forwarded again.

Queues that did not reach the quorum are released on this member when this request took
them here: two clients that each won some members would otherwise both be refused until
the lease ran out; released, the next try of either wins. A renewal that fell short is not
released, nor are the other members' grants (their answers do not say which were
renewals): they lapse, as all of them do in RocketMQ. A client whose renewal failed is told
"not held" but may still be running the batch in hand; a lock kept until it lapses keeps
the next client off that queue meanwhile.

A client may set ``only_this_broker`` itself: that member then locks only locally and says
so, as in non-strict mode. That gains it nothing against other clients: it holds the queue
on one member, which counts as one grant when another client asks for a quorum; and its
own consumer, told it holds the queue, bypasses only the guarantee it chose to skip."""

from __future__ import annotations

import asyncio
import logging

from hamq.broker.ha.member_group import MemberGroup
from hamq.broker.locks import QueueKey, RebalanceLockManager, granted_by_quorum, lock_quorum
from hamq.config import BrokerConfig
from hamq.errors import HamqError
from hamq.net.pool import ConnectionPool
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import pack_body, unpack_body

log = logging.getLogger(__name__)

# One member's answer to a forwarded lock or unlock (RocketMQ's lockBatchMQAsync: 1000 ms);
# the members are asked at once, so the client waits about this long at worst.
LOCK_FORWARD_TIMEOUT_S = 1.0
ONLY_THIS_BROKER = "only_this_broker"


class LockQuorum:
    def __init__(
        self,
        config: BrokerConfig,
        members: MemberGroup,
        pool: ConnectionPool,
        locks: RebalanceLockManager,
    ) -> None:
        self.config = config
        self.members = members
        self.pool = pool
        self.locks = locks

    @property
    def quorum(self) -> int:
        return lock_quorum(self.config.total_replicas, self.members.alive_replicas)

    def peers(self) -> list[str]:
        """The other live members of this group, by address (the name servers' view)."""
        own = self.config.broker_addr
        return sorted({addr for addr in self.members.broker_addrs.values() if addr != own})

    async def lock(
        self,
        group: str,
        client_id: str,
        queues: list[QueueKey],
        held_here: list[QueueKey],
        renewed_here: set[QueueKey],
    ) -> list[QueueKey]:
        """The queues a majority of the group granted ``client_id``; ``held_here`` is what
        this member granted it, ``renewed_here`` what of that it held here already."""
        quorum = self.quorum
        if quorum <= 1:
            return held_here
        body = pack_body([list(q) for q in queues])
        answers = await asyncio.gather(
            *(
                self._forward(addr, RequestCode.LOCK_BATCH_MQ, group, client_id, body)
                for addr in self.peers()
            )
        )
        held = granted_by_quorum(queues, [held_here, *map(_held, answers)], quorum)
        taken_short = set(held_here).difference(held, renewed_here)
        if taken_short:
            log.info(
                "%d queue(s) of group %s taken for %s here fell short of a quorum of %d: released",
                len(taken_short),
                group,
                client_id,
                quorum,
            )
            self.locks.unlock_batch(group, list(taken_short), client_id)
        return held

    async def unlock(self, group: str, client_id: str, body: bytes) -> None:
        """Forward an unlock (already done here) to the other members."""
        await asyncio.gather(
            *(
                self._forward(addr, RequestCode.UNLOCK_BATCH_MQ, group, client_id, body)
                for addr in self.peers()
            )
        )

    async def _forward(
        self, addr: str, code: int, group: str, client_id: str, body: bytes
    ) -> object:
        """One member's answer body (None if it failed or did not answer in time: no grant)."""
        ext = {"group": group, "client_id": client_id, ONLY_THIS_BROKER: True}
        try:
            conn = await asyncio.wait_for(self.pool.get(addr), LOCK_FORWARD_TIMEOUT_S)
            frame = await conn.request(code, ext, body, LOCK_FORWARD_TIMEOUT_S)
        except (HamqError, TimeoutError, OSError) as err:
            log.debug("%s forwarded to %s failed: %s", RequestCode(code).name, addr, err)
            return None
        if frame.code != ResponseCode.SUCCESS:
            log.debug("%s forwarded to %s refused: %s", RequestCode(code).name, addr, frame.remark)
            return None
        return unpack_body(frame.body) if frame.body else None


def _held(answer: object) -> list[QueueKey]:
    """The queues a member's lock answer holds; anything malformed grants nothing."""
    if not isinstance(answer, list):
        return []
    return [
        (q[0], q[1])
        for q in answer
        if isinstance(q, list) and len(q) == 2 and isinstance(q[0], str) and isinstance(q[1], int)
    ]
