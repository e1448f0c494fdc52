"""When a slave acts as its group's master (seed 004, master-slave mode only).

While a group has no master, its alive member with the smallest broker id serves what only
a master may: offset queries, locks, END_TRANSACTION, and the secondary-message services
(delay delivery, transaction check-back, pop revive), whose writes escape into another
group's master. The name servers route that same member as a read-only brokerId 0
(``namesrv/routes.py``); both sides apply one rule (``acting_master_id``) to the same
member group, so the member clients send master-only requests to is the one serving them.

The member learns of a change of its group from the name servers' reverse notification
or its own periodic member-group sync (``broker/ha/member_group.py``), and each of them
re-decides here; the transition itself goes through the role state
(``RoleState.set_acting_master``: acting services started in order, stopped in reverse).

A returning master (pre-online, ``broker/pre_online.py``) tells the acting member first
(``master_returning``): acting stops at once and stays off until the master shows up in the
member group as brokerId 0 or the hold passes (its pre-online failed), so the two never
serve master-only work together once the master has taken over the group's metadata.

Two acting members must not work from different metadata either. A member that acted was
paused (or cut off from the name servers) past their liveness timeout: another took over
and moved offsets and delay progress on. So a member whose registration lease lapsed
(``broker/registration.py``) stops acting at once and does not act until a name server
holds it again; and a member about to act first waits until its group's other live
members no longer act and takes their metadata (``GroupMetadata``, as pre-online does),
so it never escapes again what another acting member delivered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from hamq.broker.ha.member_group import MASTER_ID, MemberGroup
from hamq.broker.role import BrokerRole, RoleState
from hamq.clock import monotonic_ms
from hamq.config import BrokerConfig
from hamq.errors import HamqError, NoPermission
from hamq.namesrv.routes import acting_master_id
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import unpack_body

if TYPE_CHECKING:
    from hamq.broker.pre_online import GroupMetadata

log = logging.getLogger(__name__)

STOPPED_ACTING_WAIT_MS = 5_000  # for another member to stop acting before this one acts
STOPPED_ACTING_POLL_S = 0.1


def should_act(
    *,
    enabled: bool,
    role: BrokerRole,
    broker_id: int,
    member_ids: Collection[int],
    held_off: bool,
) -> bool:
    """Whether a member acts as master: it enabled acting (``enable_slave_acting_master``),
    it is a slave, no returning master holds it off, and in its group as the name servers
    know it (``member_ids``, this member included) there is no brokerId 0 and this member
    has the smallest id: the member the name servers route as the read-only brokerId 0."""
    return (
        enabled
        and role is BrokerRole.SLAVE
        and not held_off
        and broker_id in member_ids
        and acting_master_id(member_ids) == broker_id
    )


class ActingMasterWatch:
    """Re-decides on every member-group change and sync, and applies the decision through
    the role state; one decision runs at a time (a later request re-decides after it)."""

    def __init__(
        self,
        config: BrokerConfig,
        role: RoleState,
        members: MemberGroup,
        now_ms: Callable[[], int] = monotonic_ms,
        *,
        metadata: GroupMetadata | None = None,
        lease_lapsed: Callable[[], bool] = lambda: False,
    ) -> None:
        self.enabled = config.enable_slave_acting_master
        self.role = role
        self.members = members
        self._now_ms = now_ms
        self.metadata = metadata  # taken from the other members before acting
        self.lease_lapsed = lease_lapsed  # no name server is sure to hold this member
        self._hold_until_ms = 0  # a returning master holds acting off until then
        self._started = False
        self._deciding: asyncio.Task | None = None
        self._again = False
        members.on_change.append(self.reconsider)
        members.on_synced.append(self.reconsider)

    def held_off(self) -> bool:
        """A returning master asked this member not to act: until it is brokerId 0 in the
        member group, or the hold passed."""
        if self._hold_until_ms and (
            MASTER_ID in self.members.broker_addrs or self._now_ms() >= self._hold_until_ms
        ):
            self._hold_until_ms = 0
        return self._hold_until_ms > 0

    def decide(self) -> bool:
        return should_act(
            enabled=self.enabled,
            role=self.role.role,
            broker_id=self.role.broker_id,
            member_ids=self.members.broker_addrs.keys(),
            held_off=self.held_off() or self.lease_lapsed(),
        )

    def start(self) -> None:
        """Decide now and at every change of the group (after the role's services started)."""
        self._started = True
        self.reconsider()

    async def stop(self) -> None:
        """No decision after this one; a decision under way runs to its end (cancelling it
        could leave acting services half started)."""
        self._started = False
        if self._deciding is not None:
            await asyncio.gather(self._deciding, return_exceptions=True)

    def reconsider(self) -> None:
        if not (self._started and self.enabled):
            return
        if self._deciding is not None and not self._deciding.done():
            self._again = True
            return
        self._deciding = asyncio.create_task(self._apply())

    async def _apply(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            acting = self.decide()
            if acting and not self.role.is_acting_master:
                await self._take_over()
                acting = self.decide()  # the group may have changed meanwhile
            if await self.role.set_acting_master(acting):
                log.info(
                    "member %d %s acting as master; the group's members: %s",
                    self.role.broker_id,
                    "now" if acting else "no longer",
                    dict(self.members.broker_addrs),
                )

    async def _take_over(self) -> None:
        """Before acting: each other live member of the group stopped acting, and its
        metadata is taken. One that cannot be asked (dead, frozen) is left out: whatever
        it alone moved on is lost with it, as with a master that dies."""
        if self.metadata is None:
            return
        for broker_id, addr in sorted(self.members.broker_addrs.items()):
            if broker_id in (MASTER_ID, self.role.broker_id):
                continue
            try:
                await self._until_not_acting(self.metadata, addr)
                taken = await self.metadata.take(addr)
            except HamqError as err:
                log.warning(
                    "before acting: member %d (%s): %s; acting without its metadata",
                    broker_id,
                    addr,
                    err.message,
                )
                continue
            log.info("before acting: member %d (%s): %s", broker_id, addr, taken)

    async def _until_not_acting(self, metadata: GroupMetadata, addr: str) -> None:
        deadline_ms = self._now_ms() + STOPPED_ACTING_WAIT_MS
        while True:
            frame = await metadata.request(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
            info = (unpack_body(frame.body) or {}).get("acting_master") or {}
            if not info.get("acting"):
                return
            if self._now_ms() >= deadline_ms:
                raise HamqError(f"still acting as master after {STOPPED_ACTING_WAIT_MS} ms")
            await asyncio.sleep(STOPPED_ACTING_POLL_S)

    def check_offset_commit(self) -> None:
        """UPDATE_CONSUMER_OFFSET on a member that does not act while its group has a
        master, or one is taking it back (pre-online), is refused: that master does not
        see an offset committed here (it pulled this member's already, or never will), and
        a consumer told OK would not commit it again. Refused, the consumer keeps it and
        commits it to the master once its route names it (at its next route refresh)."""
        if not self.enabled or self.role.role is not BrokerRole.SLAVE:
            return
        master = self.members.broker_addrs.get(MASTER_ID)
        if self.role.is_acting_master or (master is None and not self.held_off()):
            return
        raise NoPermission(
            f"this member of {self.members.config.broker_name} does not act as master: "
            f"commit consumer offsets to its master ({master or 'returning'})"
        )

    async def master_returning(self, hold_ms: int) -> None:
        """A returning master is taking the group back (pre-online): stop acting now, and
        do not act again until it is brokerId 0 in the member group or ``hold_ms`` passed."""
        self._hold_until_ms = self._now_ms() + max(hold_ms, 1)
        log.info("the master is returning: acting held off for up to %d ms", hold_ms)
        await self.role.set_acting_master(False)

    def info(self) -> dict:
        held = self.held_off()
        return {
            "enabled": self.enabled,
            "acting": self.role.is_acting_master,
            "changes": self.role.acting_changes,
            "held_off_ms": max(0, self._hold_until_ms - self._now_ms()) if held else 0,
        }
