"""ControllerClient: how brokers and admin tools talk to the controller peers.

Only the controller's Raft leader decides, so a request goes to the peer last known to
lead; a follower answers CONTROLLER_NOT_LEADER naming the leader when it knows it, and the
client follows that hint, else tries the next peer. Retries are bounded by a count and by
the request's deadline; a peer's refusal (any other code) is raised as
``HamqError.for_code`` at once, since asking another peer would get the same answer.

A change whose answer was lost (the leader died, the request timed out) may have been
applied, and is asked again: every change is idempotent or carries the epochs it was
decided against, so the repeat gets the same grant or the refusal its stale epochs earn,
never a second change.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping
from typing import Any

from hamq.clock import monotonic_s
from hamq.controller.events import DeclareTopic
from hamq.controller.nodes import HostedMember, NodeHeartbeat
from hamq.controller.requests import (
    AlterSyncStateSetRequest,
    ApplyBrokerIdRequest,
    BrokerHeartbeat,
    BrokerShutdown,
    CleanBrokerDataRequest,
    ElectMasterRequest,
    ElectTrigger,
)
from hamq.errors import ConnectionLost, ControllerNotLeader, HamqError, RequestTimeout
from hamq.net.pool import ConnectionPool
from hamq.protocol import controller as wire
from hamq.protocol import controller_catalog as catalog
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame

# After asking every peer without finding the leader (an election is running), wait this
# long before the next round instead of spinning on refusals.
ROUND_PAUSE_S = 0.05
# A hung peer may hold one attempt at most this share of the request's budget, so the
# others are still tried before the deadline (but never less than this floor).
MIN_ATTEMPT_TIMEOUT_S = 0.2
# A heartbeat skips a peer that does not accept a connection this fast (it is sent every
# controller_heartbeat_interval_ms, a few hundred ms).
HEARTBEAT_CONNECT_TIMEOUT_S = 0.5
# A stopping member waits at most this long for each peer to take its shutdown notice.
SHUTDOWN_NOTICE_TIMEOUT_S = 1.0


class ControllerClient:
    """``addrs``: every controller peer's listen address (or one string split on ';')."""

    def __init__(
        self,
        addrs: str | Iterable[str],
        pool: ConnectionPool | None = None,
        timeout_s: float = 3.0,
    ) -> None:
        listed = addrs.split(";") if isinstance(addrs, str) else list(addrs)
        self.addrs = [a.strip() for a in listed if a.strip()]
        if not self.addrs:
            raise ValueError("at least one controller address (HOST:PORT) is required")
        self.timeout_s = timeout_s
        self._owns_pool = pool is None
        self.pool = pool if pool is not None else ConnectionPool(connect_timeout_s=timeout_s)
        self.leader: str | None = None  # the peer that answered last; tried first
        self._next = 0  # the next peer to try when no leader is known

    async def close(self) -> None:
        if self._owns_pool:
            await self.pool.close()

    # -- the one request loop --------------------------------------------------------------
    async def request(self, code: int, ext: dict[str, Any] | None = None) -> Frame:
        deadline = monotonic_s() + self.timeout_s
        attempt_s = max(self.timeout_s / len(self.addrs), MIN_ATTEMPT_TIMEOUT_S)
        last: HamqError = ConnectionLost(f"no controller peer of {self.addrs} answered")
        target = self.leader
        unhinted = 0  # attempts since the last hint or pause
        # Bounded by the deadline and by a count: every peer (and a hint) once per round,
        # a round per pause that fits in the timeout, whatever the peers answer.
        rounds = math.ceil(self.timeout_s / ROUND_PAUSE_S) + 1
        for _ in range(2 * len(self.addrs) * rounds):
            remaining = deadline - monotonic_s()
            if remaining <= 0:
                break
            if target is None:
                if unhinted >= len(self.addrs):
                    unhinted = 0
                    await asyncio.sleep(min(ROUND_PAUSE_S, remaining))
                target = self.addrs[self._next % len(self.addrs)]
                self._next += 1
                unhinted += 1
            addr, target = target, None
            try:
                frame = await self._ask(addr, code, ext, min(remaining, attempt_s))
            except (ConnectionLost, RequestTimeout, TimeoutError) as err:
                last = err if isinstance(err, HamqError) else RequestTimeout(f"{addr}: {err}")
                if self.leader == addr:
                    self.leader = None
                continue
            if frame.code == ResponseCode.CONTROLLER_NOT_LEADER:
                last = ControllerNotLeader(f"{addr}: {frame.remark}")
                hint = wire.leader_addr(frame.ext)
                self.leader = hint if hint != addr else None
                target = self.leader
                continue
            if frame.code != ResponseCode.SUCCESS:
                raise HamqError.for_code(frame.code, frame.remark)
            self.leader = addr
            return frame
        raise last

    async def _ask(
        self, addr: str, code: int, ext: dict[str, Any] | None, timeout_s: float
    ) -> Frame:
        conn = await asyncio.wait_for(self.pool.get(addr), timeout_s)
        return await conn.request(code, ext, timeout_s=timeout_s)

    # -- typed helpers -------------------------------------------------------------------------
    async def get_next_broker_id(self, cluster_name: str, broker_name: str) -> int:
        frame = await self.request(
            RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
            wire.group_key_ext((cluster_name, broker_name)),
        )
        return wire.next_broker_id(frame.ext)

    async def apply_broker_id(
        self,
        cluster_name: str,
        broker_name: str,
        broker_id: int,
        broker_addr: str,
        register_check_code: str,
    ) -> None:
        request = ApplyBrokerIdRequest(
            cluster_name, broker_name, broker_id, broker_addr, register_check_code
        )
        ext = wire.apply_broker_id_ext(request)
        await self.request(RequestCode.CONTROLLER_APPLY_BROKER_ID, ext)

    async def register_broker(
        self,
        cluster_name: str,
        broker_name: str,
        broker_id: int,
        broker_addr: str,
        epoch: int,
        max_offset: int,
        register_check_code: str,
    ) -> wire.ReplicaInfo:
        """``register_check_code``: the one ``broker_id`` was applied with (an address
        change is refused without it)."""
        who = BrokerHeartbeat(cluster_name, broker_name, broker_id, broker_addr, epoch, max_offset)
        frame = await self.request(
            RequestCode.CONTROLLER_REGISTER_BROKER,
            wire.register_broker_ext(who, register_check_code),
        )
        return wire.ReplicaInfo.from_ext(frame.ext)

    async def heartbeat(self, heartbeat: BrokerHeartbeat) -> None:
        """To every peer (each records it; only the leader acts on timeouts), oneway: a
        hung peer must not delay the heartbeats the others wait for. A peer that cannot
        be reached is skipped; the next heartbeat tries it again."""
        await self._to_every_peer(
            RequestCode.CONTROLLER_BROKER_HEARTBEAT, wire.broker_heartbeat_ext(heartbeat)
        )

    async def _to_every_peer(self, code: int, ext: dict[str, Any]) -> None:
        async def one(addr: str) -> None:
            try:
                conn = await asyncio.wait_for(self.pool.get(addr), HEARTBEAT_CONNECT_TIMEOUT_S)
            except (HamqError, TimeoutError):
                return
            conn.oneway(code, ext)

        await asyncio.gather(*(one(addr) for addr in self.addrs))

    async def elect_master(
        self,
        cluster_name: str,
        broker_name: str,
        broker_id: int | None = None,
        trigger: str = ElectTrigger.ADMIN.value,
        master_epoch: int | None = None,
    ) -> wire.ReplicaInfo:
        request = ElectMasterRequest(
            cluster_name, broker_name, ElectTrigger(trigger), broker_id, master_epoch
        )
        frame = await self.request(
            RequestCode.CONTROLLER_ELECT_MASTER, wire.elect_master_ext(request)
        )
        return wire.ReplicaInfo.from_ext(frame.ext)

    async def alter_sync_state_set(
        self,
        cluster_name: str,
        broker_name: str,
        master_id: int,
        master_epoch: int,
        sync_state_set: Iterable[int],
        sync_state_set_epoch: int,
    ) -> tuple[frozenset[int], int]:
        """The set and epoch now in force; ``ControllerFenced`` when the epochs are stale."""
        request = AlterSyncStateSetRequest(
            cluster_name,
            broker_name,
            master_id,
            master_epoch,
            frozenset(sync_state_set),
            sync_state_set_epoch,
        )
        frame = await self.request(
            RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, wire.alter_sync_state_set_ext(request)
        )
        return wire.sync_state_set_result(frame.ext)

    async def get_replica_info(self, cluster_name: str, broker_name: str) -> wire.ReplicaInfo:
        frame = await self.request(
            RequestCode.CONTROLLER_GET_REPLICA_INFO,
            wire.group_key_ext((cluster_name, broker_name)),
        )
        return wire.ReplicaInfo.from_ext(frame.ext)

    async def metadata(self) -> dict[str, Any]:
        """The answering peer's view: self_id, leader_id, leader_addr, term, is_leader,
        peers, commit_index, applied_index."""
        frame = await self.request(RequestCode.CONTROLLER_GET_METADATA_INFO, {})
        return dict(frame.ext)

    async def sync_state_data(self, broker_names: Iterable[str] = ()) -> list[dict[str, Any]]:
        frame = await self.request(
            RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, {"broker_names": list(broker_names)}
        )
        return catalog.list_result(catalog.answer(frame), "groups")

    async def clean_broker_data(
        self,
        cluster_name: str,
        broker_name: str,
        broker_ids: Iterable[int] = (),
        clean_living_broker: bool = False,
    ) -> None:
        request = CleanBrokerDataRequest(
            cluster_name, broker_name, frozenset(broker_ids), clean_living_broker
        )
        await self.request(RequestCode.CLEAN_BROKER_DATA, wire.clean_broker_data_ext(request))

    # -- the catalog of mirrored-queue policies (seed 003) ------------------------------------
    async def add_vhost(self, vhost: str) -> None:
        await self.request(RequestCode.CONTROLLER_ADD_VHOST, catalog.vhost_ext(vhost))

    async def delete_vhost(self, vhost: str) -> None:
        """Deletes the vhost with its policies and declared topics."""
        await self.request(RequestCode.CONTROLLER_DELETE_VHOST, catalog.vhost_ext(vhost))

    async def list_vhosts(self) -> list[str]:
        frame = await self.request(RequestCode.CONTROLLER_LIST_VHOSTS, {})
        return catalog.vhosts_result(catalog.answer(frame))

    async def set_policy(
        self,
        vhost: str,
        name: str,
        pattern: str,
        definition: Mapping[str, object],
        priority: int = 0,
        apply_to: str = "topics",
    ) -> None:
        """``definition`` as RabbitMQ writes it (``{"ha-mode": "exactly", "ha-params": 2}``);
        refused with the key it got wrong."""
        ext = catalog.set_policy_ext(vhost, name, pattern, definition, priority, apply_to)
        await self.request(RequestCode.CONTROLLER_SET_POLICY, ext)

    async def clear_policy(self, vhost: str, name: str) -> None:
        await self.request(RequestCode.CONTROLLER_CLEAR_POLICY, {"vhost": vhost, "name": name})

    async def list_policies(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """Each ``{vhost, name, pattern, apply_to, priority, definition}``."""
        frame = await self.request(RequestCode.CONTROLLER_LIST_POLICIES, {"vhost": vhost})
        return catalog.list_result(catalog.answer(frame), "policies")

    async def declare_topic(
        self,
        vhost: str,
        topic: str,
        home_node: str,
        exclusive: bool = False,
        queue_nums: int = 4,
        owner: str = "",
    ) -> None:
        """Declared again with the same arguments is a no-op; with others it is refused."""
        event = DeclareTopic(vhost, topic, home_node, exclusive, queue_nums, owner)
        await self.request(RequestCode.CONTROLLER_DECLARE_TOPIC, catalog.declare_topic_ext(event))

    async def delete_topic(self, vhost: str, topic: str, owner: str = "") -> None:
        """``owner``: the client connection deleting it ("" for an admin)."""
        ext = {"vhost": vhost, "topic": topic, "owner": owner}
        await self.request(RequestCode.CONTROLLER_DELETE_TOPIC, ext)

    async def list_topics(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """Each ``{vhost, name, wire_name, home_node, exclusive, queue_nums, owner, groups,
        policy}`` (``policy``: the effective policy's name or None)."""
        frame = await self.request(RequestCode.CONTROLLER_LIST_TOPICS, {"vhost": vhost})
        return catalog.list_result(catalog.answer(frame), "topics")

    async def register_node(self, name: str, address: str) -> None:
        ext = catalog.register_node_ext(name, address)
        await self.request(RequestCode.CONTROLLER_REGISTER_NODE, ext)

    async def node_heartbeat(
        self,
        name: str,
        address: str,
        members: Iterable[HostedMember],
        owners: Iterable[str] | None = None,
    ) -> None:
        """To every peer, oneway, like a member's heartbeat; ``owners``: the node's open
        declaring connections."""
        heartbeat = NodeHeartbeat(
            name, address, tuple(members), None if owners is None else frozenset(owners)
        )
        await self._to_every_peer(
            RequestCode.CONTROLLER_NODE_HEARTBEAT, catalog.node_heartbeat_ext(heartbeat)
        )

    async def list_nodes(self) -> list[dict[str, Any]]:
        """Each ``{node, address, alive, members: [{cluster_name, broker_name, broker_id,
        address}]}``."""
        frame = await self.request(RequestCode.CONTROLLER_LIST_NODES, {})
        return catalog.list_result(catalog.answer(frame), "nodes")

    async def broker_shutdown(
        self,
        cluster_name: str,
        broker_name: str,
        broker_id: int,
        epoch: int,
        timeout_s: float = SHUTDOWN_NOTICE_TIMEOUT_S,
    ) -> int:
        """Tell every peer this member is stopping cleanly, each answering within
        ``timeout_s`` (best effort: the member stops whatever they say); how many did."""
        ext = catalog.broker_shutdown_ext(
            BrokerShutdown(cluster_name, broker_name, broker_id, epoch)
        )

        async def one(addr: str) -> bool:
            try:
                await self._ask(addr, RequestCode.CONTROLLER_BROKER_SHUTDOWN, ext, timeout_s)
            except (HamqError, TimeoutError, OSError):
                return False
            return True

        told = await asyncio.gather(*(one(addr) for addr in self.addrs))
        return sum(told)

    async def get_placement(self) -> dict[str, Any]:
        """The placement driver's last plan and pending steps, as the leader answers them."""
        frame = await self.request(RequestCode.CONTROLLER_GET_PLACEMENT, {})
        return dict(wire.check_map(catalog.answer(frame), "answer"))
