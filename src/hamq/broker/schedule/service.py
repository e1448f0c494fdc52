"""Delay and timer messages (RocketMQ's ScheduleMessageService, plus timer messages).

A scheduled message is stored in ``SCHEDULE_TOPIC_XXXX`` instead of its topic, with
``REAL_TOPIC`` / ``REAL_QID`` saying where it belongs: delay level N in queue N-1, timer
messages in queue ``TIMER_QUEUE_ID``. On the master, one timer per delay level wakes at
the due time of that level's next message (a level's queue is FIFO with one delay, so due
times only grow). Timer messages are delivered by ``timer_message`` (RocketMQ 5's timer
wheel over a timer log). A due message is re-encoded without its schedule properties and
stored in its real queue.

Progress is a ``DelayOffsetManager`` persisted every ``flush_delay_offset_interval_ms`` and
at stop, so a restart delivers at least once. It moves only once the delivered copies are
durable under the configured flush type (under sync flush: after their fsync), so a power
loss never leaves progress past a delivery the log lost; in memory, delivery goes on from
what was written. The timer log is fsynced before a progress that counts on it is written,
and its segments are deleted only once a written progress is past them. Slaves never
deliver (their log is the master's copy).

An acting master (seed 004: a slave standing in for its dead master) delivers the same
way over the replicated schedule queues, so messages not yet due when the master died
are delivered as they fall due, but it never appends to its own commit log: due messages
are escaped into another group's master (``broker/escape.py``), grouped by topic into
batches, one batch in flight per delay level and one for the timers (so each progress
moves in order), and progress moves once the target acknowledged the batch. A failed
escape is tried again every ``DELIVER_RETRY_MS`` with the messages not yet acknowledged;
that level's (or the timers') progress waits meanwhile, as in RocketMQ, but the other
levels, and the other topics of the batch, go on: a topic no other master serves waits
for its own master's return without holding up the rest. The progress lives on the
acting master as metadata (persisted as on a master; pre-online takes it back).
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import asdict

from hamq.broker.durable import when_durable
from hamq.broker.escape import EscapeBridge
from hamq.broker.role import RoleState
from hamq.broker.schedule.timer_message import DELIVER_BATCH, DELIVER_RETRY_MS, TimerMessageService
from hamq.broker.stored_message import StoredMessage, read_messages
from hamq.errors import HamqError, MessageIllegal, ServiceNotAvailable
from hamq.net.connection import Connection, response_pieces
from hamq.net.counts import COUNTS
from hamq.net.tasks import PeriodicTask
from hamq.protocol.frame import Frame, pack_body
from hamq.protocol.limits import MAX_BATCH_BYTES, MAX_BATCH_MESSAGES
from hamq.protocol.message import encode_message, encode_properties
from hamq.protocol.properties import (
    DELAY_LEVELS_MS,
    MAX_DELAY_LEVEL,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELIVER_MS,
    SCHEDULE_PROPERTIES,
)
from hamq.store.delay_offset import DelayOffsetManager
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore, PutResult

log = logging.getLogger(__name__)

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"  # RocketMQ TopicValidator.RMQ_SYS_SCHEDULE_TOPIC
TIMER_QUEUE_ID = MAX_DELAY_LEVEL  # queues 0..17 are the delay levels
TIMER_MAX_DELAY_MS = 3 * 24 * 3600 * 1000  # RocketMQ timerMaxDelaySec: 3 days


def delay_level_of(properties: dict[str, str]) -> int:
    raw = properties[PROPERTY_DELAY_TIME_LEVEL]
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_DELAY_LEVEL:
        raise MessageIllegal(f"delay level must be 1..{MAX_DELAY_LEVEL}, got {raw!r}")
    return int(raw)


def deliver_time_of(properties: dict[str, str], now_ms: int) -> int:
    raw = properties[PROPERTY_TIMER_DELIVER_MS]
    if not raw.isdigit():
        raise MessageIllegal(f"{PROPERTY_TIMER_DELIVER_MS} must be epoch milliseconds, got {raw!r}")
    if int(raw) - now_ms > TIMER_MAX_DELAY_MS:
        raise MessageIllegal(
            f"deliver time {raw} is more than {TIMER_MAX_DELAY_MS // 1000} s "
            "ahead (RocketMQ timerMaxDelaySec)"
        )
    return int(raw)


class ScheduleMessageService:
    def __init__(
        self,
        store: MessageStore,
        flush: FlushService,
        role: RoleState,
        escape: EscapeBridge,
        *,
        on_put: Callable[[str, int], None],
        after_put: Callable[[], None],
        flush_interval_ms: int,
    ) -> None:
        self.store = store
        self.flush = flush
        self.role = role  # a master stores due messages; an acting master escapes them
        self.escape = escape
        # acting: due messages read, not yet handed to the escape worker (topic, message)
        self._outbox: list[tuple[str, bytes]] = []
        # acting: per schedule queue (a delay level, or the timers), the batches to escape
        # in order, each with what runs once it is acknowledged, and the task escaping them
        self._escapes: dict[int, deque[tuple[list[tuple[str, bytes]], Callable[[], None]]]] = {}
        self._escapers: dict[int, asyncio.Task] = {}
        self.on_put = on_put  # wakes pulls held on a real queue
        self.after_put = after_put  # writes the log and ships it, as after a request
        self.progress = DelayOffsetManager(store.root, store.clock_ms(), disk=store.disk)
        self._timers: dict[int, asyncio.Handle] = {}  # queue id -> its armed wake-up
        self._next: dict[int, int] = {}  # level -> next offset to deliver (written before)
        self.timers = TimerMessageService(
            store,
            SCHEDULE_TOPIC,
            TIMER_QUEUE_ID,
            self.progress,
            self._deliver,
            after_put,
            lambda end, then: self._when_durable(end, then, TIMER_QUEUE_ID),
        )
        self._written_end = 0  # commit-log end of the last delivery written
        self._running = False
        store.after_cut.append(self._after_cut)
        self._persist = PeriodicTask(
            "delay progress persist", flush_interval_ms / 1000, self._persist_progress
        )

    # -- storing (send path and send-back) -------------------------------------------------
    def put_message(
        self,
        topic: str,
        queue_id: int,
        properties: dict[str, str],
        body: bytes,
        born_timestamp_ms: int,
    ) -> PutResult:
        """A sent message carrying DELAY or TIMER_DELIVER_MS."""
        if PROPERTY_DELAY_TIME_LEVEL in properties:
            return self.put_delayed(
                topic, queue_id, properties, body, born_timestamp_ms, delay_level_of(properties)
            )
        due = deliver_time_of(properties, self.store.clock_ms())
        result = self._put(topic, queue_id, properties, body, born_timestamp_ms, TIMER_QUEUE_ID)
        self.timers.put(due, result)
        return result

    def put_delayed(
        self,
        topic: str,
        queue_id: int,
        properties: dict[str, str],
        body: bytes,
        born_timestamp_ms: int,
        delay_level: int,
    ) -> PutResult:
        properties[PROPERTY_DELAY_TIME_LEVEL] = str(delay_level)
        level_queue = delay_level - 1
        result = self._put(topic, queue_id, properties, body, born_timestamp_ms, level_queue)
        if self._running and level_queue not in self._timers:
            self._arm(
                level_queue,
                result.store_timestamp_ms + DELAY_LEVELS_MS[level_queue],
                self._deliver_level,
            )
        return result

    def _put(
        self,
        topic: str,
        queue_id: int,
        properties: dict[str, str],
        body: bytes,
        born_timestamp_ms: int,
        schedule_queue: int,
    ) -> PutResult:
        properties[PROPERTY_REAL_TOPIC] = topic
        properties[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
        payload = encode_message(body, encode_properties(properties))
        return self.store.put_batch(
            SCHEDULE_TOPIC, schedule_queue, payload, 1, zlib.crc32(payload), born_timestamp_ms
        )

    def get_all_delay_offset(self, conn: Connection, frame: Frame) -> list:
        """GET_ALL_DELAY_OFFSET: the progress table, for a slave's SlaveSynchronize and a
        returning master's pre-online; its DataVersion in ``ext``."""
        self.timers.save_progress()
        return response_pieces(
            frame,
            ext={"data_version": asdict(self.progress.data_version)},
            body=pack_body(self.progress.table()),
        )

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Persist progress periodically, on either role: a slave keeps the progress that
        SlaveSynchronize copies from its master."""
        self._persist.start()

    def start_delivery(self) -> None:
        """Master only: open the timer index and start every level's and the timers'
        delivery, from the progress (on a member that was a slave, its master's)."""
        self._running = True
        self._next.clear()
        for level_queue in range(MAX_DELAY_LEVEL):
            self._arm(level_queue, 0, self._deliver_level)
        self.timers.start()

    async def stop_delivery(self) -> None:
        """Stop delivering; write the progress once every delivery written is durable (the
        flush service still runs), so a clean restart, or the next master, delivers each
        message once."""
        self._running = False
        self.timers.stop()
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        await self._stop_escaping()
        if self._written_end:
            durable = asyncio.get_running_loop().create_future()
            when_durable(
                self.flush, self._written_end, lambda ok: durable.done() or durable.set_result(ok)
            )
            await durable
            # a cut (this member a slave) may take the log below it before the next stop
            self._written_end = 0
        self.timers.save_progress()
        snapshot = self.progress.snapshot()
        if snapshot is not None:
            self.write_progress(snapshot)
        self.timers.close()

    async def stop(self) -> None:
        await self._persist.stop()
        await self.stop_delivery()

    async def _persist_progress(self) -> None:
        self.timers.save_progress()
        read_ms = self.progress.timer.read_ms
        snapshot = self.progress.snapshot()
        if snapshot is not None:
            # an OSError is logged by the task; the segments stay until a write succeeds
            await asyncio.to_thread(self.write_progress, snapshot)
        self.timers.delete_delivered(read_ms)

    def write_progress(self, snapshot: bytes) -> None:
        """Write a progress snapshot, after the timer log records it counts on (also for
        progress taken from a fellow member: ``broker/pre_online.py``)."""
        self.timers.fsync_log()
        self.progress.write(snapshot)

    def _after_cut(self) -> None:
        """Progress past a level queue's end (this member cut its log as it attached as a
        slave, or is promoted without what its master delivered last) counts deliveries of
        records it does not hold, and would skip the others written at those offsets."""
        self.progress.clamp_delay(
            lambda level: self.store.max_offset(SCHEDULE_TOPIC, level - 1), self.store.clock_ms()
        )

    # -- delivery --------------------------------------------------------------------------
    def _arm(self, queue_id: int, due_ms: int, deliver: Callable[[int], None]) -> None:
        old = self._timers.pop(queue_id, None)
        if old is not None:
            old.cancel()
        delay_s = max(0, due_ms - self.store.clock_ms()) / 1000
        loop = asyncio.get_running_loop()
        self._timers[queue_id] = loop.call_later(delay_s, deliver, queue_id)

    def _deliver_level(self, level_queue: int) -> None:
        self._timers.pop(level_queue, None)
        level = level_queue + 1
        offset = self._next.get(level, self.progress.delay_offset(level))
        now = self.store.clock_ms()
        next_due = None
        delivered = 0
        end = 0
        try:
            for _ in range(DELIVER_BATCH):
                found = read_messages(self.store, SCHEDULE_TOPIC, level_queue, offset, 1)
                if not found:
                    break  # idle until put_delayed arms it again
                due = found[0].store_timestamp_ms + DELAY_LEVELS_MS[level_queue]
                if due > now:
                    next_due = due
                    break
                end = max(end, self._deliver(found[0]))
                offset = found[0].queue_offset + 1
                delivered += 1
            else:
                next_due = now  # more are due: continue after serving requests
            if delivered:
                self.after_put()  # delivery moves on only once the write succeeded
                self._next[level] = offset
                if self._outbox:  # acting: one escape batch per level in flight
                    rearm = next_due
                    self._when_durable(
                        end, lambda: self._level_durable(level, offset, rearm), level_queue
                    )
                    return
                self._when_durable(end, lambda: self._level_durable(level, offset), level_queue)
        except HamqError as err:  # disk full: progress stays, so redelivery (at least once)
            log.error("delivering delay level %d failed: %s", level, err.message)
            next_due = now + DELIVER_RETRY_MS
        if next_due is not None and self._running:
            self._arm(level_queue, next_due, self._deliver_level)

    def _when_durable(self, end: int, then: Callable[[], None], queue_id: int) -> None:
        """Run ``then`` once the deliveries written up to ``end`` are durable; a sync
        flush that timed out is waited for again (the progress must not move before).
        Acting: once the messages escaped since the last call (from schedule queue
        ``queue_id``) are acknowledged."""
        if self._outbox:
            self._escapes.setdefault(queue_id, deque()).append((self._outbox, then))
            self._outbox = []
            if queue_id not in self._escapers:
                self._escapers[queue_id] = asyncio.get_running_loop().create_task(
                    self._escape_all(queue_id)
                )
            return
        self._written_end = max(self._written_end, end)

        def flushed(ok: bool) -> None:
            if ok:
                then()
            elif self._running:
                when_durable(self.flush, end, flushed)

        when_durable(self.flush, end, flushed)

    def _level_durable(self, level: int, offset: int, rearm: int | None = None) -> None:
        """Delivered up to ``offset``; an acting master's level is armed again here at
        ``rearm`` (its next due time), once its escape batch is acknowledged."""
        if offset > self.progress.delay_offset(level):  # waits retried after a timeout
            self.progress.set_delay_offset(level, offset, self.store.clock_ms())
        if rearm is not None and self._running:
            self._arm(level - 1, rearm, self._deliver_level)

    # -- escape (acting master) ------------------------------------------------------------
    async def _escape_all(self, queue_id: int) -> None:
        """Escape one schedule queue's batches in order; a batch that fails is tried again
        (that queue's delivery and progress wait) until it is acknowledged or delivery
        stops. Each queue has its own task: a topic no other master serves holds up
        only its own delay level (as in RocketMQ) or the timers, not the others."""
        batches = self._escapes[queue_id]
        try:
            while batches:
                batch, then = batches[0]
                failures = 0
                while batch:
                    try:
                        await self._escape_batch(batch)
                    except Exception as err:  # a bug must not end this level's delivery
                        if not isinstance(err, HamqError):
                            COUNTS.internal_errors += 1
                            log.exception("escaping %d due message(s) failed", len(batch))
                        if not failures:
                            log.warning(
                                "escaping %d due message(s) failed, trying again every %d ms: %s",
                                len(batch),
                                DELIVER_RETRY_MS,
                                err.message if isinstance(err, HamqError) else repr(err),
                            )
                        failures += 1
                        await asyncio.sleep(DELIVER_RETRY_MS / 1000)
                batches.popleft()
                then()
        finally:
            self._escapers.pop(queue_id, None)

    async def _escape_batch(self, batch: list[tuple[str, bytes]]) -> None:
        """Escape ``batch`` topic by topic, taking what is acknowledged off it (a retry
        puts only what is left); a topic that fails (one only this group serves has
        nowhere to go) does not keep the others from going. Raises the first failure
        once every topic was tried."""
        failed: HamqError | None = None
        for topic in dict.fromkeys(t for t, _ in batch):
            try:
                await self._escape_topic(batch, topic)
            except HamqError as err:
                failed = failed or err
        if failed is not None:
            raise failed

    async def _escape_topic(self, batch: list[tuple[str, bytes]], topic: str) -> None:
        """Escape ``topic``'s messages of ``batch`` in payloads of at most
        MAX_BATCH_MESSAGES and MAX_BATCH_BYTES, each taken off it once acknowledged."""
        while True:
            picked: list[int] = []
            size = 0
            for i, (t, message) in enumerate(batch):
                if t != topic:
                    continue
                if picked and (
                    len(picked) == MAX_BATCH_MESSAGES or size + len(message) > MAX_BATCH_BYTES
                ):
                    break
                picked.append(i)
                size += len(message)
            if not picked:
                return
            payload = b"".join(batch[i][1] for i in picked)
            await self.escape.put(topic, payload, count=len(picked))
            for i in reversed(picked):
                del batch[i]

    async def _stop_escaping(self) -> None:
        """Drop batches not acknowledged: their progress never moved, so whoever delivers
        next (the master back, or this member acting again) delivers them."""
        self._outbox = []
        self._escapes.clear()
        escapers = list(self._escapers.values())
        for task in escapers:
            task.cancel()
        await asyncio.gather(*escapers, return_exceptions=True)
        self._escapers.clear()

    def _deliver(self, msg: StoredMessage) -> int:
        """Store ``msg`` in its real queue; returns the commit-log end of the copy (0 if
        its topic is gone and it was dropped). A member that is not master (an acting
        one) keeps it for escape instead and returns 0: whether the topic exists is the
        target's to say, as a slave's topic table lags its master's (SlaveSynchronize),
        and a topic created shortly before the master died is not in it yet."""
        properties = dict(msg.properties)
        topic = properties.pop(PROPERTY_REAL_TOPIC)
        queue_id = int(properties.pop(PROPERTY_REAL_QUEUE_ID))
        for name in SCHEDULE_PROPERTIES:
            properties.pop(name, None)
        payload = encode_message(msg.body, encode_properties(properties))
        if self.role.master_lease_lapsed():
            # its name servers may have dropped it: another member may be delivering
            raise ServiceNotAvailable("no name server is sure to hold this member: delivery stops")
        if not self.role.is_master:
            if not self.role.is_acting_master:
                # a master deposed a moment before its delivery stops: it writes nowhere
                raise ServiceNotAvailable("this member is no longer master: delivery stops")
            self._outbox.append((topic, payload))
            return 0
        config = self.store.topics.get(topic)
        if config is None:
            log.warning("dropping a scheduled message for topic %r, which no longer exists", topic)
            return 0
        queue_id %= config.write_queue_nums
        put = self.store.put_batch(
            topic, queue_id, payload, 1, zlib.crc32(payload), msg.born_timestamp_ms
        )
        self.on_put(topic, queue_id)
        return put.end_offset
