"""Pre-online (seed 004, RIP-32's BrokerPreOnlineService): a returning master takes back the
metadata its slaves moved on while one of them acted as master, before anyone sees it.

While the master was away, the acting slave served consumer-offset commits, delivered due
delay messages (escaped into another group's master) and served pops: its offsets, delay
progress and pop state are ahead of what the master has on disk. Were the master to
register at once, consumers would resume from its older offsets (mass re-consumption) and
its delay delivery would replay what the acting slave already delivered. So a master that
starts with ``enable_slave_acting_master`` (and not ``skip_pre_online``):

1. stays isolated (``registration.isolated``: no REGISTER_BROKER, no heartbeat), so no
   client routes to it, and its delay delivery, transaction check-back and pop revive do
   not start (they are role services after this one, ``Broker._role_services``);
2. asks the name servers for its group's members (GET_BROKER_MEMBER_GROUP);
3. tells each live member where it is (EXCHANGE_BROKER_HA_INFO, ``broker/ha/exchange.py``):
   the member stops acting first, then follows this master's HA address (the name servers
   do not know it yet) and answers;
4. waits until that member's HA session to it completed its handshake (its log is then cut
   to agree with this master's, so what it reports is about records this master holds);
5. pulls its consumer offsets, delay progress and pop checkpoint, and keeps the newer of
   each by DataVersion (``merge_if_not_older``; an offset never moves back);
6. once every member did, goes online (registers) and the master's other services start.

A master that never restarted but that the name servers may have dropped meanwhile (its
process paused past their liveness timeout, or cut off from them: its registration lease
lapsed) runs it again (``again``, ``Broker._lease_lapsed``): its slave may have acted.

A member that fails a step is retried every ``ROUND_INTERVAL_S`` (the group is asked again
each round, so a dead slave is no longer waited for once the name servers dropped it, after
their ``broker_not_active_timeout_ms``). One that does not serve EXCHANGE_BROKER_HA_INFO
predates acting (it never acted) and is not waited for. After ``GIVE_UP_S`` the master goes
online without the members left, with an error naming them: a group without a master is
worse than consumers going back over what those members alone saw.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hamq.broker.ha.member_group import MASTER_ID, GroupAnswer
from hamq.broker.ha.service import HAMaster
from hamq.broker.registration import NamesrvRegistration
from hamq.clock import monotonic_ms
from hamq.config import BrokerConfig
from hamq.errors import HamqError
from hamq.net.counts import COUNTS
from hamq.net.pool import ConnectionPool
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame, unpack_body
from hamq.store.delay_offset import DelayOffsetManager
from hamq.store.message_store import MessageStore
from hamq.store.metadata import DataVersion, reset_generations_from_wire

log = logging.getLogger(__name__)

ROUND_INTERVAL_S = 1.0  # between two rounds over the members not done yet
REQUEST_TIMEOUT_S = 5.0
HANDSHAKE_WAIT_S = 10.0  # for one member's HA session to attach, per round
HANDSHAKE_POLL_S = 0.05
GIVE_UP_S = 120.0
# How long a member holds off acting and follows this master's announcement: more than a
# round, so a master that dies during pre-online leaves its group masterless for no longer.
RETURNING_HOLD_MS = 30_000
# pop checkpoints and the HA info exchange: a member of an older version answers
# REQUEST_CODE_NOT_SUPPORTED, which skips that part instead of failing the round
_SERVED_OR_NOT = (ResponseCode.SUCCESS, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)


class VersionedProgress(Protocol):
    """A table members compare by DataVersion (consumer offsets, delay progress)."""

    @property
    def data_version(self) -> DataVersion: ...

    def merge(self, table: dict, version: DataVersion) -> None: ...


def merge_if_not_older(
    target: VersionedProgress,
    table: dict,
    version: DataVersion,
    merge: Callable[[dict, DataVersion], None] | None = None,
) -> bool:
    """Take a member's table if its version is not older than ours (RocketMQ's pre-online
    rule: an equal version means neither side stepped past the other, so taking it loses
    nothing); the merge (``merge``, else the table's own) never moves an offset back but
    by a newer reset generation. True if taken."""
    if version < target.data_version:
        return False
    (merge or target.merge)(table, version)
    return True


def may_act(config: BrokerConfig) -> bool:
    """A member of a master-slave group whose slaves may act as master."""
    return (
        config.enable_slave_acting_master
        and config.replication_mode == "master-slave"
        and not config.enable_controller_mode
    )


def needs_pre_online(config: BrokerConfig) -> bool:
    """A master of a group whose slaves may act for it (as RocketMQ starts its
    BrokerPreOnlineService only with enableSlaveActingMaster)."""
    return may_act(config) and not config.skip_pre_online and config.broker_role != "slave"


@dataclass
class PreOnlineState:
    """What runtime info shows: isolated until online; members done, skipped, failing."""

    isolated: bool = True
    done: dict[int, str] = field(default_factory=dict)  # broker id -> what was taken
    skipped: dict[int, str] = field(default_factory=dict)  # broker id -> why
    failing: dict[int, str] = field(default_factory=dict)  # broker id -> last error
    rounds: int = 0


class GroupMetadata:
    """Takes a fellow member's consumer offsets, delay progress, pop checkpoint and
    transaction decisions, keeping the newer of each (step 5; also a member about to act
    as master, from the member that acted before it: ``broker/acting_master.py``)."""

    def __init__(
        self,
        pool: ConnectionPool,
        store: MessageStore,
        delay_offsets: DelayOffsetManager,
        write_delay_progress: Callable[[bytes], None],
        merge_pop_checkpoint: Callable[[bytes], bool],
        merge_transaction_decisions: Callable[[bytes], bool],
    ) -> None:
        self.pool = pool
        self.store = store
        self.delay_offsets = delay_offsets
        # after the timer log it counts on is fsynced (ScheduleMessageService.write_progress)
        self.write_delay_progress = write_delay_progress
        self.merge_pop_checkpoint = merge_pop_checkpoint
        self.merge_transaction_decisions = merge_transaction_decisions

    async def request(
        self,
        addr: str,
        code: RequestCode,
        ext: dict | None = None,
        ok: tuple[int, ...] = (ResponseCode.SUCCESS,),
    ) -> Frame:
        """An answer whose code is not in ``ok`` raises, named after the request: every
        caller (here and the acting master's watch) needs that check."""
        conn = await self.pool.get(addr)
        frame = await conn.request(code, ext or {}, timeout_s=REQUEST_TIMEOUT_S)
        if frame.code not in ok:
            raise HamqError.for_code(frame.code, f"{code.name}: {frame.remark}")
        return frame

    async def take(self, addr: str) -> str:
        """What was taken, for the log and runtime info."""
        offsets = await self.request(addr, RequestCode.GET_ALL_CONSUMER_OFFSET)
        delay = await self.request(addr, RequestCode.GET_ALL_DELAY_OFFSET)
        pop = await self.request(addr, RequestCode.GET_POP_CHECKPOINT, ok=_SERVED_OR_NOT)
        decisions = await self.request(addr, RequestCode.GET_TRANSACTION_DECISIONS)
        taken = {
            "consumer_offsets": merge_if_not_older(
                self.store.offsets,
                unpack_body(offsets.body) or {},
                DataVersion.from_wire(offsets.ext.get("data_version")),
                functools.partial(
                    self.store.offsets.merge,
                    reset_generations=reset_generations_from_wire(
                        offsets.ext.get("reset_generations")
                    ),
                ),
            ),
            "delay_offsets": merge_if_not_older(
                self.delay_offsets,
                unpack_body(delay.body) or {},
                DataVersion.from_wire(delay.ext.get("data_version")),
            ),
            "pop_checkpoint": pop.code == ResponseCode.SUCCESS
            and self.merge_pop_checkpoint(pop.body),
            # half messages the member decided while acting (no op record): not asked again
            "transaction_decisions": self.merge_transaction_decisions(decisions.body),
        }
        # the member's log agrees with ours (its handshake cut it), so nothing taken points
        # past our queues; clamped anyway, as everywhere progress comes from elsewhere
        self.store.clamp_progress()
        writes = (
            (self.store.offsets, self.store.offsets.write),
            (self.delay_offsets, self.write_delay_progress),
        )
        for table, write in writes:  # fsynced off the event loop
            snapshot = table.snapshot()
            if snapshot is not None:
                await asyncio.to_thread(write, snapshot)
        return ", ".join(f"{name} {'taken' if t else 'kept'}" for name, t in taken.items())


class PreOnline:
    def __init__(
        self,
        config: BrokerConfig,
        registration: NamesrvRegistration,
        ha_master: HAMaster,
        metadata: GroupMetadata,
    ) -> None:
        self.config = config
        self.registration = registration
        self.ha_master = ha_master
        self.store = metadata.store
        self.metadata = metadata
        self.state = PreOnlineState()
        registration.isolated = True  # before its first registration

    def again(self) -> None:
        """The name servers may have dropped this master while it lived on (its lease
        lapsed, ``broker/registration.py``): its next ``run`` takes the group back again,
        from a fresh state, isolated meanwhile."""
        self.registration.isolated = True
        self.state = PreOnlineState()

    async def run(self) -> None:
        """Steps 2-6 of the module docstring; returns once online (the broker's master
        services start after it). Cancelled by the broker's stop."""
        if not self.state.isolated:
            return  # online already: this master's services restart, nothing to take
        try:
            await self._rounds()
        except Exception:  # a bug must not keep the group's master isolated for good
            COUNTS.internal_errors += 1
            log.exception("pre-online failed; going online without it")
        await self.registration.go_online()
        self.state.isolated = False
        log.info(
            "pre-online done after %d rounds: took %s, skipped %s; registered",
            self.state.rounds,
            self.state.done,
            self.state.skipped,
        )

    async def _rounds(self) -> None:
        give_up_ms = monotonic_ms() + int(GIVE_UP_S * 1000)
        while True:
            self.state.rounds += 1
            pending = await self._pending()
            if pending is not None:
                for broker_id, addr in sorted(pending.items()):
                    await self._prepare(broker_id, addr)
                if all(i in self.state.done or i in self.state.skipped for i in pending):
                    break
            if monotonic_ms() >= give_up_ms:
                log.error(
                    "pre-online: going online after %.0f s without the metadata of "
                    "members %s (%s): consumers may go back over what they alone saw",
                    GIVE_UP_S,
                    sorted(self.state.failing),
                    self.state.failing,
                )
                break
            await asyncio.sleep(ROUND_INTERVAL_S)

    def info(self) -> dict[str, Any]:
        s = self.state
        return {
            "isolated": s.isolated,
            "done": dict(s.done),
            "skipped": dict(s.skipped),
            "failing": dict(s.failing),
            "rounds": s.rounds,
        }

    async def _pending(self) -> dict[int, str] | None:
        """The group's other live members by the name servers (the union of their
        answers), or None when none answered."""
        c = self.config
        answers = await asyncio.gather(
            *(
                self.metadata.request(
                    addr,
                    RequestCode.GET_BROKER_MEMBER_GROUP,
                    {"cluster_name": c.cluster_name, "broker_name": c.broker_name},
                )
                for addr in c.namesrv
            ),
            return_exceptions=True,
        )
        members: dict[int, str] = {}
        answered = False
        for answer in answers:
            if isinstance(answer, Frame) and answer.code == ResponseCode.SUCCESS:
                answered = True
                for broker_id, addr in GroupAnswer.parse(
                    unpack_body(answer.body) or {}
                ).broker_addrs.items():
                    members.setdefault(broker_id, addr)
        if not answered:
            log.warning("pre-online: no name server answered for the member group")
            return None
        # brokerId 0 is this master's own registration from before it stopped, until the
        # name servers drop it
        return {i: a for i, a in members.items() if i != MASTER_ID and a != c.broker_addr}

    async def _prepare(self, broker_id: int, addr: str) -> None:
        if broker_id in self.state.done or broker_id in self.state.skipped:
            return
        try:
            answer = await self._exchange(broker_id, addr)
            if answer is None:
                self.state.skipped[broker_id] = "predates pre-online"
                return
            await self._wait_attached(broker_id)
            self.state.done[broker_id] = await self.metadata.take(addr)
            self.state.failing.pop(broker_id, None)
            log.info("pre-online: member %d (%s): %s", broker_id, addr, self.state.done[broker_id])
        except HamqError as err:
            self.state.failing[broker_id] = err.message
            log.warning("pre-online: member %d (%s): %s; retrying", broker_id, addr, err.message)

    async def _exchange(self, broker_id: int, addr: str) -> dict | None:
        """Step 3; None when the member does not serve it."""
        c = self.config
        frame = await self.metadata.request(
            addr,
            RequestCode.EXCHANGE_BROKER_HA_INFO,
            {
                "cluster_name": c.cluster_name,
                "broker_name": c.broker_name,
                "master_addr": c.broker_addr,
                "master_ha_addr": c.ha_server_addr,
                "master_max_offset": self.store.commitlog.max_offset,
                "hold_ms": RETURNING_HOLD_MS,
            },
            ok=_SERVED_OR_NOT,
        )
        if frame.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            log.warning(
                "pre-online: member %d (%s) does not serve it: not waited for", broker_id, addr
            )
            return None
        if frame.ext.get("broker_id") != broker_id:
            raise HamqError(
                f"member at {addr} answered as broker id {frame.ext.get('broker_id')!r}, "
                f"but the name servers list it as {broker_id}"
            )
        return frame.ext

    async def _wait_attached(self, broker_id: int) -> None:
        """Step 4."""
        deadline = monotonic_ms() + int(HANDSHAKE_WAIT_S * 1000)
        while broker_id not in self.ha_master.attached_broker_ids:
            if monotonic_ms() >= deadline:
                raise HamqError(f"its HA session did not attach within {HANDSHAKE_WAIT_S:g} s")
            await asyncio.sleep(HANDSHAKE_POLL_S)
