"""Restarting DLedger members (issue 10, defect 1): a clean stop and start re-applies
nothing — it used to erase the message store and apply the whole Raft log again — and
kill -9 re-applies only the tail written since the store's last checkpoint claim. One- and
three-member groups, real processes."""

from __future__ import annotations

import pytest
from test_dledger import Group, assert_identical_logs, consume_all

import hamq
from hamq import Message, SendStatus
from helpers import wait_for

CUT_BACK_LINE = "store cut back"


def _send(group: Group, bodies: list[bytes]) -> None:
    with hamq.Producer(group.c.namesrv) as producer:
        for body in bodies:
            assert producer.send(Message("Raft", body)).status is SendStatus.SEND_OK


def _all_applied(group: Group) -> dict[int, int]:
    """Waits until every member applied what the leader committed; their applied indexes."""

    def applied():
        has = {m: group.info(m)["ha"] for m in group.members}
        committed = max(ha["committed_index"] for ha in has.values())
        return all(ha["applied_index"] == committed for ha in has.values()) and {
            m: ha["applied_index"] for m, ha in has.items()
        }

    return wait_for(applied, 20, "every member applying the committed log")


def _log_tail(group: Group, m: int, start: int) -> str:
    return group.c.procs[f"m{m}"].log_path.read_bytes()[start:].decode(errors="replace")


def _log_size(group: Group, m: int) -> int:
    return group.c.procs[f"m{m}"].log_path.stat().st_size


def _readable_once(group: Group, bodies: list[bytes]) -> None:
    group.leader()
    wait_for(lambda: "dl" in group.admin.master_addrs(), 15, "the leader's registration")
    got = consume_all(group.c.namesrv)
    assert sorted(got) == sorted(bodies), "messages lost or repeated across the restart"


@pytest.mark.slow
@pytest.mark.parametrize("members", [(1,), (1, 2, 3)], ids=["one-member", "three-members"])
def test_restarts_reapply_only_what_the_store_may_have_lost(cluster_factory, members):
    group = Group(cluster_factory, members)
    try:
        sent = [b"first-%04d" % i for i in range(200)]
        _send(group, sent)
        applied = _all_applied(group)
        marks = {m: _log_size(group, m) for m in members}
        for m in members:
            group.c.procs[f"m{m}"].stop()  # SIGTERM: a clean shutdown
        for m in members:
            group.c.procs[f"m{m}"].start()
        for m in members:
            assert CUT_BACK_LINE not in _log_tail(group, m, marks[m])
            ha = group.info(m)["ha"]
            assert ha["recovered_applied_index"] == applied[m], "the store lost its claim"
            assert ha["recovery_cut_bytes"] == 0, "a clean restart re-applied entries"
        _readable_once(group, sent)

        # kill -9: only what follows the last claim is cut and applied again
        more = [b"second-%04d" % i for i in range(100)]
        _send(group, more)
        _all_applied(group)
        wait_for(
            lambda: all(
                group.info(m)["ha"]["claimed_applied_index"] == group.info(m)["ha"]["applied_index"]
                for m in members
            ),
            20,
            "the store checkpoints to claim everything applied",
        )
        victim = group.leader()
        claimed = group.info(victim)["ha"]["claimed_applied_index"]
        claimed_end = group.info(victim)["commitlog_max_offset"]
        tail = [b"third-%04d" % i for i in range(50)]
        _send(group, tail)
        tail_end = group.info(victim)["commitlog_max_offset"]  # the leader applied it to answer
        group.c.procs[f"m{victim}"].kill9()
        group.c.procs[f"m{victim}"].start()
        ha = group.info(victim)["ha"]
        assert ha["recovered_applied_index"] >= claimed
        assert ha["recovery_cut_bytes"] <= tail_end - claimed_end, (
            "more than the tail since the last claim was applied again"
        )
        _all_applied(group)
        _readable_once(group, sent + more + tail)
        assert_identical_logs(group)
    finally:
        group.close()
