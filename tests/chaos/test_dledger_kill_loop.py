"""kill -9 at whatever point of the Ready cycle a member happens to be (a persist, an
apply, the detached Raft-log flush, a checkpoint), over and over, under steady sends
(async flush: a process kill keeps the page cache): nothing acknowledged is lost, every
member ends with the same commit log, and each restart re-applies no more than its store
could have lost."""

from __future__ import annotations

import random
import time

import pytest
from test_dledger import MEMBERS, Group, SteadyProducer, consume_all

from helpers import wait_for

KILLS = 8
RUN_BETWEEN_KILLS_S = (0.2, 0.8)


@pytest.mark.slow
def test_members_killed_again_and_again_lose_nothing(cluster_factory):
    group = Group(cluster_factory)
    rng = random.Random(7)
    producer = SteadyProducer(group.c.namesrv)
    producer.start()
    try:
        for kill in range(KILLS):
            time.sleep(rng.uniform(*RUN_BETWEEN_KILLS_S))  # chaos: a random run between kills
            # mostly followers (a loop of restarts), every third kill the leader
            leader = group.leader()
            victim = leader if kill % 3 == 2 else rng.choice([m for m in MEMBERS if m != leader])
            proc = group.c.procs[f"m{victim}"]
            claimed = group.info(victim)["ha"]["claimed_applied_index"]
            proc.kill9()
            time.sleep(rng.uniform(0.0, 0.3))  # chaos: a random time down
            proc.start()
            # the claim was in the page cache, which a kill keeps: the restart resumes
            # from it or later, re-applying only what followed it
            assert group.info(victim)["ha"]["recovered_applied_index"] >= claimed
        wait_for(lambda: len(producer.acked) > 0, 20, "acknowledged sends")
    finally:
        producer.stop_flag.set()
        producer.join(10)
    try:
        group.leader()
        wait_for(lambda: "dl" in group.admin.master_addrs(), 15, "the leader's registration")
        acked = set(producer.acked)
        stored = wait_for(
            lambda: (lambda got: got if acked <= set(got) else None)(consume_all(group.c.namesrv)),
            30,
            "every acknowledged send readable",
        )
        assert all(stored.count(b) == 1 for b in acked), "an acknowledged send repeats"
        assert set(stored) <= producer.attempted, "a send appeared that was never made"
        wait_for(
            lambda: len({group.info(m)["commitlog_max_offset"] for m in MEMBERS}) == 1,
            30,
            "identical commit-log ends",
        )
    finally:
        group.close()
