"""What a broker knows about its own group: alive members (for RIP-34's
``aliveReplicaNumInGroup``) and the master's HA address (for slaves). Kept fresh by a
periodic GET_BROKER_MEMBER_GROUP to every name server and by their reverse notification.

Name servers share no state, and one that restarted knows nobody until the members
register again: it answers with an empty group, or one without us. Taking that answer
lowered the alive count (auto-degradation then lowered needAckNums) and cleared the
master's HA address (slaves then closed their sessions). So, as RocketMQ counts itself
and ignores empty answers:

- an answer that does not hold this member (its broker id at its own address) is ignored,
  and logged: its name server does not know the group yet;
- the group is the union of the latest answers of the name servers that know us, so a
  member is alive while any of them holds it: one restarted name server cannot lower the
  count, and a dead member drops out once each of them has dropped it (each does after
  ``broker_not_active_timeout_ms``). Where two give one broker id different addresses, the
  first in ``namesrv`` order wins;
- an answer counts until its name server's next poll: one that does not answer is left
  out, so a dead name server cannot keep a dead member alive;
- until some name server knows us, nothing changes (before the first answer, the
  configured ``total_replicas`` counts);
- an answer without a master from a name server still ``settling`` (up for less than its
  liveness timeout) is ignored too: a master that is alive may not have registered with
  it yet, and the smallest-id slave would act beside it (seed 004) until it did.

In controller mode the controller, not the name servers, says who the master is
(``follow_controller``): the name servers may still route a deposed master as brokerId 0
for a while, so ``master_addr`` is the controller's choice and ``master_ha_addr`` the HA
address that member registered with the name servers (under whichever id: every member
registers its HA address from its start, so a new master's is known before it takes id 0),
kept while the name servers' answers lack that master (a restarted one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from hamq.config import BrokerConfig
from hamq.errors import HamqError
from hamq.net.connection import Connection, response_pieces
from hamq.net.pool import ConnectionPool
from hamq.net.tasks import PeriodicTask
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, unpack_body

log = logging.getLogger(__name__)

MASTER_ID = 0
MEMBER_GROUP_TIMEOUT_S = 2.0  # one name server's answer; the others are asked meanwhile


@dataclass(frozen=True, slots=True)
class GroupAnswer:
    """One name server's view of the group: broker id -> address, and -> HA address."""

    broker_addrs: dict[int, str]
    ha_addrs: dict[int, str]

    @classmethod
    def parse(cls, group: dict) -> GroupAnswer:
        return cls(
            {int(k): v for k, v in (group.get("broker_addrs") or {}).items()},
            {int(k): v for k, v in (group.get("ha_addrs") or {}).items()},
        )


class MemberGroup:
    def __init__(self, config: BrokerConfig, pool: ConnectionPool) -> None:
        self.config = config
        self.pool = pool
        self.broker_addrs: dict[int, str] = {}
        self.ha_addrs: dict[int, str] = {}
        self.synced = False
        self.on_change: list[Callable[[], None]] = []
        # after every periodic sync, changed or not (the acting-master decision also
        # depends on time: a returning master's hold)
        self.on_synced: list[Callable[[], None]] = []
        self.controlled = config.enable_controller_mode
        self.controller_master: str | None = None  # controller mode: the master's address
        # controller mode: (master address, HA address) last seen in the name servers' answers
        self._master_ha: tuple[str, str] | None = None
        # name server -> its latest answer that holds us
        self._answers: dict[str, GroupAnswer] = {}
        self._ignoring: set[str] = set()  # name servers whose answers lack us (logged once)
        self._rounds = PeriodicTask(
            "member group sync", config.sync_broker_member_group_period_ms / 1000, self.sync_once
        )
        # a member registers as the master (0) while it is one (broker/role.py), under its
        # own id else (its DLedger member id in DLedger mode)
        self._own_ids = {
            MASTER_ID,
            config.dledger_self_id if config.replication_mode == "dledger" else config.broker_id,
        }

    @property
    def alive_replicas(self) -> int:
        """Members the name servers hold alive; before the first answer, the configured
        ``total_replicas`` (not lowered on a guess)."""
        return max(1, len(self.broker_addrs)) if self.synced else self.config.total_replicas

    @property
    def master_addr(self) -> str | None:
        if self.controlled:
            return self.controller_master
        return self.broker_addrs.get(MASTER_ID)

    @property
    def master_ha_addr(self) -> str | None:
        if not self.controlled:
            return self.ha_addrs.get(MASTER_ID)
        master = self.controller_master
        ha_addr = next(
            (
                self.ha_addrs.get(broker_id)
                for broker_id, addr in sorted(self.broker_addrs.items())
                if addr == master and self.ha_addrs.get(broker_id)
            ),
            None,
        )
        if master is not None and ha_addr is not None:
            self._master_ha = (master, ha_addr)
        elif self._master_ha is not None and self._master_ha[0] == master:
            # a restarted name server that heard from this member before the master lacks
            # it: the controller's master is still there (dropping the address closed the
            # slaves' sessions, and the master shrank its SyncStateSet)
            ha_addr = self._master_ha[1]
        return ha_addr

    def set_own_id(self, broker_id: int) -> None:
        """Controller mode: the id the controller gave this member (answers must hold it)."""
        self._own_ids = {MASTER_ID, broker_id}

    def follow_controller(self, master_addr: str | None) -> None:
        """Controller mode: the master the controller named (None: none now). An HA
        address the name servers do not know yet is asked for at once."""
        self.controller_master = master_addr
        if master_addr is not None and self.master_ha_addr is None:
            self._rounds.wake()

    def start(self) -> None:
        """Ask every period (after a first ``sync_once``)."""
        self._rounds.start()

    async def stop(self) -> None:
        await self._rounds.stop()

    def handle_notification(self, conn: Connection, frame: Frame) -> list | None:
        """NOTIFY_MIN_BROKER_ID_CHANGE from a name server: the group changed."""
        self._take(self._namesrv_of(conn), unpack_body(frame.body) or {})
        self._reconcile()
        return None if frame.is_oneway else response_pieces(frame)

    async def sync_once(self) -> None:
        namesrv = self.config.namesrv
        groups = await asyncio.gather(*(self._ask(addr) for addr in namesrv))
        for addr, group in zip(namesrv, groups):
            if group is None:
                self._answers.pop(addr, None)
            else:
                self._take(addr, group)
        self._reconcile()
        for callback in self.on_synced:
            callback()

    async def _ask(self, addr: str) -> dict | None:
        c = self.config
        try:
            conn = await self.pool.get(addr)
            frame = await conn.request(
                RequestCode.GET_BROKER_MEMBER_GROUP,
                {"cluster_name": c.cluster_name, "broker_name": c.broker_name},
                timeout_s=MEMBER_GROUP_TIMEOUT_S,
            )
        except HamqError as err:
            log.debug("member group from %s: %s", addr, err.message)
            return None
        if frame.code != 0:
            return None
        return unpack_body(frame.body) or {}

    def _namesrv_of(self, conn: Connection) -> str:
        """The configured name server a notification came from (on the connection this
        broker opened to it)."""
        return next((a for a in self.config.namesrv if self.pool.get_ready(a) is conn), conn.peer)

    def _take(self, source: str, group: dict) -> None:
        answer = GroupAnswer.parse(group)
        settling = group.get("settling") is True and MASTER_ID not in answer.broker_addrs
        if not settling and any(
            answer.broker_addrs.get(i) == self.config.broker_addr for i in self._own_ids
        ):
            self._answers[source] = answer
            self._ignoring.discard(source)
            return
        self._answers.pop(source, None)
        if source not in self._ignoring:
            self._ignoring.add(source)
            log.warning(
                "ignoring name server %s's member group of %s: it does not hold this "
                "broker (%s), or no master, yet, e.g. it restarted: %s",
                source,
                self.config.broker_name,
                self.config.broker_addr,
                answer.broker_addrs,
            )

    def _reconcile(self) -> None:
        if not self._answers:
            return  # no name server knows us: keep what we had
        order = {addr: i for i, addr in enumerate(self.config.namesrv)}
        addrs: dict[int, str] = {}
        ha: dict[int, str] = {}
        for source in sorted(self._answers, key=lambda a: order.get(a, len(order))):
            answer = self._answers[source]
            for broker_id, addr in answer.broker_addrs.items():
                addrs.setdefault(broker_id, addr)
            for broker_id, addr in answer.ha_addrs.items():
                ha.setdefault(broker_id, addr)
        changed = addrs != self.broker_addrs or ha != self.ha_addrs or not self.synced
        self.broker_addrs, self.ha_addrs, self.synced = addrs, ha, True
        if changed:
            log.info("broker group %s members now %s", self.config.broker_name, addrs)
            for callback in self.on_change:
                callback()
