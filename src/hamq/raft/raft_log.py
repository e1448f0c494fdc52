"""The core's in-memory view of its log, and which suffix still has to be persisted.

The whole log's terms are held in memory (no compaction yet), so `ledger_begin_index` is 0;
entry data only for a suffix: once an entry is both persisted and applied its data is
dropped (`release_through`) and read back from storage if ever needed again — by a lagging
follower's APPEND, a re-emitted truncation point, or re-applying after a restart. Without
that, every member would hold every message it ever stored.
A rewrite below the persisted end (a follower's truncation) moves `unstable_from` back,
so the next `Ready` re-emits the suffix and the driver's `append` replaces it on disk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hamq.raft.log import EMPTY_INDEX, NO_TERM, Entry

LEDGER_BEGIN_INDEX = 0  # no log compaction yet: the log always starts at index 0


class RaftLog:
    def __init__(self, persisted_terms: Sequence[int], read: Callable[[int], Entry]) -> None:
        """`persisted_terms[i]` is the term of stored entry i; `read(i)` fetches a stored
        entry whose data is not held here."""
        self._terms: list[int] = list(persisted_terms)
        self._read = read
        # entries from `_cached_from` on, with their data; earlier ones are read back
        self._cached_from = len(self._terms)
        self._cached: list[Entry] = []
        self._unstable_from = len(self._terms)
        # lowest index rewritten since the last `take_unstable`, so `mark_persisted`
        # does not claim a suffix that changed while the driver was writing it
        self._rewritten_from: int | None = None

    @property
    def ledger_end_index(self) -> int:
        return len(self._terms) - 1

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
        return self._terms[index]

    def entry(self, index: int) -> Entry:
        assert 0 <= index <= self.ledger_end_index, f"no entry {index}"
        if index >= self._cached_from:
            return self._cached[index - self._cached_from]
        entry = self._read(index)
        assert entry.index == index and entry.term == self._terms[index], "storage disagrees"
        return entry

    def entries(self, start: int, stop: int) -> list[Entry]:
        if start >= self._cached_from:
            return self._cached[start - self._cached_from : stop - self._cached_from]
        return [self.entry(i) for i in range(start, min(stop, self.ledger_end_index + 1))]

    def matches(self, index: int, term: int) -> bool:
        """True if our log holds an entry at `index` with `term` (the empty prefix always
        matches)."""
        if index == EMPTY_INDEX:
            return True
        return index <= self.ledger_end_index and self._terms[index] == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft's election restriction: is a candidate's log at least as new as ours?"""
        return (last_term, last_index) >= (self.ledger_end_term, self.ledger_end_index)

    def append(self, entry: Entry) -> None:
        assert entry.index == self.ledger_end_index + 1, "append must extend the log"
        self._cache(entry)

    def write(self, entry: Entry) -> None:
        """Place `entry` at its index, dropping whatever was there and after it."""
        assert entry.index <= self.ledger_end_index + 1, "write would leave a gap"
        if entry.index <= self.ledger_end_index:
            self._drop_after(entry.index - 1)
            self._note_rewrite(entry.index)
        self._cache(entry)

    def truncate_after(self, index: int) -> None:
        """Drop entries after `index`; entry `index` is re-emitted to carry the cut to disk."""
        assert 0 <= index <= self.ledger_end_index
        if index < self.ledger_end_index:
            self._drop_after(index)
            self._note_rewrite(index)

    def take_unstable(self) -> list[Entry]:
        self._rewritten_from = None
        return self.entries(self._unstable_from, self.ledger_end_index + 1)

    def mark_persisted(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        persisted_to = entries[-1].index + 1
        if self._rewritten_from is not None:
            persisted_to = min(persisted_to, self._rewritten_from)
        self._unstable_from = max(self._unstable_from, persisted_to)

    def release_through(self, index: int) -> None:
        """Stop holding the data of entries up to `index`, which must be persisted."""
        assert index <= self.persisted_end_index, "releasing entries not on disk"
        if index >= self._cached_from:
            del self._cached[: index + 1 - self._cached_from]
            self._cached_from = index + 1

    def _cache(self, entry: Entry) -> None:
        assert entry.index == self._cached_from + len(self._cached)
        self._cached.append(entry)
        self._terms.append(entry.term)

    def _drop_after(self, index: int) -> None:
        del self._terms[index + 1 :]
        if index + 1 <= self._cached_from:  # e.g. a restarted follower's stale suffix
            self._cached.clear()
            self._cached_from = index + 1
        else:
            del self._cached[index + 1 - self._cached_from :]

    def _note_rewrite(self, index: int) -> None:
        self._unstable_from = min(self._unstable_from, index)
        if self._rewritten_from is None or index < self._rewritten_from:
            self._rewritten_from = index
