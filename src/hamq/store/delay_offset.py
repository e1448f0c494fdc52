"""Delivery progress of scheduled messages (RocketMQ's ``delayOffset.json`` plus timer
progress), a versioned table so a restart resumes where delivery stopped and a slave can
take its master's progress.

Delay levels are FIFO, so one offset per level says what was delivered. Timer messages are
delivered by due time through the timer wheel (``hamq.broker.schedule.timer_wheel``), so their
progress is a read cursor over due time, as RocketMQ's ``TimerCheckpoint`` keeps
(``lastReadTimeMs``, ``lastTimerQueueOffset``): its size does not depend on how many timers
wait.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from hamq.store.disk import OS_DISK, Disk
from hamq.store.metadata import DataVersion, ProgressTable, clamp_offsets

_DELAY = "delay_offsets"
_TIMER = "timer"


@dataclass(frozen=True)
class TimerProgress:
    """Where timer delivery stands. Every timer due before ``read_ms`` is delivered. When
    the slot at ``read_ms`` is open, its window starts at timer-log position ``slot_pos``
    and its first ``slot_done`` timers (in due order) are delivered; ``slot_pos`` is -1
    while no slot is open. ``queue_offset``: timer-queue messages below it are in the timer
    log ``log_id`` (positions mean nothing in another log)."""

    queue_offset: int = 0
    read_ms: int = 0
    slot_pos: int = -1
    slot_done: int = 0
    log_id: str = ""


class DelayOffsetManager(ProgressTable):
    def __init__(self, directory: Path, now_ms: int, *, disk: Disk = OS_DISK) -> None:
        super().__init__(directory / "delay_offsets.json", now_ms, disk=disk)
        self._t.table.setdefault(_DELAY, {})
        self._t.table.setdefault(_TIMER, asdict(TimerProgress()))

    def delay_offset(self, level: int) -> int:
        return self._t.table[_DELAY].get(str(level), 0)

    def set_delay_offset(self, level: int, offset: int, now_ms: int) -> None:
        self._t.table[_DELAY][str(level)] = offset
        self._t.touch(now_ms)

    def clamp_delay(self, max_offset: Callable[[int], int], now_ms: int) -> None:
        """Move every level's offset past ``max_offset(level)`` back to it."""
        if clamp_offsets(self._t.table[_DELAY], max_offset):
            self._t.touch(now_ms)

    @property
    def timer(self) -> TimerProgress:
        return TimerProgress(**self._t.table[_TIMER])

    def set_timer(self, progress: TimerProgress, now_ms: int) -> None:
        if progress != self.timer:
            self._t.table[_TIMER] = asdict(progress)
            self._t.touch(now_ms)

    def merge(self, table: dict, version: DataVersion) -> None:
        """Take another member's progress (its table at ``version``), never moving an
        offset or the timer cursor backwards: this table is then at least as new as that
        one. Not counted as a change of this member's own."""
        before = (dict(self._t.table[_DELAY]), self._t.table[_TIMER])
        mine = self._t.table[_DELAY]
        for level, offset in table.get(_DELAY, {}).items():
            if offset > mine.get(level, -1):
                mine[level] = offset
        theirs = table.get(_TIMER)
        if isinstance(theirs, dict) and theirs.get("read_ms", 0) >= self.timer.read_ms:
            self._t.table[_TIMER] = asdict(TimerProgress(**theirs))
        if (self._t.table[_DELAY], self._t.table[_TIMER]) != before:
            self._t.dirty = True
        self._t.adopt(version)
