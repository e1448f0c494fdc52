"""Versioned metadata tables (topics, consumer offsets), persisted crash-safely.

Changes step the table's ``DataVersion`` (RocketMQ: a state version plus a counter and a
timestamp, compared in that order); peers compare versions to decide who is newer (a
returning master's pre-online, seed 004: ``broker/pre_online.py``). Consumer offsets and
delay progress change with every commit, so their version steps only every
``consumer_offset_update_version_step`` / ``delay_offset_update_version_step`` changes (as
RocketMQ 5 does), and their state version is 0 on every member (RocketMQ's state machine
version in master-slave mode) so two members' versions compare by counter. Files are JSON
written through write-then-rename.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hamq.errors import InvalidArgument
from hamq.store.disk import OS_DISK, Disk, atomic_write

log = logging.getLogger(__name__)

PERM_READ = 4  # RocketMQ PermName.PERM_READ
PERM_WRITE = 2  # RocketMQ PermName.PERM_WRITE
PERM_READ_WRITE = PERM_READ | PERM_WRITE
_RESETS = "reset_generations"  # the offsets file's section of reset generations


@dataclass(frozen=True, order=True)
class DataVersion:
    state_version: int = 0
    counter: int = 0
    timestamp_ms: int = 0

    def next(self, now_ms: int) -> DataVersion:
        return DataVersion(self.state_version, self.counter + 1, now_ms)

    @classmethod
    def from_wire(cls, raw: object) -> DataVersion:
        """A version another member sent (a response's ``data_version``); a member that
        sends none predates versions and counts as the oldest. ``InvalidArgument`` if it
        is not a version."""
        if raw is None:
            return cls()
        if (
            not isinstance(raw, dict)
            or set(raw) != set(cls.__dataclass_fields__)
            or any(type(value) is not int for value in raw.values())
        ):
            raise InvalidArgument(
                "data_version must map state_version, counter and timestamp_ms to "
                f"integers, not {raw!r:.200}"
            )
        return cls(**raw)


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
    """A dict persisted as ``{"data_version": ..., "table": {...}}`` (plus any ``sections``:
    further dicts that must reach the disk together with the table). Snapshots are taken on
    the event loop and may be written from worker threads: the file never goes back from a
    newer snapshot to an older one (a topic delete persisted on the loop must not be undone
    by a periodic write that started before it), and a failed write leaves the table due
    for the next persist."""

    def __init__(
        self,
        path: Path,
        now_ms: int,
        *,
        disk: Disk = OS_DISK,
        version_step: int = 1,
        state_version: int | None = None,
        sections: tuple[str, ...] = (),
    ) -> None:
        """``version_step``: changes per DataVersion step; ``state_version``: fixed for a
        table compared with other members' (None: the creation time, for one that is not).
        Such a table starts at (state_version, 0, 0): one never changed is older than any
        other member's (a master that lost its file must not look newest)."""
        self.path = path
        self.disk = disk
        self.table: dict[str, Any] = {}
        self.sections: dict[str, dict[str, Any]] = {name: {} for name in sections}
        self.data_version = (
            DataVersion(now_ms, 0, now_ms)
            if state_version is None
            else DataVersion(state_version, 0, 0)
        )
        self.version_step = version_step
        self._changes = 0  # since the start (RocketMQ's versionChangeCounter, not persisted)
        self.dirty = False
        self._taken = 0  # snapshots taken
        self._written = 0  # number of the newest snapshot on disk
        self._write_lock = threading.Lock()
        if disk.exists(path):
            try:
                raw = json.loads(disk.read_bytes(path))
                self.table = raw["table"]
                self.sections.update((name, raw.get(name, {})) for name in sections)
                self.data_version = DataVersion(**raw["data_version"])
                if state_version is not None:
                    self.data_version = replace(self.data_version, state_version=state_version)
            except (ValueError, KeyError, TypeError) as exc:
                # Written by rename, so a broken file means outside damage: keep a copy.
                broken = path.with_suffix(".corrupt")
                disk.replace(path, broken)
                log.error("metadata %s unreadable (%s); moved to %s", path, exc, broken)

    def touch(self, now_ms: int) -> None:
        """A change made here: due to be persisted, and counted toward the next step."""
        self._changes += 1
        if self._changes % self.version_step == 0:
            self.data_version = self.data_version.next(now_ms)
        self.dirty = True

    def adopt(self, version: DataVersion) -> None:
        """Another member's table was merged in: this one is now at least as new as it."""
        if version > self.data_version:
            self.data_version = version
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
        payload = {"data_version": asdict(self.data_version), "table": self.table, **self.sections}
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


class ProgressTable:
    """A table of progress that members compare by DataVersion (consumer offsets, delay
    progress): its version steps every ``version_step`` changes (settable: the broker's
    config names the step) and its state version is 0 (module docstring)."""

    def __init__(
        self, path: Path, now_ms: int, *, disk: Disk = OS_DISK, sections: tuple[str, ...] = ()
    ) -> None:
        self._t = VersionedTable(path, now_ms, disk=disk, state_version=0, sections=sections)

    @property
    def data_version(self) -> DataVersion:
        return self._t.data_version

    @property
    def version_step(self) -> int:
        return self._t.version_step

    @version_step.setter
    def version_step(self, changes: int) -> None:
        self._t.version_step = changes

    def table(self) -> dict[str, Any]:
        return self._t.table

    def persist(self) -> None:
        self._t.persist()

    def snapshot(self) -> TableSnapshot | None:
        return self._t.snapshot()

    def write(self, snapshot: TableSnapshot) -> None:
        self._t.write(snapshot)


def reset_generations_from_wire(raw: object) -> dict[str, int]:
    """The reset generations another member sent with its offsets (none from a member that
    predates them); ``InvalidArgument`` if they are not ``topic@group`` -> integer."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or any(
        not isinstance(key, str) or type(generation) is not int for key, generation in raw.items()
    ):
        raise InvalidArgument(
            f"reset_generations must map topic@group to integers, not {raw!r:.200}"
        )
    return raw


class ConsumerOffsetManager(ProgressTable):
    """Committed offsets by ``topic@group`` then queue id; persisted periodically and at
    shutdown (RocketMQ: flushConsumerOffsetInterval), as losing the last seconds of commits
    only means redelivery.

    Members merge each other's offsets never moving one back (``merge``), so a move back
    here (an operator's reset, or a commit below the last one: a push consumer commits the
    reset offset again after the notice, as a commit of its old position may have landed
    after the reset) steps a generation per ``topic@group`` kept in the same file: a member
    takes smaller offsets only with a newer generation, so the move reaches the slaves (and
    survives a failover) while a stale copy still cannot rewind a live group."""

    def __init__(self, directory: Path, now_ms: int, *, disk: Disk = OS_DISK) -> None:
        super().__init__(
            directory / "consumer_offsets.json", now_ms, disk=disk, sections=(_RESETS,)
        )
        try:
            self._resets = reset_generations_from_wire(self._t.sections[_RESETS])
        except InvalidArgument as err:  # written by rename: outside damage; offsets merge by max
            log.error("%s: %s; reset generations dropped", self._t.path, err.message)
            self._resets = self._t.sections[_RESETS] = {}
        # called when a commit moves an offset back (a reset) or starts a group on a
        # queue: what consumers still need may have grown (a mirrored group's need offset)
        self.on_start_or_rewind: list[Callable[[], None]] = []

    def commit(self, group: str, topic: str, queue_id: int, offset: int, now_ms: int) -> None:
        queues = self._t.table.setdefault(f"{topic}@{group}", {})
        before = queues.get(str(queue_id))
        queues[str(queue_id)] = offset
        self._t.touch(now_ms)
        if before is not None and offset < before:
            self._step_generation(f"{topic}@{group}", now_ms)
        if before is None or offset < before:
            for hook in self.on_start_or_rewind:
                hook()

    def reset(self, group: str, topic: str, offsets: dict[int, int], now_ms: int) -> None:
        """An operator's move of the group's offsets (back or on), under a new generation."""
        for queue_id, offset in offsets.items():
            self.commit(group, topic, queue_id, offset, now_ms)
        self._step_generation(f"{topic}@{group}", now_ms)

    def _step_generation(self, key: str, now_ms: int) -> None:
        """After the last one, and a clock time when that is later (a member that became
        master after a reset elsewhere continues from the generation it took)."""
        self._resets[key] = max(self._resets.get(key, 0) + 1, now_ms)

    def reset_generations(self) -> dict[str, int]:
        """``topic@group`` -> the generation of its last move back (none if never)."""
        return self._resets

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._t.table.get(f"{topic}@{group}", {}).get(str(queue_id))

    def clamp(self, max_offset: Callable[[str, int], int], now_ms: int) -> None:
        """Move every offset past its queue's ``max_offset(topic, queue_id)`` back to it."""
        changed = False
        for key, queues in self._t.table.items():
            changed |= clamp_offsets(queues, functools.partial(max_offset, key.split("@", 1)[0]))
        if changed:
            self._t.touch(now_ms)

    def merge(
        self,
        table: dict[str, dict[str, int]],
        version: DataVersion,
        reset_generations: dict[str, int] | None = None,
    ) -> None:
        """Take offsets from another member whose table is at ``version``: a group's
        offsets under a newer reset generation than ours whole (a move back there), any
        other never moving one backwards (a consumer may have committed here while the
        other was away; and one with an older generation, a master that restarted from a
        file written before its last reset, is still followed on). This table is then at
        least as new as that one. Not counted as a change of this member's own."""
        theirs_reset = reset_generations or {}
        for key, queues in table.items():
            generation, ours = theirs_reset.get(key, 0), self._resets.get(key, 0)
            if generation > ours:
                self._resets[key] = generation
                self._t.dirty = True
            mine = self._t.table.setdefault(key, {})
            for queue_id, offset in queues.items():
                before = mine.get(queue_id, -1)
                if offset > before or (generation > ours and offset != before):
                    mine[queue_id] = offset
                    self._t.dirty = True
        self._t.adopt(version)

    def delete_topic(self, topic: str, now_ms: int) -> None:
        for key in [k for k in self._t.table if k.split("@", 1)[0] == topic]:
            del self._t.table[key]
            self._resets.pop(key, None)
        self._t.touch(now_ms)
