"""RaftLog holds entry data only until an entry is persisted and applied; storage serves
it afterwards, and a stale suffix read back from storage can still be rewritten."""

from __future__ import annotations

from hamq.raft import Entry, MemoryStorage
from hamq.raft.raft_log import RaftLog


def _stored(*terms: int) -> MemoryStorage:
    storage = MemoryStorage()
    storage.append([Entry(i, t, b"d%d" % i) for i, t in enumerate(terms)])
    return storage


def _log(storage: MemoryStorage) -> RaftLog:
    return RaftLog([storage.term(i) for i in range(storage.last_index() + 1)], storage.entry)


def test_released_entries_are_read_back_from_storage() -> None:
    storage = MemoryStorage()
    reads: list[int] = []

    def read(index: int) -> Entry:
        reads.append(index)
        return storage.entry(index)

    log = RaftLog([], read)
    for index in range(4):
        log.append(Entry(index, 1, b"d%d" % index))
    unstable = log.take_unstable()
    storage.append(unstable)
    log.mark_persisted(unstable)
    log.release_through(2)
    assert log.entries(0, 4) == storage.entries_from(0)
    assert reads == [0, 1, 2]
    assert log.term(1) == 1 and log.matches(3, 1)


def test_a_restarted_followers_stale_suffix_is_rewritten() -> None:
    storage = _stored(1, 1, 2)  # entry 2 is from a deposed leader's term
    log = _log(storage)
    log.write(Entry(2, 3, b"new"))
    assert log.take_unstable() == [Entry(2, 3, b"new")]
    assert log.entry(1) == Entry(1, 1, b"d1")


def test_truncation_point_is_re_emitted_from_storage() -> None:
    storage = _stored(1, 1, 2, 2)
    log = _log(storage)
    log.truncate_after(1)
    assert log.take_unstable() == [Entry(1, 1, b"d1")]
    assert log.ledger_end_index == 1
