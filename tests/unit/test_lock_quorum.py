"""The strict-mode lock arithmetic (seed 004 "锁Quorum"): a majority of the group, counted
over the members' grants, so two clients can never both reach one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hamq.broker.locks import RebalanceLockManager, granted_by_quorum, lock_quorum

Q = [("T", 0), ("T", 1), ("T", 2)]


def test_quorum_is_a_majority_of_the_larger_of_configured_and_alive():
    assert lock_quorum(1, 1) == 1  # a single member: no quorum to reach
    assert lock_quorum(2, 2) == 2  # two replicas: both (why strict mode is off by default)
    assert lock_quorum(3, 2) == 2  # a dead member does not lower it
    assert lock_quorum(1, 3) == 2  # an unconfigured size: the members alive count
    assert lock_quorum(3, 5) == 3


def test_granted_by_quorum_counts_each_member_once_in_request_order():
    grants = [[Q[2], Q[0]], [Q[0], Q[0]], [Q[2]]]
    assert granted_by_quorum(Q, grants, 2) == [Q[0], Q[2]]
    assert granted_by_quorum(Q, grants, 3) == []


@given(
    members=st.integers(1, 5),
    order=st.lists(st.tuples(st.sampled_from("AB"), st.sets(st.integers(0, 4))), max_size=20),
)
def test_two_clients_never_both_reach_a_quorum(members, order):
    """Clients whose requests reach any subset of the members (the others dead or slow),
    with no lapse: at most one of them is ever granted a queue by a majority."""
    managers = [RebalanceLockManager() for _ in range(members)]
    quorum = lock_quorum(members, members)
    won: set[str] = set()
    for client, reached in order:
        grants = [
            m.try_lock_batch("g", [Q[0]], client, 0) for i, m in enumerate(managers) if i in reached
        ]
        if granted_by_quorum([Q[0]], grants, quorum):
            won.add(client)
    assert len(won) <= 1
