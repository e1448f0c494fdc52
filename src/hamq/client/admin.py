"""The asyncio admin clients: topics, cluster state, broker runtime info, topics declared
through a node (``AsyncAdmin``); the controller's groups and peers
(``AsyncControllerAdmin``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from hamq.client.consumer import AsyncPullConsumer
from hamq.client.controller import ControllerClient
from hamq.client.core import DEFAULT_TIMEOUT_S, MASTER_ID, ClientCore, TopicRoute
from hamq.client.message import MessageExt, MessageQueue
from hamq.clock import monotonic_s
from hamq.errors import (
    BrokerNotFound,
    HamqError,
    NoPermission,
    NotLeader,
    QueryNotFound,
    ServiceNotAvailable,
    TopicNotExist,
)
from hamq.net.connection import Connection, connect
from hamq.net.tasks import PeriodicTask, spawn
from hamq.policy.definition import DEFAULT_VHOST
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import check_int, unpack_body
from hamq.protocol.message import decode_records, offset_msg_id, parse_offset_msg_id
from hamq.store.metadata import PERM_READ_WRITE

# An exclusive declaration's connection says it is alive this often: the node closes a
# connection idle for connection_idle_timeout_ms (120 s by default), and that would
# delete the topic.
EXCLUSIVE_KEEPALIVE_S = 30.0
# A key query scans up to max_scan messages per queue on each broker group.
QUERY_MESSAGE_TIMEOUT_S = 30.0
# The group a one-message browse pull names (RocketMQ's TOOLS_CONSUMER); it commits nothing.
TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"


class DeclaredTopic:
    """A topic declared through a node. An exclusive one lives as long as the connection
    that declared it: ``close()`` (or leaving the ``with`` / ``async with`` block) closes
    that connection, and the node deletes the topic. A durable one holds no connection of
    its own; closing it changes nothing. ``close()`` may be called from any thread."""

    def __init__(
        self, vhost: str, topic: str, answer: dict[str, Any], conn: Connection | None = None
    ) -> None:
        self.vhost = vhost
        self.topic = topic
        self.answer = answer  # the controller's answer to the declaration
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self._keepalive = (
            None
            if conn is None
            else PeriodicTask(
                f"keepalive of exclusive topic {topic}",
                EXCLUSIVE_KEEPALIVE_S,
                self._ping,
                errors=(HamqError,),  # the node gone: closing the connection says it all
            )
        )
        if self._keepalive is not None:
            self._keepalive.start()

    @property
    def exclusive(self) -> bool:
        return self._conn is not None

    async def _ping(self) -> None:
        assert self._conn is not None
        await self._conn.request(RequestCode.HEART_BEAT, timeout_s=DEFAULT_TIMEOUT_S)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._close)

    def _close(self) -> None:
        if self._keepalive is not None:
            spawn(self._keepalive.stop())
        if self._conn is not None:
            self._conn.close()

    def __enter__(self) -> DeclaredTopic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> DeclaredTopic:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class AsyncAdmin:
    """``core`` lets another client share its connections, routes and vhost. Topic and
    group names are the admin's vhost's (``vhost``, default ``/``)."""

    def __init__(
        self,
        namesrv: str | Iterable[str] = (),
        timeout_s: float = 3.0,
        core: ClientCore | None = None,
        vhost: str = DEFAULT_VHOST,
    ) -> None:
        self.core = core or ClientCore(namesrv, timeout_s, vhost=vhost)

    async def close(self) -> None:
        await self.core.close()

    async def cluster_info(self) -> dict:
        frame = await self.core.invoke_namesrv(RequestCode.GET_BROKER_CLUSTER_INFO)
        return unpack_body(frame.body)

    async def master_addrs(self, cluster: str | None = None) -> dict[str, str]:
        """Broker group name -> master address, for one cluster or all."""
        info = await self.cluster_info()
        masters = {}
        for name, entry in info["broker_addr_table"].items():
            addrs = {int(k): v for k, v in entry["broker_addrs"].items()}
            if (cluster is None or entry["cluster"] == cluster) and MASTER_ID in addrs:
                masters[name] = addrs[MASTER_ID]
        return masters

    async def read_addrs(self) -> dict[str, str]:
        """Broker group name -> the member to read its state from: the master, or with
        none the smallest-id member (RocketMQ's ``selectBrokerAddr``; the acting master of
        seed 004 when the group enabled it)."""
        info = await self.cluster_info()
        return {
            name: addrs[min(addrs)]
            for name, entry in info["broker_addr_table"].items()
            if (addrs := {int(k): v for k, v in entry["broker_addrs"].items()})
        }

    async def create_topic(
        self,
        topic: str,
        queue_nums: int = 4,
        perm: int = PERM_READ_WRITE,
        cluster: str | None = None,
        wait_s: float = 5.0,
        write_queue_nums: int | None = None,
    ) -> dict[str, str]:
        """Create (or update) ``topic`` on every master of ``cluster`` (RocketMQ's
        ``updateTopic -c``), ``queue_nums`` read queues and as many write queues unless
        ``write_queue_nums`` says otherwise; waits until the name servers route it."""
        topic = self.core.wire(topic)
        write_queue_nums = queue_nums if write_queue_nums is None else write_queue_nums
        masters = await self.master_addrs(cluster)
        if not masters:
            raise BrokerNotFound(
                f"no master broker registered{f' in cluster {cluster}' if cluster else ''}"
            )
        ext = {
            "topic": topic,
            "read_queue_nums": queue_nums,
            "write_queue_nums": write_queue_nums,
            "perm": perm,
        }
        await asyncio.gather(
            *(
                self.core.invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
                for addr in masters.values()
            )
        )
        deadline = monotonic_s() + wait_s
        while True:
            try:
                route = await self.core.route(topic, refresh=True)
                if {q.broker_name for q in route.write_queues} >= set(masters) and len(
                    route.write_queues
                ) >= write_queue_nums * len(masters):
                    break
            except TopicNotExist:
                pass
            if monotonic_s() > deadline:
                break
            await asyncio.sleep(0.05)
        return masters

    async def delete_topic(self, topic: str) -> None:
        """Delete ``topic`` on every member of every group that has it, then on the name
        servers. A DLedger follower answers NOT_LEADER (it applies the delete from its
        group's log) and a slave NO_PERMISSION (it copies its master's topic table), so
        only the master or leader (brokerId 0) must take it."""
        topic = self.core.wire(topic)
        route = await self.core.route(topic, refresh=True)
        members = [
            (broker_id, addr) for ids in route.brokers.values() for broker_id, addr in ids.items()
        ]
        results = await asyncio.gather(
            *(
                self.core.invoke(addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})
                for _, addr in members
            ),
            return_exceptions=True,
        )
        for (broker_id, _), result in zip(members, results):
            if isinstance(result, (NotLeader, NoPermission)) and broker_id != MASTER_ID:
                continue
            if isinstance(result, BaseException):
                raise result
        await asyncio.gather(
            *(
                self.core.invoke(addr, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic})
                for addr in self.core.namesrv
            )
        )

    async def topic_route(self, topic: str) -> TopicRoute:
        """The route of ``topic`` in the admin's vhost (its queues name the wire topic)."""
        return await self.core.route(self.core.wire(topic), refresh=True)

    async def topic_route_raw(self, topic: str) -> dict:
        frame = await self.core.invoke_namesrv(
            RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": self.core.wire(topic)}
        )
        return unpack_body(frame.body)

    async def topic_list(self) -> list[str]:
        """Every topic the name servers route; outside ``/`` only the vhost's, by their
        names there."""
        frame = await self.core.invoke_namesrv(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        return self._in_vhost(unpack_body(frame.body))

    async def broker_runtime_info(self, addr: str) -> dict:
        frame = await self.core.invoke(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
        return unpack_body(frame.body)

    async def topic_offsets(self, topic: str) -> list[dict]:
        """Per queue: broker, queue id, min and max offset (``topicStatus``)."""
        route = await self.topic_route(topic)

        async def row(mq: MessageQueue) -> dict:
            addr = route.read_addr(mq.broker_name)
            ext = {"topic": mq.topic, "queue_id": mq.queue_id}
            lo, hi = await asyncio.gather(
                self.core.invoke(addr, RequestCode.GET_MIN_OFFSET, ext),
                self.core.invoke(addr, RequestCode.GET_MAX_OFFSET, ext),
            )
            return {
                "broker_name": mq.broker_name,
                "queue_id": mq.queue_id,
                "min_offset": lo.ext["offset"],
                "max_offset": hi.ext["offset"],
            }

        return list(await asyncio.gather(*(row(mq) for mq in route.read_queues)))

    async def consumer_progress(self, group: str) -> list[dict]:
        """Per queue the group has committed on: the broker's max offset, the group's
        offset and the lag between them (RocketMQ's ``consumerProgress``)."""
        rows = []
        group = self.core.wire(group)
        for broker_name, addr in sorted((await self.read_addrs()).items()):
            frame = await self.core.invoke(addr, RequestCode.GET_ALL_CONSUMER_OFFSET)
            for key, queues in sorted((unpack_body(frame.body) or {}).items()):
                topic, _, owner = key.partition("@")
                if owner != group:
                    continue
                for queue_id, offset in sorted(queues.items(), key=lambda kv: int(kv[0])):
                    top = await self.core.invoke(
                        addr,
                        RequestCode.GET_MAX_OFFSET,
                        {"topic": topic, "queue_id": int(queue_id)},
                    )
                    max_offset = top.ext["offset"]
                    rows.append(
                        {
                            "topic": self.core.user(topic),
                            "broker_name": broker_name,
                            "queue_id": int(queue_id),
                            "broker_offset": max_offset,
                            "consumer_offset": offset,
                            "lag": max_offset - offset,
                        }
                    )
        return rows

    async def declare_topic(
        self,
        node_addr: str,
        topic: str,
        *,
        vhost: str | None = None,
        exclusive: bool = False,
        queue_nums: int = 4,
    ) -> DeclaredTopic:
        """Declare ``topic`` in ``vhost`` (default: the admin's) through the node at
        ``node_addr`` (a container's listen), its home node. An exclusive topic is
        declared on a connection of its own, kept open until the handle is closed."""
        vhost = self.core.vhost if vhost is None else vhost
        ext = {"vhost": vhost, "topic": topic, "exclusive": exclusive, "queue_nums": queue_nums}
        if not exclusive:
            frame = await self.core.invoke(node_addr, RequestCode.DECLARE_TOPIC, ext)
            return DeclaredTopic(vhost, topic, unpack_body(frame.body) or {})
        conn = await connect(node_addr, timeout_s=self.core.timeout_s)
        try:
            frame = await conn.request(
                RequestCode.DECLARE_TOPIC, ext, timeout_s=self.core.timeout_s
            )
            if frame.code != ResponseCode.SUCCESS:
                raise HamqError.for_code(frame.code, frame.remark)
        except BaseException:
            conn.close()
            raise
        return DeclaredTopic(vhost, topic, unpack_body(frame.body) or {}, conn)

    async def undeclare_topic(
        self, node_addr: str, topic: str, *, vhost: str | None = None
    ) -> None:
        """Delete a declared topic through a node."""
        vhost = self.core.vhost if vhost is None else vhost
        await self.core.invoke(
            node_addr, RequestCode.UNDECLARE_TOPIC, {"vhost": vhost, "topic": topic}
        )

    async def elect(self, broker_name: str, member_id: int, wait_s: float = 10.0) -> str:
        """DLedger: move leadership of ``broker_name`` to ``member_id`` (it is caught up
        first); returns the new master's address once the name servers route it."""
        info = await self.cluster_info()
        entry = info["broker_addr_table"].get(broker_name)
        leader = {int(k): v for k, v in (entry or {}).get("broker_addrs", {}).items()}.get(0)
        if leader is None:
            raise BrokerNotFound(f"broker group {broker_name} has no leader right now")
        await self.core.invoke(
            leader, RequestCode.DLEDGER_TRANSFER_LEADERSHIP, {"member_id": member_id}
        )
        deadline = monotonic_s() + wait_s
        while monotonic_s() < deadline:
            await asyncio.sleep(0.1)
            entry = (await self.cluster_info())["broker_addr_table"].get(broker_name, {})
            new = {int(k): v for k, v in entry.get("broker_addrs", {}).items()}.get(0)
            if new is not None and new != leader:
                runtime = await self.broker_runtime_info(new)
                if runtime.get("ha", {}).get("member_id") == member_id:
                    return new
        raise BrokerNotFound(
            f"member {member_id} of {broker_name} did not take over within {wait_s} s"
        )

    # -- the message browser and consumer groups (broker/message_lookup.py,
    #    broker/consumer_admin.py) ------------------------------------------------------
    async def view_message(self, topic: str, msg_id: str) -> list[MessageExt]:
        """The message ``msg_id`` names (RocketMQ's queryMsgById), from every broker group
        serving ``topic`` whose record at the id's commit-log offset is of that topic: an
        id holds no broker, so two groups may each have a record there."""
        phys, index = parse_offset_msg_id(msg_id)
        wanted = offset_msg_id(phys, index)  # the id as the broker spells it
        route = await self.topic_route(topic)

        async def one(broker_name: str) -> list[MessageExt]:
            try:
                frame = await self.core.invoke_group(
                    route.topic,
                    broker_name,
                    RequestCode.VIEW_MESSAGE_BY_ID,
                    {"physical_offset": phys},
                )
            except QueryNotFound:
                return []
            return [
                m
                for m in decode_records(frame.body, 0, MessageExt, broker_name)
                if m.queue.topic == route.topic and m.offset_msg_id == wanted
            ]

        found = await asyncio.gather(*(one(name) for name in sorted(route.brokers)))
        return [m for group in found for m in group]

    async def query_messages_by_key(
        self, topic: str, key: str, max_scan: int = 10_000
    ) -> tuple[list[MessageExt], bool]:
        """Messages of ``topic`` whose KEYS or UNIQ_KEY is ``key``, newest first
        (RocketMQ's queryMsgByKey). There is no key index: each broker group scans its
        queues backwards, at most ``max_scan`` messages each; the flag says whether a scan
        stopped before a queue's start (or at the answer's size limit)."""
        route = await self.topic_route(topic)
        ext = {"topic": route.topic, "key": key, "max_scan": max_scan}

        async def one(broker_name: str) -> tuple[list[MessageExt], bool]:
            frame = await self.core.invoke_group(
                route.topic,
                broker_name,
                RequestCode.QUERY_MESSAGE,
                ext,
                timeout_s=QUERY_MESSAGE_TIMEOUT_S,
            )
            ids = set(frame.ext["msg_ids"])
            messages = decode_records(frame.body, 0, MessageExt, broker_name)
            return [m for m in messages if m.offset_msg_id in ids], frame.ext["truncated"]

        groups = sorted({mq.broker_name for mq in route.read_queues})
        answers = await asyncio.gather(*(one(name) for name in groups))
        messages = [m for found, _ in answers for m in found]
        messages.sort(key=lambda m: (m.store_timestamp_ms, m.queue_offset), reverse=True)
        return messages, any(truncated for _, truncated in answers)

    async def message_at(
        self, topic: str, broker_name: str, queue_id: int, offset: int
    ) -> MessageExt | None:
        """The message at ``offset`` of one queue, None past its end or below its start:
        a one-message pull that commits nothing."""
        check_int("offset", offset)
        mq = MessageQueue(self.core.wire(topic), broker_name, queue_id)
        result = await AsyncPullConsumer(TOOLS_CONSUMER_GROUP, core=self.core).pull(mq, offset, 1)
        found = [m for m in result.messages if m.queue_offset == offset]
        return found[0] if found else None

    async def consumer_groups(self) -> list[str]:
        """Groups with committed offsets or a client connected now, on any broker group."""
        groups: set[str] = set()
        for addr in (await self.read_addrs()).values():
            offsets, live = await asyncio.gather(
                self.core.invoke(addr, RequestCode.GET_ALL_CONSUMER_OFFSET),
                self.core.invoke(addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG),
            )
            groups.update(key.partition("@")[2] for key in unpack_body(offsets.body) or {})
            groups.update(unpack_body(live.body) or {})
        return sorted(self._in_vhost(groups))

    async def consumer_members(self, group: str) -> list[str]:
        """The client ids of ``group`` connected to any broker group now."""
        ext = {"group": self.core.wire(group)}
        members: set[str] = set()
        for addr in (await self.read_addrs()).values():
            frame = await self.core.invoke(addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext)
            members.update(unpack_body(frame.body) or [])
        return sorted(members)

    async def reset_offset(self, group: str, topic: str, timestamp_ms: int) -> list[dict]:
        """Move ``group``'s offsets of ``topic`` to the first message stored at or after
        ``timestamp_ms`` (RocketMQ's resetOffsetByTime) on each broker group's master;
        its live consumers take the new offsets. Per queue: broker_name, queue_id,
        old_offset (None: never committed), new_offset."""
        check_int("timestamp_ms", timestamp_ms)
        route = await self.topic_route(topic)
        ext = {"group": self.core.wire(group), "topic": route.topic, "timestamp_ms": timestamp_ms}

        async def one(broker_name: str) -> list[dict]:
            addr = route.master_addr(broker_name)
            if addr is None:
                raise ServiceNotAvailable(
                    f"broker group {broker_name} has no master to reset offsets on"
                )
            frame = await self.core.invoke(addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext)
            return [{"broker_name": broker_name, **row} for row in unpack_body(frame.body)]

        groups = sorted({mq.broker_name for mq in route.read_queues})
        rows = await asyncio.gather(*(one(name) for name in groups))
        return [row for group_rows in rows for row in group_rows]

    def _in_vhost(self, wire_names: Iterable[str]) -> list[str]:
        """The names of this vhost among wire names, as its users know them."""
        if self.core.vhost == DEFAULT_VHOST:
            return list(wire_names)
        prefix = self.core.wire("")
        return [n.removeprefix(prefix) for n in wire_names if n.startswith(prefix)]


def controller_list(controllers: str | Iterable[str]) -> list[str]:
    """``ADDR[,ADDR]`` (``;`` works too, as for name servers) into addresses: an embedded
    controller answers on its name server's address, so either list may be given."""
    if isinstance(controllers, str):
        controllers = controllers.replace(";", ",").split(",")
    addrs = [a.strip() for a in controllers if a.strip()]
    if not addrs:
        raise ValueError("at least one controller address (HOST:PORT) is required")
    return addrs


class AsyncControllerAdmin:
    """What an operator asks of the controller: a group's SyncStateSet and members, the
    controller peers, electing a master and forgetting members. Answers are plain dicts
    (the wire's field names) so the CLI prints them as they are."""

    def __init__(self, controllers: str | Iterable[str], timeout_s: float = 3.0) -> None:
        self.client = ControllerClient(controller_list(controllers), timeout_s=timeout_s)

    async def close(self) -> None:
        await self.client.close()

    async def sync_state(self, broker_name: str) -> dict:
        """The group's master, epochs, SyncStateSet and each member's liveness and offsets."""
        for group in await self.client.sync_state_data([broker_name]):
            if group["broker_name"] == broker_name:
                return group
        raise BrokerNotFound(f"the controller knows no broker group {broker_name}")

    async def elect_master(
        self, broker_name: str, broker_id: int | None = None, cluster: str | None = None
    ) -> dict:
        """An admin election (``broker_id`` preferred, or the controller's choice); the
        group's state once the election is applied."""
        cluster = cluster or (await self.sync_state(broker_name))["cluster_name"]
        info = await self.client.elect_master(cluster, broker_name, broker_id)
        return {"cluster_name": cluster, "broker_name": broker_name, **info.to_ext()}

    async def metadata(self) -> dict:
        """The controller peers, the Raft leader and its term, as the leader sees them."""
        return await self.client.metadata()

    async def clean_broker_metadata(
        self,
        broker_name: str,
        broker_ids: Iterable[int] = (),
        clean_living_broker: bool = False,
        cluster: str | None = None,
    ) -> dict:
        """Forget ``broker_ids`` of the group (no ids: the whole group); a living member
        only with ``clean_living_broker``."""
        cluster = cluster or (await self.sync_state(broker_name))["cluster_name"]
        ids = sorted(set(broker_ids))
        await self.client.clean_broker_data(cluster, broker_name, ids, clean_living_broker)
        return {
            "cluster_name": cluster,
            "broker_name": broker_name,
            "broker_ids": ids,
            "clean_living_broker": clean_living_broker,
        }
