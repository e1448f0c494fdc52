"""A DLedger follower rebuilt with an empty disk catches up at low traffic (issue 10,
defect 3): the leader's watermark still says it holds everything it acknowledged, and
resending from there could never continue its empty log; it must be found out and
brought back within seconds, not after hundreds of sends or never."""

from __future__ import annotations

import shutil
import time

import pytest
from test_dledger import MEMBERS, Group

import hamq
from hamq import Message, SendStatus
from helpers import wait_for

SLOW_SENDS = 5
SEND_GAP_S = 0.3  # pacing: sends keep coming while the emptied follower restarts
CATCH_UP_S = 10.0


def _ha(group: Group, member: int) -> dict:
    return group.admin.broker_runtime_info(group.c.broker_addr(f"m{member}"))["ha"]


def _send(producer: hamq.Producer, body: bytes) -> None:
    assert producer.send(Message("Raft", body)).status is SendStatus.SEND_OK


@pytest.mark.slow
def test_follower_rebuilt_with_an_empty_disk_catches_up_at_low_traffic(cluster_factory):
    group = Group(cluster_factory)  # members flush the default way: async
    try:
        with hamq.Producer(group.c.namesrv) as producer:
            for i in range(20):
                _send(producer, b"before-%d" % i)
            leader = group.leader()
            follower = next(m for m in MEMBERS if m != leader)
            # it has acknowledged and applied everything so far
            wait_for(
                lambda: (
                    _ha(group, follower)["applied_index"] == _ha(group, leader)["applied_index"]
                ),
                15,
                "the follower applying it all",
            )
            proc = group.c.procs[f"m{follower}"]
            proc.stop()
            shutil.rmtree(group.c.root / f"m{follower}")
            proc.start()
            for i in range(SLOW_SENDS):
                _send(producer, b"after-%d" % i)
                time.sleep(SEND_GAP_S)
        assert group.leader() == leader

        def caught_up():
            led, fol = _ha(group, leader), _ha(group, follower)
            return fol["applied_index"] == led["applied_index"] == led["committed_index"]

        wait_for(caught_up, CATCH_UP_S, "the rebuilt follower to hold the committed log again")
        ends = {
            m: group.admin.broker_runtime_info(group.c.broker_addr(f"m{m}"))["commitlog_max_offset"]
            for m in (leader, follower)
        }
        assert ends[leader] == ends[follower], ends
    finally:
        group.close()
