"""PopQueueState: in-flight bookkeeping, the acked prefix, redelivery order and stale
receipt handles."""

from hamq.broker.pop.state import AckedRanges, AckResult, PopQueueState


def test_acked_prefix_advances_over_out_of_order_acks():
    s = PopQueueState(10)
    s.check_out(range(10, 15), [0] * 5, deadline_ms=1000, ck=1)
    assert s.pop_offset == 15
    assert s.ack(12, 1) is AckResult.ACKED
    assert s.ack(11, 1) is AckResult.ACKED
    assert s.consume_offset == 10
    assert s.ack(10, 1) is AckResult.ACKED
    assert s.consume_offset == 13 and not s.acked
    assert s.ack(10, 1) is AckResult.ALREADY_ACKED
    assert s.ack(99, 1) is AckResult.STALE  # never popped


def test_expired_come_back_in_offset_order_with_reconsume_times_plus_one():
    s = PopQueueState(0)
    s.check_out([0, 1, 2], [0, 0, 0], deadline_ms=100, ck=7)
    s.ack(1, 7)
    assert s.take_expired(now_ms=99, limit=10) == []
    assert s.take_expired(now_ms=100, limit=10) == [(0, 1), (2, 1)]
    s.check_out([0, 2], [1, 1], deadline_ms=300, ck=8)
    assert s.ack(0, 7) is AckResult.STALE  # handle of the first delivery
    assert s.ack(0, 8) is AckResult.ACKED
    assert s.take_expired(now_ms=300, limit=1) == [(2, 2)]


def test_change_of_deadline_supersedes_the_old_one():
    s = PopQueueState(0)
    s.check_out([0], [0], deadline_ms=100, ck=1)
    s.check_out([0], [0], deadline_ms=500, ck=2)  # change invisible time
    assert s.take_expired(now_ms=200, limit=10) == []
    assert s.take_expired(now_ms=500, limit=10) == [(0, 1)]


def test_take_then_restore_keeps_the_message_due():
    s = PopQueueState(0)
    s.check_out([0, 1], [0, 0], deadline_ms=100, ck=1)
    assert len(s.take_expired(200, 10)) == 2
    s.restore_deadlines()  # the redelivery could not be recorded
    assert s.take_expired(200, 10) == [(0, 1), (1, 1)]


def test_replayed_checkpoint_below_the_prefix_is_ignored():
    s = PopQueueState(50)  # offsets up to 50 acked (committed offset)
    s.check_out([40, 41, 50, 51], [0] * 4, deadline_ms=100, ck=3)
    assert sorted(s.inflight) == [50, 51]
    assert s.pop_offset == 52


def test_forget_below_retention_minimum():
    s = PopQueueState(0)
    s.check_out(range(6), [0] * 6, deadline_ms=100, ck=1)
    s.ack(4, 1)
    s.forget_below(4)
    assert s.consume_offset == 5 and sorted(s.inflight) == [5]
    assert s.take_expired(100, 10) == [(5, 1)]


def test_wire_round_trip():
    s = PopQueueState(3)
    s.check_out(range(3, 8), [0, 1, 2, 0, 0], deadline_ms=100, ck=9)
    s.ack(5, 9)
    t = PopQueueState.from_wire(s.to_wire())
    assert (t.consume_offset, t.pop_offset, t.inflight, t.acked.ranges()) == (
        s.consume_offset,
        s.pop_offset,
        s.inflight,
        s.acked.ranges(),
    )
    assert t.take_expired(100, 10) == s.take_expired(100, 10)


def test_truncate_to_a_shorter_queue_forgets_offsets_past_its_end():
    s = PopQueueState(0)
    s.check_out(range(6), [0] * 6, deadline_ms=100, ck=1)
    s.ack(4, 1)
    s.truncate_to(3)
    assert (s.consume_offset, s.pop_offset, sorted(s.inflight), len(s.acked)) == (
        0,
        3,
        [0, 1, 2],
        0,
    )


def test_acks_behind_a_poison_message_stay_one_range():
    """A message never acked pins the prefix; the acks after it cost one range, not one
    entry each, and the deadline heap does not keep their stale entries."""
    s = PopQueueState(0)
    for start in range(0, 100_000, 1000):
        s.check_out(range(start, start + 1000), [0] * 1000, deadline_ms=100, ck=start)
        for offset in range(max(start, 1), start + 1000):
            assert s.ack(offset, start) is AckResult.ACKED
    assert s.consume_offset == 0 and s.acked.ranges() == [(1, 100_000)]
    assert len(s._deadlines) <= 2 * len(s.inflight) + 1024
    assert s.ack(0, 0) is AckResult.ACKED
    assert s.consume_offset == 100_000 and not s.acked


def test_acked_ranges_merge_split_and_keep():
    r = AckedRanges()
    for offset in (5, 7, 6, 10, 9, 2):
        r.add(offset)
    assert r.ranges() == [(2, 3), (5, 8), (9, 11)]
    assert 6 in r and 8 not in r and 1 not in r
    assert r.take_prefix(2) == 3 and r.take_prefix(4) == 4
    r.keep(6, 10)
    assert r.ranges() == [(6, 8), (9, 10)]


def test_an_older_checkpoint_with_single_acked_offsets_loads_as_ranges():
    s = PopQueueState.from_wire([0, 5, [[0, 100, 0, 1]], [1, 2, 3, 4]])
    assert s.acked.ranges() == [(1, 5)]
    assert s.ack(0, 1) is AckResult.ACKED and s.consume_offset == 5


def test_offsets_a_replayed_checkpoint_skips_over_are_due_at_once():
    """A CK this state missed handed out 0..3; the next one it sees names 4..5: 0..3 may be
    held unacked by someone, so they come back (at least once) instead of being skipped."""
    s = PopQueueState(0)
    s.check_out([4, 5], [0, 0], deadline_ms=100, ck=9)
    assert s.pop_offset == 6
    assert s.take_expired(now_ms=0, limit=10) == [(0, 1), (1, 1), (2, 1), (3, 1)]
