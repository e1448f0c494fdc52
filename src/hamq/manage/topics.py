"""Declaring a topic in a cluster with nodes (seed 003): through a node, the topic's home,
which asks the controller; the placement driver then puts it in its policy's group (or in
its home node's own). ``hamq admin declare-topic`` and the web API's ``PUT /api/topics``
declare here. A topic created on the masters instead (RocketMQ's updateTopic) is not
declared there, so the placement driver collects it as a stray."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from hamq.client.admin import AsyncAdmin, AsyncControllerAdmin
from hamq.clock import monotonic_s
from hamq.errors import InvalidArgument, ServiceNotAvailable, TopicNotExist
from hamq.manage.queues import node_request
from hamq.protocol.codes import RequestCode
from hamq.protocol.controller_catalog import check_topic

DECLARE_TIMEOUT_S = 10.0
PLACED_POLL_S = 0.2


def declaring_node(nodes: Iterable[Mapping[str, Any]], name: str | None) -> Mapping[str, Any]:
    """The node (a ``list_nodes`` row) to declare through: the one called ``name``, else
    the first alive node by name; one that is not alive cannot take the declaration."""
    rows = sorted(nodes, key=lambda n: n["node"])
    if name is None:
        alive = [n for n in rows if n["alive"]]
        if not alive:
            raise ServiceNotAvailable("no node is alive to declare the topic through")
        return alive[0]
    found = next((n for n in rows if n["node"] == name), None)
    if found is None:
        known = ", ".join(n["node"] for n in rows) or "none"
        raise InvalidArgument(f"no node named {name!r} (nodes: {known})")
    if not found["alive"]:
        raise ServiceNotAvailable(f"node {name} is not alive to declare the topic through")
    return found


async def declare_topic(node_addr: str, vhost: str, name: str, queue_nums: int) -> dict:
    """DECLARE_TOPIC through the node at ``node_addr`` (not exclusive): the declaration as
    the controller took it (declared again alike, a no-op)."""
    check_topic(vhost, name)
    return await node_request(
        node_addr,
        RequestCode.DECLARE_TOPIC,
        {"vhost": vhost, "topic": name, "exclusive": False, "queue_nums": queue_nums},
        DECLARE_TIMEOUT_S,
    )


async def wait_placed(
    controllers: AsyncControllerAdmin,
    namesrv: AsyncAdmin,
    vhost: str,
    name: str,
    timeout_s: float,
) -> list[str] | None:
    """The groups holding the declared topic once one holds it and the name servers route
    it (a client can send to it then), or None if that took longer than ``timeout_s``.
    ``namesrv`` names topics in ``vhost``."""
    deadline = monotonic_s() + timeout_s
    while True:
        topics = await controllers.client.list_topics(vhost)
        row = next((t for t in topics if t["name"] == name), None)
        if row is None:  # deleted while it was being placed
            raise TopicNotExist(f"no topic {name} in vhost {vhost}")
        if row["groups"] and await _routed(namesrv, name):
            return list(row["groups"])
        if monotonic_s() >= deadline:
            return None
        await asyncio.sleep(PLACED_POLL_S)


async def _routed(namesrv: AsyncAdmin, name: str) -> bool:
    try:
        await namesrv.topic_route_raw(name)
    except TopicNotExist:
        return False
    return True
