"""Declared topics as rabbitmqctl's ``list_queues`` and RabbitMQ's ``/api/queues`` show
queues: each with its policy, master, mirrors (and which are synchronised), messages and
consumer lag, joined from what the controller knows (declared topics, the group each is
written in, that group's master and SyncStateSet, which node hosts which member) and what
the group masters count. ``sync_queue`` asks a topic's master to copy its history to its
unsynchronised mirrors (``rabbitmqctl sync_queue``)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from hamq.client.admin import AsyncAdmin, AsyncControllerAdmin
from hamq.errors import HamqError, InvalidArgument, ServiceNotAvailable, TopicNotExist
from hamq.manage.fanout import MAX_IN_FLIGHT, gather_bounded
from hamq.manage.policies import find_policy
from hamq.net.connection import connect
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.controller_catalog import check_topic
from hamq.protocol.frame import unpack_body

# A sync restarts the slaves' HA; the master answers once it has told them.
SYNC_TIMEOUT_S = 10.0

# (wire topic, broker name, queue id) -> every consumer group's committed offset there.
ConsumerOffsets = dict[tuple[str, str, int], list[int]]


def member_nodes(nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Member listen address -> the node hosting it, from the nodes' last heartbeats."""
    return {member["address"]: node["node"] for node in nodes for member in node["members"]}


def _pid(node_of: Mapping[str, str], addr: str) -> dict[str, str | None]:
    """A member as a pid: its node (None until a heartbeat of its node lists it: just
    added) and its listen address."""
    return {"node": node_of.get(addr), "address": addr}


def mirrors(group: Mapping[str, Any] | None, node_of: Mapping[str, str]) -> dict[str, Any]:
    """A group's master and alive slaves (and which of them are synchronised) as pids."""
    if group is None:
        return {"pid": None, "slave_pids": [], "synchronised_slave_pids": []}
    slaves = sorted(
        (m for m in group["members"] if m["broker_id"] != group["master_id"] and m["alive"]),
        key=lambda m: m["broker_id"],
    )
    in_sync = set(group["sync_state_set"])
    return {
        "pid": _pid(node_of, group["master_addr"]) if group["master_id"] is not None else None,
        "slave_pids": [_pid(node_of, m["address"]) for m in slaves],
        "synchronised_slave_pids": [
            _pid(node_of, m["address"]) for m in slaves if m["broker_id"] in in_sync
        ],
    }


async def consumer_offsets(namesrv: AsyncAdmin) -> ConsumerOffsets:
    """Every consumer group's committed offsets, read once from each group's master (or
    acting master); a group that does not answer counts as having none."""
    reads = sorted((await namesrv.read_addrs()).items())
    answers = await asyncio.gather(
        *(namesrv.core.invoke(addr, RequestCode.GET_ALL_CONSUMER_OFFSET) for _, addr in reads),
        return_exceptions=True,
    )
    offsets: ConsumerOffsets = defaultdict(list)
    for (broker_name, _), answer in zip(reads, answers):
        if isinstance(answer, BaseException):
            if not isinstance(answer, HamqError):
                raise answer
            continue
        for key, queues in (unpack_body(answer.body) or {}).items():
            topic = key.partition("@")[0]
            for queue_id, offset in queues.items():
                offsets[(topic, broker_name, int(queue_id))].append(offset)
    return offsets


async def consumer_lag(namesrv: AsyncAdmin) -> dict[str, int]:
    """Wire topic -> how far every consumer group together is behind its queues' ends
    (one max-offset read per queue some group consumes; a group not answering counts 0)."""
    consumed = await consumer_offsets(namesrv)
    reads = await namesrv.read_addrs()
    queues = sorted(key for key in consumed if key[1] in reads)
    tops = await gather_bounded(
        [
            partial(
                namesrv.core.invoke,
                reads[broker_name],
                RequestCode.GET_MAX_OFFSET,
                {"topic": topic, "queue_id": queue_id},
            )
            for topic, broker_name, queue_id in queues
        ],
        MAX_IN_FLIGHT * 8,  # one request each, where a topic's call sends two per queue
    )
    lag: dict[str, int] = defaultdict(int)
    for key, top in zip(queues, tops):
        if isinstance(top, HamqError):
            continue
        lag[key[0]] += sum(max(top.ext["offset"] - offset, 0) for offset in consumed[key])
    return dict(lag)


async def _counts(
    namesrv: AsyncAdmin, wire: str, consumed: ConsumerOffsets
) -> tuple[int | None, int | None]:
    """Messages held over every queue of the topic and the consumer groups' lag behind
    them (both None while no master routes it)."""
    try:
        queues = await namesrv.topic_offsets(wire)
    except HamqError:
        return None, None
    messages = _held(queues)
    lag = sum(
        max(q["max_offset"] - offset, 0)
        for q in queues
        for offset in consumed.get((wire, q["broker_name"], q["queue_id"]), ())
    )
    return messages, lag


def _held(queues: Iterable[Mapping[str, Any]]) -> int:
    return sum(q["max_offset"] - q["min_offset"] for q in queues)


async def messages_held(namesrv: AsyncAdmin, topics: Sequence[str]) -> int:
    """Messages held over the topics' queues (one that no master serves counts 0), asked
    a few topics at a time."""
    held = await gather_bounded([partial(namesrv.topic_offsets, t) for t in topics])
    total = 0
    for queues in held:
        if not isinstance(queues, HamqError):
            total += _held(queues)
    return total


async def _nothing() -> tuple[int, int]:
    """A topic not placed yet holds nothing and nobody lags behind it."""
    return 0, 0


async def queue_rows(
    namesrv: AsyncAdmin, controllers: AsyncControllerAdmin, vhost: str | None
) -> list[dict[str, Any]]:
    """Every declared topic of ``vhost`` (None: of every vhost) with its policy, master,
    mirrors, messages and lag: its mirrors are the members of the group it is written in
    now (the last of its groups)."""
    topics = sorted(
        await controllers.client.list_topics(vhost), key=lambda t: (t["vhost"], t["name"])
    )
    node_of = member_nodes(await controllers.client.list_nodes())
    writable = {t["groups"][-1] for t in topics if t["groups"]}
    groups = {
        g["broker_name"]: g
        for g in (await controllers.client.sync_state_data(sorted(writable)) if writable else [])
    }
    consumed = await consumer_offsets(namesrv) if groups else {}
    placed = [groups.get(t["groups"][-1]) if t["groups"] else None for t in topics]
    counts = await gather_bounded(
        [
            partial(_counts, namesrv, topic["wire_name"], consumed) if group else _nothing
            for topic, group in zip(topics, placed)
        ]
    )
    rows = []
    for topic, group, count in zip(topics, placed, counts):
        messages, lag = (None, None) if isinstance(count, HamqError) else count
        row: dict[str, Any] = {
            "name": topic["name"],
            "vhost": topic["vhost"],
            "policy": topic["policy"] or "",
            "broker_name": group["broker_name"] if group else None,
        }
        row.update(mirrors(group, node_of))
        row.update(messages=messages, lag=lag)
        rows.append(row)
    return rows


async def node_request(addr: str, code: int, ext: dict, timeout_s: float) -> dict:
    """One request to a node's (container's) port or a group master's port."""
    conn = await connect(addr)
    try:
        frame = await conn.request(code, ext, timeout_s=timeout_s)
    finally:
        conn.close()
    if frame.code != ResponseCode.SUCCESS:
        raise HamqError.for_code(frame.code, frame.remark)
    return unpack_body(frame.body) or dict(frame.ext or {})


async def sync_queue(
    controllers: AsyncControllerAdmin, vhost: str, name: str, cancel: bool
) -> dict[str, Any]:
    """SYNC_QUEUE (or its cancel) to the master of the group the topic is written in, with
    its policy's ha-sync-batch-size; the master's answer (the mirrors it told)."""
    check_topic(vhost, name)
    topic = next(
        (t for t in await controllers.client.list_topics(vhost) if t["name"] == name), None
    )
    if topic is None:
        raise TopicNotExist(f"no topic {name} in vhost {vhost}")
    if not topic.get("groups"):
        raise ServiceNotAvailable(f"topic {name} is not placed on any node yet")
    policy = await find_policy(controllers, vhost, topic["policy"]) if topic["policy"] else None
    group = await controllers.sync_state(topic["groups"][-1])
    if group["master_id"] is None:
        raise ServiceNotAvailable(f"topic {name} has no master (group {group['broker_name']})")
    if policy is None or policy.definition.ha_mode is None:
        raise InvalidArgument(f"topic {name} is not mirrored (no ha policy applies)")
    answer = await node_request(
        group["master_addr"],
        RequestCode.SYNC_QUEUE,
        {"cancel": cancel, "batch_size": policy.definition.ha_sync_batch_size},
        SYNC_TIMEOUT_S,
    )
    return {"vhost": vhost, "name": name, "group": group["broker_name"], **answer}
