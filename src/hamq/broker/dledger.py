"""The DLedger commit log (seed 002): a broker group's Raft log holds its send batches.

Only the leader takes sends; it proposes each batch as one Raft entry and answers once the
entry is committed. Every member applies committed entries, in order, to its own message
store, with the leader's store timestamp — so every member's commit log is byte-identical
and consume queues only ever show committed messages. The store's checkpoint records the
Raft index applied up to its offsets; after a crash the store is cut back to that point and
the committed entries past it are applied again (deterministically).

This module is the asyncio shell around ``hamq.raft.RawNode``: ticks, the Ready cycle
(persist, then send, then apply), and the member-to-member transport.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import struct
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import msgpack

from hamq.broker.topics import TopicService, topic_args
from hamq.config import BrokerConfig
from hamq.errors import HamqError, InvalidArgument, NotLeader, SystemBusy
from hamq.net.connection import Connection, error_pieces, response_pieces
from hamq.net.pool import ConnectionPool
from hamq.net.server import Server
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, require
from hamq.raft import (EMPTY_INDEX, EntryId, FailureReason, FileStorage, Message,
                       MessageDecodeError, RaftConfig, RaftError, RawNode, Ready, Role)
from hamq.raft.storage import persist
from hamq.store.message_store import MessageStore, PutResult
from hamq.store.metadata import TopicConfig

log = logging.getLogger(__name__)

TICK_INTERVAL_S = 0.01
CHECKPOINT_INTERVAL_S = 0.2
# Entries in flight to one follower. Each is one APPEND; followers write (and fsync) what
# arrived together in one Ready, so more in flight means bigger group commits.
MAX_PENDING_PUSHES = 256
RAFT_DIR = "dledger"

ProposalCallback = Callable[[PutResult | None, HamqError | None], None]


# What a Raft entry holds: a send batch, or a topic change (topic metadata goes through
# consensus too, so a newly elected leader always knows every topic).
KIND_SEND = 0
KIND_TOPIC = 1
KIND_DELETE_TOPIC = 2


def encode_entry(topic: str, queue_id: int, count: int, crc: int, born_ts: int, store_ts: int,
                 payload: bytes) -> bytes:
    return msgpack.packb([KIND_SEND, topic, queue_id, count, crc, born_ts, store_ts, payload],
                         use_bin_type=True)


_MESSAGE_HEAD = struct.Struct(">I")


def encode_message(msg: Message) -> list:
    """A Raft message as frame pieces: the message without its entry's data, then the data
    itself — the same bytes object for every follower, written by reference, not re-packed."""
    entry = msg.entry
    if entry is None or not entry.data:
        head = msg.encode()
        return [_MESSAGE_HEAD.pack(len(head)), head]
    head = dataclasses.replace(msg, entry=dataclasses.replace(entry, data=b"")).encode()
    return [_MESSAGE_HEAD.pack(len(head)), head, entry.data]


def decode_message(body: bytes) -> Message:
    if len(body) < _MESSAGE_HEAD.size:
        raise MessageDecodeError("raft frame shorter than its length prefix")
    (head_len,) = _MESSAGE_HEAD.unpack_from(body)
    end = _MESSAGE_HEAD.size + head_len
    msg = Message.decode(body[_MESSAGE_HEAD.size:end])
    if msg.entry is None or end == len(body):
        return msg
    return dataclasses.replace(msg, entry=dataclasses.replace(msg.entry, data=body[end:]))


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class DLedgerCommitLog:
    def __init__(self, config: BrokerConfig, store: MessageStore, topics: TopicService,
                 on_applied: Callable[[list[tuple[str, int]]], None],
                 on_role_change: Callable[[bool], None]) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.on_applied = on_applied          # wakes pulls held on the queues that grew
        self.on_role_change = on_role_change  # True when this member became the leader
        self.node_id = config.dledger_self_id
        self.peers = config.dledger_peer_map
        self.storage = FileStorage(Path(config.store_dir) / RAFT_DIR)
        self._claimed = self._recover_store()
        election_ms = config.dledger_election_timeout_ms
        raft_config = RaftConfig(self.node_id, tuple(sorted(self.peers)),
                                 election_timeout_ms=election_ms,
                                 push_timeout_ms=election_ms * 2 // 5,
                                 max_pending_pushes=MAX_PENDING_PUSHES)
        self.node = RawNode(raft_config, self.storage, random.Random(os.urandom(8)), _now_ms(),
                            applied_index=self._claimed[0])
        # The store checkpoint claims (Raft index, log offset) pairs, and only for indexes
        # the Raft checkpoint on disk has as committed (a restarted node accepts no more).
        self.durable_committed_index = self.storage.load_checkpoint().committed_index
        self._checkpoint_saved_at = 0.0
        self._apply_marks: deque[tuple[int, int]] = deque()  # (applied index, log end)
        store.checkpoint_extra = self._claim_applied
        self.server = Server(self)
        self.pool = ConnectionPool()
        self._pending: dict[EntryId, ProposalCallback] = {}
        self._results: dict[int, PutResult] = {}           # applied, awaiting completion
        self._completed_early: dict[int, ProposalCallback] = {}  # completed, not yet applied
        self._pumping = False
        self._pump_again = False
        self.sync_appends = config.flush_disk_type == "sync"
        self.sync_interval_s = config.flush_interval_commitlog_ms / 1000
        self._synced_at = time.monotonic()
        self._was_leader = False
        self._task: asyncio.Task | None = None

    @property
    def is_leader(self) -> bool:
        return self.node.role == Role.LEADER

    @property
    def leader_id(self) -> int:
        return self.node.leader_id

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.server.start(self.peers[self.node_id])
        self._task = asyncio.create_task(self._tick_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for callback in self._pending.values():
            callback(None, NotLeader("member shutting down; the outcome is unknown"))
        self._pending.clear()
        await self.server.close()
        await self.pool.close()
        self.storage.close()

    def status(self) -> dict:
        return {"role": "dledger", "member_id": self.node_id, "leader_id": self.node.leader_id,
                "is_leader": self.is_leader, "term": self.node.term,
                "committed_index": self.node.committed_index,
                "applied_index": self.node.applied_index}

    # -- the send path --------------------------------------------------------------------------
    def not_leader(self, why: str = "") -> NotLeader:
        leader = self.peers.get(self.node.leader_id, "unknown, an election is running")
        return NotLeader(f"member {self.node_id} is not the leader of group "
                         f"{self.config.broker_name} (leader's raft endpoint: {leader})"
                         + (f": {why}" if why else ""))

    def propose(self, entry: bytes, callback: ProposalCallback) -> None:
        try:
            entry_id = self.node.propose(entry)
        except RaftError as err:
            raise self.not_leader(str(err)) from None
        self._pending[entry_id] = callback
        self._schedule_pump()

    def transfer_leadership(self, to_id: int) -> None:
        if to_id not in self.peers:
            raise InvalidArgument(f"{to_id} is not a member of group {self.config.broker_name}")
        try:
            self.node.transfer_leadership(to_id)
        except RaftError as err:
            raise self.not_leader(f"cannot transfer leadership: {err}") from None
        self._schedule_pump()

    # -- RequestHandler: the Raft port ----------------------------------------------------------
    def handle(self, conn: Connection, frame: Frame) -> list | None:
        if frame.code == RequestCode.DLEDGER_MESSAGE:
            try:
                self.node.step(decode_message(frame.body))
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
        self._propose_and_reply(conn, frame, [KIND_TOPIC, config.topic_name,
                                              config.read_queue_nums, config.write_queue_nums,
                                              config.perm])

    def delete_topic(self, conn: Connection, frame: Frame) -> None:
        self._propose_and_reply(conn, frame, [KIND_DELETE_TOPIC, require(frame.ext, "topic")])

    def _propose_and_reply(self, conn: Connection, frame: Frame, entry: list) -> None:
        def committed(result: PutResult | None, err: HamqError | None) -> None:
            conn.reply(error_pieces(frame, err) if err else response_pieces(frame))
        self.propose(msgpack.packb(entry, use_bin_type=True), committed)

    def handle_transfer(self, conn: Connection, frame: Frame) -> list:
        self.transfer_leadership(require(frame.ext, "member_id", int))
        return response_pieces(frame, ext={"from": self.node_id})

    # -- the Ready cycle ------------------------------------------------------------------------
    async def _tick_loop(self) -> None:
        while True:
            self.node.tick(_now_ms())
            if not self._pumping and not self.sync_appends and self._sync_due():
                await self._sync_if_idle()
            self._schedule_pump()
            await asyncio.sleep(TICK_INTERVAL_S)

    def _schedule_pump(self) -> None:
        if self._pumping:
            self._pump_again = True
        elif self.node.has_ready():
            self._pumping = True
            asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        try:
            while self.node.has_ready():
                ready = self.node.ready()
                # A leader may ship entries while it writes them itself (etcd's
                # optimisation): it counts towards the quorum only after advance().
                early = self.is_leader and ready.hard_state is None
                if early:
                    self._send_all(ready.messages)
                save_checkpoint = self._checkpoint_due(ready)
                if ready.hard_state or save_checkpoint or (ready.entries and (
                        self.sync_appends or self._sync_due())):
                    await asyncio.to_thread(self._persist, ready, save_checkpoint)
                elif ready.entries:  # page-cache writes only: no thread hop on the hot path
                    self._persist(ready, save_checkpoint)
                if not early:
                    self._send_all(ready.messages)
                self._apply(ready)
                self.node.advance(ready)
                self._pump_again = False
        except Exception:
            log.exception("DLedger ready cycle failed")
            raise
        finally:
            self._pumping = False
        if self.is_leader != self._was_leader:
            self._was_leader = self.is_leader
            log.info("member %d is now %s of group %s (term %d)", self.node_id,
                     "LEADER" if self.is_leader else "a follower", self.config.broker_name,
                     self.node.term)
            self.on_role_change(self.is_leader)
        if self._pump_again:
            self._pump_again = False
            self._schedule_pump()

    def _checkpoint_due(self, ready: Ready) -> bool:
        """The Raft checkpoint (ledger end, committed index) costs fsyncs of its own and is
        only a recovery hint, so it is written at most every CHECKPOINT_INTERVAL_S."""
        if ready.checkpoint is None or \
                time.monotonic() - self._checkpoint_saved_at < CHECKPOINT_INTERVAL_S:
            return False
        self._checkpoint_saved_at = time.monotonic()
        return True

    def _persist(self, ready: Ready, save_checkpoint: bool) -> None:
        """In a worker thread: nothing is sent before the state it depends on is written —
        and, with ``flush_disk_type = "sync"``, fsynced. With "async" (the store's default
        contract) appends reach the page cache first, which survives a process crash, and
        are fsynced every ``flush_interval_commitlog_ms``; votes and terms always are."""
        sync = self.sync_appends or ready.hard_state is not None or self._sync_due()
        persist(self.storage, ready, checkpoint=save_checkpoint, sync=sync)
        if sync:
            self._synced_at = time.monotonic()
        if save_checkpoint:
            self.durable_committed_index = ready.checkpoint.committed_index

    def _sync_due(self) -> bool:
        return time.monotonic() - self._synced_at >= self.sync_interval_s

    async def _sync_if_idle(self) -> None:
        """The periodic fsync of an idle member (a busy one syncs in its Ready cycle)."""
        self._pumping = True
        try:
            await asyncio.to_thread(self.storage.sync)
            self._synced_at = time.monotonic()
        finally:
            self._pumping = False
        self._schedule_pump()

    def _send_all(self, messages: list[Message]) -> None:
        """One write per peer for all of a Ready's messages to it."""
        by_peer: dict[int, list[list]] = {}
        for msg in messages:
            by_peer.setdefault(msg.to_id, []).append(encode_message(msg))
        for peer, bodies in by_peer.items():
            addr = self.peers[peer]
            conn = self.pool.get_ready(addr)
            if conn is not None:
                conn.oneway_many(RequestCode.DLEDGER_MESSAGE, bodies)
            else:  # connect in the background; Raft resends what is lost meanwhile
                asyncio.ensure_future(self._connect(addr))

    async def _connect(self, addr: str) -> None:
        try:
            await self.pool.get(addr)
        except HamqError:
            pass

    def _apply(self, ready: Ready) -> None:
        arrived = []
        leader = self.is_leader
        for entry in ready.committed_entries:
            if entry.is_noop:
                continue
            kind, *fields = msgpack.unpackb(entry.data, raw=False)
            if kind == KIND_SEND:
                topic, queue_id, count, crc, born_ts, store_ts, payload = fields
                result = self.store.put_batch(topic, queue_id, payload, count, crc, born_ts,
                                              store_timestamp_ms=store_ts)
                arrived.append((topic, queue_id))
            else:
                result = None
                self._apply_topic_change(kind, fields)
            waiting = self._completed_early.pop(entry.index, None)
            if waiting is not None:
                waiting(result, None)
            elif leader or self._pending:
                self._results[entry.index] = result
        if arrived:
            self.store.commit()
            self.on_applied(arrived)
        if ready.committed_entries:
            self._apply_marks.append((ready.committed_entries[-1].index,
                                      self.store.commitlog.written_offset))
        for entry_id in ready.completed_proposals:
            callback = self._pending.pop(entry_id, None)
            if callback is None:
                continue
            if entry_id.index in self._results:
                callback(self._results.pop(entry_id.index), None)
            else:  # committed in this Ready but applied in a later one
                self._completed_early[entry_id.index] = callback
        for failed in ready.failed_proposals:
            callback = self._pending.pop(failed.entry_id, None)
            if callback is not None:
                err = SystemBusy("not committed in time; the outcome is unknown") \
                    if failed.reason is FailureReason.TIMEOUT else \
                    NotLeader("leadership changed before commit; the outcome is unknown")
                callback(None, err)
        if not self._pending:
            self._results.clear()

    def _apply_topic_change(self, kind: int, fields: list) -> None:
        if kind == KIND_TOPIC:
            self.topics.install(TopicConfig(*fields))
        elif fields[0] in self.store.topics.topics:
            self.topics.remove(fields[0])

    # -- recovery ---------------------------------------------------------------------------------
    def _claim_applied(self) -> dict:
        """Called as the store takes a checkpoint: the newest (index, offset) pair that a
        restarted member can resume from."""
        while self._apply_marks and self._apply_marks[0][0] <= self.durable_committed_index:
            self._claimed = self._apply_marks.popleft()
        return {"applied_index": self._claimed[0], "applied_offset": self._claimed[1]}

    def _recover_store(self) -> tuple[int, int]:
        """Cut the message store back to the last claimed pair; the node re-delivers
        everything committed after that index, and applying is deterministic."""
        checkpoint = self.store.read_checkpoint()
        applied = checkpoint.get("applied_index", EMPTY_INDEX)
        offset = checkpoint.get("applied_offset", 0) if applied != EMPTY_INDEX else 0
        if self.store.commitlog.written_offset != offset:
            log.info("DLedger recovery: store cut back to %d (applied index %d)", offset, applied)
            self.store.truncate_to(offset)
        return applied, offset
