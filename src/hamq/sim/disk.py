"""A simulated disk: writes stay pending until `sync()`, and a crash keeps only a prefix
of the pending ones (a torn write), the way a real disk loses unsynced data."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from hamq.raft.log import Checkpoint, Entry, HardState
from hamq.raft.storage import LogStorage, MemoryStorage


class SimDisk(LogStorage):
    def __init__(self) -> None:
        self.durable = MemoryStorage()
        self._pending: list[Callable[[MemoryStorage], None]] = []

    def append(self, entries: Sequence[Entry]) -> None:
        batch = list(entries)
        self._pending.append(lambda store: store.append(batch))

    def truncate_suffix(self, from_index: int) -> None:
        self._pending.append(lambda store: store.truncate_suffix(from_index))

    def save_hard_state(self, hard_state: HardState) -> None:
        self._pending.append(lambda store: store.save_hard_state(hard_state))

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        self._pending.append(lambda store: store.save_checkpoint(checkpoint))

    def sync(self) -> None:
        self._apply(len(self._pending))

    def crash(self, rng: random.Random) -> int:
        """Lose the unsynced writes except a random prefix; returns how many survived."""
        kept = rng.randrange(len(self._pending) + 1)
        self._apply(kept)
        self._pending.clear()
        return kept

    def _apply(self, count: int) -> None:
        for op in self._pending[:count]:
            op(self.durable)
        del self._pending[:count]

    # reads see only durable state: the core reads storage when (re)starting, and entries
    # it released after they were persisted (the driver syncs before advancing)
    def entry(self, index: int) -> Entry:
        assert not self._pending, "reads happen only at restart, after a crash or sync"
        return self.durable.entry(index)

    def entries_from(self, index: int) -> list[Entry]:
        assert not self._pending
        return self.durable.entries_from(index)

    def last_index(self) -> int:
        assert not self._pending
        return self.durable.last_index()

    def load_hard_state(self) -> HardState:
        return self.durable.load_hard_state()

    def load_checkpoint(self) -> Checkpoint:
        return self.durable.load_checkpoint()
