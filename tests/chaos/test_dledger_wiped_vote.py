"""A DLedger member whose disk was lost restarts empty, and must not vote until the group
vouches for it: its vote would elect a member missing messages that were acknowledged
with its copy counted (raft/node.py, "A member that started on an empty disk")."""

from __future__ import annotations

import shutil
import time

import pytest
from test_dledger import MEMBERS, Group, consume_all

import hamq
from hamq import Message, SendStatus
from helpers import wait_for

NO_LEADER_S = 4.0  # several election timeouts of the members' default


def _send(producer: hamq.Producer, body: bytes) -> None:
    assert producer.send(Message("Raft", body)).status is SendStatus.SEND_OK


@pytest.mark.slow
def test_a_wiped_member_does_not_elect_one_missing_acknowledged_messages(cluster_factory):
    group = Group(cluster_factory, flush_disk_type="sync")
    try:
        leader = group.leader()
        wiped, stale = (m for m in MEMBERS if m != leader)
        procs = {m: group.c.procs[f"m{m}"] for m in MEMBERS}
        acked = [b"both-%d" % i for i in range(5)] + [b"two-%d" % i for i in range(10)]
        with hamq.Producer(group.c.namesrv) as producer:
            for body in acked[:5]:
                _send(producer, body)
            wait_for(
                lambda: (
                    group.info(stale)["ha"]["applied_index"]
                    == group.info(leader)["ha"]["applied_index"]
                ),
                15,
                "all applied",
            )
            procs[stale].stop()
            for body in acked[5:]:  # held by the leader and 'wiped' only
                _send(producer, body)
        procs[leader].stop()
        procs[wiped].stop()
        shutil.rmtree(group.c.root / f"m{wiped}")
        procs[wiped].start()
        procs[stale].start()
        # 'stale' could lead only with the vote of the member that lost the messages
        deadline = time.monotonic() + NO_LEADER_S
        while time.monotonic() < deadline:
            for m in (wiped, stale):
                info = group.info(m)["ha"]
                assert not info["is_leader"], f"member {m} leads without the acked messages"
            time.sleep(0.2)
        procs[leader].start()
        group.leader()
        wait_for(lambda: "dl" in group.admin.master_addrs(), 15, "the leader's registration")
        wait_for(
            lambda: sorted(consume_all(group.c.namesrv)) == sorted(acked),
            20,
            "every acknowledged message readable",
        )
        wait_for(
            lambda: len({group.info(m)["commitlog_max_offset"] for m in MEMBERS}) == 1,
            20,
            "identical commit-log ends",
        )
    finally:
        group.close()
