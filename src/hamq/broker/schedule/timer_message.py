"""Timer messages (RocketMQ 5's ``TimerMessageStore``): messages with a deliver time, up to
three days ahead, kept in one queue of the schedule topic and indexed as they are stored in
a timer wheel over a timer log on disk (``timer_wheel``, ``timer_log``). A read cursor
walks the wheel a second at a time: when a second comes, its slot is opened and its timers
are read in windows, sorted by due time and delivered as they fall due.

Memory is the wheel's slot array plus one window, whatever the number of pending timers;
progress is the cursor (``TimerProgress``), a fixed size. The cursor moves only once the
delivered copies are durable (``when_durable``), and the timer log is fsynced before a
progress counting on it is written (``fsync_log``), so a restart after ``kill -9`` or a
power loss delivers every timer at least once, a clean restart once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from hamq.broker.schedule.timer_log import TimerLog, TimerRecord
from hamq.broker.schedule.timer_wheel import SLOT_MS, TimerWheel
from hamq.broker.stored_message import StoredMessage, read_message, read_messages
from hamq.errors import HamqError
from hamq.protocol.properties import PROPERTY_TIMER_DELIVER_MS
from hamq.store.delay_offset import DelayOffsetManager, TimerProgress
from hamq.store.message_store import MessageStore, PutResult

log = logging.getLogger(__name__)

# Messages delivered per wake-up before yielding to the event loop (serving requests).
DELIVER_BATCH = 256
# After a failed delivery (disk full), try again this much later.
DELIVER_RETRY_MS = 1000
# Timer-queue messages read per store lookup when indexing a backlog.
SCAN_BATCH = 1024
# Empty wheel slots the read cursor passes per wake-up when catching up.
ADVANCE_STEPS = 4096
# A rebuilt index (lost, or a promoted slave's) indexes again the timers delivered in the
# last minute before the read cursor: at least once, never lost.
REBUILD_MARGIN_MS = 60_000
TIMER_LOG_DIR = "timerlog"


class TimerMessageService:
    def __init__(
        self,
        store: MessageStore,
        topic: str,
        queue_id: int,
        progress: DelayOffsetManager,
        deliver: Callable[[StoredMessage], int],
        after_put: Callable[[], None],
        when_durable: Callable[[int, Callable[[], None]], None],
    ) -> None:
        self.store = store
        self.topic = topic  # where timer messages wait: (topic, queue_id)
        self.queue_id = queue_id
        self.progress = progress
        self.deliver = deliver  # stores a message in its real queue: its log end
        self.after_put = after_put
        self.when_durable = when_durable
        self._handle: asyncio.TimerHandle | None = None
        self._wake_ms = 0  # when the armed wake-up runs
        self._running = False
        self._wheel: TimerWheel | None = None
        self._enqueue_offset = 0  # next timer-queue offset to index
        self._read_ms = 0  # slot the cursor is at
        self._slot_pos = -1  # the open slot's window starts here (-1: none open)
        self._slot_done = 0  # window timers durably delivered
        self._window: list[TimerRecord] = []
        self._window_next = -1  # where the open slot's walk goes on (-1: its end)
        self._window_written = 0  # window timers written (delivery goes on from here)
        self._logged: set[int] = set()  # indexed past the saved progress (restart only)
        self._rebuilt_below = 0  # a rebuilt index skips delivered timers below this
        self._rebuilt_before_ms = 0  # ...due before this

    def start(self) -> None:
        """Master only: open the index and start delivering. A member that was master
        before rebuilds it from the progress, which its successor may have moved."""
        self.close()
        self._window, self._window_next, self._window_written = [], -1, 0
        self._rebuilt_below = self._rebuilt_before_ms = 0
        self._running = True
        self._open_index()
        self._wake(0)

    def stop(self) -> None:
        """Stop delivering; durable callbacks still move the cursor (then save it)."""
        self._running = False
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def close(self) -> None:
        """Close the index; the progress is left as last saved (a slave's comes from its
        master)."""
        if self._wheel is not None:
            self._wheel.log.close()
            self._wheel = None

    def put(self, due_ms: int, result: PutResult) -> None:
        """A timer message was stored: index it now if the index is caught up, else let
        delivery index it from the queue."""
        if self._running and not (
            result.base_queue_offset == self._enqueue_offset
            and self._index(due_ms, result.base_queue_offset, result.physical_offset)
        ):
            if self._handle is None or self._wake_ms > self.store.clock_ms():
                self._wake(0)  # not one wake-up per send while a backlog waits

    def save_progress(self) -> None:
        """Put the cursor into the progress table (before a snapshot of it)."""
        if self._wheel is not None:
            self.progress.set_timer(
                TimerProgress(
                    self._enqueue_offset,
                    self._read_ms,
                    self._slot_pos,
                    self._slot_done,
                    self._wheel.log.log_id,
                ),
                self.store.clock_ms(),
            )

    def fsync_log(self) -> None:
        """Make the timer log durable (before a progress counting on it is written; safe
        from a worker thread)."""
        wheel = self._wheel  # read once: a role change may close it meanwhile
        if wheel is not None:
            wheel.log.fsync()

    def delete_delivered(self, read_ms: int) -> None:
        """Delete timer-log segments a written progress (cursor at ``read_ms``) is past."""
        if self._wheel is not None:
            self._wheel.log.delete_due_before(read_ms)

    def _wake(self, due_ms: int) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._wake_ms = due_ms
        delay_s = max(0, due_ms - self.store.clock_ms()) / 1000
        self._handle = asyncio.get_running_loop().call_later(delay_s, self._deliver_timers)

    def _open_index(self) -> None:
        """Recover the timer log and rebuild the wheel from it: records due before the
        saved cursor are delivered and skipped. A log that is not the one the progress
        names (lost, or this broker was a slave) is started afresh and indexed again from
        the timer queue."""
        saved = self.progress.timer
        directory = self.store.root / TIMER_LOG_DIR
        timer_log = TimerLog(directory, disk=self.store.disk)
        if timer_log.log_id != saved.log_id:
            if saved.log_id:
                log.warning(
                    "timer log %s is not the one the progress names: indexing the "
                    "timer queue again",
                    timer_log.log_id,
                )
            timer_log.close()
            self.store.disk.rmtree(directory)
            timer_log = TimerLog(directory, disk=self.store.disk)
            self._enqueue_offset = 0  # from the queue's first message
            self._rebuilt_below = saved.queue_offset
            self._rebuilt_before_ms = saved.read_ms - REBUILD_MARGIN_MS
            saved = TimerProgress(saved.queue_offset, saved.read_ms)  # positions were another log's
        else:
            self._enqueue_offset = saved.queue_offset
        self._wheel = wheel = TimerWheel(timer_log)
        self._read_ms, self._slot_pos, self._slot_done = (
            saved.read_ms,
            saved.slot_pos,
            saved.slot_done,
        )
        if not self._read_ms:  # the first start: the cursor starts now
            self._read_ms = self.store.clock_ms() // SLOT_MS * SLOT_MS
        after: list[TimerRecord] = []  # indexed after the saved progress
        last = -1  # the last timer-queue offset indexed

        def visit(record: TimerRecord) -> None:
            nonlocal last
            last = max(last, record.queue_offset)
            if record.queue_offset >= saved.queue_offset:
                after.append(record)
            if record.due_ms >= saved.read_ms:
                wheel.link(record)

        timer_log.recover(visit)
        if timer_log.cut and last + 1 < self._enqueue_offset:
            # damage cut records the saved progress counts as indexed: index them again
            self._enqueue_offset = last + 1
        self._logged = {record.queue_offset for record in after if self._message_of(record)}
        if self._slot_pos >= 0:
            self._load_window()

    def _index(self, due_ms: int, queue_offset: int, physical_offset: int) -> bool:
        """Add a stored timer message to the wheel; False if it must wait (the cursor is a
        whole turn behind, or the timer log cannot be written). A timer due in a slot the
        cursor has opened or passed goes to the next slot: delivered within a second."""
        slot_floor = self._read_ms + (SLOT_MS if self._slot_pos >= 0 else 0)
        due_ms = max(due_ms, slot_floor)
        if not self._wheel.fits(due_ms, self._read_ms):
            return False
        try:
            self._wheel.add(due_ms, queue_offset, physical_offset)
        except OSError as exc:
            log.error("writing the timer log failed (retried from the queue): %s", exc)
            return False
        self._enqueue_offset = queue_offset + 1
        return True

    def _index_backlog(self) -> bool:
        """Index timer-queue messages not indexed yet (after a restart, a failed append, or
        while the cursor is a turn behind); True if more wait."""
        if self._enqueue_offset >= self.store.max_offset(self.topic, self.queue_id):
            self._logged.clear()
            return False
        batch = read_messages(
            self.store, self.topic, self.queue_id, self._enqueue_offset, SCAN_BATCH
        )
        for msg in batch:
            due = int(msg.properties[PROPERTY_TIMER_DELIVER_MS])
            if msg.queue_offset in self._logged or (
                msg.queue_offset < self._rebuilt_below
                and max(due, msg.store_timestamp_ms) < self._rebuilt_before_ms
            ):
                self._enqueue_offset = msg.queue_offset + 1  # indexed, or delivered
                continue
            if not self._index(due, msg.queue_offset, msg.physical_offset):
                return False
        return len(batch) == SCAN_BATCH

    def _deliver_timers(self) -> None:
        self._handle = None
        now = self.store.clock_ms()
        retry = False
        try:
            # a backlog is indexed first, so that its timers are delivered in due order
            more = self._index_backlog() or self._advance(now)
            more = self._deliver_due(now) or more
        except HamqError as err:  # disk full: the window is not moved, so tried again
            log.error("delivering timer messages failed: %s", err.message)
            retry = True
        if not self._running:
            return
        if retry:
            self._wake(now + DELIVER_RETRY_MS)
        elif more:
            self._wake(now)
        elif self._window_written < len(self._window):
            self._wake(self._window[self._window_written].due_ms)
        elif self._slot_pos < 0:
            self._wake(self._read_ms)
        # else: the window waits to be durable, and that wakes delivery again

    def _advance(self, now: int) -> bool:
        """Move the cursor: open the slot it is at once that second has come, load the
        open slot's next window once the last is durably delivered, pass a slot once its
        chain is. True if more steps are left for the next wake-up."""
        wheel = self._wheel
        for _ in range(ADVANCE_STEPS):
            if self._slot_pos < 0:  # no slot open
                if self._read_ms > now:
                    return False
                tail = wheel.tail(self._read_ms)
                if tail < 0:
                    self._read_ms += SLOT_MS
                    continue
                self._slot_pos, self._slot_done = tail, 0
            elif self._slot_done < len(self._window):
                return False  # still delivering this window
            elif self._window_next >= 0:
                self._slot_pos, self._slot_done = self._window_next, 0
            else:  # the slot is delivered
                wheel.clear(self._read_ms)
                self._read_ms += SLOT_MS
                self._slot_pos, self._slot_done = -1, 0
                self._window = []
                continue
            self._load_window()
        return True

    def _load_window(self) -> None:
        self._window, self._window_next = self._wheel.window(self._read_ms, self._slot_pos)
        self._window_written = self._slot_done  # after a restart: those were delivered

    def _deliver_due(self, now: int) -> bool:
        """Deliver the open window's due timers (a batch); True if more are due."""
        window = self._window
        first = written = self._window_written
        end = 0
        while (
            written < len(window)
            and window[written].due_ms <= now
            and written - first < DELIVER_BATCH
        ):
            msg = self._message_of(window[written])
            if msg is not None:
                end = max(end, self.deliver(msg))
            written += 1
        if written == first:
            return False
        self.after_put()  # the window moves on only once the write succeeded
        self._window_written = written
        self.when_durable(end, lambda: self._window_durable(window, written))
        return written < len(window) and window[written].due_ms <= now

    def _message_of(self, record: TimerRecord) -> StoredMessage | None:
        """The timer message ``record`` indexes; None if retention removed it, or if the
        record outlived it (a power loss cut the commit log under the record, and another
        message now has its offset: that one has a record of its own)."""
        msg = read_message(self.store, self.topic, self.queue_id, record.queue_offset)
        if (
            msg is None
            or msg.physical_offset != record.physical_offset
            or int(msg.properties[PROPERTY_TIMER_DELIVER_MS]) > record.due_ms
        ):
            return None
        return msg

    def _window_durable(self, window: list[TimerRecord], written: int) -> None:
        if window is self._window and written > self._slot_done:
            self._slot_done = written
            if written == len(window) and self._running:
                self._wake(0)  # the next window or slot
