"""Credit across a SyncStateSet shrink (issue 16, seed 003): a synchronised mirror frozen
(SIGSTOP) under a pipelined flood for longer than ``ha_max_time_slave_not_catchup_ms``.
Credit holds the producer back while the mirror holds every all-ack send; once the master
shrinks the set the waiting sends are confirmed, their credit comes back and the producer
goes on at full speed while the mirror is still frozen — RabbitMQ's publisher resumes once
the unresponsive mirror is dropped. After SIGCONT nothing acknowledged is lost. The send
timeout is long, so no answer comes from a timed-out wait: only the shrink releases it."""

from __future__ import annotations

import time

import pytest
from controller_group import MEMBERS, assert_acked_readable, module_group, read_all
from test_flow_control import CREDIT, WINDOW, Flood

from helpers import wait_for

NOT_CATCHUP_MS = 3000
SETTINGS = {
    "max_unconfirmed_bytes": CREDIT,
    "ha_max_time_slave_not_catchup_ms": NOT_CATCHUP_MS,
    "sync_flush_timeout_ms": 120_000,  # an all-ack wait ends by the shrink, not by timing out
}


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    with module_group(tmp_path_factory, "shrink", **SETTINGS) as g:
        yield g


def test_producers_resume_once_a_frozen_mirror_leaves_the_sync_state_set(group):
    master = group.master()
    mirror = sorted(m for m in MEMBERS if m != master)[0]
    flood = Flood(group.c.namesrv)
    flood.start()
    try:
        wait_for(lambda: len(flood.acks) >= 200, 60, "the flood under way")
        group.freeze(mirror)
        frozen_at = time.monotonic()
        wait_for(
            lambda: group.info(master).get("flow", {}).get("out_of_credit"),
            20,
            "the master out of credit",
        )
        wait_for(lambda: mirror not in group.sync_state_set(), 30, "the frozen mirror dropped")
        shrunk_at = time.monotonic()
        wait_for(
            lambda: flood.acked_between(shrunk_at, 1e18) >= 2 * WINDOW,
            30,
            "sends confirmed after the shrink, the mirror still frozen",
        )
        print(
            f"\nshrink after {shrunk_at - frozen_at:.1f} s frozen; "
            f"{flood.acked_between(shrunk_at, 1e18)} acks since"
        )
    finally:
        group.thaw(mirror)
    flood.finish()
    assert not flood.failed, f"sends failed: {flood.failed[:5]}"
    assert_acked_readable(flood.acks, read_all(group.c.namesrv))
