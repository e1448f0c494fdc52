"""The log storage interface the Raft driver persists `Ready`s into, plus an in-memory one.

The core never writes storage: it reads the log's terms once to start, and from then on
tells its driver what to write (etcd's split of `Storage` and `Ready`). It reads back, with
`entry`, only entries it was told are persisted and whose data it no longer holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from hamq.raft.errors import LogIndexError
from hamq.raft.log import EMPTY_INDEX, NO_TERM, Checkpoint, Entry, HardState
from hamq.raft.ready import Ready


class LogStorage(ABC):
    """Entries are contiguous from index 0; writes become durable at `sync()`."""

    @abstractmethod
    def append(self, entries: Sequence[Entry]) -> None:
        """Write `entries`, first dropping any stored entries at or after the first one's index."""

    @abstractmethod
    def truncate_suffix(self, from_index: int) -> None:
        """Drop every entry whose index is >= `from_index`."""

    @abstractmethod
    def entry(self, index: int) -> Entry: ...

    @abstractmethod
    def last_index(self) -> int: ...

    @abstractmethod
    def save_hard_state(self, hard_state: HardState) -> None: ...

    @abstractmethod
    def load_hard_state(self) -> HardState: ...

    @abstractmethod
    def save_checkpoint(self, checkpoint: Checkpoint) -> None: ...

    @abstractmethod
    def load_checkpoint(self) -> Checkpoint: ...

    @abstractmethod
    def sync(self) -> None:
        """Make every write so far durable."""

    def term(self, index: int) -> int:
        return NO_TERM if index == EMPTY_INDEX else self.entry(index).term

    def entries_from(self, index: int) -> list[Entry]:
        return [self.entry(i) for i in range(index, self.last_index() + 1)]

    def _check_append(self, entries: Sequence[Entry]) -> None:
        """Shared input validation: contiguous, and no gap after the stored log."""
        if not entries:
            return
        first = entries[0].index
        if first < 0 or first > self.last_index() + 1:
            raise LogIndexError(f"append at {first} leaves a gap after {self.last_index()}")
        for offset, entry in enumerate(entries):
            if entry.index != first + offset:
                raise LogIndexError(f"entries not contiguous at {entry.index}")


class MemoryStorage(LogStorage):
    """A list-backed store: tests, and the simulator's durable half."""

    def __init__(self) -> None:
        self._entries: list[Entry] = []
        self._hard_state = HardState()
        self._checkpoint = Checkpoint()

    def append(self, entries: Sequence[Entry]) -> None:
        self._check_append(entries)
        if entries:
            del self._entries[entries[0].index :]
            self._entries.extend(entries)

    def truncate_suffix(self, from_index: int) -> None:
        if from_index < 0:
            raise LogIndexError(f"negative truncate index {from_index}")
        del self._entries[from_index:]

    def entry(self, index: int) -> Entry:
        if not 0 <= index < len(self._entries):
            raise LogIndexError(f"index {index} outside [0, {len(self._entries) - 1}]")
        return self._entries[index]

    def entries_from(self, index: int) -> list[Entry]:
        return self._entries[index:]

    def last_index(self) -> int:
        return len(self._entries) - 1

    def save_hard_state(self, hard_state: HardState) -> None:
        self._hard_state = hard_state

    def load_hard_state(self) -> HardState:
        return self._hard_state

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        self._checkpoint = checkpoint

    def load_checkpoint(self) -> Checkpoint:
        return self._checkpoint

    def sync(self) -> None:
        """Nothing to flush: memory is as durable as this store gets."""


def persist(
    storage: LogStorage, ready: Ready, *, checkpoint: bool = True, sync: bool = True
) -> None:
    """The first step of the Ready contract: save the hard state, append the entries (they
    replace the stored suffix), sync, then save the checkpoint — before any of the Ready's
    messages leave. A driver may skip the checkpoint (a recovery hint) or, when it accepts
    page-cache durability for entries, the sync of a Ready without a hard state. A
    checkpoint is never saved before the log it describes is synced: recovery trusts every
    record up to its committed index (see `FileStorage`)."""
    if ready.hard_state is not None:
        storage.save_hard_state(ready.hard_state)
    if ready.entries:
        storage.append(ready.entries)
    checkpoint_to_save = ready.checkpoint if checkpoint else None
    if sync or checkpoint_to_save is not None or ready.hard_state is not None:
        storage.sync()
    if checkpoint_to_save is not None:
        storage.save_checkpoint(checkpoint_to_save)
