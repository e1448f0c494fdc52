"""The core's in-memory view of its log, and which suffix still has to be persisted.

The whole log is held in memory (no compaction yet), so `ledger_begin_index` is 0.
A rewrite below the persisted end (a follower's truncation) moves `unstable_from` back,
so the next `Ready` re-emits the suffix and the driver's `append` replaces it on disk.
"""

from __future__ import annotations

from collections.abc import Sequence

from hamq.raft.log import EMPTY_INDEX, NO_TERM, Entry

LEDGER_BEGIN_INDEX = 0  # no log compaction yet: the log always starts at index 0


class RaftLog:
    def __init__(self, persisted: Sequence[Entry]) -> None:
        self._entries: list[Entry] = list(persisted)
        assert all(e.index == i for i, e in enumerate(self._entries)), "log not contiguous"
        self._unstable_from = len(self._entries)
        # lowest index rewritten since the last `take_unstable`, so `mark_persisted`
        # does not claim a suffix that changed while the driver was writing it
        self._rewritten_from: int | None = None

    @property
    def ledger_end_index(self) -> int:
        return len(self._entries) - 1

    @property
    def ledger_end_term(self) -> int:
        return self.term(self.ledger_end_index)

    @property
    def persisted_end_index(self) -> int:
        return self._unstable_from - 1

    def term(self, index: int) -> int:
        """Term at `index`; NO_TERM before the log's start or past its end."""
        if index == EMPTY_INDEX or index > self.ledger_end_index:
            return NO_TERM
        return self._entries[index].term

    def entry(self, index: int) -> Entry:
        assert 0 <= index <= self.ledger_end_index, f"no entry {index}"
        return self._entries[index]

    def entries(self, start: int, stop: int) -> list[Entry]:
        return self._entries[start:stop]

    def matches(self, index: int, term: int) -> bool:
        """True if our log holds an entry at `index` with `term` (the empty prefix always matches)."""
        if index == EMPTY_INDEX:
            return True
        return index <= self.ledger_end_index and self._entries[index].term == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft's election restriction: is a candidate's log at least as new as ours?"""
        return (last_term, last_index) >= (self.ledger_end_term, self.ledger_end_index)

    def append(self, entry: Entry) -> None:
        assert entry.index == self.ledger_end_index + 1, "append must extend the log"
        self._entries.append(entry)

    def write(self, entry: Entry) -> None:
        """Place `entry` at its index, dropping whatever was there and after it."""
        assert entry.index <= self.ledger_end_index + 1, "write would leave a gap"
        if entry.index <= self.ledger_end_index:
            del self._entries[entry.index:]
            self._note_rewrite(entry.index)
        self._entries.append(entry)

    def truncate_after(self, index: int) -> None:
        """Drop entries after `index`; entry `index` is re-emitted to carry the cut to disk."""
        assert 0 <= index <= self.ledger_end_index
        if index < self.ledger_end_index:
            del self._entries[index + 1:]
            self._note_rewrite(index)

    def take_unstable(self) -> list[Entry]:
        self._rewritten_from = None
        return self._entries[self._unstable_from:]

    def mark_persisted(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        persisted_to = entries[-1].index + 1
        if self._rewritten_from is not None:
            persisted_to = min(persisted_to, self._rewritten_from)
        self._unstable_from = max(self._unstable_from, persisted_to)

    def _note_rewrite(self, index: int) -> None:
        self._unstable_from = min(self._unstable_from, index)
        if self._rewritten_from is None or index < self._rewritten_from:
            self._rewritten_from = index
