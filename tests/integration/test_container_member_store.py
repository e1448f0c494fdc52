"""A node's ``member_store``: the member the placement driver puts on it runs with the
container's store settings (sync flush, small commit-log segments), though the driver's
ADD_BROKER names no store setting at all."""

from __future__ import annotations

import sys
from pathlib import Path

import hamq
from hamq import Message
from hamq.errors import HamqError
from hamq.policy.placement import group_for_node
from harness import Cluster
from helpers import free_port, wait_for

sys.path.insert(0, str(Path(__file__).parent))
from test_container import start_container
from test_placement_driver import ask, groups_of

NODE = "hamq@store1"
GROUP = group_for_node(NODE)
TOPIC = "member.store"
SEGMENT_BYTES = 64 * 1024
BODY = b"x" * 4096
WAIT_S = 40.0  # node registered, member placed, elected and routed


def test_a_placed_member_runs_with_the_containers_member_store(tmp_path):
    c = Cluster(tmp_path)
    try:
        controller = f"127.0.0.1:{free_port()}"
        c.start_embedded_controller("namesrv", controller, placement_interval_ms=300)
        (c.root / "store1").mkdir()
        start_container(
            c,
            "store1",
            [],
            node_name=NODE,
            controller_addr=[controller],
            store_root=str(c.root / "store1"),
            node_heartbeat_interval_ms=300,
            member_store={
                "flush_disk_type": "sync",
                "mapped_file_size_commitlog": SEGMENT_BYTES,
                "disk_min_free_bytes": 1024 * 1024,
            },
        )

        def declared() -> bool:
            try:  # refused until the node is registered (the topic's home)
                ask(controller, lambda client: client.declare_topic("/", TOPIC, NODE))
            except HamqError:
                return False
            return True

        wait_for(declared, WAIT_S, f"{TOPIC} declared on {NODE}")
        wait_for(lambda: groups_of(c.namesrv, TOPIC)[0] == {GROUP}, WAIT_S, f"{TOPIC} routed")
        count = 3 * SEGMENT_BYTES // len(BODY)
        with hamq.Producer(c.namesrv) as producer:
            stored = {producer.send(Message(TOPIC, BODY)).queue.broker_name for _ in range(count)}
        assert stored == {GROUP}

        with hamq.Admin(c.namesrv) as admin:
            info = admin.broker_runtime_info(admin.master_addrs()[GROUP])
        assert info["broker_name"] == GROUP and info["flush_disk_type"] == "sync"
        # 3 segments' worth of messages: closed segments of the container's size, not one
        # 256 MiB segment (BrokerConfig's default)
        segments = sorted((c.root / "store1" / GROUP / "commitlog").iterdir())
        assert len(segments) >= 3
        assert all(0 < seg.stat().st_size <= SEGMENT_BYTES for seg in segments)
        assert int(segments[1].name) <= SEGMENT_BYTES
    finally:
        c.stop_all()
