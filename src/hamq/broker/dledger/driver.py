"""The asyncio shell around a DLedger member's core: ticks, the Ready cycle on the event
loop with its fsyncs in worker threads, the periodic Raft-log flush, and the
member-to-member transport.

Only the leader takes sends; what it is asked in one event-loop turn becomes one Raft
entry (``grouping``), answered once that entry is applied (``core``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable
from pathlib import Path

from hamq.broker.dledger.core import DLedgerCore
from hamq.broker.dledger.grouping import ProposalCallback
from hamq.broker.dledger.wire import (
    KIND_DELETE_TOPIC,
    KIND_TOPIC,
    Command,
    decode_message,
    encode_command,
)
from hamq.broker.topics import TopicService, topic_args
from hamq.clock import monotonic_ms, monotonic_s
from hamq.config import BrokerConfig
from hamq.errors import HamqError, InvalidArgument, NotLeader
from hamq.net.connection import Connection, error_pieces, response_pieces
from hamq.net.raft_transport import RaftTransport
from hamq.net.server import Server
from hamq.net.tasks import PeriodicTask
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, require
from hamq.raft import FileStorage, MessageDecodeError, RaftConfig, RaftError, RawNode
from hamq.store.message_store import MessageStore, PutResult
from hamq.store.metadata import TopicConfig

log = logging.getLogger(__name__)

TICK_INTERVAL_S = 0.01
# APPENDs in flight to one follower (each carries a run of entries); followers write what
# arrived together in one Ready, so more in flight means bigger writes.
MAX_PENDING_PUSHES = 256
RAFT_DIR = "dledger"


def _ignore(result: PutResult | None, err: HamqError | None) -> None:
    """A proposal nobody waits for (a topic config the leader adds before a send)."""


class DLedgerCommitLog:
    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicService,
        *,
        on_applied: Callable[[list[tuple[str, int]]], None],
        on_role_change: Callable[[bool], None],
    ) -> None:
        self.config = config
        self.store = store
        self.on_role_change = on_role_change  # True when this member became the leader
        self.node_id = config.dledger_self_id
        self.peers = config.dledger_peer_map
        election_ms = config.dledger_election_timeout_ms
        raft_config = RaftConfig(
            self.node_id,
            tuple(sorted(self.peers)),
            election_timeout_ms=election_ms,
            push_timeout_ms=election_ms * 2 // 5,
            max_pending_pushes=MAX_PENDING_PUSHES,
        )
        self.transport = RaftTransport(self.peers, RequestCode.DLEDGER_MESSAGE)
        self.storage = FileStorage(Path(config.store_dir) / RAFT_DIR)
        self.core = DLedgerCore(
            raft_config,
            self.storage,
            store,
            topics,
            random.Random(os.urandom(8)),
            monotonic_ms(),
            sync_appends=config.flush_disk_type == "sync",
            send=self.transport.send,
            on_applied=on_applied,
            not_leader=self.not_leader,
        )
        self.server = Server(self, config)
        self._pumping = False
        self._pump_again = False
        self.flush_interval_s = config.flush_interval_commitlog_ms / 1000
        self._flushed_at = monotonic_s()
        self._flush_task: asyncio.Task | None = None
        self._pump_future: asyncio.Future | None = None
        self._stopping = False
        self._led_term: int | None = None  # the term this member leads in, None if not
        # topics whose config this leader knows to be in the log (see propose_send)
        self._topics_in_log: set[str] = set()
        self._ticks = PeriodicTask("DLedger tick", TICK_INTERVAL_S, self._tick)

    @property
    def node(self) -> RawNode:  # tests and tools inspect it
        return self.core.node

    @property
    def is_leader(self) -> bool:
        return self.core.is_leader

    @property
    def leader_id(self) -> int:
        return self.core.node.leader_id

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.server.start(self.peers[self.node_id])
        self._ticks.start()

    async def stop(self) -> None:
        """Stop, then make the Raft log and its checkpoint durable, so the store's last
        checkpoint can claim everything applied and a clean restart re-applies nothing."""
        await self._ticks.stop()
        self._stopping = True
        # a Ready cycle or a flush may be writing in a worker thread: let it finish before
        # the storage's files are closed (a reused descriptor would take its writes)
        await asyncio.gather(
            *(t for t in (self._pump_future, self._flush_task) if t), return_exceptions=True
        )
        self.core.fail_all(NotLeader("member shutting down; the outcome is unknown"))
        job = self.core.begin_flush()
        try:
            await asyncio.to_thread(self.core.run_flush, job)
            self.core.flush_done(job)
        except OSError:
            log.exception("DLedger final flush failed; the next start re-applies the tail")
        await self.server.close()
        await self.transport.close()
        self.storage.close()

    def status(self) -> dict:
        return {
            "role": "dledger",
            "member_id": self.node_id,
            "leader_id": self.leader_id,
            "is_leader": self.is_leader,
            **self.core.status(),
        }

    # -- the send path --------------------------------------------------------------------------
    def not_leader(self, why: str = "") -> NotLeader:
        leader = self.peers.get(self.leader_id, "unknown, an election is running")
        return NotLeader(
            f"member {self.node_id} is not the leader of group "
            f"{self.config.broker_name} (leader's raft endpoint: {leader})"
            + (f": {why}" if why else "")
        )

    def propose(self, command: Command, callback: ProposalCallback, *, alone: bool = False) -> None:
        """Queue `command` for the entry of this event-loop turn (proposed when the Ready
        cycle next runs; `alone`: in an entry of its own); `callback` gets its result once
        that entry is applied."""
        self.core.propose(command, callback, alone=alone)
        self._schedule_pump()

    def propose_send(self, topic: str, command: Command, callback: ProposalCallback) -> None:
        """A send. A topic this leader auto-created (or last saw created under another
        leader) gets its config proposed first: members take topics only from the log."""
        if topic not in self._topics_in_log:
            config = self.store.topics.get(topic)
            if config is not None:
                self.propose(_topic_command(config), _ignore)
                self._topics_in_log.add(topic)
        self.propose(command, callback)

    def transfer_leadership(self, to_id: int) -> None:
        if to_id not in self.peers:
            raise InvalidArgument(f"{to_id} is not a member of group {self.config.broker_name}")
        try:
            self.core.node.transfer_leadership(to_id)
        except RaftError as err:
            raise self.not_leader(f"cannot transfer leadership: {err}") from None
        self._schedule_pump()

    # -- RequestHandler: the Raft port ----------------------------------------------------------
    def handle(self, conn: Connection, frame: Frame) -> list | None:
        if frame.code == RequestCode.DLEDGER_MESSAGE:
            try:
                self.core.node.step(decode_message(frame.body))
            except (MessageDecodeError, RaftError) as err:
                log.warning("dropping raft message from %s: %s", conn.peer, err)
            self._schedule_pump()
            return None
        raise HamqError(f"DLedger port does not serve request code {frame.code}")

    def after_batch(self) -> None:
        pass

    def create_topic(self, conn: Connection, frame: Frame) -> None:
        """UPDATE_AND_CREATE_TOPIC on a DLedger group: replicated, answered once committed."""
        config = TopicService.build(*topic_args(frame.ext, self.config.default_topic_queue_nums))
        self._propose_and_reply(conn, frame, _topic_command(config))
        self._topics_in_log.add(config.topic_name)

    def delete_topic(self, conn: Connection, frame: Frame) -> None:
        topic = require(frame.ext, "topic")
        # alone in its entry: see DLedgerCore on why a delete waits for the store's claim
        self._propose_and_reply(conn, frame, encode_command([KIND_DELETE_TOPIC, topic]), alone=True)
        self._topics_in_log.discard(topic)

    def _propose_and_reply(
        self, conn: Connection, frame: Frame, command: Command, alone: bool = False
    ) -> None:
        def committed(result: PutResult | None, err: HamqError | None) -> None:
            conn.reply(error_pieces(frame, err) if err else response_pieces(frame))

        self.propose(command, committed, alone=alone)

    def handle_transfer(self, conn: Connection, frame: Frame) -> list:
        self.transfer_leadership(require(frame.ext, "member_id", int))
        return response_pieces(frame, ext={"from": self.node_id})

    # -- the Ready cycle ------------------------------------------------------------------------
    def _tick(self) -> None:
        if not self._pumping:  # the core applies a backlog on ticks: not mid-cycle
            self.core.tick(monotonic_ms())
            self._maybe_flush()
        else:
            self.core.node.tick(monotonic_ms())
        self._schedule_pump()

    def _schedule_pump(self) -> None:
        if self._stopping:
            return
        if self._pumping:
            self._pump_again = True
        elif self.core.has_work():
            self._pumping = True
            self._pump_future = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        core = self.core
        try:
            while (cycle := core.start_cycle()) is not None:
                if cycle.fsync:
                    written = await asyncio.to_thread(core.persist, cycle)
                else:  # page-cache writes only: no thread hop on the hot path
                    written = core.persist(cycle)
                if not written:  # the core writes it again after a pause
                    break
                core.finish_cycle(cycle, monotonic_ms())
                self._pump_again = False
                self._maybe_flush()
        except Exception:
            log.exception("DLedger ready cycle failed")
            raise
        finally:
            self._pumping = False
        # Compared by term, not by leading or not: a pump that spans a step-down and a
        # re-election in a newer term must still move the member's epoch on.
        led_term = core.node.term if self.is_leader else None
        if led_term != self._led_term:
            self._led_term = led_term
            self._topics_in_log.clear()
            log.info(
                "member %d is now %s of group %s (term %d)",
                self.node_id,
                "LEADER" if self.is_leader else "a follower",
                self.config.broker_name,
                core.node.term,
            )
            self.on_role_change(self.is_leader)
        if self._pump_again:
            self._pump_again = False
            self._schedule_pump()

    def _maybe_flush(self) -> None:
        """Every ``flush_interval_commitlog_ms``, fsync the Raft log and save its checkpoint
        in a worker thread the Ready cycle never waits for, like the commit log's flush
        thread. Only called between Readies (see ``DLedgerCore.begin_flush``)."""
        if self._flush_task is not None or monotonic_s() - self._flushed_at < self.flush_interval_s:
            return
        self._flush_task = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        job = self.core.begin_flush()
        try:
            await asyncio.to_thread(self.core.run_flush, job)
            self.core.flush_done(job)
        except Exception:  # nothing awaits this task: report here, retry next interval
            self.core.flush_failed(job)
            log.exception("DLedger flush failed")
        finally:
            self._flushed_at = monotonic_s()
            self._flush_task = None


def _topic_command(config: TopicConfig) -> Command:
    return encode_command(
        [
            KIND_TOPIC,
            config.topic_name,
            config.read_queue_nums,
            config.write_queue_nums,
            config.perm,
        ]
    )
