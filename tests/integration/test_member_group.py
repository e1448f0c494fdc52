"""A restarted name server knows nobody until the brokers register again, and answers
GET_BROKER_MEMBER_GROUP with an empty group (issue 10, defect 5). With two name servers,
that answer must neither lower the master's alive replica count (auto-degradation would
lower needAckNums) nor clear the master's HA address on the slave (which would close its
replication session)."""

from __future__ import annotations

import time

import hamq
from helpers import wait_for

SYNC_PERIOD_MS = 200
WATCH_S = 3.0  # fifteen member-group polls by each broker
GROUP = {"total_replicas": 2, "sync_broker_member_group_period_ms": SYNC_PERIOD_MS}


# (master's alive replicas, its slaves' HA states, the slave's HA state) when all is well
WHOLE = (2, ["TRANSFER"], "TRANSFER")


def _view(admin: hamq.Admin, c) -> tuple:
    master = admin.broker_runtime_info(c.broker_addr("master"))
    slave = admin.broker_runtime_info(c.broker_addr("slave"))
    return (
        master["alive_replicas"],
        [s["state"] for s in master["ha"]["slaves"]],
        slave["ha"]["state"],
    )


def test_restarted_name_server_lowers_no_alive_count_and_disconnects_no_slave(cluster_factory):
    c = cluster_factory()
    for name in ("ns1", "ns2"):
        c.start_namesrv(
            name, scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=3000
        )
    c.start_broker(
        "master",
        broker_role="sync_master",
        in_sync_replicas=2,
        min_in_sync_replicas=1,
        enable_auto_in_sync_replicas=True,
        **GROUP,
    )
    c.start_broker("slave", broker_id=1, broker_role="slave", **GROUP)
    with hamq.Admin(c.namesrv) as admin:
        wait_for(lambda: _view(admin, c) == WHOLE, 15, "the slave replicating, both alive")
        # the first name server in every broker's list forgets the group; the brokers
        # register again only every register_broker_interval_ms (30 s)
        c.restart("ns1")
        with hamq.Admin(c.namesrv_addrs[0]) as ns1:
            assert ns1.cluster_info()["broker_addr_table"] == {}
        watch_until = time.monotonic() + WATCH_S
        while time.monotonic() < watch_until:
            assert _view(admin, c) == WHOLE
            time.sleep(0.05)
