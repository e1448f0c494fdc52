"""SyncStateSet rules (seed 001) and all-ack inside the master core: catch-up time, expand,
shrink, the confirm offset, and the effective set (applied ∪ proposed) all-ack waits on."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamq.broker.ha.service import StoreRecords
from hamq.config import StoreConfig
from hamq.replication.master import MasterReplication, ReplicaStatus
from hamq.replication.quorum import QuorumConfig
from hamq.replication.sync_state_set import SyncStateSet
from hamq.store.message_store import MessageStore

MASTER = 0
MAX_NOT_CATCHUP_MS = 1000


def sss() -> SyncStateSet:
    return SyncStateSet(MASTER, MAX_NOT_CATCHUP_MS)


@pytest.fixture(scope="module")
def empty_log(tmp_path_factory) -> StoreRecords:
    """A real, empty message store: every slave attaches at offset 0."""
    root = tmp_path_factory.mktemp("store")
    return StoreRecords(MessageStore(StoreConfig(store_dir=str(root), disk_min_free_bytes=1)))


def all_ack_core(s: SyncStateSet) -> MasterReplication:
    return MasterReplication(QuorumConfig(), 1 << 30, 1 << 20, sync_state_set=s, all_ack=True)


def ship_and_ack(m: MasterReplication, broker_id: int, master_max: int, ack: int, now: int):
    while m.next_transfer(broker_id, master_max, now) is not None:
        pass
    return m.on_ack(broker_id, ack, now)


def run(done):
    for callback, status in done:
        callback(status)


def test_caught_up_time_is_the_transfer_time_once_the_ack_reaches_its_max_offset():
    s = sss()
    s.on_connect(1, 0, now_ms=0)
    s.on_transfer(1, master_max_offset=500, now_ms=100)
    s.on_ack(1, 400)
    assert s.slaves[1].last_caught_up_ms == 0  # behind the master's offset at that transfer
    s.on_ack(1, 500)
    assert s.slaves[1].last_caught_up_ms == 100  # the transfer's time, not the ack's


def test_a_slave_joins_once_its_ack_reaches_the_confirm_offset_and_counts_at_once():
    s = sss()
    s.on_connect(1, 0, now_ms=0)
    s.on_ack(1, 300)
    assert not s.maybe_expand(1, master_max_offset=500)  # confirm is the master's 500
    s.on_ack(1, 500)
    assert s.maybe_expand(1, master_max_offset=500)
    assert s.effective == {MASTER, 1} and s.applied == {MASTER}
    assert s.change(now_ms=10, master_max_offset=500) == {MASTER, 1}
    assert s.apply(frozenset({MASTER, 1}), epoch=1)
    assert s.change(now_ms=10, master_max_offset=500) is None


def test_confirm_offset_is_the_least_ack_of_the_set_the_master_counting_its_max():
    s = sss()
    for b in (1, 2):
        s.on_connect(b, 0, now_ms=0)
    s.apply(frozenset({MASTER, 1, 2}), epoch=1)
    s.on_ack(1, 700)
    s.on_ack(2, 400)
    assert s.confirm_offset(master_max_offset=800) == 400
    s.on_ack(2, 900)
    assert s.confirm_offset(master_max_offset=800) == 700
    s.on_connect(3, 0, now_ms=0)  # not a member: does not count
    assert s.confirm_offset(master_max_offset=800) == 700


def test_a_member_not_caught_up_for_too_long_or_disconnected_leaves_only_once_applied():
    s = sss()
    for b in (1, 2):
        s.on_connect(b, 0, now_ms=0)
    s.apply(frozenset({MASTER, 1, 2}), epoch=1)
    s.on_transfer(1, master_max_offset=100, now_ms=500)
    s.on_ack(1, 100)  # caught up at 500
    assert s.change(now_ms=MAX_NOT_CATCHUP_MS, master_max_offset=100) is None
    # slave 2 never caught up since it connected at 0: out of sync after the limit
    assert s.change(now_ms=MAX_NOT_CATCHUP_MS + 1, master_max_offset=100) == {MASTER, 1}
    assert s.effective == {MASTER, 1, 2}  # a shrink counts only once applied
    s.on_disconnect(1)
    assert s.change(now_ms=MAX_NOT_CATCHUP_MS + 1, master_max_offset=100) == {MASTER}
    assert not s.apply(frozenset({MASTER}), epoch=0)  # a late answer to an older alter
    assert s.apply(frozenset({MASTER}), epoch=2)
    assert s.effective == {MASTER}


def test_an_applied_set_without_its_master_is_refused():
    with pytest.raises(ValueError, match="does not contain its master"):
        sss().apply(frozenset({1}), epoch=1)


def test_all_ack_waits_for_every_member_including_one_whose_join_is_in_flight(empty_log):
    s = sss()
    m = all_ack_core(s)
    m.attach(1, 1, 0, None, empty_log, 0)
    m.attach(2, 2, 0, None, empty_log, 0)
    run(m.apply_sync_state_set(frozenset({MASTER, 1}), epoch=1))
    results: list[ReplicaStatus] = []
    m.wait_for_acks(100, 2, 0, 10_000, results.append)
    run(ship_and_ack(m, 2, 100, 100, 1))  # slave 2 is not a member: does not count
    assert results == []
    run(ship_and_ack(m, 1, 200, 200, 2))
    assert results == [ReplicaStatus.PUT_OK]
    assert not s.maybe_expand(2, master_max_offset=200)  # confirm is 200 (slave 1)
    run(ship_and_ack(m, 2, 200, 200, 3))
    assert s.maybe_expand(2, master_max_offset=200)  # joins: counted before it is applied
    m.wait_for_acks(300, 2, 3, 10_000, results.append)
    run(ship_and_ack(m, 1, 300, 300, 4))
    assert results == [ReplicaStatus.PUT_OK]  # slave 2 lacks 300
    run(ship_and_ack(m, 2, 300, 300, 5))
    assert results == [ReplicaStatus.PUT_OK] * 2


def test_an_all_ack_wait_on_a_disconnected_member_ends_when_the_shrink_is_applied(empty_log):
    s = sss()
    m = all_ack_core(s)
    m.attach(1, 1, 0, None, empty_log, 0)
    m.attach(2, 2, 0, None, empty_log, 0)
    run(m.apply_sync_state_set(frozenset({MASTER, 1, 2}), epoch=1))
    results: list[ReplicaStatus] = []
    m.wait_for_acks(100, 3, 0, 10_000, results.append)
    run(ship_and_ack(m, 1, 100, 100, 1))
    run(m.disconnect(2))
    assert results == []  # not failed: a shrink will drop slave 2
    assert s.change(now_ms=2, master_max_offset=100) == {MASTER, 1}
    assert results == []  # proposed, not yet applied
    run(m.apply_sync_state_set(frozenset({MASTER, 1}), epoch=2))
    assert results == [ReplicaStatus.PUT_OK]


def test_all_ack_with_the_master_alone_in_the_set_answers_at_once():
    m = all_ack_core(sss())
    results: list[ReplicaStatus] = []
    m.wait_for_acks(100, 2, 0, 10_000, results.append)
    assert results == [ReplicaStatus.PUT_OK]


# -- properties ------------------------------------------------------------------------------
SLAVES = (1, 2, 3)
op = st.one_of(
    st.tuples(st.just("send"), st.integers(1, 300)),
    st.tuples(st.just("ack"), st.sampled_from(SLAVES), st.integers(0, 300)),
    st.tuples(st.just("connect"), st.sampled_from(SLAVES)),
    st.tuples(st.just("disconnect"), st.sampled_from(SLAVES)),
    st.tuples(st.just("change"), st.integers(0, 2 * MAX_NOT_CATCHUP_MS)),
    st.tuples(st.just("apply"), st.sampled_from(("new", "none", "again"))),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=60))
def test_confirm_offset_and_all_ack_never_run_ahead_of_a_member(empty_log, ops):
    """The test keeps its own model: what each slave holds (what it acked in its current
    session; a new session starts at 0 here, an empty log), the set the controller applied
    and every set proposed since. The confirm offset never exceeds what a member of
    applied ∪ proposed holds, and no all-ack send completes while such a member lacks it."""
    s = sss()
    m = all_ack_core(s)
    holds: dict[int, int] = {}
    applied: frozenset[int] = frozenset({MASTER})
    pending: list[frozenset[int]] = []
    epoch = 0
    master_max = 0
    now = 0
    completed: list[int] = []

    def members() -> frozenset[int]:
        return applied.union(*pending)

    def check(done) -> None:
        for callback, status in done:
            callback(status)

    for step in ops:
        now += 1
        kind = step[0]
        if kind == "send":
            master_max += step[1]
            end = master_max
            m.wait_for_acks(
                end,
                2,
                now,
                1 << 40,
                lambda status, end=end: status is ReplicaStatus.PUT_OK and completed.append(end),
            )
        elif kind == "connect":
            m.attach(step[1], step[1], 0, None, empty_log, now)
            holds[step[1]] = 0
        elif kind == "disconnect" and step[1] in m.slaves:
            check(m.disconnect(step[1]))
            del holds[step[1]]
        elif kind == "ack" and step[1] in m.slaves:
            b = step[1]
            target = min(master_max, holds[b] + step[2])
            while m.next_transfer(b, master_max, now) is not None:
                pass
            check(m.on_ack(b, target, now))
            holds[b] = max(holds[b], target)
            if s.maybe_expand(b, master_max):
                pending.append(s.effective)
        elif kind == "change":
            now += step[1]
            proposal = s.change(now, master_max)
            if proposal is not None:
                pending.append(proposal)
        elif kind == "apply" and step[1] == "again":
            # the held set announced again (a poll): the proposals are still outstanding
            check(m.apply_sync_state_set(applied, epoch))
        elif kind == "apply" and pending:
            # the controller applies one of the outstanding proposals, or refuses them all
            if step[1] == "new":
                epoch += 1
                applied = pending[-1]
                check(m.apply_sync_state_set(applied, epoch))
                pending = []
        held = {b: holds.get(b, 0) for b in members() if b != MASTER}
        # a disconnected member keeps what it last acked in the model too: it still has it
        for b in members():
            if b != MASTER and b not in holds:
                held[b] = s.slaves[b].ack_offset if b in s.slaves else 0
        confirm = m.confirm_offset(master_max)
        assert confirm <= master_max
        assert all(confirm <= h for h in held.values()), (confirm, held)
        for end in completed:
            assert all(h >= end for h in held.values()), (end, held, members())
        completed.clear()


def test_a_member_holding_the_whole_log_of_an_idle_master_stays():
    """No transfer for longer than the limit (nothing was sent): a member that holds the
    whole log is caught up now, not since the last transfer."""
    s = sss()
    s.on_connect(1, 0, now_ms=0)
    s.apply(frozenset({MASTER, 1}), epoch=1)
    s.on_transfer(1, master_max_offset=100, now_ms=10)
    s.on_ack(1, 100)
    assert s.change(now_ms=10 * MAX_NOT_CATCHUP_MS, master_max_offset=100) is None
    # then the master writes and the slave stops acking: it falls out after the limit
    assert s.change(now_ms=11 * MAX_NOT_CATCHUP_MS, master_max_offset=200) is None
    assert s.change(now_ms=11 * MAX_NOT_CATCHUP_MS + 1, master_max_offset=200) == {MASTER}


def test_the_held_set_announced_again_keeps_a_join_in_flight(empty_log):
    """A poll (or a repeated notification) answers with the set the master already holds
    while its expand is at the controller, which may apply it: the joining member must go
    on counting, or sends are acknowledged without a member that can be elected."""
    s = sss()
    m = all_ack_core(s)
    m.attach(1, 1, 0, None, empty_log, 0)
    run(m.apply_sync_state_set(frozenset({MASTER}), epoch=1))
    run(ship_and_ack(m, 1, 100, 100, 1))
    assert s.maybe_expand(1, master_max_offset=100)
    assert s.change(now_ms=2, master_max_offset=100) == {MASTER, 1}  # sent to the controller
    results: list[ReplicaStatus] = []
    m.wait_for_acks(200, 2, 3, 10_000, results.append)
    run(m.apply_sync_state_set(frozenset({MASTER}), epoch=1))  # the poll's answer
    assert results == [] and s.effective == {MASTER, 1}
    assert m.confirm_offset(master_max_offset=200) == 100
    run(m.apply_sync_state_set(frozenset({MASTER, 1}), epoch=2))  # the alter's answer
    run(ship_and_ack(m, 1, 200, 200, 4))
    assert results == [ReplicaStatus.PUT_OK]


def test_a_refused_join_stops_counting_and_sends_complete_without_it(empty_log):
    """The controller refused the expand at the held epoch (the member was not alive to
    it): nothing was applied, so a member that then went silent holds no send back."""
    s = sss()
    m = all_ack_core(s)
    m.attach(1, 1, 0, None, empty_log, 0)
    run(m.apply_sync_state_set(frozenset({MASTER}), epoch=1))
    run(ship_and_ack(m, 1, 100, 100, 1))
    assert s.change(now_ms=2, master_max_offset=100) == {MASTER, 1}
    results: list[ReplicaStatus] = []
    m.wait_for_acks(200, 2, 3, 10_000, results.append)
    run(m.disconnect(1))
    assert results == [] and s.change(now_ms=4, master_max_offset=200) is None
    run(m.refuse_sync_state_set())
    assert results == [ReplicaStatus.PUT_OK] and s.effective == {MASTER}
