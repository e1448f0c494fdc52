"""Delivery progress of scheduled messages (RocketMQ's ``delayOffset.json`` plus timer
progress), a versioned table so a restart resumes where delivery stopped and a slave can
take its master's progress.

Delay levels are FIFO, so one offset per level says what was delivered. Timer messages are
delivered by due time, out of queue order: ``timer_offset`` is the first undelivered queue
offset and ``timer_delivered`` the delivered offsets above it.
"""
from __future__ import annotations

from pathlib import Path

from hamq.store.disk import OS_DISK, Disk
from hamq.store.metadata import DataVersion, VersionedTable

_DELAY = "delay_offsets"
_TIMER_OFFSET = "timer_offset"
_TIMER_DELIVERED = "timer_delivered"


class DelayOffsetManager:
    def __init__(self, directory: Path, now_ms: int, *, disk: Disk = OS_DISK) -> None:
        self._t = VersionedTable(directory / "delay_offsets.json", now_ms, disk=disk)
        self._t.table.setdefault(_DELAY, {})
        self._t.table.setdefault(_TIMER_OFFSET, 0)
        self._delivered: set[int] = set(self._t.table.get(_TIMER_DELIVERED, []))

    @property
    def data_version(self) -> DataVersion:
        return self._t.data_version

    def delay_offset(self, level: int) -> int:
        return self._t.table[_DELAY].get(str(level), 0)

    def set_delay_offset(self, level: int, offset: int, now_ms: int) -> None:
        self._t.table[_DELAY][str(level)] = offset
        self._t.touch(now_ms)

    @property
    def timer_offset(self) -> int:
        return self._t.table[_TIMER_OFFSET]

    def timer_delivered(self, offset: int) -> bool:
        return offset < self.timer_offset or offset in self._delivered

    def mark_timer_delivered(self, offset: int, now_ms: int) -> None:
        self._delivered.add(offset)
        self._compact()
        self._t.touch(now_ms)

    def _compact(self) -> None:
        first = self.timer_offset
        while first in self._delivered:
            self._delivered.discard(first)
            first += 1
        self._t.table[_TIMER_OFFSET] = first

    def table(self) -> dict:
        return {**self._t.table, _TIMER_DELIVERED: sorted(self._delivered)}

    def merge(self, table: dict, now_ms: int) -> None:
        """Take another replica's progress, never moving an offset backwards."""
        before = (dict(self._t.table[_DELAY]), self.timer_offset, set(self._delivered))
        mine = self._t.table[_DELAY]
        for level, offset in table.get(_DELAY, {}).items():
            if offset > mine.get(level, -1):
                mine[level] = offset
        first = max(self.timer_offset, table.get(_TIMER_OFFSET, 0))
        self._t.table[_TIMER_OFFSET] = first
        self._delivered = {o for o in self._delivered | set(table.get(_TIMER_DELIVERED, []))
                           if o >= first}
        self._compact()
        if (self._t.table[_DELAY], self.timer_offset, self._delivered) != before:
            self._t.touch(now_ms)

    def snapshot(self) -> bytes | None:
        self._t.table[_TIMER_DELIVERED] = sorted(self._delivered)
        return self._t.snapshot()

    def write(self, snapshot: bytes) -> None:
        self._t.write(snapshot)

    def persist(self) -> None:
        snapshot = self.snapshot()
        if snapshot is not None:
            self.write(snapshot)
