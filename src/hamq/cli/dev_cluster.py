"""``hamq dev --mode cluster``: seed 003's picture, a cluster of nodes ready for policies.
Name servers embed the controller peers; each node is a broker container with a node name
(``hamq@node1`` ...) and no members of its own: the controller's placement driver adds the
members of each policy's group (``hamq admin set-policy``) to the nodes the policy names.

Nodes are declared dead after ``DEV_NODE_HEARTBEAT_TIMEOUT_MS`` without a heartbeat (they
send one every ``DEV_NODE_HEARTBEAT_INTERVAL_MS``), so ``exactly N`` replaces a killed
node's mirror within a few seconds rather than the production default's five."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from hamq.cli.dev_container import CONTAINER_PORT_OFFSET
from hamq.cli.dev_controller import ControllerLayout, poll_until
from hamq.client.controller import ControllerClient

DEV_NODE_HEARTBEAT_INTERVAL_MS = 300
DEV_NODE_HEARTBEAT_TIMEOUT_MS = 2000
DEV_PLACEMENT_INTERVAL_MS = 300
READY_TIMEOUT_S = 60.0  # every node started and registered with the controller leader


def node_name(index: int) -> str:
    """Node ``index`` (from 1) as RabbitMQ names a node: ``hamq@node1``."""
    return f"hamq@node{index}"


# What each controller peer adds in cluster mode: it places policy groups quickly.
PEER_SETTINGS = {
    "node_heartbeat_timeout_ms": DEV_NODE_HEARTBEAT_TIMEOUT_MS,
    "placement_interval_ms": DEV_PLACEMENT_INTERVAL_MS,
}


def node_settings(
    port_base: int, root: Path, namesrv: list[str], layout: ControllerLayout, nodes: int
) -> dict[str, dict]:
    """Each node's container config: name (``node1`` ...) -> settings. The members the
    placement driver adds keep their stores under the node's own directory."""
    return {
        f"node{index}": node_config(
            index,
            f"127.0.0.1:{port_base + CONTAINER_PORT_OFFSET + index}",
            root / f"node{index}",
            namesrv,
            layout,
        )
        for index in range(1, nodes + 1)
    }


def node_config(
    index: int, listen: str, store_root: Path, namesrv: list[str], layout: ControllerLayout
) -> dict:
    """Node ``index``'s container config on ``listen`` (the chaos suite puts each node on a
    host of its own)."""
    return {
        "listen": listen,
        "namesrv": namesrv,
        "brokers": [],
        "store_root": str(store_root),
        "node_name": node_name(index),
        "controller_addr": layout.addrs,
        "node_heartbeat_interval_ms": DEV_NODE_HEARTBEAT_INTERVAL_MS,
    }


async def wait_nodes_alive(
    controller: ControllerClient, names: set[str], timeout_s: float
) -> list[dict]:
    """The controller's node list once every node of ``names`` is registered and alive,
    polled until ``timeout_s``; TimeoutError names what was missing."""

    async def check() -> tuple[list[dict] | None, object]:
        nodes = await controller.list_nodes()
        alive = {n["node"] for n in nodes if n["alive"]}
        return (nodes, None) if names <= alive else (None, f"alive: {sorted(alive)}")

    return await poll_until(check, timeout_s, f"nodes {sorted(names)} not all alive")


def cluster_ready(
    layout: ControllerLayout,
    nodes: dict[str, dict],
    pids: dict[str, int],
    timeout_s: float = READY_TIMEOUT_S,
) -> dict:
    """``hamq dev``'s ready line in cluster mode, once every node is registered alive: the
    controller peers (which one leads Raft) and the nodes (name, address, pid)."""

    async def ask() -> dict:
        controller = ControllerClient(layout.addrs)
        try:
            await wait_nodes_alive(controller, {s["node_name"] for s in nodes.values()}, timeout_s)
            return await controller.metadata()
        finally:
            await controller.close()

    try:
        meta = asyncio.run(ask())
    except TimeoutError as err:
        raise click.ClickException(f"{err}; see the logs") from None
    return {
        "controllers": layout.ready_peers(pids, meta.get("leader_id")),
        "nodes": [
            {"name": s["node_name"], "address": s["listen"], "pid": pids[s["listen"]]}
            for s in nodes.values()
        ],
    }
