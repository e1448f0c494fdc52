"""Break-it tests of slave acting master (issue 15, seed 004) on real processes: faults the
builders' tests do not make. A master that is only paused (SIGSTOP past the name server's
``broker_not_active_timeout_ms``, then SIGCONT) never restarts, so the pre-online of its
start does not run again; meanwhile its slave acted. Stopped processes are resumed and
every process is stopped by its PID (tests/harness.py)."""

from __future__ import annotations

import os
import signal

from acting_cluster import ACTING, GROUP_A, GROUP_B, ActingCluster, keys_by_group

import hamq
from hamq import Message, MessageQueue
from hamq.client.consumer import PullStatus
from helpers import wait_for

DELAY_LEVEL = 3  # 10 s: due while A's master is paused


def test_paused_master_takes_the_outage_back_before_it_serves_again(cluster_factory):
    """A's master is frozen past its liveness timeout: the name server drops it, a1 acts,
    the group consumes everything through a1 and a delay message falls due and is
    delivered once, through B. Thawed, the master did not restart: it must still not
    serve its older offsets nor deliver the delay message a second time (into A), and
    while it is back a1 no longer acts."""
    per_queue, committed = 20, 5
    ac = ActingCluster(cluster_factory, {"PauseT": 2, "PauseDly": 1})
    a0 = ac.c.procs["a0"]
    paused = False
    try:
        mqs = [MessageQueue("PauseT", GROUP_A, q) for q in range(2)]
        for mq in mqs:
            ac.send_to(
                GROUP_A,
                [Message("PauseT", b"%d-%d" % (mq.queue_id, i)) for i in range(per_queue)],
                queue_id=mq.queue_id,
            )
        with hamq.PullConsumer("g-pause", ac.c.namesrv) as consumer:
            for mq in mqs:
                consumer.commit_offset(mq, committed)
        for mq in mqs:
            wait_for(
                lambda mq=mq: ac.consumer_offset(ACTING, "g-pause", mq) == committed,
                20,
                "a1 synced the offsets",
            )
        ac.send_to(GROUP_A, [Message("PauseDly", b"d", keys="dly", delay_level=DELAY_LEVEL)])
        ac.wait_replicated()

        os.kill(a0.pid, signal.SIGSTOP)
        paused = True
        wait_for(lambda: ac.routed_master("PauseT", GROUP_A) == ac.addr(ACTING), 20, "a1 routed")
        wait_for(lambda: ac.runtime(ACTING)["acting_master"]["acting"], 20, "a1 acting")
        with hamq.PullConsumer("g-pause", ac.c.namesrv) as consumer:
            for mq in mqs:
                offset = consumer.fetch_offset(mq)
                assert offset == committed
                while offset < per_queue:
                    result = consumer.pull(mq, offset, 8)
                    assert result.status is PullStatus.FOUND
                    offset = result.next_begin_offset
                    consumer.commit_offset(mq, offset)
        for mq in mqs:
            assert ac.consumer_offset(ACTING, "g-pause", mq) == per_queue
        wait_for(
            lambda: keys_by_group(ac.read_topic("PauseDly")).get(GROUP_B) == ["dly"],
            40,
            "the delay message delivered through B",
        )
        wait_for(
            lambda: int(ac.delay_offsets(ACTING).get(str(DELAY_LEVEL), 0)) >= 1,
            20,
            "a1's delay progress past it",
        )

        os.kill(a0.pid, signal.SIGCONT)
        paused = False
        wait_for(lambda: ac.routed_master("PauseT", GROUP_A) == ac.addr("a0"), 40, "a0 routed")
        # the master serves the outage's offsets (a consumer that restarts resumes there)
        for mq in mqs:
            assert ac.consumer_offset("a0", "g-pause", mq) == per_queue, (
                f"a0 answers {ac.consumer_offset('a0', 'g-pause', mq)} for {mq}: the offsets "
                f"committed on the acting member ({per_queue}) went back"
            )
        wait_for(
            lambda: "delay_delivery" in ac.runtime("a0")["role"]["services"],
            30,
            "a0's delay delivery running",
        )
        wait_for(
            lambda: int(ac.delay_offsets("a0").get(str(DELAY_LEVEL), 0)) >= 1,
            30,
            "a0's delay progress past the message",
        )
        delivered = keys_by_group(ac.read_topic("PauseDly"))
        assert not delivered.get(GROUP_A), f"delivered again by the thawed master: {delivered}"
        assert delivered.get(GROUP_B) == ["dly"], delivered
        wait_for(lambda: not ac.runtime(ACTING)["acting_master"]["acting"], 20, "a1 stops")
    finally:
        if paused:
            os.kill(a0.pid, signal.SIGCONT)
        ac.close()
