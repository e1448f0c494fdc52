"""The RocketMQ-shaped API: clusters and broker groups (roles, epochs, SyncStateSet, confirm
offset), topics and their routes, consumer groups and their lag, message lookup, and the
admin actions (elect a master, create or delete a topic, reset a group's offset).

Routes read and act through ``hamq.manage`` and the admin clients the CLI uses, so a
script sees what ``hamq admin`` prints. Topic and group names are a vhost's (``?vhost=``,
default ``/``) and come back as that vhost names them."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response

from hamq.client.admin import AsyncAdmin, AsyncControllerAdmin
from hamq.client.core import MASTER_ID
from hamq.client.message import MessageExt
from hamq.errors import BrokerNotFound, HamqError, InvalidArgument, QueryNotFound
from hamq.manage.consumers import consumer_group
from hamq.manage.groups import broker_groups, elect_master
from hamq.manage.messages import message_json
from hamq.manage.topics import declare_topic, declaring_node, wait_placed
from hamq.policy.definition import DEFAULT_VHOST, PolicyError, check_vhost, wire_name
from hamq.protocol.codes import ResponseCode
from hamq.protocol.controller_catalog import check_topic
from hamq.protocol.limits import INT64_MAX, MAX_NAME_LENGTH, MAX_QUEUE_NUMS, MAX_TOPIC_LENGTH
from hamq.protocol.message import parse_offset_msg_id, validate_name
from hamq.protocol.properties import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX
from hamq.store.metadata import PERM_READ_WRITE
from hamq.web.access import ClusterAccess, cluster_access
from hamq.web.errors import ERROR_RESPONSES, ApiError, ErrorBody, status_of
from hamq.web.names import NamePath, NameQuery, TopicPath, VhostQuery
from hamq.web.rabbit import known_vhost
from hamq.web.rocket_models import (
    BrokerGroup,
    Cluster,
    ClusterGroup,
    ClusterMember,
    ConsumerGroup,
    ConsumerGroupSummary,
    ElectMaster,
    MessageList,
    MessageView,
    ResetDone,
    ResetOffset,
    TopicCreated,
    TopicDetail,
    TopicKind,
    TopicSpec,
    TopicSummary,
)

# RocketMQ's TopicValidator: the brokers' own topics (revive log, schedule, transactions).
SYSTEM_TOPIC_PREFIXES = ("rmq_sys_", "RMQ_SYS_", "SCHEDULE_TOPIC_")
# A key search reads at most this many index entries unless told otherwise.
DEFAULT_MAX_SCAN = 10_000
MAX_SCAN_LIMIT = 1_000_000
# A declared topic's first placement may start a group on its node (a new member elects).
PLACED_TIMEOUT_S = 20.0
INVALID = ResponseCode.INVALID_ARGUMENT
# The controller's answers to an election of a member it cannot make master.
ELECTION_REFUSALS = frozenset(
    {
        ResponseCode.CONTROLLER_ELECT_MASTER_FAILED,
        ResponseCode.CONTROLLER_BROKER_NOT_ALIVE,
        ResponseCode.CONTROLLER_INVALID_MASTER,
        ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
    }
)

router = APIRouter(tags=["rocketmq"], responses=ERROR_RESPONSES)

Access = Annotated[ClusterAccess, Depends(cluster_access)]


@contextmanager
def _field(name: str) -> Iterator[None]:
    """A check's refusal as a 400 naming the request field it is about."""
    try:
        yield
    except InvalidArgument as err:
        raise ApiError(400, err.code, err.message, name) from None


async def _vhost(
    access: Access,
    vhost: VhostQuery = DEFAULT_VHOST,
) -> str:
    """A vhost the controller has (404 otherwise, as on the RabbitMQ-shaped routes); ``/``
    always exists, and without a controller configured nobody keeps a list to check."""
    try:
        check_vhost(vhost)
    except PolicyError as err:
        raise ApiError(400, err.code, err.message, "vhost") from None
    if vhost == DEFAULT_VHOST or not access.controllers:
        return vhost
    return await known_vhost(access.controller_admin(), vhost)


Vhost = Annotated[str, Depends(_vhost)]


def _admin(access: Access, vhost: Vhost) -> AsyncAdmin:
    """The app's admin client with names in ``vhost``: the same connections and route
    cache (routes are cached by wire name, so vhosts never mix)."""
    shared = access.admin()
    if vhost == DEFAULT_VHOST:
        return shared
    core = copy.copy(shared.core)
    core.vhost = vhost
    return AsyncAdmin(core=core)


Admin = Annotated[AsyncAdmin, Depends(_admin)]


def _controllers(access: ClusterAccess) -> AsyncControllerAdmin | None:
    """The controller admin, or None: groups are then read from their members."""
    return access.controller_admin() if access.controllers else None


def _topic(topic: str, vhost: str) -> str:
    """A topic name in ``vhost``; in ``/`` a retry or dead-letter topic (``%RETRY%g``) too,
    as the topic list shows it."""
    with _field("topic"):
        if vhost == DEFAULT_VHOST:
            return validate_name(topic, "topic", MAX_TOPIC_LENGTH)
        return check_topic(vhost, topic)


def _name(value: str, field: str, vhost: str = DEFAULT_VHOST) -> str:
    """A group or broker name (with its vhost, for a consumer group)."""
    with _field(field):
        validate_name(wire_name(vhost, value), field, MAX_NAME_LENGTH)
    return value


# -- clusters and broker groups -------------------------------------------------------------


@router.get("/api/clusters", response_model=list[Cluster])
async def clusters(access: Access) -> list[Cluster]:
    """Each cluster's broker groups and their registered members (``clusterList``)."""
    info = await access.admin().cluster_info()
    groups = info["broker_addr_table"]
    return [
        Cluster(
            cluster_name=cluster,
            groups=[
                ClusterGroup(
                    broker_name=name,
                    members=[
                        ClusterMember(
                            broker_id=int(broker_id),
                            addr=addr,
                            role="master" if int(broker_id) == MASTER_ID else "slave",
                        )
                        for broker_id, addr in sorted(
                            groups[name]["broker_addrs"].items(), key=lambda kv: int(kv[0])
                        )
                    ],
                )
                for name in sorted(names)
                if name in groups
            ],
        )
        for cluster, names in sorted(info["cluster_addr_table"].items())
    ]


async def _groups(access: ClusterAccess, broker_names: list[str] | None = None) -> list[dict]:
    """The broker groups (or those named). While the controllers cannot answer (no
    quorum: when an operator most needs this), each group as its members report it, with
    ``controller_error`` saying why."""
    controllers = _controllers(access)
    names = broker_names or []
    try:
        return await broker_groups(access.admin(), controllers, names)
    except HamqError as err:
        if controllers is None or status_of(err) != 503:
            raise
        unanswered = f"the controllers did not answer: {err.message}"
    return [
        group | {"controller_error": unanswered}
        for group in await broker_groups(access.admin(), None, names)
    ]


@router.get("/api/groups", response_model=list[BrokerGroup])
async def groups(access: Access) -> list[dict]:
    """Every broker group: members and roles, epochs, SyncStateSet, confirm offset."""
    return await _groups(access)


@router.get("/api/groups/{broker_name}", response_model=BrokerGroup)
async def group(access: Access, broker_name: NamePath) -> dict:
    """One broker group, as in ``/api/groups``."""
    name = _name(broker_name, "broker_name")
    for found in await _groups(access, [name]):
        return found
    raise BrokerNotFound(f"no broker group {name}")


@router.post("/api/groups/{broker_name}/actions", response_model=BrokerGroup)
async def group_action(access: Access, broker_name: NamePath, action: ElectMaster) -> dict:
    """``elect_master``: the controller elects ``broker_id`` (it must be an alive member
    of the SyncStateSet), or a DLedger group moves its leadership there. The controller
    refusing that member is 409: the group's state, not the request, is in the way."""
    try:
        return await elect_master(
            access.admin(),
            _controllers(access),
            _name(broker_name, "broker_name"),
            action.broker_id,
        )
    except HamqError as err:
        if err.code not in ELECTION_REFUSALS:
            raise
        raise ApiError(409, err.code, err.message, "broker_id") from None


# -- topics -----------------------------------------------------------------------------------


def _kind(topic: str) -> TopicKind:
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return "retry"
    if topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
        return "dlq"
    return "system" if topic.startswith(SYSTEM_TOPIC_PREFIXES) else "normal"


@router.get("/api/topics", response_model=list[TopicSummary])
async def topics(admin: Admin) -> list[TopicSummary]:
    """The vhost's topics the name servers route, with their kind."""
    return [TopicSummary(name=t, kind=_kind(t)) for t in sorted(await admin.topic_list())]


@router.get("/api/topics/{topic}", response_model=TopicDetail)
async def topic(admin: Admin, vhost: Vhost, topic: TopicPath) -> dict:
    """The topic's route (queue data per group, each group's members) and each queue's
    min and max offset (``topicRoute`` and ``topicStatus``)."""
    name = _topic(topic, vhost)
    route = await admin.topic_route_raw(name)
    return {
        "name": name,
        "vhost": vhost,
        "queue_datas": route["queue_datas"],
        "broker_datas": route["broker_datas"],
        "queues": await admin.topic_offsets(name),
    }


@router.put(
    "/api/topics/{topic}",
    response_model=TopicCreated,
    responses={504: {"model": ErrorBody, "description": "Declared but not placed in time."}},
)
async def put_topic(
    access: Access, admin: Admin, vhost: Vhost, topic: TopicPath, spec: TopicSpec
) -> TopicCreated:
    """In a cluster with nodes (the controller places groups by policy, ``hamq dev --mode
    cluster``) declare the topic through a node, as ``hamq admin declare-topic`` does, and
    answer once it is placed and routed: a topic created on the masters there is not
    declared, so the placement driver would delete it. Otherwise create or update it on
    every master (of ``cluster``), as ``updateTopic``."""
    name = _topic(topic, vhost)
    controllers = _controllers(access)
    nodes = await controllers.client.list_nodes() if controllers is not None else []
    if controllers is not None and nodes:
        return await _declare(controllers, admin, vhost, name, spec, nodes)
    if spec.node is not None:
        raise ApiError(400, INVALID, "the cluster has no node to declare the topic on", "node")
    masters = await admin.create_topic(
        name,
        spec.read_queues,
        spec.perm,
        cluster=None if spec.cluster is None else _name(spec.cluster, "cluster"),
        write_queue_nums=spec.write_queues,
    )
    return TopicCreated(name=name, vhost=vhost, brokers=sorted(masters))


async def _declare(
    controllers: AsyncControllerAdmin,
    admin: AsyncAdmin,
    vhost: str,
    name: str,
    spec: TopicSpec,
    nodes: list[dict],
) -> TopicCreated:
    """Declare through ``spec.node`` (or the first alive node) and wait for placement. A
    declared topic is read-write with one queue count, so the body must say no more."""
    with _field("topic"):  # "/" also opens %RETRY% topics, which nobody declares
        check_topic(vhost, name)
    given = spec.model_fields_set
    counts = {getattr(spec, f) for f in ("read_queues", "write_queues") if f in given}
    if len(counts) > 1:
        raise ApiError(400, INVALID, "a declared topic has one queue count", "write_queues")
    if spec.perm != PERM_READ_WRITE:
        raise ApiError(400, INVALID, "a declared topic is read-write (perm 6)", "perm")
    if spec.cluster is not None:
        raise ApiError(400, INVALID, "the controller places a declared topic", "cluster")
    with _field("node"):
        node = declaring_node(nodes, spec.node)
    await declare_topic(node["address"], vhost, name, counts.pop() if counts else spec.read_queues)
    groups = await wait_placed(controllers, admin, vhost, name, PLACED_TIMEOUT_S)
    if groups is None:
        raise ApiError(
            504,
            ResponseCode.SERVICE_NOT_AVAILABLE,
            f"topic {name} declared through {node['node']} but not placed and routed within "
            f"{PLACED_TIMEOUT_S:g} s (GET /api/queues shows when it is)",
        )
    return TopicCreated(name=name, vhost=vhost, brokers=groups, node=node["node"])


@router.delete("/api/topics/{topic}", status_code=204, response_class=Response)
async def delete_topic(access: Access, admin: Admin, vhost: Vhost, topic: TopicPath) -> Response:
    """Delete the topic: a declared one through the controller (its placement driver then
    deletes it from the groups, which would otherwise place it again), any other on every
    member that has it and on the name servers."""
    name = _topic(topic, vhost)
    controllers = _controllers(access)
    if controllers is not None and any(
        t["name"] == name for t in await controllers.client.list_topics(vhost)
    ):
        await controllers.client.delete_topic(vhost, name)
    else:
        await admin.delete_topic(name)
    return Response(status_code=204)


# -- consumer groups ------------------------------------------------------------------------


@router.get("/api/consumer-groups", response_model=list[ConsumerGroupSummary])
async def consumer_groups(admin: Admin) -> list[ConsumerGroupSummary]:
    """Groups with committed offsets or live consumers."""
    return [ConsumerGroupSummary(name=g) for g in sorted(await admin.consumer_groups())]


@router.get("/api/consumer-groups/{group}", response_model=ConsumerGroup)
async def consumer_group_detail(admin: Admin, vhost: Vhost, group: NamePath) -> dict:
    """The group's clients and, per queue it committed on, offsets and lag."""
    found = await consumer_group(admin, _name(group, "group", vhost))
    if not found["members"] and not found["queues"]:
        raise QueryNotFound(f"consumer group {group}: no live consumer and no committed offset")
    return found


@router.post("/api/consumer-groups/{group}/actions", response_model=ResetDone)
async def consumer_group_action(
    admin: Admin, vhost: Vhost, group: NamePath, action: ResetOffset
) -> ResetDone:
    """``reset_offset``: every queue of ``topic`` goes back (or forward) to the first
    message stored at or after ``timestamp_ms``; live consumers of the group take it."""
    name = _name(group, "group", vhost)
    queues = await admin.reset_offset(name, _topic(action.topic, vhost), action.timestamp_ms)
    return ResetDone.model_validate({"group": name, "topic": action.topic, "queues": queues})


# -- messages -------------------------------------------------------------------------------


def _message(msg: MessageExt) -> MessageView:
    return MessageView.model_validate(message_json(msg))


@router.get("/api/messages/{topic}/{msg_id}", response_model=MessageList)
async def message_by_id(admin: Admin, vhost: Vhost, topic: TopicPath, msg_id: str) -> MessageList:
    """The message stored at the id's place in each group serving the topic."""
    name = _topic(topic, vhost)
    with _field("msg_id"):
        parse_offset_msg_id(msg_id)
    found = await admin.view_message(name, msg_id)
    if not found:
        raise QueryNotFound(f"no message {msg_id} in topic {topic}")
    return MessageList(messages=[_message(m) for m in found])


@router.get("/api/messages/{topic}", response_model=MessageList)
async def messages(
    admin: Admin,
    vhost: Vhost,
    topic: TopicPath,
    key: Annotated[str | None, Query(min_length=1, max_length=MAX_NAME_LENGTH)] = None,
    max_scan: Annotated[int, Query(ge=1, le=MAX_SCAN_LIMIT)] = DEFAULT_MAX_SCAN,
    broker_name: NameQuery = None,
    queue_id: Annotated[int | None, Query(ge=0, lt=MAX_QUEUE_NUMS)] = None,
    offset: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
) -> MessageList:
    """By key (``?key=K[&max_scan=N]``, newest scanned first) or at one queue offset
    (``?broker_name=B&queue_id=Q&offset=O``)."""
    name = _topic(topic, vhost)
    if key is not None:
        found, truncated = await admin.query_messages_by_key(name, key, max_scan)
        return MessageList(messages=[_message(m) for m in found], truncated=truncated)
    missing = [
        p
        for p, v in (("broker_name", broker_name), ("queue_id", queue_id), ("offset", offset))
        if v is None
    ]
    if missing:
        raise ApiError(
            400,
            InvalidArgument.code,
            "give key, or broker_name, queue_id and offset together",
            missing[0],
        )
    assert broker_name is not None and queue_id is not None and offset is not None
    msg = await admin.message_at(name, _name(broker_name, "broker_name"), queue_id, offset)
    if msg is None:
        raise QueryNotFound(f"no message at {broker_name}:{queue_id} offset {offset} of {topic}")
    return MessageList(messages=[_message(msg)])
