"""The DLedger commit log (seed 002): a broker group's Raft log holds its send batches.

Only the leader takes sends; the send batches (and topic changes) of one event-loop turn
become one Raft entry, and each is answered once that entry is committed. Every member
applies committed entries, in order, to its own message store, with the leader's store
timestamp — so every member's commit log is byte-identical and consume queues only ever
show committed messages. The store's checkpoint records the
Raft index applied up to its offsets; after a crash the store is cut back to that point and
the committed entries past it are applied again (deterministically).

This module is the asyncio shell around ``hamq.raft.RawNode``: ticks, the Ready cycle
(persist, then send, then apply), and the member-to-member transport.
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
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
from hamq.raft import (EMPTY_INDEX, Checkpoint, EntryId, FailureReason, FileStorage, Message,
                       MessageDecodeError, RaftConfig, RaftError, RawNode, Ready, Role)
from hamq.raft.storage import persist
from hamq.store.message_store import MessageStore, PutResult
from hamq.store.metadata import TopicConfig

log = logging.getLogger(__name__)

TICK_INTERVAL_S = 0.01
# APPENDs in flight to one follower (each carries a run of entries); followers write what
# arrived together in one Ready, so more in flight means bigger writes.
MAX_PENDING_PUSHES = 256
RAFT_DIR = "dledger"

ProposalCallback = Callable[[PutResult | None, HamqError | None], None]


# Sends (and topic changes) proposed in one event-loop turn share one Raft entry up to
# this size, so pipelined single-message sends do not each cost an entry, an APPEND and a
# write on every member.
MAX_GROUPED_ENTRY_BYTES = 512 * 1024

# A Raft entry is a run of commands, each `u32 meta length | u32 data length | meta | data`:
# meta is a msgpack list [kind, fields...]; data is a send's batch bytes, kept out of the
# msgpack so that applying hands the store a slice of the entry instead of a copy. Topic
# metadata goes through consensus too, so a newly elected leader always knows every topic.
KIND_SEND = 0
KIND_TOPIC = 1
KIND_DELETE_TOPIC = 2
_COMMAND_HEAD = struct.Struct(">II")

Command = list  # the pieces of one encoded command, joined into its entry when proposed


def encode_command(meta: list, data: bytes = b"") -> Command:
    packed = msgpack.packb(meta, use_bin_type=True)
    return [_COMMAND_HEAD.pack(len(packed), len(data)), packed, data]


def encode_entry(topic: str, queue_id: int, count: int, crc: int, born_ts: int, store_ts: int,
                 payload: bytes) -> Command:
    """The command storing one send batch (the leader's store timestamp included, so every
    member writes identical records)."""
    return encode_command([KIND_SEND, topic, queue_id, count, crc, born_ts, store_ts], payload)


def decode_commands(data: bytes) -> Iterator[tuple[list, memoryview]]:
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        meta_len, data_len = _COMMAND_HEAD.unpack_from(view, pos)
        pos += _COMMAND_HEAD.size
        meta = msgpack.unpackb(view[pos:pos + meta_len], raw=False)
        pos += meta_len
        yield meta, view[pos:pos + data_len]
        pos += data_len


@dataclass(slots=True)
class _Group:
    """Commands waiting to be proposed as one entry, and the callbacks answering them."""

    pieces: list = field(default_factory=list)
    callbacks: list[ProposalCallback] = field(default_factory=list)
    size: int = 0


_U32 = struct.Struct(">I")  # the head's length, then the data count


def encode_message(msg: Message) -> list:
    """A Raft message as frame pieces: the message without its entries' data, the data
    count and lengths, then the data themselves — the same bytes objects for every
    follower, written by reference, not re-packed."""
    if not any(entry.data for entry in msg.entries):
        head = msg.encode()
        return [_U32.pack(len(head)), head]
    head = msg.encode(with_data=False)
    lengths = struct.pack(f">I{len(msg.entries)}I", len(msg.entries),
                          *(len(entry.data) for entry in msg.entries))
    return [_U32.pack(len(head)), head, lengths, *(e.data for e in msg.entries)]


def decode_message(body: bytes) -> Message:
    try:
        (head_len,) = _U32.unpack_from(body)
        pos = _U32.size + head_len
        head = body[_U32.size:pos]
        if pos >= len(body):
            return Message.decode(head)
        (count,) = _U32.unpack_from(body, pos)
        lengths = struct.unpack_from(f">{count}I", body, pos + _U32.size)
    except struct.error as exc:
        raise MessageDecodeError(f"raft frame: {exc}") from None
    pos += _U32.size + _U32.size * count
    if pos + sum(lengths) != len(body):
        raise MessageDecodeError("raft frame data does not match its lengths")
    data = []
    for length in lengths:
        data.append(bytes(body[pos:pos + length]))
        pos += length
    return Message.decode(head, data)


def _answer(callbacks: list[ProposalCallback], results: list[PutResult | None]) -> None:
    assert len(callbacks) == len(results), "an entry's commands and callbacks differ"
    for callback, result in zip(callbacks, results):
        callback(result, None)


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
        self._apply_marks: deque[tuple[int, int]] = deque()  # (applied index, log end)
        store.checkpoint_extra = self._claim_applied
        self.server = Server(self)
        self.pool = ConnectionPool()
        self._group = _Group()
        # per entry, one callback (and result) per command, in the entry's order
        self._pending: dict[EntryId, list[ProposalCallback]] = {}
        self._results: dict[int, list[PutResult | None]] = {}  # applied, awaiting completion
        self._completed_early: dict[int, list[ProposalCallback]] = {}  # completed, not applied
        self._pumping = False
        self._pump_again = False
        self.sync_appends = config.flush_disk_type == "sync"
        self.flush_interval_s = config.flush_interval_commitlog_ms / 1000
        self._flushed_at = time.monotonic()
        self._flush_task: asyncio.Task | None = None
        self._pump_future: asyncio.Future | None = None
        self._stopping = False
        self._unsaved_checkpoint: Checkpoint | None = None
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
        self._stopping = True
        # a Ready cycle or a flush may be writing in a worker thread: let it finish before
        # the storage's files are closed (a reused descriptor would take its writes)
        await asyncio.gather(*(t for t in (self._pump_future, self._flush_task) if t),
                             return_exceptions=True)
        for callbacks in self._completed_early.values():
            self._group.callbacks.extend(callbacks)
        self._completed_early.clear()
        shutting_down = NotLeader("member shutting down; the outcome is unknown")
        for callbacks in [self._group.callbacks, *self._pending.values()]:
            for callback in callbacks:
                callback(None, shutting_down)
        self._group = _Group()
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

    def propose(self, command: Command, callback: ProposalCallback) -> None:
        """Queue `command` for the entry of this event-loop turn (proposed when the Ready
        cycle next runs); `callback` gets its result once that entry is committed."""
        if not self.is_leader:
            raise self.not_leader()
        size = sum(map(len, command))
        if self._group.size and self._group.size + size > MAX_GROUPED_ENTRY_BYTES:
            self._propose_group()
        self._group.pieces += command
        self._group.callbacks.append(callback)
        self._group.size += size
        self._schedule_pump()

    def _propose_group(self) -> None:
        group, self._group = self._group, _Group()
        if not group.callbacks:
            return
        try:
            entry_id = self.node.propose(b"".join(group.pieces))
        except RaftError as err:  # leadership lost or being transferred since queued
            error = self.not_leader(str(err))
            for callback in group.callbacks:
                callback(None, error)
            return
        self._pending[entry_id] = group.callbacks

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
        self.propose(encode_command(entry), committed)

    def handle_transfer(self, conn: Connection, frame: Frame) -> list:
        self.transfer_leadership(require(frame.ext, "member_id", int))
        return response_pieces(frame, ext={"from": self.node_id})

    # -- the Ready cycle ------------------------------------------------------------------------
    async def _tick_loop(self) -> None:
        while True:
            self.node.tick(_now_ms())
            if not self._pumping:
                self._maybe_flush()
            self._schedule_pump()
            await asyncio.sleep(TICK_INTERVAL_S)

    def _schedule_pump(self) -> None:
        if self._stopping:
            return
        if self._pumping:
            self._pump_again = True
        elif self._group.callbacks or self.node.has_ready():
            self._pumping = True
            self._pump_future = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        try:
            while True:
                self._propose_group()
                if not self.node.has_ready():
                    break
                ready = self.node.ready()
                # A leader may send before its own write (etcd's optimisation: it counts
                # towards the quorum only after advance()): entries ship while it writes
                # them; without entries, its COMMITs and heartbeats wait until the
                # clients of newly committed entries are answered. A follower answers
                # before applying: its answers gate the leader's commit.
                leading = self.is_leader and ready.hard_state is None
                if leading and ready.entries:
                    self._send_all(ready.messages)
                if ready.hard_state is not None or (ready.entries and self.sync_appends):
                    await asyncio.to_thread(persist, self.storage, ready, checkpoint=False)
                elif ready.entries:  # page-cache writes only: no thread hop on the hot path
                    persist(self.storage, ready, checkpoint=False, sync=False)
                if ready.checkpoint is not None:
                    self._unsaved_checkpoint = ready.checkpoint
                if not leading:
                    self._send_all(ready.messages)
                self._apply(ready)
                if leading and not ready.entries:
                    self._send_all(ready.messages)
                self.node.advance(ready)
                self._pump_again = False
                self._maybe_flush()
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

    def _maybe_flush(self) -> None:
        """Every ``flush_interval_commitlog_ms``, fsync the Raft log and then save the Raft
        checkpoint (ledger end, committed index) it now covers — in a worker thread the
        Ready cycle never waits for, like the commit log's flush thread. With "async" (the
        store's default contract) appends reach the page cache before anything depending on
        them is sent, which survives a process crash, and this is their only fsync; with
        "sync" every Ready's appends were fsynced already. Terms and votes are always
        fsynced in the Ready cycle. Only called between Readies: the job is detached from
        the storage on the loop, so it never races a persist."""
        if self._flush_task is not None or \
                time.monotonic() - self._flushed_at < self.flush_interval_s:
            return
        checkpoint, self._unsaved_checkpoint = self._unsaved_checkpoint, None
        self._flush_task = asyncio.ensure_future(
            self._flush(self.storage.detach_sync(), checkpoint))

    async def _flush(self, sync: Callable[[], None], checkpoint: Checkpoint | None) -> None:
        def run() -> None:
            sync()
            if checkpoint is not None:  # only now is the log it describes durable
                self.storage.save_checkpoint(checkpoint)
        try:
            await asyncio.to_thread(run)
            if checkpoint is not None:
                self.durable_committed_index = checkpoint.committed_index
        except Exception:  # nothing awaits this task: report here, retry next interval
            log.exception("DLedger flush failed")
        finally:
            self._flushed_at = time.monotonic()
            self._flush_task = None

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
        arrived: list[tuple[str, int]] = []
        for entry in ready.committed_entries:
            if entry.is_noop:
                continue
            results = [self._apply_command(meta, data, arrived)
                       for meta, data in decode_commands(entry.data)]
            waiting = self._completed_early.pop(entry.index, None)
            if waiting is not None:
                _answer(waiting, results)
            elif EntryId(entry.term, entry.index) in self._pending:
                self._results[entry.index] = results  # its completion comes later
        if arrived:
            self.store.commit()
            self.on_applied(arrived)
        if ready.committed_entries:
            self._apply_marks.append((ready.committed_entries[-1].index,
                                      self.store.commitlog.written_offset))
        for entry_id in ready.completed_proposals:
            callbacks = self._pending.pop(entry_id, None)
            if callbacks is None:
                continue
            if entry_id.index in self._results:
                _answer(callbacks, self._results.pop(entry_id.index))
            else:  # committed in this Ready but applied in a later one
                self._completed_early[entry_id.index] = callbacks
        for failed in ready.failed_proposals:
            callbacks = self._pending.pop(failed.entry_id, None)
            if callbacks is not None:
                err = SystemBusy("not committed in time; the outcome is unknown") \
                    if failed.reason is FailureReason.TIMEOUT else \
                    NotLeader("leadership changed before commit; the outcome is unknown")
                for callback in callbacks:
                    callback(None, err)
        if not self._pending:
            self._results.clear()

    def _apply_command(self, meta: list, data: memoryview,
                       arrived: list[tuple[str, int]]) -> PutResult | None:
        kind, *fields = meta
        if kind != KIND_SEND:
            self._apply_topic_change(kind, fields)
            return None
        topic, queue_id, count, crc, born_ts, store_ts = fields
        arrived.append((topic, queue_id))
        return self.store.put_batch(topic, queue_id, data, count, crc, born_ts,
                                    store_timestamp_ms=store_ts)

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
