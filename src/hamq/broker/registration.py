"""Keeping the name servers informed: a full REGISTER_BROKER at start, on topic changes and
every ``register_broker_interval_ms``; a lightweight BROKER_HEARTBEAT every
``broker_heartbeat_interval_ms`` (seed 004); UNREGISTER_BROKER at shutdown. Every name
server is told independently (RocketMQ's model: they never talk to each other).

A registration's ``data_version.state_version`` is the epoch an authority gave this member
(RocketMQ 5 sets the master epoch there): the controller's master epoch in controller mode,
the Raft term in DLedger mode, 0 in master-slave mode (its epoch is a local count that a
restart resets). A name server lets a newer master take brokerId 0 from a live holder at
once and refuses an older one (``namesrv/routes.py``), so the routes follow an election
within a heartbeat and a deposed master cannot hold them.

Every registration says whether this member may act as master while its group has none
(``enable_acting_master``, seed 004): a name server that supports it then routes the
group's smallest-id slave as a read-only brokerId 0.

A member may start ``isolated`` (seed 004's ``isIsolated``: a returning master's pre-online,
``broker/pre_online.py``): it then neither registers nor heartbeats, so no client routes to
it, until ``go_online()``, which registers at once.

A member of a group whose slaves may act as master keeps a lease (``watch_lease``): a
name server that accepted a registration or heartbeat sent at time T holds it until at
least T plus its liveness timeout. Once that passed for every name server (this process
was paused, its host cut off from them), they may have dropped it and another member may
have acted: the secondary-message services of a master or acting member write nothing
(``RoleState.master_lease_lapsed``), and ``on_lease_lapsed`` isolates a master, which
runs pre-online again before it registers (it never restarted, so nothing else would take
back what the acting slave moved on), or ends acting (``broker/acting_master.py``)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict

from hamq.broker.ha.member_group import MASTER_ID
from hamq.broker.role import RoleState
from hamq.clock import monotonic_ms
from hamq.config import BrokerConfig, NamesrvConfig
from hamq.errors import HamqError
from hamq.net.pool import ConnectionPool
from hamq.net.tasks import PeriodicTask, cancel_all
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame, pack_body
from hamq.store.metadata import TopicConfigManager

log = logging.getLogger(__name__)


class NamesrvRegistration:
    def __init__(
        self,
        config: BrokerConfig,
        topics: TopicConfigManager,
        pool: ConnectionPool,
        role: RoleState,
    ) -> None:
        self.config = config
        self.topics = topics
        self.pool = pool
        self.role = role  # the id registered follows it: 0 while this member is the master
        self._authority = config.enable_controller_mode or config.replication_mode == "dledger"
        self.isolated = False  # unseen by the name servers until go_online() (pre-online)
        self._going_online = False
        # Controller mode: a name server refused this member as master (a newer epoch holds
        # brokerId 0, it has been deposed): re-read the role now, not at the next poll.
        self.on_master_refused: Callable[[], Awaitable[None]] | None = None
        self._rereading: asyncio.Task | None = None
        # The state version each name server last accepted. A name server missing here
        # refused the last registration (a fellow member still holds our id: DLedger's
        # old leader has not gone silent yet, or a newer master holds id 0), and one that
        # accepted another version has not heard of an epoch this master was elected in
        # again: either is registered with in full at the next heartbeat rather than in
        # register_broker_interval_ms.
        self._accepted: dict[str, int] = {}
        # name server -> when the last registration or heartbeat it accepted was sent, and
        # the liveness timeout it holds this member by (its answer to a registration)
        self._accepted_at: dict[str, int] = {}
        self._timeout_ms: dict[str, int] = {}
        self.on_lease_lapsed: Callable[[], None] | None = None  # see watch_lease
        self._lapse_told = False  # the lapse under way is logged
        # fires when the lease ends: a heartbeat to a name server that answers nothing waits
        # its whole request timeout, and the lapse must not wait for the next round
        self._lease_end: asyncio.TimerHandle | None = None
        self._rounds = [
            PeriodicTask(
                f"heartbeat to name server {addr}",
                config.broker_heartbeat_interval_ms / 1000,
                functools.partial(self._heartbeat, addr),
            )
            for addr in config.namesrv
        ]
        # a full registration every interval, and at once when asked (request_register)
        self._rounds.append(
            PeriodicTask(
                "registration with the name servers",
                config.register_broker_interval_ms / 1000,
                self._register_all,
                (),
            )
        )

    @property
    def identity(self) -> dict:
        c = self.config
        return {
            "cluster_name": c.cluster_name,
            "broker_name": c.broker_name,
            "broker_id": self.role.registered_id,
            "broker_addr": c.broker_addr,
        }

    def request_register(self) -> None:
        self._rounds[-1].wake()

    async def start(self) -> None:
        await self._register_all()
        for task in self._rounds:
            task.start()

    async def go_online(self) -> None:
        """End isolation: register with every name server now (heartbeats follow); a
        lease starts afresh with the first one accepted."""
        self.isolated = False
        self._accepted_at.clear()
        self._lapse_told = False
        # The heartbeat rounds wait for this registration: one woken meanwhile would send
        # a heartbeat (or a second registration) ahead of it.
        self._going_online = True
        try:
            await self._register_all()
        finally:
            self._going_online = False

    def watch_lease(self, on_lapsed: Callable[[], None]) -> None:
        """Call ``on_lapsed`` while this member, master or acting master, finds the lease of
        the module docstring lapsed (a master's callback isolates it: told once)."""
        self.on_lease_lapsed = on_lapsed

    def _lease_end_ms(self) -> int:
        default_ms = (
            self.config.broker_not_active_timeout_ms or NamesrvConfig.broker_not_active_timeout_ms
        )
        return max(
            sent_ms + self._timeout_ms.get(addr, default_ms)
            for addr, sent_ms in self._accepted_at.items()
        )

    def lease_lapsed(self) -> bool:
        """A watched member that registered once and that no name server is sure to hold
        any more: each accepted its last registration or heartbeat from it longer ago
        than the liveness timeout it holds it by."""
        if self.on_lease_lapsed is None or not self._accepted_at:
            return False
        return monotonic_ms() > self._lease_end_ms()

    def _held_back(self) -> bool:
        """Isolated (then nothing is sent), perhaps just now: a master that found its lease
        lapsed is isolated by ``on_lease_lapsed``; an acting member stops acting and
        registers again."""
        if self.isolated:
            return True
        serving = self.role.is_master or self.role.is_acting_master
        if serving and self.on_lease_lapsed is not None and self.lease_lapsed():
            self.on_lease_lapsed()
            if self._lapse_told:  # logged once a lapse: each round of each name server asks
                return self.isolated
            self._lapse_told = True
            log.error(
                "no name server accepted this member for longer than its liveness timeout "
                "(paused, or cut off from them): another may have served as master "
                "meanwhile; %s",
                "isolated until pre-online has taken the group back"
                if self.isolated
                else "its secondary-message services write nothing until one holds it again"
                if self.role.is_master
                else "acting ends",
            )
        return self.isolated

    @property
    def state_version(self) -> int:
        return self.role.epoch if self._authority else 0

    async def stop(self) -> None:
        await asyncio.gather(*(task.stop() for task in self._rounds))
        await cancel_all([self._rereading])
        if self._lease_end is not None:
            self._lease_end.cancel()
        if self.isolated:
            return  # never registered
        await asyncio.gather(
            *(
                self._call(addr, RequestCode.UNREGISTER_BROKER, self.identity)
                for addr in self.config.namesrv
            ),
            return_exceptions=True,
        )

    async def _register_all(self) -> None:
        await asyncio.gather(*(self._register(addr) for addr in self.config.namesrv))

    async def _heartbeat(self, addr: str) -> None:
        if self._held_back() or self._going_online:
            return
        if self._accepted.get(addr) != self.state_version:
            await self._register(addr)
            return
        sent_ms = monotonic_ms()
        answer = await self._call(addr, RequestCode.BROKER_HEARTBEAT, self.identity)
        if answer is not None and answer.code == ResponseCode.SUCCESS:
            self._renew(addr, sent_ms)
        elif answer is not None and answer.code == ResponseCode.BROKER_NOT_FOUND:
            await self._register(addr)  # name server restarted or expired us

    def _renew(self, addr: str, sent_ms: int) -> None:
        self._accepted_at[addr] = max(sent_ms, self._accepted_at.get(addr, sent_ms))
        self._lapse_told = False
        if self.on_lease_lapsed is None:
            return
        if self._lease_end is not None:
            self._lease_end.cancel()
        delay_s = max(0, self._lease_end_ms() - monotonic_ms() + 1) / 1000
        self._lease_end = asyncio.get_running_loop().call_later(delay_s, self._held_back)

    async def _register(self, addr: str) -> None:
        if self._held_back():
            return
        state_version = self.state_version  # as registered, though the role moves on
        ext = dict(self.identity, ha_addr=self.config.ha_server_addr)
        if self.config.broker_not_active_timeout_ms:
            ext["heartbeat_timeout_ms"] = self.config.broker_not_active_timeout_ms
        body = pack_body(
            {
                "topic_configs": {
                    name: {
                        "read_queue_nums": t.read_queue_nums,
                        "write_queue_nums": t.write_queue_nums,
                        "perm": t.perm,
                    }
                    for name, t in self.topics.topics.items()
                },
                "data_version": dict(asdict(self.topics.data_version), state_version=state_version),
                "enable_acting_master": self.config.enable_slave_acting_master,
            }
        )
        sent_ms = monotonic_ms()
        answer = await self._call(addr, RequestCode.REGISTER_BROKER, ext, body)
        code = None if answer is None else answer.code
        if answer is not None and code == ResponseCode.SUCCESS:
            self._accepted[addr] = state_version
            timeout_ms = answer.ext.get("heartbeat_timeout_ms")
            if type(timeout_ms) is int:  # an older name server does not say
                self._timeout_ms[addr] = timeout_ms
            self._renew(addr, sent_ms)
        elif code == ResponseCode.NO_PERMISSION:
            self._accepted.pop(addr, None)
            if ext["broker_id"] == MASTER_ID:
                self._reread_role()

    def _reread_role(self) -> None:
        """One re-read at a time: a master cut off from its controller is refused at every
        heartbeat while its re-reads wait for the controller."""
        if self.on_master_refused is None or not (
            self._rereading is None or self._rereading.done()
        ):
            return
        self._rereading = asyncio.create_task(self._reread(self.on_master_refused))

    async def _reread(self, reread: Callable[[], Awaitable[None]]) -> None:
        try:
            await reread()
        except (HamqError, OSError) as err:
            log.warning("re-reading the role after a refusal as master failed: %s", err)

    async def _call(self, addr: str, code: int, ext: dict, body: bytes = b"") -> Frame | None:
        """The response, or None; never raises, so the loops keep running."""
        try:
            conn = await self.pool.get(addr)
            frame = await conn.request(code, ext, body, timeout_s=3.0)
        except HamqError as err:
            log.warning("name server %s: %s", addr, err.message)
            return None
        if frame.code not in (ResponseCode.SUCCESS, ResponseCode.BROKER_NOT_FOUND):
            # e.g. another live member holds this broker id: the name server refuses us
            log.warning("name server %s refused %s: %s", addr, RequestCode(code).name, frame.remark)
        return frame
