"""Pop consumption (RocketMQ 5): POP_MESSAGE, ACK_MESSAGE, BATCH_ACK_MESSAGE and
CHANGE_MESSAGE_INVISIBLETIME, with long polling and the revive service.

Departure from RocketMQ: a message whose invisible time ran out is redelivered *in place*,
from its original queue and ahead of new messages, with ``reconsume_times + 1``, instead of
being copied by the revive service into ``%RETRY%<group>_<topic>``. The copy buys RocketMQ
nothing here (CK/ACK records already make the in-flight state durable) and would double the
bytes written per unacked message; in place, a redelivery is a read of the original record
and one small CK. The group's consumer offset is the end of the acked prefix of each queue.

A message due again after ``max_reconsume_times`` redeliveries (a field of the pop, 16 by
default, as RocketMQ's retryMaxTimes) is not handed out: a copy goes to ``%DLQ%<group>``
and it is acked (RocketMQ 5's pop filter: TO_DLQ, then ack), so a poison message stops
pinning its queue's consume offset.

Popped messages are answered from the store as raw records (like a pull) together with, per
record run, the offsets handed out and their reconsume times; the receipt handle is
(queue, offset, ck) where ck is the revive-log offset of the checkpoint that handed the
message out.

Acting master (seed 004): a slave acting for a group with no master serves pops, acks and
invisible-time changes from its store, with the state it rebuilt from the replicated revive
log, and redelivers in place as a master does; its CK and ACK records go into one chosen
master of another group (``escaped.py``), never into its own log. It sends nothing to
the DLQ (that would be a write of its own): a message past ``max_reconsume_times`` is
redelivered until the master returns, which dead-letters it at its next expiry.

Failover (seed 003): a member that starts serving pops in another master epoch than it
last did (promoted by the controller or a role change, or back as master in a new epoch)
is a new master. What its state holds in flight was handed out by an earlier master, whose
consumers lost it: every such message is due at once (RabbitMQ's new master requeues every
delivered-but-unacked message), not after its invisible time, and comes with
``reconsume_times + 1`` (the client shows it as ``redelivered``). Acks that reached the
revive log the new master took are replayed first, so those messages stay acked. Where a
group started (the offset its init mode chose) is an INIT record of the revive log as well:
a new master that has no consumer offset for it yet (the table reaches slaves only every
few seconds) starts it there, not at its own end past what was sent since. A master
that starts again in its own epoch (its boot in master-slave mode, a restart after a lapsed
lease) and an acting slave keep the invisible times.

GET_POP_CHECKPOINT (pre-online): a member answers its pop state with a ``DataVersion``;
the returning master takes it if newer (``merge_checkpoint``), so what was popped and not
acked during the outage is redelivered by it, and what was acked is not. The version's
``state_version`` is the wall clock when this member last began acting (the merged one on a
master), ``counter`` the changes since: a member that acted after the master last took a
state is newer, and otherwise the master, which saw every change the slaves saw, is.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, astuple, dataclass
from pathlib import Path

from hamq.broker.escape import EscapeBridge
from hamq.broker.pop.escaped import EscapedReviveLog, EscapePut, ReviveEscape
from hamq.broker.pop.ledger import StateKey, apply_record
from hamq.broker.pop.revive_log import (
    KIND_CK,
    KIND_INIT,
    KIND_RESET,
    REVIVE_LOG_TOPIC,
    AckEntry,
    CkEntry,
    ReviveLog,
    ack_record,
    ck_record,
)
from hamq.broker.pop.state import AckResult, PopQueueState
from hamq.broker.role import RoleState
from hamq.broker.send_back import copy_properties, put_dead_letter
from hamq.broker.stats import BrokerStats
from hamq.broker.stored_message import read_message
from hamq.broker.topics import TopicService
from hamq.clock import monotonic_ms, wall_ms
from hamq.config import BrokerConfig
from hamq.errors import HamqError, InvalidArgument, NoPermission, ServiceNotAvailable
from hamq.net.connection import Connection, error_pieces, response_pieces
from hamq.net.tasks import PeriodicTask, spawn
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame, pack_body, require, unpack_body
from hamq.protocol.limits import MAX_PULL_BYTES
from hamq.protocol.properties import DEFAULT_MAX_RECONSUME_TIMES
from hamq.store.flush import FlushService
from hamq.store.message_store import GetStatus, MessageStore, PutResult
from hamq.store.metadata import PERM_READ, DataVersion

log = logging.getLogger(__name__)

_DUTY_ERRORS = (OSError, HamqError)  # logged; the sweep and the checkpoint carry on

DEFAULT_POP_BATCH = 32  # RocketMQ's default maxMsgNums of a pop
MAX_POP_MESSAGES = 1024  # messages one pop may hand out
MAX_BATCH_ACK_ENTRIES = 4096  # acks one BATCH_ACK_MESSAGE may carry
MIN_INVISIBLE_TIME_MS = 100  # shorter would redeliver before a client could ack
MAX_INVISIBLE_TIME_MS = 12 * 3600_000  # RocketMQ proxy's maxInvisibleTimeMills
ESCAPED_READ_TIMEOUT_S = 5.0  # reading what earlier acting members escaped, at acting start
HOLD_SWEEP_INTERVAL_S = 0.05  # held pops re-check for expired invisibility this often
INIT_MODE_MIN = "min"  # RocketMQ ConsumeInitMode.MIN: a new group starts at
INIT_MODE_MAX = "max"  # the queue's first message (MIN) or its end (MAX)


@dataclass
class HeldPop:
    conn: Connection
    frame: Frame
    group: str
    topic: str
    queue_id: int  # -1: any queue of the topic
    expires_ms: int  # monotonic: a poll time is a timeout, not a stored time


class PopService:
    def __init__(
        self,
        store: MessageStore,
        topics: TopicService,
        flush: FlushService,
        role: RoleState,
        config: BrokerConfig,
        *,
        on_written: Callable[[], None],
        on_put: Callable[[str, int], None],
        escape: EscapeBridge | EscapePut | None = None,
        stats: BrokerStats | None = None,
    ) -> None:
        self.store = store
        self.topics = topics
        self.flush = flush
        self.stats = stats or BrokerStats()  # the broker's, shared with sends and pulls
        self.revive = ReviveLog(store, config.broker_name)
        self.broker_name = config.broker_name
        # an acting master's CK/ACK records (no escape: this member never acts), and where
        # it reads what an earlier acting member of its group escaped
        self._escape_source = ReviveEscape(escape) if isinstance(escape, EscapeBridge) else None
        self.escaped = (
            EscapedReviveLog(
                self._escape_source.put if self._escape_source is not None else escape,
                Path(config.store_dir),
                store.disk,
            )
            if escape is not None
            else None
        )
        self.data_version = DataVersion()
        self.max_wait_ms = config.long_polling_max_wait_ms
        self.inflight_threshold = config.pop_inflight_message_threshold
        self.role = role
        self.on_written = on_written  # ships new log bytes to slaves
        self.on_put = on_put  # wakes pulls held on a dead-letter queue
        self.states: dict[StateKey, PopQueueState] = {}
        self._rotation: dict[tuple[str, str], int] = {}
        # Held pops by topic, oldest first. The pull service tells ``serve_arrivals`` of
        # writes to these topics (a live view), so an idle pop costs nothing per write.
        self.held: dict[str, list[HeldPop]] = {}
        # Held pops per connection and per (topic, queue id or -1): past a cap a pop is
        # answered at once, so idle clients cannot make every write and sweep walk a
        # list of thousands (10k held pops took every request from 0.05 to 377 ms).
        self.max_held_per_connection = config.max_held_pops_per_connection
        self.max_held_per_queue = config.max_held_pops_per_queue
        self._held_by_conn: Counter[Connection] = Counter()
        self._held_by_queue: Counter[tuple[str, int]] = Counter()
        self._acked_topics: set[str] = set()  # acks may lift the in-flight threshold
        # Topics of pops held while the read cap held records back: they may have arrived
        # before the pop (no arrival will come for them), so look again when it rises.
        self._capped: set[str] = set()
        store.read_cap_listeners.append(self._read_cap_rose)
        self._duties = [
            PeriodicTask("held pop sweep", HOLD_SWEEP_INTERVAL_S, self._sweep, _DUTY_ERRORS),
            PeriodicTask(
                "revive checkpoint",
                config.revive_interval_ms / 1000,
                self._checkpoint,
                _DUTY_ERRORS,
            ),
        ]
        self._checkpointed_at = (-1, -1)  # (revive offset, version counter) last written
        # Each queue's state as last encoded for a checkpoint, with the state object and
        # its version then: a checkpoint re-encodes only the queues that changed.
        self._encoded: dict[StateKey, tuple[PopQueueState, int, list]] = {}
        # The master epoch this service last started in (module docstring, failover).
        self._serving_epoch = role.epoch
        self._acting_loaded = False  # acting: what earlier acting members escaped is read
        self._ensure_revive_topic()
        self._recover()
        store.after_cut.append(self._after_cut)

    def forget_topic(self, topic: str) -> None:
        """The topic was deleted: its in-flight pop state goes with it."""
        for key in [k for k in self.states if k[1] == topic]:
            del self.states[key]

    def reset_offset(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """An operator reset the group's offsets (broker/consumer_admin.py): its pops go on
        from there; what was in flight is forgotten (its acks answer as stale). Written to
        the revive log first, in one record (an acting member writes nothing of its own),
        so a rebuild of the state does not go on from the acks before it, and a refused
        write leaves every queue as it was."""
        entries = [(q, offset) for q, offset in offsets.items() if (group, topic, q) in self.states]
        if not entries:
            return
        if not self.acting:
            self.revive.append_reset(group, topic, entries)
        for queue_id, offset in entries:
            self.states[(group, topic, queue_id)] = PopQueueState(offset)
        self._changed()

    def _replay_reset(self, group: str, topic: str, entries: list) -> None:
        """A RESET record replayed: the queues restart there, their offsets with them."""
        now = self.store.clock_ms()
        for queue_id, offset in entries:
            self.states[(group, topic, queue_id)] = PopQueueState(offset)
            self.store.offsets.commit(group, topic, queue_id, offset, now)

    def handlers(self) -> dict[int, Callable[[Connection, Frame], list | None]]:
        return {
            RequestCode.POP_MESSAGE: self.pop,
            RequestCode.ACK_MESSAGE: self.ack,
            RequestCode.BATCH_ACK_MESSAGE: self.batch_ack,
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME: self.change_invisible_time,
            RequestCode.GET_POP_CHECKPOINT: self.get_pop_checkpoint,
            RequestCode.POP_ESCAPED_REVIVE: self.take_escaped,
            RequestCode.POP_ESCAPED_CONFIRM: self.confirm_escaped,
        }

    @property
    def serving(self) -> bool:
        """Pops and acks are taken on a master and on a slave acting as one."""
        return self.role.is_master or self.acting

    @property
    def acting(self) -> bool:
        """Acting as master, with somewhere to escape to (else pops stay refused)."""
        return self.escaped is not None and self.role.is_acting_master

    @property
    def _loading(self) -> bool:
        """An acting member takes requests from the moment it acts, but its state holds
        what earlier acting members escaped only once ``start`` read it back: until then a
        pop would hand out again what they had acked, and an ack would be taken for stale.
        So pops are held (or find nothing) and acks are refused (retriably) meanwhile."""
        return self.acting and not self._acting_loaded

    def _check_loaded(self) -> None:
        if self._loading:
            raise ServiceNotAvailable("this member's pop state is still loading: try again")

    # -- lifecycle ------------------------------------------------------------------------
    def _recover(self) -> None:
        """The pop state as of the revive log's end: the last checkpoint, then the records
        after it."""
        self.states.clear()
        self._encoded.clear()
        checkpoint = self.revive.load_checkpoint()
        for group, topic, queue_id, data in checkpoint.get("queues", []):
            self.states[(group, topic, queue_id)] = PopQueueState.from_wire(data)
        self.data_version = DataVersion(**checkpoint.get("data_version", {}))
        replayed = 0
        for record in self.revive.replay(checkpoint.get("revive_offset", 0)):
            if record.kind == KIND_INIT:
                self._start_group(record.group, record.topic, record.entries)
            elif record.kind == KIND_RESET:
                self._replay_reset(record.group, record.topic, record.entries)
            else:
                apply_record(self.states, record, self._start_offset)
                if record.kind != KIND_CK:
                    self._commit_offsets(record.group, record.entries)
            replayed += 1
        if replayed:
            self._changed(replayed)
        self._state_at = self.revive.end_offset  # the state holds every record below
        if replayed:
            log.info(
                "pop state rebuilt: %d revive log records replayed, %d queues",
                replayed,
                len(self.states),
            )

    def _after_cut(self) -> None:
        """Consumer offsets were clamped to this member's log (cut as it attached as a
        slave, or promoted). A state or checkpoint past the revive log's end counts pops
        and acks that are gone, and consume offsets past messages written at the same queue
        offsets since: the checkpoint goes, and the state is rebuilt at the next start
        from the revive log and the clamped consumer offsets."""
        if self.revive.load_checkpoint().get("revive_offset", 0) > self.revive.end_offset:
            self.revive.write_checkpoint(b"{}")
            self._checkpointed_at = (-1, -1)
        self._state_at = -1

    def _ensure_revive_topic(self) -> None:
        """A master's revive log topic (a slave takes it from its master)."""
        if self.role.is_master and self.store.topics.get(REVIVE_LOG_TOPIC) is None:
            self.topics.create(REVIVE_LOG_TOPIC, 1, 1, PERM_READ, notify=False)

    async def start(self) -> None:
        """Master or acting master (pop revive): the state follows the revive log from here
        on. On a member that was a slave the log grew with its master's records: rebuilt
        first; an acting member then takes what earlier acting members escaped. An acting
        period is a new state version (module docstring)."""
        self._ensure_revive_topic()
        if self.revive.end_offset != self._state_at:
            self._recover()
        if self.acting:
            await self._take_escaped_records()
            self._acting_loaded = True
            self._retry_held(list(self.held), lambda h: True, self.store.clock_ms())
            self.data_version = DataVersion(wall_ms(), 0, wall_ms())
            self.escaped.start()
        elif self.role.epoch != self._serving_epoch:
            self._serving_epoch = self.role.epoch
            self._revive_in_flight()
        for duty in self._duties:
            duty.start()

    def _revive_in_flight(self) -> None:
        """A new master: what earlier masters left in flight is due now (module
        docstring)."""
        now = self.store.clock_ms()
        revived = sum(state.revive_now(now) for state in self.states.values())
        if revived:
            self._changed()
            log.info(
                "pop: %d messages in flight before master epoch %d are redelivered now",
                revived,
                self.role.epoch,
            )

    async def _take_escaped_records(self) -> None:
        """Replay, after this member's own revive log, the records acting members of this
        group escaped (under its broker name) into the cluster's other masters: an acting
        member that died took the pops and acks of its period there only. Records applied
        again converge (in order, a CK re-hands-out only what is not acked, an ACK of an
        older receipt is stale). Bounded in time; without them the member serves anyway
        (at least once holds: some messages come again, none is lost)."""
        if self._escape_source is None:
            return
        try:
            records = await asyncio.wait_for(
                self._escape_source.records_of(self.broker_name), ESCAPED_READ_TIMEOUT_S
            )
        except (HamqError, OSError, TimeoutError) as exc:
            log.warning("pop records escaped by earlier acting members not read: %s", exc)
            return
        for record in records:
            apply_record(self.states, record, self._start_offset)
            if record.kind != KIND_CK:
                self._commit_offsets(record.group, record.entries)
        if records:
            self._changed(len(records))
            log.info("pop state: %d records escaped by acting members replayed", len(records))

    async def stop(self) -> None:
        self._acting_loaded = False
        for duty in self._duties:
            await duty.stop()
        if self.escaped is not None:
            await self.escaped.stop()
        held, self.held = self.held, {}
        self._held_by_conn.clear()
        self._held_by_queue.clear()
        for h in (h for pops in held.values() for h in pops):
            h.conn.reply(response_pieces(h.frame, ResponseCode.PULL_NOT_FOUND))
        snapshot = self._snapshot()
        if snapshot is not None:
            self._write_checkpoint(snapshot)
        self._state_at = self.revive.end_offset

    def _snapshot(self) -> dict | None:
        """The state and the revive offset it covers, taken between event-loop turns (so
        every record below that offset is applied and nothing above it). Only queues
        changed since the last checkpoint are encoded here; the encoded lists are never
        changed afterwards, so the JSON is written in a worker thread."""
        end = self.revive.end_offset
        if (end, self.data_version.counter) == self._checkpointed_at:
            return None
        self._checkpointed_at = (end, self.data_version.counter)
        return {
            "revive_offset": end,
            "data_version": asdict(self.data_version),
            "queues": self._encode_queues(),
        }

    def _encode_queues(self) -> list[list]:
        """Every queue's state as ``[group, topic, queue id, wire]``, re-encoding only the
        queues changed since the last call."""
        encoded = {}
        for key, state in self.states.items():
            cached = self._encoded.get(key)
            if cached is None or cached[0] is not state or cached[1] != state.version:
                cached = (state, state.version, state.to_wire())
            encoded[key] = cached
        self._encoded = encoded
        return [[g, t, q, wire] for (g, t, q), (_, _, wire) in encoded.items()]

    def _write_checkpoint(self, snapshot: dict) -> None:
        self.revive.write_checkpoint(json.dumps(snapshot).encode())

    async def _checkpoint(self) -> None:
        snapshot = self._snapshot()
        if snapshot is not None:
            await asyncio.to_thread(self._write_checkpoint, snapshot)

    # -- state ----------------------------------------------------------------------------
    def _state(self, group: str, topic: str, queue_id: int, init_mode: str) -> PopQueueState:
        key = (group, topic, queue_id)
        state = self.states.get(key)
        if state is None:
            offset = self.store.offsets.query(group, topic, queue_id)
            if offset is None:
                offset = (  # from the end: what readers may reach (see GET_MAX_OFFSET)
                    self.store.min_offset
                    if init_mode == INIT_MODE_MIN
                    else self.store.readable_max_offset
                )(topic, queue_id)
                self.store.offsets.commit(group, topic, queue_id, offset, self.store.clock_ms())
                if not self.acting:  # an acting member writes nothing of its own
                    self.revive.append_init(group, topic, [(queue_id, offset)])
            state = self.states[key] = PopQueueState(offset)
        return state

    def _start_group(self, group: str, topic: str, entries: list) -> None:
        """An INIT record replayed: the group starts there on queues it has no consumer
        offset for (``ReviveLog.append_init``); an offset it has is newer."""
        now = self.store.clock_ms()
        for queue_id, offset in entries:
            if self.store.offsets.query(group, topic, queue_id) is None:
                self.store.offsets.commit(group, topic, queue_id, offset, now)

    def _start_offset(self, group: str, topic: str, queue_id: int, offsets: list[int]) -> int:
        """A queue's first CK since the checkpoint: it started at the committed offset, or
        (none persisted yet) at the first offset it handed out."""
        offset = self.store.offsets.query(group, topic, queue_id)
        return min(offsets) if offset is None else offset

    def _changed(self, count: int = 1) -> None:
        self.data_version = DataVersion(
            self.data_version.state_version, self.data_version.counter + count, wall_ms()
        )

    # -- POP_MESSAGE ----------------------------------------------------------------------
    def pop(self, conn: Connection, frame: Frame) -> list | None:
        ext = frame.ext
        if not self.serving:
            raise NoPermission("this broker is a slave: pop from the group's master")
        group = require(ext, "group")
        topic = require(ext, "topic")
        queue_id = ext.get("queue_id", -1)
        if not isinstance(queue_id, int):
            raise InvalidArgument("request field 'queue_id' must be an integer (-1: any)")
        self.topics.for_read(topic, max(queue_id, 0))
        invisible_ms = require(ext, "invisible_time_ms", int)
        if not MIN_INVISIBLE_TIME_MS <= invisible_ms <= MAX_INVISIBLE_TIME_MS:
            raise InvalidArgument(
                f"invisible_time_ms must be in {MIN_INVISIBLE_TIME_MS}.."
                f"{MAX_INVISIBLE_TIME_MS}, got {invisible_ms}"
            )
        max_msgs = ext.get("max_msgs", DEFAULT_POP_BATCH)
        if not isinstance(max_msgs, int) or not 1 <= max_msgs <= MAX_POP_MESSAGES:
            raise InvalidArgument(f"max_msgs must be in 1..{MAX_POP_MESSAGES}, got {max_msgs}")
        if ext.get("init_mode", INIT_MODE_MIN) not in (INIT_MODE_MIN, INIT_MODE_MAX):
            raise InvalidArgument(f"init_mode must be {INIT_MODE_MIN!r} or {INIT_MODE_MAX!r}")
        poll_ms = ext.get("poll_time_ms", 0)
        if not isinstance(poll_ms, int) or poll_ms < 0:
            raise InvalidArgument(f"poll_time_ms must be an integer >= 0, got {poll_ms!r}")
        poll_ms = min(poll_ms, self.max_wait_ms)
        max_reconsume_times = ext.get("max_reconsume_times", DEFAULT_MAX_RECONSUME_TIMES)
        if not isinstance(max_reconsume_times, int) or max_reconsume_times < 0:
            raise InvalidArgument(
                f"max_reconsume_times must be an integer >= 0, got {max_reconsume_times!r}"
            )
        pieces = self._answer(frame, hold=poll_ms > 0 and self._may_hold(conn, topic, queue_id))
        if pieces is None:
            self.held.setdefault(topic, []).append(
                HeldPop(conn, frame, group, topic, queue_id, monotonic_ms() + poll_ms)
            )
            self._held_by_conn[conn] += 1
            self._held_by_queue[(topic, queue_id)] += 1
            if self._reads_capped():
                self._capped.add(topic)
        return pieces

    def _reads_capped(self) -> bool:
        return self.store.reads_end < self.store.commitlog.max_offset

    def _read_cap_rose(self) -> None:
        if not self._capped:
            return
        topics = {t for t in self._capped if t in self.held}
        self._capped = set()
        self._retry_held(topics, lambda h: True, self.store.clock_ms())
        if self._reads_capped():  # those still held may wait for what it still holds back
            self._capped = {t for t in topics if t in self.held}

    def _may_hold(self, conn: Connection, topic: str, queue_id: int) -> bool:
        """Room for one more held pop of ``conn`` on the queue (RocketMQ's popPollingSize
        per queue; past it RocketMQ answers POLLING_FULL, here an empty answer)."""
        return (
            self._held_by_conn[conn] < self.max_held_per_connection
            and self._held_by_queue[(topic, queue_id)] < self.max_held_per_queue
        )

    def _release(self, h: HeldPop) -> None:
        for counter, key in (
            (self._held_by_conn, h.conn),
            (self._held_by_queue, (h.topic, h.queue_id)),
        ):
            counter[key] -= 1
            if not counter[key]:
                del counter[key]

    def _answer(self, frame: Frame, hold: bool) -> list | None:
        if self._loading:  # held (or answered empty) until the state is loaded
            return None if hold else response_pieces(frame, ResponseCode.PULL_NOT_FOUND)
        ext = frame.ext
        group, topic = ext["group"], ext["topic"]
        queue_id = ext.get("queue_id", -1)
        remaining = ext.get("max_msgs", DEFAULT_POP_BATCH)
        init_mode = ext.get("init_mode", INIT_MODE_MIN)
        max_reconsume_times = ext.get("max_reconsume_times", DEFAULT_MAX_RECONSUME_TIMES)
        config = self.store.topics.get(topic)
        if queue_id >= 0:
            queue_ids = [queue_id]
        elif config is None:
            queue_ids = []
        else:
            n = config.read_queue_nums
            start = self._rotation.get((group, topic), 0)
            self._rotation[(group, topic)] = start + 1
            queue_ids = [(start + i) % n for i in range(n)]
        now = self.store.clock_ms()
        entries: list[CkEntry] = []
        chunks: list[list] = []
        bodies: list[bytes] = []
        taken: list[PopQueueState] = []
        # Every queue of the group starts now, even those this pop does not reach, so the
        # init mode applies once per group rather than whenever a queue is first reached.
        states = [
            (qid, cq, self._state(group, topic, qid, init_mode))
            for qid in queue_ids
            if (cq := self.store.queues.get((topic, qid))) is not None
        ]
        try:  # a failed write (the DLQ copy, an ACK or the CK) leaves due messages due
            for qid, cq, state in states:
                state.forget_below(cq.min_offset)
                state.truncate_to(cq.max_offset)
                offsets: list[int] = []
                times: list[int] = []
                due = state.take_expired(now, remaining)
                if due:
                    taken.append(state)
                    due = self._dead_letter(group, topic, qid, state, due, max_reconsume_times)
                if due:
                    self._read_redeliveries(topic, qid, due, offsets, times, chunks, bodies)
                if len(offsets) < remaining and len(state.inflight) < self.inflight_threshold:
                    self._read_new(
                        topic,
                        qid,
                        state.pop_offset,
                        remaining - len(offsets),
                        offsets,
                        times,
                        chunks,
                        bodies,
                    )
                if offsets:
                    entries.append((qid, offsets, times))
                    remaining -= len(offsets)
                    if not remaining:
                        break
            if not entries:
                if hold:
                    return None
                return response_pieces(frame, ResponseCode.PULL_NOT_FOUND)
            deadline = now + ext["invisible_time_ms"]
            ck = self._write_ck(group, topic, deadline, entries)
        except (HamqError, OSError):
            for state in taken:
                state.restore_deadlines()
            raise
        for qid, offsets, times in entries:
            self.states[(group, topic, qid)].check_out(offsets, times, deadline, ck)
        self._changed()
        body = b"".join(bodies)
        self.stats.consumed(group, topic, sum(len(e[1]) for e in entries), body, now)
        return response_pieces(
            frame,
            ext={"ck": ck, "pop_time_ms": now, "deadline_ms": deadline, "chunks": chunks},
            body=body,
        )

    def _write_ck(self, group: str, topic: str, deadline_ms: int, entries: list[CkEntry]) -> int:
        """Record a CK; returns its receipt id. An acting master's escapes and the answer
        does not wait for it: a CK that never gets there only lets the messages be handed
        out again sooner by whoever serves the group next (at least once still holds)."""
        if not self.acting:
            return self.revive.append_ck(group, topic, deadline_ms, entries).base_queue_offset
        self.escaped.check_room()
        ck = self.escaped.next_ck(self.store.clock_ms())
        self.escaped.submit(ck_record(self.broker_name, group, topic, deadline_ms, entries, ck))
        return ck

    def _dead_letter(
        self,
        group: str,
        topic: str,
        qid: int,
        state: PopQueueState,
        due: list[tuple[int, int]],
        max_reconsume_times: int,
    ) -> list[tuple[int, int]]:
        """Due redeliveries past ``max_reconsume_times`` go to the group's DLQ and are
        acked (an ACK record, so a restart agrees); returns the others. An acting master
        writes no DLQ copy: all are redelivered (module docstring)."""
        redeliver = [d for d in due if d[1] <= max_reconsume_times]
        if len(redeliver) == len(due) or self.acting:
            return due
        acks: list[AckEntry] = []
        for offset, times in due:
            if times <= max_reconsume_times:
                continue
            original = read_message(self.store, topic, qid, offset)
            if original is not None:  # None: removed by retention meanwhile
                put_dead_letter(
                    self.store,
                    self.topics,
                    group,
                    original,
                    copy_properties(original, topic, times),
                    self.on_put,
                )
            acks.append((topic, qid, offset, state.inflight[offset][2]))
        self.revive.append_ack(group, acks)
        for _, _, offset, ck in acks:
            state.ack(offset, ck)
        self._changed()
        self._commit_offsets(group, acks)
        log.info(
            "%s:%d: %d messages of group %s past %d redeliveries sent to its DLQ",
            topic,
            qid,
            len(acks),
            group,
            max_reconsume_times,
        )
        return redeliver

    def _read_new(
        self,
        topic: str,
        qid: int,
        start: int,
        limit: int,
        offsets: list[int],
        times: list[int],
        chunks: list[list],
        bodies: list[bytes],
    ) -> None:
        result = self.store.get_messages(topic, qid, start, limit, MAX_PULL_BYTES)
        if result.status is not GetStatus.FOUND:
            return
        got = list(range(start, min(result.next_begin_offset, start + limit)))
        offsets += got
        times += [0] * len(got)
        chunks.append([qid, got, [0] * len(got), len(result.records)])
        bodies.append(result.records)

    def _read_redeliveries(
        self,
        topic: str,
        qid: int,
        due: list[tuple[int, int]],
        offsets: list[int],
        times: list[int],
        chunks: list[list],
        bodies: list[bytes],
    ) -> None:
        """One chunk per record holding due offsets (they may share a batch record)."""
        record_end = -1
        for offset, reconsume_times in due:
            if offset >= record_end:
                result = self.store.get_messages(topic, qid, offset, 1, MAX_PULL_BYTES)
                if result.status is not GetStatus.FOUND:
                    continue  # deleted meanwhile; forget_below drops it on the next pop
                record_end = result.next_begin_offset
                chunk = [qid, [], [], len(result.records)]
                chunks.append(chunk)
                bodies.append(result.records)
            chunk[1].append(offset)
            chunk[2].append(reconsume_times)
            offsets.append(offset)
            times.append(reconsume_times)

    # -- long polling ---------------------------------------------------------------------
    def serve_arrivals(self, arrived: set[tuple[str, int]]) -> None:
        """After a commit-log write put messages into ``arrived`` queues: retry only the
        held pops of those queues (RocketMQ's PopLongPollingService notifies per queue)."""
        by_topic: dict[str, set[int]] = {}
        for topic, qid in arrived:
            if topic in self.held:
                by_topic.setdefault(topic, set()).add(qid)
        if by_topic:
            self._retry_held(
                by_topic,
                lambda h: h.queue_id < 0 or h.queue_id in by_topic[h.topic],
                self.store.clock_ms(),
            )

    def _sweep(self) -> None:
        """Every ``HOLD_SWEEP_INTERVAL_S``: answer held pops whose poll time ran out, and
        retry those of a group with a redelivery now due, or whose topic had acks (which may
        lift the in-flight threshold). Nothing is read for a pop with nothing to find."""
        if not self.held:
            self._acked_topics.clear()
            return
        now = self.store.clock_ms()
        acked, self._acked_topics = self._acked_topics, set()
        due: dict[tuple[str, str], bool] = {}

        def wanted(h: HeldPop) -> bool:
            if h.expires_ms <= monotonic_ms() or h.topic in acked:
                return True
            key = (h.group, h.topic)
            if key not in due:
                due[key] = self._redelivery_due(h.group, h.topic, now)
            return due[key]

        self._retry_held(self.held, wanted, now)

    def _redelivery_due(self, group: str, topic: str, now: int) -> bool:
        config = self.store.topics.get(topic)
        if config is None:
            return False
        for qid in range(config.read_queue_nums):
            state = self.states.get((group, topic, qid))
            deadline = state.next_deadline_ms() if state is not None else None
            if deadline is not None and deadline <= now:
                return True
        return False

    def _retry_held(
        self, topics: Iterable[str], wanted: Callable[[HeldPop], bool], now: int
    ) -> None:
        """Answer again the held pops of ``topics`` that are ``wanted``; those past their
        poll time are answered even if they find nothing."""
        replies: list[tuple[Connection, list]] = []
        for topic in list(topics):
            still: list[HeldPop] = []
            for h in self.held.get(topic, ()):
                if h.conn.is_closed:
                    self._release(h)
                    continue
                if not wanted(h):
                    still.append(h)
                    continue
                try:
                    pieces = self._answer(h.frame, hold=monotonic_ms() < h.expires_ms)
                except HamqError as err:
                    pieces = error_pieces(h.frame, err)
                if pieces is None:
                    still.append(h)
                else:
                    self._release(h)
                    replies.append((h.conn, pieces))
            if still:
                self.held[topic] = still
            else:
                self.held.pop(topic, None)
        if replies:
            self.store.commit()  # the CKs of these answers reach the log before they leave
            self.on_written()
            for conn, pieces in replies:
                conn.reply(pieces)

    # -- ACK_MESSAGE / BATCH_ACK_MESSAGE ----------------------------------------------------
    def ack(self, conn: Connection, frame: Frame) -> list | None:
        ext = frame.ext
        entry = (
            require(ext, "topic"),
            require(ext, "queue_id", int),
            require(ext, "offset", int),
            require(ext, "ck", int),
        )
        stale, put = self._ack(require(ext, "group"), [entry])
        if stale:
            raise InvalidArgument(
                f"receipt handle of {entry[0]}:{entry[1]} offset {entry[2]} is stale: its "
                "invisible time ran out and it was delivered again (or it was never popped)"
            )
        return self._answer_durable(conn, frame, put, {})

    def batch_ack(self, conn: Connection, frame: Frame) -> list | None:
        group = require(frame.ext, "group")
        entries = unpack_body(frame.body)
        if (
            not isinstance(entries, list)
            or len(entries) > MAX_BATCH_ACK_ENTRIES
            or not all(
                isinstance(e, list)
                and len(e) == 4
                and isinstance(e[0], str)
                and isinstance(e[1], int)
                and isinstance(e[2], int)
                and isinstance(e[3], int)
                for e in entries
            )
        ):
            raise InvalidArgument(
                f"BATCH_ACK_MESSAGE body must be a list of at most "
                f"{MAX_BATCH_ACK_ENTRIES} [topic, queue_id, offset, ck]"
            )
        stale, put = self._ack(group, entries)
        return self._answer_durable(conn, frame, put, {"stale": stale})

    def _ack(
        self, group: str, entries: list
    ) -> tuple[list[int], PutResult | asyncio.Future | None]:
        """Apply acks; returns the indexes of stale ones and the ACK record written (on an
        acting master, a future done once it is escaped)."""
        if not self.serving:
            raise NoPermission("this broker is a slave: ack on the group's master")
        self._check_loaded()
        if self.acting:
            self.escaped.check_room()
        stale: list[int] = []
        accepted: list[AckEntry] = []
        states = self.states
        already = False
        for i, (topic, qid, offset, ck) in enumerate(entries):
            state = states.get((group, topic, qid))
            result = state.ack(offset, ck) if state is not None else AckResult.STALE
            if result is AckResult.ACKED:
                accepted.append((topic, qid, offset, ck))
            elif result is AckResult.STALE:
                stale.append(i)
            else:
                already = True
        if not accepted:
            # a client retrying an ack that timed out: answered once its record is stored
            return stale, self.escaped.settled() if already and self.acting else None
        if self.held:
            self._acked_topics.update(topic for topic, _, _, _ in accepted)
        self._changed()
        self._commit_offsets(group, accepted)
        if self.acting:
            return stale, self.escaped.submit(
                ack_record(self.broker_name, group, accepted), wait=True
            )
        return stale, self.revive.append_ack(group, accepted)

    def _commit_offsets(self, group: str, entries: list) -> None:
        """The group's consumer offset of each touched queue follows its acked prefix."""
        now = self.store.clock_ms()
        for key in {(group, topic, qid) for topic, qid, _, _ in entries}:
            state = self.states.get(key)
            if state is not None:
                self.store.offsets.commit(group, key[1], key[2], state.consume_offset, now)

    def _answer_durable(
        self,
        conn: Connection,
        frame: Frame,
        put: PutResult | asyncio.Future | None,
        answer: dict,
    ) -> list | None:
        """Answer at once, or under sync flush once the ACK record is on disk, or on an
        acting master once it is in the chosen master."""
        if isinstance(put, asyncio.Future):
            put.add_done_callback(lambda _: conn.reply(response_pieces(frame, ext=answer)))
            return None
        if put is None or not self.flush.sync:
            return response_pieces(frame, ext=answer)

        def flushed(ok: bool) -> None:
            conn.reply(
                response_pieces(frame, ext=answer)
                if ok
                else response_pieces(
                    frame,
                    ResponseCode.FLUSH_DISK_TIMEOUT,
                    ext=answer,
                    remark="flush to disk timed out; ack stored",
                )
            )

        self.flush.wait_flushed(put.end_offset, flushed)
        return None

    # -- CHANGE_MESSAGE_INVISIBLETIME -------------------------------------------------------
    def change_invisible_time(self, conn: Connection, frame: Frame) -> list:
        ext = frame.ext
        if not self.serving:
            raise NoPermission("this broker is a slave: change invisible time on the master")
        self._check_loaded()
        group, topic = require(ext, "group"), require(ext, "topic")
        qid, offset = require(ext, "queue_id", int), require(ext, "offset", int)
        invisible_ms = require(ext, "invisible_time_ms", int)
        if not 0 <= invisible_ms <= MAX_INVISIBLE_TIME_MS:
            raise InvalidArgument(
                f"invisible_time_ms must be in 0..{MAX_INVISIBLE_TIME_MS}, got {invisible_ms}"
            )
        state = self.states.get((group, topic, qid))
        entry = state.lookup(offset, require(ext, "ck", int)) if state is not None else None
        if entry is None:
            raise InvalidArgument(
                f"receipt handle of {topic}:{qid} offset {offset} is stale or the message was acked"
            )
        deadline = self.store.clock_ms() + invisible_ms
        ck = self._write_ck(group, topic, deadline, [(qid, [offset], [entry[1]])])
        state.check_out([offset], [entry[1]], deadline, ck)
        self._changed()
        return response_pieces(frame, ext={"ck": ck, "deadline_ms": deadline})

    # -- POP_ESCAPED_REVIVE: an acting master's CK/ACK record, into this master's log ------
    def take_escaped(self, conn: Connection, frame: Frame) -> None:
        """Stored once a member of the record's group confirms it is putting it (answered
        from a task)."""
        spawn(self._take_escaped(conn, frame))

    async def _take_escaped(self, conn: Connection, frame: Frame) -> None:
        try:
            record = self.revive.check_escaped(frame.body)
            if self._escape_source is None:
                raise NoPermission("this broker cannot confirm escaped pop records")
            await self._escape_source.confirm(frame.body, record.broker_name)
            put = self.store_escaped(frame.body)
        except HamqError as err:
            conn.reply(error_pieces(frame, err))
            return
        self.store.commit()  # written and shipped now: this is no request's turn any more
        self.on_written()
        pieces = self._answer_durable(conn, frame, put, {})
        if pieces is not None:
            conn.reply(pieces)

    def confirm_escaped(self, conn: Connection, frame: Frame) -> list:
        """POP_ESCAPED_CONFIRM: SUCCESS only if this member is putting that record now."""
        digest = require(frame.ext, "digest")
        if self.escaped is None or not self.escaped.putting(digest):
            raise NoPermission("this member is putting no pop record of that digest")
        return response_pieces(frame)

    def store_escaped(self, record: bytes) -> PutResult:
        """Append an acting master's record (``escaped.py``) to this master's revive log;
        records under this broker's own name are refused (``ReviveLog.append_escaped``)."""
        if not self.role.is_master:
            raise NoPermission("this broker is not a master: escape pop records to a master")
        return self.revive.append_escaped(record)

    # -- GET_POP_CHECKPOINT (pre-online) ------------------------------------------------
    def get_pop_checkpoint(self, conn: Connection, frame: Frame) -> list:
        """This member's pop state and its DataVersion (module docstring)."""
        state = {"data_version": asdict(self.data_version), "queues": self._encode_queues()}
        return response_pieces(frame, body=pack_body(state))

    def merge_checkpoint(self, body: bytes) -> bool:
        """Take another member's pop state (a GET_POP_CHECKPOINT answer) if its DataVersion
        is newer than this member's; True if taken. Its acked prefixes become the groups'
        consumer offsets, and a checkpoint at this member's revive log end keeps it over a
        restart (the records below were this member's older state)."""
        raw = unpack_body(body)
        try:
            version = DataVersion(**raw["data_version"])
            states = {
                (group, topic, queue_id): PopQueueState.from_wire(wire)
                for group, topic, queue_id, wire in raw["queues"]
            }
            for (group, topic, _), state in states.items():
                state.check()
                if not (isinstance(group, str) and isinstance(topic, str)):
                    raise ValueError(f"group and topic must be names: {group!r}, {topic!r}")
            if not all(type(v) is int for v in astuple(version)):
                raise ValueError(f"data_version must hold integers: {version}")
        except (LookupError, TypeError, ValueError) as exc:
            raise InvalidArgument(f"pop checkpoint unreadable: {exc!r}") from None
        if _newness(version) <= _newness(self.data_version):
            return False
        self.states = states
        self._encoded.clear()
        self.data_version = version
        now = self.store.clock_ms()
        for (group, topic, queue_id), state in states.items():
            self.store.offsets.commit(group, topic, queue_id, state.consume_offset, now)
        self._state_at = self.revive.end_offset
        self._checkpointed_at = (-1, -1)
        self._write_checkpoint(self._snapshot())
        log.info("pop state taken from another member: %d queues, version %s", len(states), version)
        return True


def _newness(version: DataVersion) -> tuple[int, int]:
    return version.state_version, version.counter
