"""Where a slave's log stops agreeing with its master's, from epoch entries alone.

The classic cases first (each with the two logs it stands for), then a property test that
plays random master changes, writes and partial replication with divergent tails, and
checks the answer against the true common prefix of the two logs.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hamq.replication.consistent_point import EpochEntry, epoch_ends, find_consistent_point


def entries(*pairs: tuple[int, int]) -> list[EpochEntry]:
    return [EpochEntry(epoch, start) for epoch, start in pairs]


HISTORY = entries((1, 0), (2, 100), (4, 250))


def test_identical_histories_agree_up_to_the_log_end():
    assert find_consistent_point(HISTORY, 300, HISTORY, 300) == 300


def test_a_slave_behind_in_the_last_epoch_agrees_up_to_its_own_end():
    assert find_consistent_point(HISTORY, 300, HISTORY, 260) == 260


def test_a_slave_behind_by_whole_epochs_agrees_up_to_its_own_end():
    assert find_consistent_point(HISTORY, 300, entries((1, 0)), 80) == 80


def test_a_slave_ahead_in_the_same_epoch_is_cut_to_the_master_end():
    # a deposed master of epoch 4 that kept writing: its tail past 300 was never replicated
    assert find_consistent_point(HISTORY, 300, HISTORY, 340) == 300


def test_master_with_newer_epochs_cuts_the_slave_where_the_shared_epoch_ended():
    # the slave wrote 250..290 as master of epoch 2; the new master had epoch 2 only up to 250
    master = entries((1, 0), (2, 100), (3, 250))
    slave = entries((1, 0), (2, 100))
    assert find_consistent_point(master, 400, slave, 290) == 250


def test_an_epoch_the_master_never_had_is_walked_past():
    # the slave was master of epoch 3 and wrote 150..190 that nobody copied; the new master
    # (epoch 4) had stopped at 150 in epoch 2
    master = entries((1, 0), (2, 100), (4, 150))
    slave = entries((1, 0), (2, 100), (3, 150))
    assert find_consistent_point(master, 500, slave, 190) == 150


def test_walking_down_past_several_unknown_epochs():
    master = entries((1, 0), (5, 40))
    slave = entries((1, 0), (2, 30), (3, 35))
    assert find_consistent_point(master, 90, slave, 60) == 30


def test_no_shared_epoch_means_nothing_agrees():
    assert find_consistent_point(entries((2, 0)), 100, entries((1, 0)), 50) == 0


def test_empty_epoch_files():
    assert find_consistent_point([], 0, [], 0) == 0
    assert find_consistent_point(HISTORY, 300, [], 0) == 0
    assert find_consistent_point([], 0, HISTORY, 300) == 0


def test_an_epoch_with_no_record_yet_ends_where_it_starts():
    # the master was just elected at its log end 300 and has written nothing in epoch 5
    master = entries((1, 0), (2, 100), (4, 250), (5, 300))
    assert epoch_ends(master, 300) == {1: 100, 2: 250, 4: 300, 5: 300}
    assert find_consistent_point(master, 300, HISTORY, 320) == 300


def test_a_log_shorter_than_its_epoch_file_bounds_every_end():
    # a power loss took records the fsynced epoch file still names
    assert epoch_ends(HISTORY, 180) == {1: 100, 2: 180, 4: 180}
    assert find_consistent_point(HISTORY, 300, HISTORY, 180) == 180


# -- property: random histories ---------------------------------------------------------
Record = tuple[int, int]  # (epoch that wrote it, serial): unique per write


def exact_entries(log: list[Record], current_epoch: int | None = None) -> list[EpochEntry]:
    """The epoch file a member keeps exactly: one entry per run of records one epoch wrote,
    plus the epoch it masters now if it has written nothing in it yet."""
    found: list[EpochEntry] = []
    for offset, (epoch, _) in enumerate(log):
        if not found or found[-1].epoch != epoch:
            found.append(EpochEntry(epoch, offset))
    if current_epoch is not None and (not found or found[-1].epoch != current_epoch):
        found.append(EpochEntry(current_epoch, len(log)))
    return found


def common_prefix(a: list[Record], b: list[Record]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


MEMBERS = 3
step = st.tuples(
    st.sampled_from(["elect", "write", "replicate"]),
    st.integers(0, MEMBERS - 1),
    st.integers(0, 5),
)


def play(steps: list[tuple[str, int, int]]) -> tuple[list[list[Record]], int, int]:
    """Any member may be elected (clean or not), so tails diverge; a slave copies only after
    cutting its log to what it truly shares with the master, as the protocol requires."""
    logs: list[list[Record]] = [[] for _ in range(MEMBERS)]
    master, epoch, serial = 0, 1, 0
    for kind, member, count in steps:
        if kind == "elect":
            master, epoch = member, epoch + 1
        elif kind == "write":
            for _ in range(count):
                serial += 1
                logs[master].append((epoch, serial))
        elif member != master:
            keep = common_prefix(logs[member], logs[master])
            logs[member] = logs[master][: keep + count]
    return logs, master, epoch


@settings(max_examples=400, deadline=None)
@given(
    st.lists(step, max_size=40),
    st.integers(0, MEMBERS - 1),
    st.lists(st.integers(0, 10), min_size=MEMBERS, max_size=MEMBERS),
)
def test_consistent_point_is_the_true_common_prefix(steps, slave, lost_tails):
    logs, master, epoch = play(steps)
    if slave == master:
        slave = (slave + 1) % MEMBERS
    master_file = exact_entries(logs[master], epoch)
    slave_file = exact_entries(logs[slave])
    truth = common_prefix(logs[master], logs[slave])
    assert find_consistent_point(master_file, len(logs[master]), slave_file, len(logs[slave])) == (
        truth
    )

    # a power loss then takes log tails the fsynced epoch files still name: never past the
    # truth, so nothing that disagrees is ever kept
    master_log = logs[master][: max(0, len(logs[master]) - lost_tails[master])]
    slave_log = logs[slave][: max(0, len(logs[slave]) - lost_tails[slave])]
    point = find_consistent_point(master_file, len(master_log), slave_file, len(slave_log))
    assert point <= common_prefix(master_log, slave_log)
