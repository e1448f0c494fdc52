from __future__ import annotations

from hamq.raft import EntryId, QuorumAckChecker, quorum_index


def test_quorum_index_is_the_middle_of_the_sorted_watermarks() -> None:
    # the seed's example: five members at 1, 1, 2, 3, 3 -> sorted [3, 3, 2, 1, 1] -> 2
    assert quorum_index([1, 1, 2, 3, 3]) == 2
    assert quorum_index([5]) == 5
    assert quorum_index([4, -1, 7]) == 4
    assert quorum_index([9, 9, 0, 0]) == 0  # 2 of 4 is not a majority


def test_pending_proposals_complete_in_order_and_expire() -> None:
    checker = QuorumAckChecker([1, 2, 3])
    checker.start_term(2)
    for index, at_ms in [(5, 0), (6, 10), (7, 20)]:
        checker.add_pending(2, index, at_ms)
    assert checker.complete_up_to(2, 6) == [EntryId(2, 5), EntryId(2, 6)]
    assert checker.expire(2, now_ms=30, timeout_ms=10) == [EntryId(2, 7)]
    assert checker.complete_up_to(2, 9) == []


def test_new_term_cleans_stale_terms() -> None:
    checker = QuorumAckChecker([1, 2, 3])
    checker.start_term(1)
    checker.add_pending(1, 3, 0)
    checker.update_water_mark(1, 2, 3)
    assert checker.start_term(4) == [EntryId(1, 3)]
    assert list(checker.peer_water_marks_by_term) == [4]
    assert checker.water_mark(4, 2) == -1


def test_acks_only_raise_watermarks() -> None:
    checker = QuorumAckChecker([1, 2])
    checker.start_term(1)
    assert checker.update_water_mark(1, 2, 5)
    assert not checker.update_water_mark(1, 2, 3)
    assert checker.water_mark(1, 2) == 5


def test_a_member_that_lost_entries_is_lowered_and_counts_again_through_acks() -> None:
    checker = QuorumAckChecker([1, 2, 3])
    checker.start_term(1)
    for member in (1, 2, 3):
        checker.update_water_mark(1, member, 5)
    checker.lower_water_mark(1, 3, 2)  # 3 reported its log ends at 2
    assert checker.quorum_index(1) == 5  # 1 and 2 still hold 5
    checker.lower_water_mark(1, 2, -1)  # 2 was rebuilt with an empty disk
    assert checker.quorum_index(1) == 2
    assert checker.update_water_mark(1, 2, 4)
    assert checker.quorum_index(1) == 4
