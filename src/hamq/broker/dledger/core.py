"""The synchronous heart of a DLedger member: Ready processing, applying, claims, recovery.

No asyncio, sockets or clocks: the broker's driver (``driver.py``) runs it on its event
loop, handing the persist and the flush to worker threads, and the simulator runs the very
same object step by step on a simulated disk. One Ready goes through three steps:

1. ``start_cycle``: propose the waiting group, take the Ready; a leader ships its new
   entries before writing them (etcd's optimisation: it counts towards the quorum only
   after ``advance``).
2. ``persist``: terms and votes are fsynced; entries reach the page cache (fsynced too
   with ``flush_disk_type = "sync"``); the Raft checkpoint is left to the periodic flush.
3. ``finish_cycle``: a follower answers (its answers gate the leader's commit), committed
   entries are applied to the message store, clients answered, then ``advance``.

Every member applies committed entries in order with the leader's store timestamp, so
every commit log is byte-identical. The store's checkpoint claims a (Raft index, log
offset) pair that a restarted member resumes from: only pairs whose index the Raft
checkpoint on disk has as committed and whose offset the store has fsynced, so neither a
process kill nor a power loss can leave the store behind its claim. A restart cuts the
store back to the claim and re-applies what follows — the tail written since the last
checkpoint, never the whole log.

Applying can fail (a full disk): the member then stops applying, reports why, keeps
replicating and voting, and tries again every APPLY_RETRY_MS from the same command — no
entry is skipped, none is applied twice. Writing the Raft log can fail too (the same full
disk): the Ready stays unwritten, nothing that depends on it happens (no answer, no apply,
a leader does not count itself), and the same Ready is written again every
PERSIST_RETRY_MS (the file store undoes a failed append, so a retry writes it whole).

A topic delete is the one command that applying again after a restart cannot redo: the
sends before it would find the topic's queues gone and take other queue offsets. So a
delete is proposed alone, first in its entry, and a member applies it only once its store
claims everything before it; a restart then resumes at the delete or after it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from hamq.broker.conditional import queue_offset_mismatch
from hamq.broker.dledger.grouping import ProposalCallback, ProposalGroup
from hamq.broker.dledger.wire import (
    KIND_DELETE_TOPIC,
    KIND_SEND,
    KIND_TOPIC,
    Command,
    decode_commands,
    first_command_kind,
)
from hamq.errors import BrokerSystemError, HamqError, NotLeader, QueueOffsetMismatch, SystemBusy
from hamq.raft import (
    EMPTY_INDEX,
    Checkpoint,
    Entry,
    EntryId,
    FailureReason,
    FileStorage,
    Message,
    RaftConfig,
    RaftError,
    RawNode,
    Ready,
    Rng,
    Role,
)
from hamq.raft.log import UNKNOWN_VOTE
from hamq.raft.storage import persist
from hamq.store.message_store import MessageStore, PutResult, WritesUndone
from hamq.store.metadata import TopicConfig

log = logging.getLogger(__name__)

# A member whose applying failed tries again this often (RocketMQ retries a failed
# dispatch on its next round too); the cause, usually a full disk, clears on its own time.
APPLY_RETRY_MS = 1000
PERSIST_RETRY_MS = 1000


class TopicTable(Protocol):
    """Where topic commands land (``TopicService``)."""

    def install(self, config: TopicConfig, notify: bool = True) -> TopicConfig: ...

    def remove(self, topic: str) -> None: ...


@dataclass(slots=True)
class Cycle:
    """One Ready between its three steps."""

    ready: Ready
    leading: bool  # a leader's Ready without a term change: it sent before writing
    fsync: bool  # persisting it fsyncs: a driver runs that off its event loop


@dataclass(slots=True)
class FlushJob:
    """Make the Raft log durable, then save the checkpoint that describes it."""

    sync: Callable[[], None]
    checkpoint: Checkpoint | None


# What applying one command gave: a send's put, a conditional send that found its queue
# elsewhere (nothing stored), or None for a topic change.
CommandResult = PutResult | QueueOffsetMismatch | None


@dataclass(slots=True)
class _Cursor:
    """Where applying stands: the next command of the next entry, and the results of the
    commands of that entry already applied (a failure can stop it in the middle)."""

    index: int
    command: int = 0
    results: list[CommandResult] = field(default_factory=list)

    def copy(self) -> _Cursor:
        return _Cursor(self.index, self.command, list(self.results))


@dataclass(frozen=True, slots=True)
class Recovery:
    """What a restart found: the pair the store claimed, and how much it cut back."""

    applied_index: int
    applied_offset: int
    cut_bytes: int


def recover_store(store: MessageStore, raft_committed_index: int) -> Recovery:
    """Cut the message store back to the pair its checkpoint claims; the node re-delivers
    everything committed after that index, and applying is deterministic."""
    checkpoint = store.read_checkpoint()
    applied = checkpoint.get("applied_index", EMPTY_INDEX)
    offset = checkpoint.get("applied_offset", 0) if applied != EMPTY_INDEX else 0
    written = store.commitlog.written_offset
    if applied > raft_committed_index:
        raise BrokerSystemError(
            f"the message store claims Raft index {applied} applied, but the Raft log holds "
            f"only up to committed index {raft_committed_index}: the Raft directory was "
            "replaced or lost data it had fsynced; restore it or empty the store"
        )
    if written < offset:
        raise BrokerSystemError(
            f"the message store claims {offset} bytes applied (Raft index {applied}) but its "
            f"commit log ends at {written}: it lost data it had fsynced"
        )
    if written > offset:
        log.info(
            "DLedger recovery: store cut back to %d (applied index %d), %d bytes "
            "re-applied from the Raft log",
            offset,
            applied,
            written - offset,
        )
        store.truncate_to(offset)
    return Recovery(applied, offset, written - offset)


def raft_committed_index(storage: FileStorage) -> int:
    """The committed index a node started on `storage` will have."""
    return min(storage.load_checkpoint().committed_index, storage.last_index())


class DLedgerCore:
    def __init__(
        self,
        raft_config: RaftConfig,
        storage: FileStorage,
        store: MessageStore,
        topics: TopicTable,
        rng: Rng,
        now_ms: int,
        *,
        sync_appends: bool,
        send: Callable[[list[Message]], None],
        on_applied: Callable[[list[tuple[str, int]]], None],
        not_leader: Callable[[str], HamqError],
    ) -> None:
        self.storage = storage
        self.store = store
        self.topics = topics
        self.sync_appends = sync_appends  # flush_disk_type = "sync": entries fsynced per Ready
        self.send = send  # hands a Ready's messages to the transport
        self.on_applied = on_applied  # wakes pulls held on the queues that grew
        self.not_leader = not_leader
        self.recovery = recover_store(store, raft_committed_index(storage))
        self.node = RawNode(
            raft_config, storage, rng, now_ms, applied_index=self.recovery.applied_index
        )
        self._claimed = (self.recovery.applied_index, self.recovery.applied_offset)
        self._apply_marks: deque[tuple[int, int]] = deque()  # (applied index, log end)
        # the store checkpoint claims only indexes the Raft checkpoint on disk has as
        # committed (a restarted node accepts no more)
        self.durable_committed_index = storage.load_checkpoint().committed_index
        self._unsaved_checkpoint: Checkpoint | None = None
        store.checkpoint_extra = self.claim_applied
        self.applied_index = self.recovery.applied_index  # applied to the store (the node
        # may have handed out more: those wait while applying is paused)
        self._cursor = _Cursor(self.applied_index + 1)
        self.apply_error = ""  # why applying is paused, "" while it runs
        self.waiting_for_claim = EMPTY_INDEX  # a topic delete's index, until it may apply
        self._retry_at_ms = 0
        self._unwritten: Cycle | None = None  # a Ready whose write failed: written first
        self.persist_error = ""  # why, until a retry succeeds
        self._persist_retry_at_ms = 0
        self._now_ms = now_ms  # as of the last tick
        self._group = ProposalGroup()
        # per entry, one callback (and result) per command, in the entry's order
        self._pending: dict[EntryId, list[ProposalCallback]] = {}
        self._results: dict[int, list[CommandResult]] = {}  # applied, awaiting completion
        self._completed_early: dict[int, list[ProposalCallback]] = {}  # completed, not applied

    @property
    def is_leader(self) -> bool:
        return self.node.role == Role.LEADER

    # -- proposals --------------------------------------------------------------------------
    def propose(self, command: Command, callback: ProposalCallback, *, alone: bool = False) -> None:
        """Queue `command` for the entry proposed at the next cycle (`alone`: an entry of
        its own); `callback` gets its result once that entry is applied."""
        if not self.is_leader:
            raise self.not_leader("")
        if alone or not self._group.fits(command):
            self._propose_group()
        self._group.add(command, callback)
        if alone:
            self._propose_group()

    def has_work(self) -> bool:
        if self._unwritten is not None:
            return self._now_ms >= self._persist_retry_at_ms
        return bool(self._group.callbacks) or self.node.has_ready()

    def _propose_group(self) -> None:
        group, self._group = self._group, ProposalGroup()
        if not group.callbacks:
            return
        try:
            entry_id = self.node.propose(group.data())
        except RaftError as err:  # leadership lost or being transferred since queued
            error = self.not_leader(str(err))
            for callback in group.callbacks:
                callback(None, error)
            return
        self._pending[entry_id] = group.callbacks

    def fail_all(self, error: HamqError) -> None:
        """Answer every waiting proposal with `error` (the member is stopping)."""
        callbacks = list(self._group.callbacks)
        for waiting in [*self._completed_early.values(), *self._pending.values()]:
            callbacks += waiting
        self._group = ProposalGroup()
        self._completed_early.clear()
        self._pending.clear()
        for callback in callbacks:
            callback(None, error)

    # -- the Ready cycle ----------------------------------------------------------------------
    def tick(self, now_ms: int) -> None:
        self._now_ms = now_ms
        self.node.tick(now_ms)
        if self.apply_error and now_ms >= self._retry_at_ms:
            log.info("retrying to apply from Raft index %d", self._cursor.index)
            self.apply_error = ""
        if self.waiting_for_claim != EMPTY_INDEX and self._claimed[0] >= self.waiting_for_claim - 1:
            self.waiting_for_claim = EMPTY_INDEX
        self._apply_backlog(now_ms)

    def start_cycle(self) -> Cycle | None:
        if self._unwritten is not None:  # its messages that could leave first already did
            if self._now_ms < self._persist_retry_at_ms:
                return None
            cycle, self._unwritten = self._unwritten, None
            return cycle
        self._propose_group()
        if not self.node.has_ready():
            return None
        ready = self.node.ready()
        leading = self.is_leader and ready.hard_state is None
        if leading and ready.entries:
            self.send(ready.messages)
        return Cycle(
            ready,
            leading,
            ready.hard_state is not None or (bool(ready.entries) and self.sync_appends),
        )

    def persist(self, cycle: Cycle) -> bool:
        """Write the Ready (a driver may run this in a worker thread). False if that failed:
        then `finish_cycle` must not run, and `start_cycle` hands out the same Ready again
        once PERSIST_RETRY_MS have passed."""
        try:
            persist(self.storage, cycle.ready, checkpoint=False, sync=cycle.fsync)
        except OSError as err:
            self._unwritten = cycle
            self.persist_error = f"writing the Raft log failed: {err}"
            self._persist_retry_at_ms = self._now_ms + PERSIST_RETRY_MS
            log.error(
                "%s; this member writes it again in %d ms", self.persist_error, PERSIST_RETRY_MS
            )
            return False
        self.persist_error = ""
        return True

    def finish_cycle(self, cycle: Cycle, now_ms: int) -> None:
        ready = cycle.ready
        if ready.checkpoint is not None:
            self._unsaved_checkpoint = ready.checkpoint
        if not cycle.leading:
            self.send(ready.messages)
        self._apply_backlog(now_ms)
        if (
            not self.paused
            and ready.committed_entries
            and ready.committed_entries[0].index == self._cursor.index
        ):
            self._apply(ready.committed_entries, now_ms)
        self._complete(ready)
        if cycle.leading and not ready.entries:
            self.send(ready.messages)
        self.node.advance(ready)

    def run_cycle(self, now_ms: int) -> bool:
        """All three steps at once (the simulator, and tests); False if there was none."""
        cycle = self.start_cycle()
        if cycle is None or not self.persist(cycle):
            return False
        self.finish_cycle(cycle, now_ms)
        return True

    # -- the periodic flush ------------------------------------------------------------------
    def begin_flush(self) -> FlushJob:
        """Terms and votes are fsynced in the Ready cycle; entries (with "async") only
        reach the page cache, which survives a process crash: this is their fsync, and only
        after it may the Raft checkpoint (ledger end, committed index) be saved. Only call
        between cycles: the job is detached from the storage, so it never races a persist."""
        checkpoint, self._unsaved_checkpoint = self._unsaved_checkpoint, None
        return FlushJob(self.storage.detach_sync(), checkpoint)

    def run_flush(self, job: FlushJob) -> None:
        """The job's I/O (a driver may run this in a worker thread)."""
        job.sync()
        if job.checkpoint is not None:
            self.storage.save_checkpoint(job.checkpoint)

    def flush_done(self, job: FlushJob) -> None:
        if job.checkpoint is not None:
            self.durable_committed_index = job.checkpoint.committed_index

    def flush_failed(self, job: FlushJob) -> None:
        """Keep the checkpoint for the next flush, unless a newer one replaced it."""
        if self._unsaved_checkpoint is None:
            self._unsaved_checkpoint = job.checkpoint

    # -- applying -------------------------------------------------------------------------
    def _apply_backlog(self, now_ms: int) -> None:
        """Apply entries the node handed out while applying was paused, from the log."""
        if self.paused or self.applied_index >= self.node.applied_index:
            return
        last = min(
            self.node.applied_index, self.applied_index + self.node.config.max_committed_per_ready
        )
        self._apply(self.node.log.entries(self._cursor.index, last + 1), now_ms)

    def _apply(self, entries: list[Entry], now_ms: int) -> None:
        arrived: list[tuple[str, int]] = []
        committed = self._cursor.copy()  # where to resume if the store undoes a write
        try:
            for entry in entries:
                assert entry.index == self._cursor.index, "entries applied out of order"
                if self._must_wait_for_claim(entry):
                    self.waiting_for_claim = entry.index
                    break
                if not entry.is_noop:
                    for number, (meta, data) in enumerate(decode_commands(entry.data)):
                        if number < self._cursor.command:
                            continue  # applied before a failure stopped this entry
                        is_send = meta[0] == KIND_SEND
                        if not is_send:
                            # sends before a topic change reach the disk first, so a failed
                            # write never needs a topic change undone
                            self._commit(arrived)
                        self._cursor.results.append(self._apply_command(meta, data, arrived))
                        self._cursor.command = number + 1
                        if not is_send:
                            committed = self._cursor.copy()
                self._entry_applied(entry)
            self._commit(arrived)
        except (HamqError, OSError) as err:
            self._pause(err, committed, arrived, now_ms)
            return
        if self._cursor.command == 0 and entries:
            self._apply_marks.append((self.applied_index, self.store.commitlog.written_offset))

    @property
    def stopped_mid_entry(self) -> bool:
        """Applying paused inside an entry: a restart applies that entry again from its
        first command (claims name whole entries)."""
        return self._cursor.command > 0

    @property
    def paused(self) -> bool:
        return bool(self.apply_error) or self.waiting_for_claim != EMPTY_INDEX

    def _must_wait_for_claim(self, entry: Entry) -> bool:
        """A topic delete waits until the store claims every entry before it."""
        return (
            self._cursor.command == 0
            and not entry.is_noop
            and first_command_kind(entry.data) == KIND_DELETE_TOPIC
            and self._claimed[0] < entry.index - 1
        )

    def _entry_applied(self, entry: Entry) -> None:
        results = self._cursor.results
        self.applied_index = entry.index
        self._cursor = _Cursor(entry.index + 1)
        waiting = self._completed_early.pop(entry.index, None)
        if waiting is not None:
            _answer(waiting, results)
        elif EntryId(entry.term, entry.index) in self._pending:
            self._results[entry.index] = results  # its completion comes later

    def _commit(self, arrived: list[tuple[str, int]]) -> None:
        if not arrived:
            return
        self.store.commit()  # WritesUndone when it failed: the store undid the whole turn
        self.on_applied(list(arrived))
        arrived.clear()

    def _pause(
        self, err: Exception, committed: _Cursor, arrived: list[tuple[str, int]], now_ms: int
    ) -> None:
        """Stop applying at the first command not on disk; retry later from there."""
        # a put whose segment roll failed undid the puts since the last commit too
        undone = isinstance(err, WritesUndone)
        if not undone:
            try:
                self._commit(arrived)  # the writes before the failed one
            except WritesUndone as commit_err:
                undone, err = True, commit_err
        if undone:
            # the store undid every write since the last commit: resume where it ended
            # (answers already given stay right: applying again gives the same results)
            self.applied_index = committed.index - 1
            self._cursor = committed
        elif self._cursor.command == 0 and self.applied_index >= committed.index:
            # whole entries reached the disk before the failure: claimable like any other
            # (or a clean stop while paused would apply them again after the restart)
            self._apply_marks.append((self.applied_index, self.store.commitlog.written_offset))
        self.apply_error = f"applying Raft index {self._cursor.index} failed: {err}"
        self._retry_at_ms = now_ms + APPLY_RETRY_MS
        log.error(
            "%s; this member stops applying and retries in %d ms", self.apply_error, APPLY_RETRY_MS
        )

    def _apply_command(
        self, meta: list, data: memoryview, arrived: list[tuple[str, int]]
    ) -> CommandResult:
        kind, *fields = meta
        if kind != KIND_SEND:
            self._apply_topic_change(kind, fields)
            return None
        topic, queue_id, count, crc, born_ts, store_ts, *condition = fields
        if condition:  # a conditional send: decided here, alike on every member
            mismatch = queue_offset_mismatch(self.store, topic, queue_id, condition[0])
            if mismatch is not None:
                return mismatch
        result = self.store.put_batch(
            topic, queue_id, data, count, crc, born_ts, store_timestamp_ms=store_ts
        )
        arrived.append((topic, queue_id))
        return result

    def _apply_topic_change(self, kind: int, fields: list) -> None:
        if kind == KIND_TOPIC:
            self.topics.install(TopicConfig(*fields))
            return
        topic = fields[0]
        if topic in self.store.topics.topics:
            self.topics.remove(topic)
        else:  # queues without a config (sends only), or applied again after a restart
            self.store.delete_topic(topic)

    def _complete(self, ready: Ready) -> None:
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
                err = (
                    SystemBusy("not committed in time; the outcome is unknown")
                    if failed.reason is FailureReason.TIMEOUT
                    else NotLeader("leadership changed before commit; the outcome is unknown")
                )
                for callback in callbacks:
                    callback(None, err)
        if not self._pending:
            self._results.clear()

    # -- claims ---------------------------------------------------------------------------
    def claim_applied(self) -> dict:
        """Called as the store takes a checkpoint: the newest (index, offset) pair that a
        restarted member can resume from."""
        durable_offset = self.store.durable_offset
        while self._apply_marks and self._claimable(self._apply_marks[0], durable_offset):
            self._claimed = self._apply_marks.popleft()
        return {"applied_index": self._claimed[0], "applied_offset": self._claimed[1]}

    def _claimable(self, mark: tuple[int, int], durable_offset: int) -> bool:
        index, offset = mark
        return index <= self.durable_committed_index and offset <= durable_offset

    def status(self) -> dict:
        return {
            "term": self.node.term,
            "committed_index": self.node.committed_index,
            # past committed_index: entries this member holds that no quorum has yet
            "ledger_end_index": self.node.log.ledger_end_index,
            # False: started on an empty disk, votes for nobody until caught up
            "vouched": self.node.voted_for != UNKNOWN_VOTE,
            "applied_index": self.applied_index,
            "apply_error": self.apply_error,
            "persist_error": self.persist_error,
            "waiting_for_claim": self.waiting_for_claim,
            "claimed_applied_index": self._claimed[0],
            "recovered_applied_index": self.recovery.applied_index,
            "recovery_cut_bytes": self.recovery.cut_bytes,
        }


def _answer(callbacks: list[ProposalCallback], results: list[CommandResult]) -> None:
    assert len(callbacks) == len(results), "an entry's commands and callbacks differ"
    for callback, result in zip(callbacks, results):
        if isinstance(result, QueueOffsetMismatch):
            callback(None, result)
        else:
            callback(result, None)
