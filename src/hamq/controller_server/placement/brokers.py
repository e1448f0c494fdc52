"""The placement driver's requests to group masters and node containers, each bounded:
a hung broker or container costs one round of its group, never the driver. Where a group's
master is comes from the controller's own view at the moment of asking (its state and the
members' heartbeats), never from a plan."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from hamq.clock import monotonic_ms
from hamq.controller.core import ControllerCore
from hamq.controller.state import BrokerGroup
from hamq.controller_server.placement.checks import StepRefused
from hamq.controller_server.placement.cleanup import QueueState, topic_drained
from hamq.errors import HamqError, TopicNotExist
from hamq.net.pool import ConnectionPool
from hamq.policy.definition import wire_name
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame, unpack_body

# Every request the driver sends is bounded: a hung broker or container costs one round
# of its group, never the driver.
REQUEST_TIMEOUT_S = 5.0


class Brokers:
    """The mirror cluster's groups as the controller sees them, and requests to their
    masters and to the nodes' containers."""

    def __init__(self, core: ControllerCore, cluster: str) -> None:
        self.core = core
        self.cluster = cluster
        self.pool = ConnectionPool(connect_timeout_s=REQUEST_TIMEOUT_S)

    async def close(self) -> None:
        await self.pool.close()

    def alive(self, name: str) -> frozenset[int]:
        return self.core.liveness.alive((self.cluster, name), monotonic_ms())

    def group(self, name: str) -> BrokerGroup:
        group = self.core.state.groups.get((self.cluster, name))
        if group is None:
            raise StepRefused(f"group {name} is not known to the controller")
        return group

    def master_addr(self, name: str) -> str:
        group = self.group(name)
        alive = self.alive(name)
        if group.master_id is None or group.master_id not in alive:
            raise StepRefused(f"group {name} has no alive master")
        return group.members[group.master_id].address

    async def set_perm(self, vhost: str, topic: str, group: str, perm: int) -> None:
        decl = self.core.state.topics.get((vhost, topic))
        if decl is None:
            return  # deleted meanwhile: the next plan drops it
        ext = {
            "topic": wire_name(vhost, topic),
            "read_queue_nums": decl.queue_nums,
            "write_queue_nums": decl.queue_nums,
            "perm": perm,
        }
        await self.request(self.master_addr(group), RequestCode.UPDATE_AND_CREATE_TOPIC, ext)

    async def placement_drained(self, topic: str, group: str, queue_nums: int) -> bool:
        addr = self.master_addr(group)
        offsets = await self.offsets(addr)  # first: an offset read later only moves on
        return topic_drained(topic, await self.queues(addr, topic, queue_nums), offsets)

    async def offsets(self, addr: str) -> Mapping[str, Mapping[Any, int]]:
        """GET_ALL_CONSUMER_OFFSET's table: "topic@group" -> {queue id: offset}."""
        frame = await self.request(addr, RequestCode.GET_ALL_CONSUMER_OFFSET)
        return unpack_body(frame.body) or {}

    async def queues(self, addr: str, topic: str, queue_nums: int) -> list[QueueState]:
        queues = []
        for queue_id in range(queue_nums):
            ext = {"topic": topic, "queue_id": queue_id}
            low, high = await asyncio.gather(
                self.request(addr, RequestCode.GET_MIN_OFFSET, ext),
                self.request(addr, RequestCode.GET_MAX_OFFSET, ext),
            )
            queues.append(QueueState(queue_id, int(low.ext["offset"]), int(high.ext["offset"])))
        return queues

    async def delete_in(self, group: str, topic: str) -> None:
        """DELETE_TOPIC_IN_BROKER on the group's master; a topic it no longer has was
        deleted by an earlier attempt."""
        try:
            await self.request(
                self.master_addr(group), RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic}
            )
        except TopicNotExist:
            pass

    async def request(
        self,
        addr: str,
        code: int,
        ext: dict[str, Any] | None = None,
        body: bytes = b"",
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> Frame:
        conn = await self.pool.get(addr)
        frame = await conn.request(code, ext, body, timeout_s)
        if frame.code != ResponseCode.SUCCESS:
            raise HamqError.for_code(frame.code, frame.remark)
        return frame
