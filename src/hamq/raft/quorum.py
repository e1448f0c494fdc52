"""QuorumAckChecker: the leader's per-term watermarks and its pending proposals.

Both maps are keyed by term as in DLedger, so entries of a term this member no longer
leads are found and cleaned instead of lingering.
"""

from __future__ import annotations

from collections.abc import Iterable

from hamq.raft.log import EMPTY_INDEX, EntryId


def quorum_index(water_marks: Iterable[int]) -> int:
    """The highest index a majority has reached: the middle of the watermarks sorted
    descending (with 5 members, position 2 is reached by at least 3 of them)."""
    ordered = sorted(water_marks, reverse=True)
    assert ordered, "a group has at least one member"
    return ordered[len(ordered) // 2]


class QuorumAckChecker:
    def __init__(self, member_ids: Iterable[int]) -> None:
        self._member_ids = tuple(member_ids)
        self.peer_water_marks_by_term: dict[int, dict[int, int]] = {}
        # term -> index -> time the proposal was made (ms), in index order
        self.pending_append_responses_by_term: dict[int, dict[int, int]] = {}

    def start_term(self, term: int) -> list[EntryId]:
        """Begin leading `term`; returns pending proposals of older terms, now failed."""
        stale = self.drop_all()
        self.peer_water_marks_by_term[term] = dict.fromkeys(self._member_ids, EMPTY_INDEX)
        self.pending_append_responses_by_term[term] = {}
        return stale

    def drop_all(self) -> list[EntryId]:
        stale = [
            EntryId(term, index)
            for term, pending in sorted(self.pending_append_responses_by_term.items())
            for index in pending
        ]
        self.peer_water_marks_by_term.clear()
        self.pending_append_responses_by_term.clear()
        return stale

    def water_mark(self, term: int, member_id: int) -> int:
        return self.peer_water_marks_by_term[term][member_id]

    def update_water_mark(self, term: int, member_id: int, index: int) -> bool:
        """Raise a member's watermark (an ack never lowers it: a late ack is still a
        fact). True if it rose."""
        marks = self.peer_water_marks_by_term[term]
        if index <= marks[member_id]:
            return False
        marks[member_id] = index
        return True

    def lower_water_mark(self, term: int, member_id: int, index: int) -> None:
        """A member reported that its log ends at `index`, before its watermark: it lost
        entries it had acknowledged (node.py says why lowering is safe)."""
        marks = self.peer_water_marks_by_term[term]
        assert index < marks[member_id], "lowering only ever lowers"
        marks[member_id] = index

    def quorum_index(self, term: int) -> int:
        return quorum_index(self.peer_water_marks_by_term[term].values())

    def add_pending(self, term: int, index: int, now_ms: int) -> None:
        self.pending_append_responses_by_term[term][index] = now_ms

    def complete_up_to(self, term: int, committed_index: int) -> list[EntryId]:
        pending = self.pending_append_responses_by_term[term]
        done = [EntryId(term, i) for i in pending if i <= committed_index]
        for entry_id in done:
            del pending[entry_id.index]
        return done

    def expire(self, term: int, now_ms: int, timeout_ms: int) -> list[EntryId]:
        pending = self.pending_append_responses_by_term[term]
        expired = [EntryId(term, i) for i, t in pending.items() if now_ms - t >= timeout_ms]
        for entry_id in expired:
            del pending[entry_id.index]
        return expired
