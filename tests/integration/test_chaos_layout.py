"""Each replication mode's chaos layout on real hosts (network namespaces where this machine
has them): it starts, becomes healthy, takes topics, serves a send and its read through
hamq's client, survives a kill -9 of its master (started again, healthy again), and stops
every process it started."""

from __future__ import annotations

import os

import pytest

import hamq
from hamq import Message, SendStatus
from hamq.chaos.cluster import Cluster
from hamq.chaos.disk_faults import DiskFaults
from hamq.chaos.hosts import make_hosts
from hamq.chaos.layout import MODES, layout_for
from hamq.client.consumer import PullStatus
from helpers import pid_alive

pytestmark = pytest.mark.slow

HEALTHY_S = 60.0  # the first start of six processes on a loaded 2-core machine
TOPICS = {"chaos-normal": 2}
CONFIRM_S = 10.0  # a mirrored send waits for every synchronised mirror


@pytest.fixture
def run(tmp_path, request):
    """Hosts and disks of one run, removed afterwards whatever happened."""
    mode, proxied = request.param
    hosts = make_hosts(f"lt{os.getpid() % 10000}{MODES.index(mode)}{int(proxied)}")
    disks = DiskFaults(tmp_path)
    cluster = Cluster(layout_for(mode, proxied), hosts, disks, tmp_path)
    try:
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            disks.close()
            hosts.close()


def send_and_read(cluster: Cluster, tag: bytes) -> None:
    """One send acknowledged SEND_OK and read back at the offset its answer named."""
    with hamq.Producer(cluster.namesrv, send_timeout_s=CONFIRM_S) as producer:
        result = producer.send(Message("chaos-normal", tag))
    assert result.status is SendStatus.SEND_OK
    with hamq.PullConsumer("layout-check", cluster.namesrv) as consumer:
        got = consumer.pull(result.queue, result.queue_offset, 1)
    assert got.status is PullStatus.FOUND
    assert got.messages[0].body == tag


@pytest.mark.parametrize("run", [(m, False) for m in MODES], ids=MODES, indirect=True)
def test_layout_starts_fails_over_and_stops(run):
    cluster = run
    layout = cluster.layout
    assert layout.promise and "\n" not in layout.promise
    assert all(len(cluster.processes_on(h)) == 1 for h in layout.hosts), "one process a host"
    cluster.start()
    cluster.wait_healthy(HEALTHY_S)
    cluster.create_topics(TOPICS)
    cluster.wait_healthy(HEALTHY_S)  # mirrored: the topics' group is placed and whole
    send_and_read(cluster, b"before")

    groups = cluster.members()
    copies = 1 if layout.mode == "single" else 3
    assert groups and all(len(ms) == copies for ms in groups.values())
    committed = cluster.committed_offsets()
    assert set(committed) == set(groups) and all(c > 0 for c in committed.values())
    for group, logs in cluster.member_logs().items():
        assert set(logs) == set(groups[group])
        assert all(any(path.iterdir()) for path in logs.values()), f"{group}'s commit logs"

    (group, master), *_ = cluster.masters().items()
    old_pid = cluster.pid(master)
    cluster.kill9(master)
    assert not cluster.is_running(master) and not pid_alive(old_pid)
    cluster.start_process(master)
    assert cluster.pid(master) != old_pid
    cluster.wait_healthy(HEALTHY_S)
    send_and_read(cluster, b"after")

    pids = [cluster.pid(p) for p in layout.processes]
    cluster.stop()
    assert not [p for p in pids if pid_alive(p)], "a process outlived stop()"


@pytest.mark.parametrize(
    "run", [("controller", True), ("dledger", True)], ids=["controller", "dledger"], indirect=True
)
def test_proxied_layout_routes_every_link_through_its_proxies(run):
    """Proxied: clients, members, controller peers and Raft peers all reach each other
    through the FrameProxies (where the loss nemesis works), none directly."""
    cluster = run
    cluster.start()
    cluster.wait_healthy(HEALTHY_S)
    cluster.create_topics(TOPICS)
    send_and_read(cluster, b"proxied")
    assert all(a.startswith(cluster.hosts.client_address) for a in cluster.namesrv.split(";"))
    used = {n for n, proxy in cluster.proxies.items() if proxy.counts("up").forwarded}
    master = cluster.masters()["broker-a"]
    want = {f"{master}/client"} | {f"{p}/namesrv" for p in cluster.layout.namesrvs}
    if cluster.layout.mode == "dledger":
        want |= {f"{p}/dledger" for p in cluster.layout.groups["broker-a"] if p != master}
    else:  # the slaves copy the master's log through its HA proxy
        want.add(f"{master}/ha")
    assert want <= used, f"links not through their proxies: {sorted(want - used)}"
