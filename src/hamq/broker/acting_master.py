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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

from hamq.broker.ha.member_group import MASTER_ID, MemberGroup
from hamq.broker.role import BrokerRole, RoleState
from hamq.clock import monotonic_ms
from hamq.config import BrokerConfig
from hamq.namesrv.routes import acting_master_id

log = logging.getLogger(__name__)


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
    ) -> None:
        self.enabled = config.enable_slave_acting_master
        self.role = role
        self.members = members
        self._now_ms = now_ms
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
            held_off=self.held_off(),
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
            if await self.role.set_acting_master(acting):
                log.info(
                    "member %d %s acting as master; the group's members: %s",
                    self.role.broker_id,
                    "now" if acting else "no longer",
                    dict(self.members.broker_addrs),
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
