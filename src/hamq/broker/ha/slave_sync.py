"""RocketMQ's SlaveSynchronize: a slave copies its master's topic table, consumer offsets
and delay offsets every ``slave_sync_interval_ms``, so it can serve reads (and resume
consumers at their committed offsets) when the master is gone.

Nothing newer here is overwritten by an older master's copy (seed 004: this member may have
acted as master): offsets and delay progress are merged, never moving back (an offset reset
moves them back by its newer generation: ``store/metadata.py``), and keep the newer
DataVersion. The topic table is replaced whole, as it must carry deletions, and that
cannot lose anything newer: topics change only on a master (a slave, acting or not,
refuses topic changes), and the master persists each change before answering it.

A DLedger member takes no topics this way: topics (and their deletion) are Raft commands,
applied only from the log in log order; a table copied from a leader ahead of it would
make it skip a delete it later applies, and its queues would then differ from the others'."""

from __future__ import annotations

import logging

from hamq.broker.ha.member_group import MemberGroup
from hamq.broker.topics import TopicService
from hamq.errors import HamqError
from hamq.net.pool import ConnectionPool
from hamq.net.tasks import PeriodicTask
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import unpack_body
from hamq.store.delay_offset import DelayOffsetManager
from hamq.store.message_store import MessageStore
from hamq.store.metadata import DataVersion, TopicConfig, reset_generations_from_wire

log = logging.getLogger(__name__)


class SlaveSynchronize:
    def __init__(
        self,
        store: MessageStore,
        topics: TopicService,
        members: MemberGroup,
        pool: ConnectionPool,
        delay_offsets: DelayOffsetManager,
        *,
        interval_ms: int,
        sync_topics: bool,
    ) -> None:
        self.store = store
        self.delay_offsets = delay_offsets
        self.topics = topics
        self.sync_topics = sync_topics
        self.members = members
        self.pool = pool
        self._rounds = PeriodicTask("slave sync", interval_ms / 1000, self.sync_once)

    def request_sync(self) -> None:
        """Sync now (a replicated record named a topic this slave does not know)."""
        self._rounds.wake()

    async def start(self) -> None:
        """Slave only: sync once, then every interval."""
        await self.sync_once()
        self._rounds.start()

    async def stop(self) -> None:
        await self._rounds.stop()

    async def sync_once(self) -> bool:
        master = self.members.master_addr  # the controller's choice in controller mode
        if master is None or master == self.members.config.broker_addr:  # DLedger: we lead
            return False
        try:
            conn = await self.pool.get(master)
            topics = (
                await conn.request(RequestCode.GET_ALL_TOPIC_CONFIG, timeout_s=3.0)
                if self.sync_topics
                else None
            )
            offsets = await conn.request(RequestCode.GET_ALL_CONSUMER_OFFSET, timeout_s=3.0)
            delay = await conn.request(RequestCode.GET_ALL_DELAY_OFFSET, timeout_s=3.0)
        except HamqError as err:
            log.debug("slave sync from %s failed: %s", master, err.message)
            return False
        if topics is not None and topics.code == 0:
            self.topics.replace_all(
                {
                    name: TopicConfig(name, **cfg)
                    for name, cfg in (unpack_body(topics.body) or {}).items()
                }
            )
        # Offsets and delay progress are merged, never overwritten: an offset never moves
        # back (but by a group's newer reset generation: an operator's reset), so a master
        # that returned without pre-online (skip_pre_online, or a slave it could not wait
        # for) cannot undo what consumers committed on this member while it acted as
        # master; the version taken is the newer of the two.
        try:
            if offsets.code == 0:
                self.store.offsets.merge(
                    unpack_body(offsets.body) or {},
                    DataVersion.from_wire(offsets.ext.get("data_version")),
                    reset_generations_from_wire(offsets.ext.get("reset_generations")),
                )
            if delay.code == 0:
                self.delay_offsets.merge(
                    unpack_body(delay.body) or {},
                    DataVersion.from_wire(delay.ext.get("data_version")),
                )
        except HamqError as err:
            log.warning("slave sync from %s: bad metadata: %s", master, err.message)
            return False
        return True
