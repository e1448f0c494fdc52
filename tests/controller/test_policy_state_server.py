"""A real controller peer (``hamq controller``) keeps the catalog of mirrored-queue
policies: vhosts, policies, declared topics and nodes go over the wire and come back the
same, refusals name what is wrong, and everything survives a kill -9 and restart (from the
snapshot and the log after it). Node heartbeats and clean-shutdown notices are soft state."""

from __future__ import annotations

import asyncio

import pytest

from hamq.client.controller import ControllerClient
from hamq.controller.nodes import HostedMember
from hamq.errors import ControllerRefused, InvalidArgument
from helpers import free_port

NODE = "hamq@node1"
NODE_ADDR = f"127.0.0.1:{free_port()}"
MEMBER = HostedMember("hamq", "policy-group", 1, f"127.0.0.1:{free_port()}")
HA_TWO = {"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic"}
DEADLINE_S = 30.0


async def _eventually(read, want, what: str):
    """Poll ``read()`` (a controller answer; refusals while it starts) until it equals
    ``want``."""
    got = None
    for _ in range(int(DEADLINE_S / 0.1)):
        try:
            got = await read()
        except (ControllerRefused, OSError, TimeoutError) as err:
            got = err
        if got == want:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: {got!r}, wanted {want!r}")


async def _catalog(client: ControllerClient) -> tuple:
    return (
        await client.list_vhosts(),
        await client.list_policies(),
        await client.list_topics(),
        [(n["node"], n["address"]) for n in await client.list_nodes()],  # liveness is soft
    )


def test_the_catalog_round_trips_and_survives_a_restart(cluster_factory):
    cluster = cluster_factory()
    addr = f"127.0.0.1:{free_port()}"
    proc = cluster.start_controller(
        "controller1",
        addr,
        controller_election_timeout_ms=300,
        controller_snapshot_interval_entries=3,
        node_heartbeat_timeout_ms=2000,
    )

    async def scenario():
        client = ControllerClient([addr], timeout_s=5.0)
        try:
            await _eventually(client.list_vhosts, ["/"], "a fresh controller's vhosts")
            await client.add_vhost("v1")
            await client.register_node(NODE, NODE_ADDR)
            await client.set_policy("/", "ha-two", "^two\\.", HA_TWO, priority=1)
            await client.set_policy("v1", "ha-all", ".*", {"ha-mode": "all"}, apply_to="queues")
            await client.declare_topic("/", "two.orders", NODE)
            await client.declare_topic("v1", "x", NODE, exclusive=True, queue_nums=2, owner="c1")
            await client.declare_topic("/", "two.orders", NODE)  # again alike: a no-op

            with pytest.raises(ControllerRefused, match="vhost 'v9' does not exist"):
                await client.set_policy("v9", "p", ".*", {"ha-mode": "all"})
            with pytest.raises(InvalidArgument, match="ha-sync-mode"):
                await client.set_policy("/", "p", ".*", {"ha-mode": "all", "ha-sync-mode": "x"})
            with pytest.raises(InvalidArgument, match="'home_node'"):
                await client.declare_topic("/", "t", "not a node")
            with pytest.raises(ControllerRefused, match="already declared"):
                await client.declare_topic("/", "two.orders", NODE, queue_nums=8)
            with pytest.raises(ControllerRefused, match="is not declared"):
                await client.delete_topic("/", "nope")

            assert await client.list_policies("/") == [
                {
                    "vhost": "/",
                    "name": "ha-two",
                    "pattern": "^two\\.",
                    "apply_to": "topics",
                    "priority": 1,
                    "definition": HA_TWO,
                }
            ]
            (topic,) = await client.list_topics("/")
            assert (topic["name"], topic["wire_name"], topic["policy"]) == (
                "two.orders",
                "two.orders",
                "ha-two",
            )
            (exclusive,) = await client.list_topics("v1")
            assert (exclusive["wire_name"], exclusive["owner"], exclusive["policy"]) == (
                "v1%x",
                "c1",
                "ha-all",
            )

            # a node's heartbeat (oneway) makes it alive with the members it hosts
            await client.node_heartbeat(NODE, NODE_ADDR, [MEMBER])
            alive = [
                {
                    "node": NODE,
                    "address": NODE_ADDR,
                    "alive": True,
                    "members": [
                        {
                            "cluster_name": "hamq",
                            "broker_name": "policy-group",
                            "broker_id": 1,
                            "address": MEMBER.address,
                        }
                    ],
                }
            ]
            await _eventually(client.list_nodes, alive, "the node after its heartbeat")
            # a shutdown notice is taken by every peer (here the one)
            assert await client.broker_shutdown("hamq", "policy-group", 1, 1) == 1

            await client.delete_topic("v1", "x")
            before = await _catalog(client)
            assert before[0] == ["/", "v1"] and len(before[1]) == 2 and len(before[2]) == 1
        finally:
            await client.close()

        proc.kill9()
        proc.start()  # its snapshot (every 3 entries) and the log after it
        client = ControllerClient([addr], timeout_s=5.0)
        try:
            await _eventually(lambda: _catalog(client), before, "the catalog after a restart")
            (node,) = await client.list_nodes()
            assert node["alive"] is False and node["members"] == []  # soft state: not kept
        finally:
            await client.close()

    asyncio.run(scenario())


def test_a_master_stopped_by_sigterm_tells_the_controller_before_it_stops(cluster_factory):
    """The broker side of CONTROLLER_BROKER_SHUTDOWN: a controller-mode master's clean stop
    leaves its epoch in the controller's shutdown notices (what the policy's
    ha-promote-on-shutdown is judged by); a slave's would not."""
    cluster = cluster_factory()
    cluster.start_namesrv(enable_controller_in_namesrv=True, controller_heartbeat_timeout_ms=3000)
    broker = cluster.start_broker(
        "solo",
        broker_name="solo",
        enable_controller_mode=True,
        controller_addr=cluster.namesrv_addrs,
        controller_heartbeat_interval_ms=300,
        sync_broker_metadata_period_ms=500,
    )

    async def group() -> dict | None:
        client = ControllerClient(cluster.namesrv_addrs, timeout_s=2.0)
        try:
            (found,) = await client.sync_state_data(["solo"])
            return found
        except (ControllerRefused, OSError, TimeoutError, ValueError):
            return None
        finally:
            await client.close()

    async def scenario():
        for _ in range(int(DEADLINE_S / 0.2)):
            elected = await group()
            if elected and elected["master_id"] is not None:
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("the member was never elected")
        assert elected["shutdown_epoch"] is None
        broker.stop()  # SIGTERM, waits for the process to exit
        stopped = await group()
        assert stopped is not None
        assert stopped["shutdown_epoch"] == elected["master_epoch"] >= 1

    asyncio.run(scenario())
