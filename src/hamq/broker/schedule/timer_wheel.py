"""The timer wheel (RocketMQ 5's ``TimerWheel``): one slot per second of due time, each
holding only the timer-log position of the slot's newest timer; the slot's timers are the
chain of records behind it in the timer log. Memory is the slot array — ``WHEEL_SLOTS`` × 8
bytes, 2.8 MB — plus one window of a slot being delivered, whatever the number of pending
timers.

A slot is reused every ``WHEEL_SLOTS`` seconds; the schedule service never adds a timer a
whole turn or more ahead of the read cursor (``fits``), so a chain holds one second's
timers only, and a walk stops at a record of another second (left by an earlier turn).
"""

from __future__ import annotations

from array import array

from hamq.broker.schedule.timer_log import TimerLog, TimerRecord

SLOT_MS = 1000  # RocketMQ timerPrecisionMs
# Four days of slots: more than timerMaxDelaySec (3 days) ahead of a cursor that is on
# time, with a day to spare for a cursor catching up after the broker was down.
WHEEL_SLOTS = 4 * 24 * 3600
WINDOW = 4096  # timers of one slot read, sorted and delivered at a time


class TimerWheel:
    def __init__(self, log: TimerLog, slots: int = WHEEL_SLOTS) -> None:
        self.log = log
        self.slots = slots
        self._tails = array("q", [-1]) * slots

    def _slot(self, slot_ms: int) -> int:
        return (slot_ms // SLOT_MS) % self.slots

    def fits(self, due_ms: int, read_ms: int) -> bool:
        """Whether a timer due at ``due_ms`` may enter the wheel while the read cursor is at
        ``read_ms``: its slot must not be one the cursor has yet to pass for an earlier
        second."""
        return due_ms // SLOT_MS - read_ms // SLOT_MS < self.slots

    def add(self, due_ms: int, queue_offset: int, physical_offset: int) -> int:
        """Append a timer to the log and make it its slot's newest; returns its position.
        ``OSError`` (disk full) leaves the wheel as it was."""
        slot = self._slot(due_ms)
        pos = self.log.append(self._tails[slot], due_ms, queue_offset, physical_offset)
        self._tails[slot] = pos
        return pos

    def link(self, record: TimerRecord) -> None:
        """Recovery: ``record`` (read in log order) is its slot's newest so far."""
        self._tails[self._slot(record.due_ms)] = record.pos

    def tail(self, slot_ms: int) -> int:
        """Position of the newest timer of the slot starting at ``slot_ms`` (-1: empty)."""
        return self._tails[self._slot(slot_ms)]

    def clear(self, slot_ms: int) -> None:
        """The slot at ``slot_ms`` is delivered; its next turn starts a new chain."""
        self._tails[self._slot(slot_ms)] = -1

    def window(
        self, slot_ms: int, from_pos: int, limit: int = WINDOW
    ) -> tuple[list[TimerRecord], int]:
        """Up to ``limit`` timers of the slot starting at ``slot_ms``, walking its chain
        back from ``from_pos``, sorted by (due, queue offset); and the position the walk
        goes on from (-1: the chain ended)."""
        second = slot_ms // SLOT_MS
        found: list[TimerRecord] = []
        pos = from_pos
        while pos >= 0 and len(found) < limit:
            record = self.log.read(pos)
            if record is None or record.due_ms // SLOT_MS != second:
                pos = -1  # cut, deleted, or an earlier turn's record: the chain ends
                break
            found.append(record)
            pos = record.prev_pos if record.prev_pos < pos else -1
        found.sort(key=lambda r: (r.due_ms, r.queue_offset))
        return found, pos
