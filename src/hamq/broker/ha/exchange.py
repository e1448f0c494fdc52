"""EXCHANGE_BROKER_HA_INFO on a slave (seed 004, pre-online step 3): a returning master,
isolated so the name servers do not know it yet, announces its addresses. The slave

1. stops acting as master and holds acting off (``master_returning``), so no commit, delay
   delivery or pop of its own moves its metadata on after the master has pulled it;
2. follows the announced HA address (``HASlave.follow_announced``) while the name servers
   know no master;
3. answers ``{"max_offset", "broker_id"}``; the master then waits for the HA handshake and
   pulls this member's metadata.

An announcement can depose an acting master and point this member's replication elsewhere,
so a stranger's is refused: it must name this member's cluster and group, come from the
host of the master it announces, not announce an address the name servers know as another
member, and, while the name servers know a master, announce that master; a member that
followed a master before takes only that master's HA address back. What remains: there is
no authentication in hamq, so a process on the master's own host, once the master is down,
can announce itself there and hold acting off (and, bound to the master's HA port, receive
this member's handshake) until the hold passes; and a member that never followed a master
(it started during the outage) takes any announcement that passes the other checks.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from hamq.broker.ha.member_group import MASTER_ID, MemberGroup
from hamq.broker.ha.service import HASlave
from hamq.broker.role import RoleState
from hamq.config import BrokerConfig
from hamq.errors import HamqError, NoPermission
from hamq.net.connection import Connection, error_pieces, response_pieces
from hamq.net.tasks import spawn
from hamq.protocol.frame import Frame, require, require_int, require_name
from hamq.store.message_store import MessageStore

log = logging.getLogger(__name__)

MAX_HOLD_MS = 60_000  # an announcement holds acting off for at most this long


def _host(addr: str) -> str:
    return addr.rpartition(":")[0]


class BrokerHaInfoExchange:
    def __init__(
        self,
        config: BrokerConfig,
        role: RoleState,
        members: MemberGroup,
        ha_slave: HASlave,
        store: MessageStore,
        master_returning: Callable[[int], Awaitable[None]],
    ) -> None:
        self.config = config
        self.role = role
        self.members = members
        self.ha_slave = ha_slave
        self.store = store
        self.master_returning = master_returning

    def handle(self, conn: Connection, frame: Frame) -> None:
        """Checked at once (a refusal is answered here); answered once acting stopped."""
        master_addr, ha_addr, hold_ms = self._check(conn, frame.ext)
        spawn(self._follow(conn, frame, master_addr, ha_addr, hold_ms))

    def _check(self, conn: Connection, ext: dict) -> tuple[str, str, int]:
        c = self.config
        cluster, group = require_name(ext, "cluster_name"), require_name(ext, "broker_name")
        master_addr, ha_addr = require(ext, "master_addr"), require(ext, "master_ha_addr")
        hold_ms = require_int(ext, "hold_ms", 1, MAX_HOLD_MS)
        if (cluster, group) != (c.cluster_name, c.broker_name):
            raise NoPermission(
                f"announced master of {cluster}/{group}; this member is of "
                f"{c.cluster_name}/{c.broker_name}"
            )
        if self.role.is_master:
            raise NoPermission("this member is a master: it follows no announced master")
        if not (_host(master_addr) == _host(ha_addr) == _host(conn.peer)):
            raise NoPermission(
                f"announcement from {conn.peer} for a master at {master_addr} (HA {ha_addr}): "
                "a master announces itself, from its own host"
            )
        others = {a for i, a in self.members.broker_addrs.items() if i != MASTER_ID}
        known = self.members.broker_addrs.get(MASTER_ID)
        if (
            master_addr in others
            or master_addr == c.broker_addr
            or known not in (None, master_addr)
        ):
            raise NoPermission(
                f"{master_addr} is not this group's master (the name servers know "
                f"{dict(self.members.broker_addrs)})"
            )
        followed = self.ha_slave.master_addr
        if followed is not None and followed != ha_addr:
            raise NoPermission(
                f"this member followed the master at HA address {followed}, not {ha_addr}"
            )
        return master_addr, ha_addr, hold_ms

    async def _follow(
        self, conn: Connection, frame: Frame, master_addr: str, ha_addr: str, hold_ms: int
    ) -> None:
        try:
            await self.master_returning(hold_ms)
        except HamqError as err:
            conn.reply(error_pieces(frame, err))
            return
        self.ha_slave.follow_announced(ha_addr, hold_ms)
        log.info(
            "master %s (HA %s) is returning: acting held off, following it for up to %d ms",
            master_addr,
            ha_addr,
            hold_ms,
        )
        conn.reply(
            response_pieces(
                frame,
                ext={
                    "max_offset": self.store.commitlog.max_offset,
                    "broker_id": self.config.broker_id,
                },
            )
        )
