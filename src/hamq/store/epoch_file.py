"""A member's master epochs on disk: RocketMQ 5's ``EpochFileCache``, Kafka's leader-epoch
checkpoint.

Entries are (epoch, start offset) pairs, appended when this member becomes master (the new
epoch, its log end at that moment) and when, as a slave, it meets a new epoch in the
stream (that epoch and the start offset the master gave it). They let a member find where
its log and a new master's agree (``hamq.replication.consistent_point``) and truncate the
rest before copying.

Every change rewrites the whole file with ``atomic_write`` before the list in memory
changes, so a crash or power loss leaves the old list or the new one, and a failed write
loses nothing. The file is a few lines of text with a CRC: a damaged one is refused with
``CorruptEpochFileError``. Removing it is the recovery, and a safe one: a member with no
epochs shares none with its master, so it truncates its whole log and copies it again.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from hamq.replication.consistent_point import EpochEntry, epoch_ends
from hamq.store.disk import OS_DISK, Disk, atomic_write

_MAGIC = "hamq-epochs v1"


class EpochOrderError(ValueError):
    """An append that would break the order epochs and their start offsets must keep."""


class CorruptEpochFileError(Exception):
    """The epoch file does not hold a valid list (see the module docstring for recovery)."""


class EpochFile:
    """The epoch entries of one member, kept in ``path``."""

    def __init__(self, path: Path, disk: Disk = OS_DISK) -> None:
        self.path = Path(path)
        self._disk = disk
        self._entries = self._load()

    def entries(self) -> tuple[EpochEntry, ...]:
        return self._entries

    def last_epoch(self) -> int:
        """The newest epoch; 0 when there is none (epochs start at 1, the first election)."""
        return self._entries[-1].epoch if self._entries else 0

    def end_offset_of(self, epoch: int, log_end: int) -> int | None:
        """Where ``epoch``'s records end in a log ending at ``log_end``: the next entry's
        start, or the log end; None when this member never had that epoch."""
        return epoch_ends(self._entries, log_end).get(epoch)

    def append(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset``. Appending the last entry again
        is a no-op (a slave meets the same epoch after every reconnect); an older or equal
        epoch, or a start below the last one, is refused: that would rewrite history."""
        entry = EpochEntry(epoch, start_offset)
        if self._entries and entry == self._entries[-1]:
            return
        problem = _out_of_order(self._entries[-1] if self._entries else None, entry)
        if problem:
            raise EpochOrderError(f"{problem} in {self.path}")
        self._save((*self._entries, entry))

    def truncate_suffix_from(self, offset: int) -> None:
        """The log was cut to end at ``offset``: forget the epochs that start at or after
        it (they hold no record any more)."""
        kept = tuple(entry for entry in self._entries if entry.start_offset < offset)
        if kept != self._entries:
            self._save(kept)

    def truncate_prefix_to(self, offset: int) -> None:
        """Retention removed the records below ``offset``: forget the epochs that ended at
        or before it and raise the first survivor's start to ``offset``. The last entry
        always stays: it is the current epoch, whatever the log holds."""
        entries = self._entries
        first = 0
        while first + 1 < len(entries) and entries[first + 1].start_offset <= offset:
            first += 1
        kept = list(entries[first:])
        if kept and kept[0].start_offset < offset:
            kept[0] = EpochEntry(kept[0].epoch, offset)
        if tuple(kept) != entries:
            self._save(tuple(kept))

    def _save(self, entries: tuple[EpochEntry, ...]) -> None:
        body = "".join(f"{entry.epoch} {entry.start_offset}\n" for entry in entries)
        header = f"{_MAGIC} {zlib.crc32(body.encode()):08x}\n"
        atomic_write(self._disk, self.path, (header + body).encode())
        self._entries = entries

    def _load(self) -> tuple[EpochEntry, ...]:
        if not self._disk.exists(self.path):
            return ()
        data = self._disk.read_bytes(self.path)
        try:
            header, _, body = data.decode("ascii").partition("\n")
            magic, _, crc = header.rpartition(" ")
            if magic != _MAGIC or crc != f"{zlib.crc32(body.encode()):08x}":
                raise ValueError("bad header or CRC")
            pairs = [line.split(" ") for line in body.splitlines()]
            entries = tuple(EpochEntry(int(epoch), int(start)) for epoch, start in pairs)
            for before, entry in zip((None, *entries), entries):
                problem = _out_of_order(before, entry)
                if problem:
                    raise ValueError(problem)
        except ValueError as e:  # UnicodeDecodeError and a wrong field count are ValueErrors
            raise CorruptEpochFileError(
                f"{self.path} is not a valid epoch file ({e}); removing it makes this member "
                "copy its whole log again from its master"
            ) from e
        return entries


def _out_of_order(last: EpochEntry | None, entry: EpochEntry) -> str | None:
    """Why ``entry`` cannot follow ``last``, or None: epochs start at 1 and only grow, and
    an epoch cannot start below the one before it (equal is fine: an epoch with no record)."""
    if entry.epoch < 1 or entry.start_offset < 0:
        return (
            f"epoch {entry.epoch} at offset {entry.start_offset}: epochs start at 1, offsets at 0"
        )
    if last is not None and (entry.epoch <= last.epoch or entry.start_offset < last.start_offset):
        return (
            f"epoch {entry.epoch} at offset {entry.start_offset} cannot follow "
            f"epoch {last.epoch} at offset {last.start_offset}"
        )
    return None
