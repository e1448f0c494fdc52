"""Versioned metadata tables (topics, consumer offsets), persisted crash-safely.

Every change steps the table's ``DataVersion`` (RocketMQ: a state version fixed at start
plus a counter and a timestamp); peers compare versions to decide who is newer (pre-online
sync in seed 004). Files are JSON written through write-then-rename.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hamq.store.disk import OS_DISK, Disk, atomic_write

log = logging.getLogger(__name__)

PERM_READ = 4  # RocketMQ PermName.PERM_READ
PERM_WRITE = 2  # RocketMQ PermName.PERM_WRITE
PERM_READ_WRITE = PERM_READ | PERM_WRITE


@dataclass(frozen=True, order=True)
class DataVersion:
    state_version: int = 0
    counter: int = 0
    timestamp_ms: int = 0

    def next(self, now_ms: int) -> DataVersion:
        return DataVersion(self.state_version, self.counter + 1, now_ms)


@dataclass(frozen=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ_WRITE


class TableSnapshot(bytes):
    """An encoded table, numbered in the order the snapshots were taken."""

    number: int


class VersionedTable:
    """A dict persisted as ``{"data_version": ..., "table": {...}}``. Snapshots are taken on
    the event loop and may be written from worker threads: the file never goes back from a
    newer snapshot to an older one (a topic delete persisted on the loop must not be undone
    by a periodic write that started before it), and a failed write leaves the table due
    for the next persist."""

    def __init__(self, path: Path, now_ms: int, *, disk: Disk = OS_DISK) -> None:
        self.path = path
        self.disk = disk
        self.table: dict[str, Any] = {}
        self.data_version = DataVersion(now_ms, 0, now_ms)
        self.dirty = False
        self._taken = 0  # snapshots taken
        self._written = 0  # number of the newest snapshot on disk
        self._write_lock = threading.Lock()
        if disk.exists(path):
            try:
                raw = json.loads(disk.read_bytes(path))
                self.table = raw["table"]
                self.data_version = DataVersion(**raw["data_version"])
            except (ValueError, KeyError, TypeError) as exc:
                # Written by rename, so a broken file means outside damage: keep a copy.
                broken = path.with_suffix(".corrupt")
                disk.replace(path, broken)
                log.error("metadata %s unreadable (%s); moved to %s", path, exc, broken)

    def touch(self, now_ms: int) -> None:
        self.data_version = self.data_version.next(now_ms)
        self.dirty = True

    def persist(self) -> None:
        snapshot = self.snapshot()
        if snapshot is not None:
            self.write(snapshot)

    def snapshot(self) -> TableSnapshot | None:
        """The encoded table if it changed (taken on the event loop; ``write`` may then run
        in a worker thread)."""
        if not self.dirty:
            return None
        self.dirty = False
        payload = {"data_version": asdict(self.data_version), "table": self.table}
        snapshot = TableSnapshot(json.dumps(payload, sort_keys=True).encode())
        self._taken += 1
        snapshot.number = self._taken
        return snapshot

    def write(self, snapshot: TableSnapshot) -> None:
        """Make ``snapshot`` durable; a no-op when a newer one already is."""
        with self._write_lock:
            if snapshot.number <= self._written:
                return
            try:
                atomic_write(self.disk, self.path, snapshot)
            except OSError:
                self.dirty = True  # the next persist writes the table again
                raise
            self._written = snapshot.number


class TopicConfigManager:
    def __init__(self, directory: Path, now_ms: int, *, disk: Disk = OS_DISK) -> None:
        self._t = VersionedTable(directory / "topics.json", now_ms, disk=disk)
        self.topics: dict[str, TopicConfig] = {
            name: TopicConfig(**cfg) for name, cfg in self._t.table.items()
        }

    @property
    def data_version(self) -> DataVersion:
        return self._t.data_version

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def put(self, config: TopicConfig, now_ms: int) -> None:
        self.topics[config.topic_name] = config
        self._t.table[config.topic_name] = asdict(config)
        self._t.touch(now_ms)
        self._t.persist()

    def delete(self, topic: str, now_ms: int) -> bool:
        if self.topics.pop(topic, None) is None:
            return False
        del self._t.table[topic]
        self._t.touch(now_ms)
        self._t.persist()
        return True


def clamp_offsets(offsets: dict[str, int], end_of: Callable[[int], int]) -> bool:
    """Move each offset (keyed by queue id or delay level) past ``end_of(key)`` back to
    it; True if one moved."""
    moved = False
    for key, offset in offsets.items():
        end = end_of(int(key))
        if offset > end:
            offsets[key] = end
            moved = True
    return moved


class ConsumerOffsetManager:
    """Committed offsets by ``topic@group`` then queue id; persisted periodically and at
    shutdown (RocketMQ: flushConsumerOffsetInterval), as losing the last seconds of commits
    only means redelivery."""

    def __init__(self, directory: Path, now_ms: int, *, disk: Disk = OS_DISK) -> None:
        self._t = VersionedTable(directory / "consumer_offsets.json", now_ms, disk=disk)

    @property
    def data_version(self) -> DataVersion:
        return self._t.data_version

    def commit(self, group: str, topic: str, queue_id: int, offset: int, now_ms: int) -> None:
        self._t.table.setdefault(f"{topic}@{group}", {})[str(queue_id)] = offset
        self._t.touch(now_ms)

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._t.table.get(f"{topic}@{group}", {}).get(str(queue_id))

    def table(self) -> dict[str, dict[str, int]]:
        return self._t.table

    def clamp(self, max_offset: Callable[[str, int], int], now_ms: int) -> None:
        """Move every offset past its queue's ``max_offset(topic, queue_id)`` back to it."""
        changed = False
        for key, queues in self._t.table.items():
            changed |= clamp_offsets(queues, functools.partial(max_offset, key.split("@", 1)[0]))
        if changed:
            self._t.touch(now_ms)

    def merge(self, table: dict[str, dict[str, int]], now_ms: int) -> None:
        """Take offsets from another replica, never moving one backwards (a consumer may
        have committed on this replica while the other was away)."""
        changed = False
        for key, queues in table.items():
            mine = self._t.table.setdefault(key, {})
            for queue_id, offset in queues.items():
                if offset > mine.get(queue_id, -1):
                    mine[queue_id] = offset
                    changed = True
        if changed:
            self._t.touch(now_ms)

    def delete_topic(self, topic: str, now_ms: int) -> None:
        for key in [k for k in self._t.table if k.split("@", 1)[0] == topic]:
            del self._t.table[key]
        self._t.touch(now_ms)

    def persist(self) -> None:
        self._t.persist()

    def snapshot(self) -> TableSnapshot | None:
        return self._t.snapshot()

    def write(self, snapshot: TableSnapshot) -> None:
        self._t.write(snapshot)
