"""A member's role as one shared state: master or slave, the master epoch, its broker id
and the master's address. Services read it (``is_master``, one property read, cheap on
the send path) instead of keeping a copy, and the services that run on one role only are
started and stopped by it when the role changes, with no restart of the process.

A role change runs in this order (one change at a time: a change asked for while another
is running waits for it; asking for the role the member already has changes nothing):

master -> slave
  1. the role flips first, so new sends, topic changes, pops, acks and END_TRANSACTIONs
     are refused from here on;
  2. the master's services stop, in the reverse of their start order: pop revive,
     transaction check-back, delay delivery, and last the HA master, so what the others
     wrote until they stopped is still shipped to the slaves;
  3. the slave's services start: the HA client (following the master's HA address the
     name servers give), then slave metadata sync;
  4. the member re-registers with the name servers under its own broker id.

slave -> master
  1. the slave's services stop: slave metadata sync, then the HA client, so nothing the old
     master ships is written into the log after this point (then consumer offsets and delay
     progress slave sync took past that log go back to its queues' ends);
  2. the epoch moves on (to the Raft term of the leadership in DLedger mode, so no two
     members are master in one epoch; else by one) and the role flips: writes are taken
     from here on;
  3. the master's services start: HA master, delay delivery, transaction check-back (its
     decisions read back from the op log first), pop revive (its state rebuilt from the
     revive log), each starting from what the old master left in the replicated log;
  4. last, the member re-registers as brokerId 0, so clients route to it only once it is
     ready.

Acting master (seed 004, master-slave mode only): while a group has no master, its slave
with the smallest broker id acts as a read-only master (``broker/acting_master.py`` decides).
``set_acting_master`` runs under the same lock as a change:

start acting (a slave only)
  1. the flag goes up first (``is_acting_master``), so the acting services, which read it,
     put what they write through the escape bridge into another group's master and never
     into this member's log;
  2. the acting services start in order: delay delivery, transaction check-back, pop revive
     (the master's service objects, registered under "acting_*" names). The slave's own
     services (HA client, slave sync) keep running: the log still only grows by HA.

stop acting
  1. the acting services stop, in the reverse of their start order, while the flag is still
     up (what they put until they stopped still escapes);
  2. the flag goes down.

Every ``change()`` ends acting first (steps above), whatever it then does: a member that
becomes master starts the same services under their master names, and one that stays a
slave is told again by the next member-group sync whether it should act.

Which services follow the role is the broker's choice (``Broker.__init__``): in DLedger
mode Raft replicates the log, so there is no HA master or client, slave sync copies no
topics, and the broker-internal writers (delay delivery, check-back, pop revive) do not run
because their writes would bypass Raft.

A service whose start or stop raises is logged with its name and the change goes on with
the others (a member half switched is better than one stuck in the old role); the error
stays in ``errors`` (runtime info) until that service next starts or stops cleanly. A
service whose stop failed still counts as running (``services`` shows it): every later
change stops it again, and one back to its role stops it before starting it afresh.

Without an authority (master-slave mode) the epoch is this member's own count of its
promotions and lives in memory only: a restart starts again at 0. In controller mode
(issue 14, ``broker/replicas_manager.py``) every change carries the controller's master
epoch: a slave records the epoch of the master it follows, a change from an epoch lower
than the one the member knows is refused (a late notification must not undo a newer
election), and ``before_master`` records the new epoch (the epoch file) after the slave's
services stopped and before the role flips, so no record of the new epoch is written
before its start is known; a master elected again in a newer epoch records it too.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum

from hamq.broker.ha.member_group import MASTER_ID
from hamq.net.counts import COUNTS

log = logging.getLogger(__name__)


class BrokerRole(Enum):
    MASTER = "master"
    SLAVE = "slave"


@dataclass(frozen=True, slots=True)
class RoleService:
    """A service that runs on one role only; ``start`` and ``stop`` may be coroutines."""

    name: str
    start: Callable[[], Awaitable[None] | None]
    stop: Callable[[], Awaitable[None] | None]


@dataclass
class RoleServices:
    """What follows the role, in start order (stopped in reverse); ``after_change`` runs
    last in every change (re-registration)."""

    master: list[RoleService] = field(default_factory=list)
    slave: list[RoleService] = field(default_factory=list)
    # run on top of the slave's while it acts as master (module docstring)
    acting: list[RoleService] = field(default_factory=list)
    after_change: list[Callable[[], None]] = field(default_factory=list)
    # given the new master epoch before the role flips (controller mode: the epoch file);
    # one that raises stops the change: the member stays a slave
    before_master: list[Callable[[int], Awaitable[None] | None]] = field(default_factory=list)


class RoleState:
    def __init__(self, role: BrokerRole, broker_id: int, master_addr: str | None = None) -> None:
        self.role = role
        # a master's epoch; a slave's is the one of the master it follows (controller
        # mode) or of its own last mastership
        self.epoch = 0
        self.broker_id = broker_id  # this member's own id: registered while a slave
        self.master_addr = master_addr  # the group's master (this member's own while master)
        self.changes = 0  # completed role changes
        self.acting_master = False  # a slave serving master-only work (seed 004)
        self.acting_changes = 0  # times acting began or ended
        self.services = RoleServices()
        # a master or acting member whose registration lapsed at every name server may
        # have had another member act for it (seed 004): its secondary-message services
        # write nothing until a name server holds it again (``broker/registration.py``)
        self.master_lease_lapsed: Callable[[], bool] = _never
        self.running: set[str] = set()
        self.errors: dict[str, str] = {}  # service -> its last failed start or stop
        self._lock = asyncio.Lock()

    @property
    def is_master(self) -> bool:
        return self.role is BrokerRole.MASTER

    @property
    def is_acting_master(self) -> bool:
        return self.acting_master

    @property
    def registered_id(self) -> int:
        """The broker id the name servers know this member by."""
        return MASTER_ID if self.role is BrokerRole.MASTER else self.broker_id

    async def start(self) -> None:
        """Start the current role's services (the broker's start)."""
        async with self._lock:
            await self._start_all(self._services_of(self.role))

    async def stop(self) -> None:
        """Stop every role service still running (the broker's stop)."""
        async with self._lock:
            await self._end_acting()
            await self._stop_all(exclude=[])

    async def change(
        self, role: BrokerRole, master_addr: str | None = None, epoch: int | None = None
    ) -> bool:
        """Switch to ``role`` in the order of the module docstring; False if the member
        already had it (only ``master_addr`` is taken then, and a newer ``epoch``: a master
        elected again in a newer term) or if ``epoch`` is older than the one it knows. A
        new master takes ``epoch`` when an authority gives one (the Raft term in DLedger
        mode, the controller's master epoch), else its epoch + 1; a slave takes it too."""
        async with self._lock:
            await self._end_acting()
            if epoch is not None and epoch < self.epoch:
                log.warning(
                    "refused a change to %s from epoch %d: this member knows epoch %d",
                    role.value,
                    epoch,
                    self.epoch,
                )
                return False
            if role is self.role:
                await self._same_role(master_addr, epoch)
                return False
            log.info("role change %s -> %s (epoch %d)", self.role.value, role.value, self.epoch)
            if role is BrokerRole.SLAVE:
                self.role, self.master_addr = role, master_addr
                self.epoch = self.epoch if epoch is None else epoch
                await self._stop_all(exclude=self.services.slave)
            else:
                await self._stop_all(exclude=self.services.master)
                new_epoch = self.epoch + 1 if epoch is None else epoch
                try:
                    await self._before_master(new_epoch)
                except Exception:
                    await self._start_all(self.services.slave)  # still a slave
                    raise
                self.epoch = new_epoch
                self.role, self.master_addr = role, master_addr
            await self._start_all(self._services_of(role))
            for callback in self.services.after_change:
                callback()
            self.changes += 1
            log.info("now %s (epoch %d), running %s", role.value, self.epoch, sorted(self.running))
            return True

    async def restart_from(self, name: str) -> bool:
        """A master's services from ``name`` on stop (in reverse) and start again (in
        order), the rest keep running: a master that its name servers dropped runs
        pre-online again before its secondary-message services resume. False if this
        member is no master (a change got there first) or has no such service."""
        async with self._lock:
            names = [service.name for service in self.services.master]
            if self.role is not BrokerRole.MASTER or name not in names:
                return False
            keep = self.services.master[: names.index(name)]
            await self._stop_all(exclude=keep)
            log.info("restarting %s", names[names.index(name) :])
            await self._start_all(self.services.master[len(keep) :])
            return True

    async def set_acting_master(self, acting: bool) -> bool:
        """Begin or end acting as master (module docstring); False if nothing changed: the
        member already did (or did not) act, or it is not a slave (only a slave acts)."""
        async with self._lock:
            if acting == self.acting_master or (acting and self.role is not BrokerRole.SLAVE):
                return False
            if acting:
                self.acting_master = True
                await self._start_all(self.services.acting)
                self.acting_changes += 1
                log.info("acting as master: running %s", sorted(self.running))
                return True
            return await self._end_acting()

    async def _end_acting(self) -> bool:
        if not self.acting_master:
            return False
        await self._stop_all(exclude=self.services.master + self.services.slave)
        self.acting_master = False
        self.acting_changes += 1
        log.info("no longer acting as master: running %s", sorted(self.running))
        return True

    async def _same_role(self, master_addr: str | None, epoch: int | None) -> None:
        """No change of role: a slave takes the master (the controller's, None included,
        when it gives an epoch), a master a newer epoch (recorded first, as at a change)."""
        if epoch is None:
            self.master_addr = master_addr or self.master_addr
            return
        if self.role is BrokerRole.MASTER and epoch > self.epoch:
            await self._before_master(epoch)
        else:
            self.master_addr = master_addr
        self.epoch = epoch

    async def _before_master(self, epoch: int) -> None:
        for hook in self.services.before_master:
            result = hook(epoch)
            if inspect.isawaitable(result):
                await result

    def follow(self, master_addr: str | None) -> None:
        """A slave learnt where its master is (from the name servers)."""
        if self.role is BrokerRole.SLAVE:
            self.master_addr = master_addr

    def info(self) -> dict:
        return {
            "role": self.role.value,
            "epoch": self.epoch,
            "broker_id": self.broker_id,
            "master_addr": self.master_addr,
            "services": sorted(self.running),
            "changes": self.changes,
            "errors": dict(self.errors),
        }

    def _services_of(self, role: BrokerRole) -> list[RoleService]:
        return self.services.master if role is BrokerRole.MASTER else self.services.slave

    async def _start_all(self, services: list[RoleService]) -> None:
        for service in services:
            if service.name in self.running and not await self._run(service, "stop"):
                continue  # its stop failed last time, and again: not started over it
            self.running.discard(service.name)
            if await self._run(service, "start"):
                self.running.add(service.name)

    async def _stop_all(self, exclude: list[RoleService]) -> None:
        """Stop the running services not in ``exclude``, in the reverse of their start
        order."""
        keep = {service.name for service in exclude}
        for service in reversed(self.services.master + self.services.slave + self.services.acting):
            if (
                service.name in self.running
                and service.name not in keep
                and await self._run(service, "stop")
            ):
                self.running.discard(service.name)

    async def _run(self, service: RoleService, action: str) -> bool:
        try:
            result = getattr(service, action)()
            if inspect.isawaitable(result):
                await result
        except Exception as exc:  # one service must not stop the others
            COUNTS.internal_errors += 1
            self.errors[service.name] = f"{action} failed: {exc!r}"
            log.exception(
                "%s of %s failed during a role change to %s; going on with the others",
                action,
                service.name,
                self.role.value,
            )
            return False
        self.errors.pop(service.name, None)
        return True


def _never() -> bool:
    return False
