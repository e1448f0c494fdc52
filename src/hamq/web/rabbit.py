"""RabbitMQ's management API where RabbitMQ has the resource (seed 003 names
``PUT /api/policies/%2f/ha-all``): policies, queues (declared topics with their mirrors),
vhosts, nodes and the overview, with RabbitMQ's bodies and status codes (PUT 201 created /
204 updated, DELETE 204), so a RabbitMQ user's scripts port with little change.

``{vhost}`` is URL-encoded as RabbitMQ writes it (``%2f`` is ``/``); it is a path segment
that may decode to ``/``, hence the ``:path`` converters, and routes with more segments
after it are declared first; a policy's is ``{vhost:vhost}/{name:path}`` (web/names.py), so
a name an older version stored with a "/" is still addressed whole."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response

from hamq.client.admin import AsyncControllerAdmin
from hamq.clock import wall_ms
from hamq.errors import HamqError, InvalidArgument
from hamq.manage.policies import find_policy, set_policy
from hamq.manage.processes import broker_processes, process_count
from hamq.manage.queues import messages_held, queue_rows, sync_queue
from hamq.policy.definition import Policy, check_vhost, make_policy
from hamq.protocol.codes import ResponseCode
from hamq.web.access import ClusterAccess, cluster_access
from hamq.web.errors import ERROR_RESPONSES, ApiError, status_of
from hamq.web.history import History, history_of
from hamq.web.names import PolicyNamePath, VhostPath
from hamq.web.rabbit_models import (
    GroupMember,
    GroupOut,
    HistoryOut,
    HistorySeries,
    MessageStats,
    NodeMember,
    NodeOut,
    ObjectTotals,
    Overview,
    PolicyBody,
    PolicyOut,
    QueueAction,
    QueueOut,
    QueueTotals,
    RateDetails,
    RateSample,
    TopicSeries,
    VhostOut,
)

router = APIRouter(prefix="/api", responses=ERROR_RESPONSES, tags=["rabbitmq"])
AccessDep = Annotated[ClusterAccess, Depends(cluster_access)]
HistoryDep = Annotated[History, Depends(history_of)]
# Fields of a policy outside its definition, by how PolicyError's message starts.
_POLICY_FIELDS = (("pattern", "pattern"), ("priority", "priority"), ("apply-to", "apply-to"))


def _vhost(vhost: str) -> str:
    try:
        return check_vhost(vhost)
    except InvalidArgument as err:
        raise ApiError(400, ResponseCode.INVALID_ARGUMENT, err.message, "vhost") from None


async def known_vhost(ctl: AsyncControllerAdmin, vhost: str) -> str:
    """``vhost`` when the controller has it: 404 names an unknown one, as RabbitMQ does."""
    if _vhost(vhost) not in await ctl.client.list_vhosts():
        raise ApiError(
            404, ResponseCode.QUERY_NOT_FOUND, f"vhost {vhost!r} does not exist", "vhost"
        )
    return vhost


def _not_found(what: str) -> ApiError:
    return ApiError(404, ResponseCode.QUERY_NOT_FOUND, f"{what} does not exist")


async def _delete(
    delete: Awaitable[None], still_there: Callable[[], Awaitable[bool]], what: str
) -> None:
    """Run ``delete``; when a concurrent DELETE of the same thing won, the controller
    refuses this one at apply ("a concurrent change came first"): that is the 404 of a
    DELETE that came second, not the caller's bad request."""
    try:
        await delete
    except HamqError as err:
        if err.code != ResponseCode.CONTROLLER_INVALID_REQUEST or await still_there():
            raise
        raise _not_found(what) from None


# -- policies ---------------------------------------------------------------------------------


def _policy_out(row: dict[str, Any]) -> PolicyOut:
    definition = row["definition"]
    return PolicyOut(
        vhost=row["vhost"],
        name=row["name"],
        pattern=row["pattern"],
        apply_to=row["apply_to"],
        definition=json.loads(definition) if isinstance(definition, str) else definition,
        priority=row["priority"],
    )


def _policy_field(message: str, definition: dict[str, Any]) -> str | None:
    """The body field a ``PolicyError`` is about (its message starts with the name)."""
    if message.startswith("definition key "):
        unknown = (k for k in definition if message.startswith(f"definition key {k!r}"))
        return f"definition.{next(unknown, '')}".rstrip(".")
    for prefix, field in _POLICY_FIELDS:
        if message.startswith(prefix):
            return field
    for key in sorted({*definition, "ha-params"}, key=len, reverse=True):
        if message.startswith(key):
            return f"definition.{key}"
    return "definition" if message.startswith("definition") else None


def _checked_policy(vhost: str, name: str, body: PolicyBody) -> Policy:
    """The policy after ``set-policy``'s checks; what they refuse is 400 naming the field."""
    try:
        return make_policy(
            vhost,
            name,
            body.pattern,
            body.definition,
            priority=body.priority,
            apply_to=body.apply_to,
        )
    except InvalidArgument as err:
        field = "name" if err.message.startswith("policy name") else None
        raise ApiError(
            400,
            ResponseCode.INVALID_ARGUMENT,
            err.message,
            field or _policy_field(err.message, body.definition),
        ) from None


@router.get("/policies", response_model=list[PolicyOut], response_model_by_alias=True)
async def list_policies(access: AccessDep) -> list[PolicyOut]:
    rows = await access.controller_admin().client.list_policies(None)
    return [_policy_out(r) for r in rows]


@router.get("/policies/{vhost:vhost}/{name:path}", response_model=PolicyOut)
async def get_policy(vhost: VhostPath, name: PolicyNamePath, access: AccessDep) -> PolicyOut:
    ctl = access.controller_admin()
    for row in await ctl.client.list_policies(await known_vhost(ctl, vhost)):
        if row["name"] == name:
            return _policy_out(row)
    raise _not_found(f"policy {name!r} in vhost {vhost!r}")


@router.put(
    "/policies/{vhost:vhost}/{name:path}",
    status_code=201,
    response_class=Response,
    responses={201: {"description": "created"}, 204: {"description": "updated"}},
)
async def put_policy(
    vhost: VhostPath, name: PolicyNamePath, body: PolicyBody, access: AccessDep
) -> Response:
    policy = _checked_policy(_vhost(vhost), name, body)
    ctl = access.controller_admin()
    await known_vhost(ctl, vhost)
    existed = await find_policy(ctl, vhost, name) is not None
    await set_policy(ctl, policy)
    return Response(status_code=204 if existed else 201)


@router.delete("/policies/{vhost:vhost}/{name:path}", status_code=204)
async def delete_policy(vhost: VhostPath, name: PolicyNamePath, access: AccessDep) -> Response:
    ctl = access.controller_admin()
    what = f"policy {name!r} in vhost {vhost!r}"
    if await find_policy(ctl, await known_vhost(ctl, vhost), name) is None:
        raise _not_found(what)

    async def still_there() -> bool:
        return await find_policy(ctl, vhost, name) is not None

    await _delete(ctl.client.clear_policy(vhost, name), still_there, what)
    return Response(status_code=204)


@router.get("/policies/{vhost:path}", response_model=list[PolicyOut])
async def list_vhost_policies(vhost: VhostPath, access: AccessDep) -> list[PolicyOut]:
    ctl = access.controller_admin()
    rows = await ctl.client.list_policies(await known_vhost(ctl, vhost))
    return [_policy_out(r) for r in rows]


# -- queues -----------------------------------------------------------------------------------


def _queue_out(row: dict[str, Any]) -> QueueOut:
    master = row["pid"]
    return QueueOut(
        name=row["name"],
        vhost=row["vhost"],
        policy=row["policy"] or None,
        node=master["node"] if master else None,
        slave_nodes=[p["node"] for p in row["slave_pids"]],
        synchronised_slave_nodes=[p["node"] for p in row["synchronised_slave_pids"]],
        messages=row["messages"],
        lag=row["lag"],
        broker_name=row["broker_name"],
        master_address=master["address"] if master else None,
        slave_addresses=[p["address"] for p in row["slave_pids"]],
    )


async def _queues(access: ClusterAccess, vhost: str | None) -> list[QueueOut]:
    ctl = access.controller_admin()
    if vhost is not None:
        await known_vhost(ctl, vhost)
    return [_queue_out(r) for r in await queue_rows(access.admin(), ctl, vhost)]


@router.get("/queues", response_model=list[QueueOut])
async def list_queues(access: AccessDep) -> list[QueueOut]:
    return await _queues(access, None)


@router.post("/queues/{vhost:path}/{name}/actions", status_code=204)
async def queue_action(
    vhost: VhostPath, name: str, body: QueueAction, access: AccessDep
) -> Response:
    """``sync`` copies the topic's history to its unsynchronised mirrors, ``cancel_sync``
    stops that (RabbitMQ's queue actions)."""
    ctl = access.controller_admin()
    await known_vhost(ctl, vhost)
    try:
        await sync_queue(ctl, vhost, name, cancel=body.action == "cancel_sync")
    except InvalidArgument as err:
        raise ApiError(400, ResponseCode.INVALID_ARGUMENT, err.message, "name") from None
    return Response(status_code=204)


@router.get("/queues/{vhost:path}/{name}", response_model=QueueOut)
async def get_queue(vhost: VhostPath, name: str, access: AccessDep) -> QueueOut:
    for queue in await _queues(access, vhost):
        if queue.name == name:
            return queue
    raise ApiError(
        404, ResponseCode.TOPIC_NOT_EXIST, f"no topic {name!r} in vhost {vhost!r}", "name"
    )


@router.get("/queues/{vhost:path}", response_model=list[QueueOut])
async def list_vhost_queues(vhost: VhostPath, access: AccessDep) -> list[QueueOut]:
    return await _queues(access, vhost)


# -- vhosts and nodes -------------------------------------------------------------------------


@router.get("/vhosts", response_model=list[VhostOut])
async def list_vhosts(access: AccessDep) -> list[VhostOut]:
    return [VhostOut(name=v) for v in sorted(await access.controller_admin().client.list_vhosts())]


@router.get("/vhosts/{vhost:path}", response_model=VhostOut)
async def get_vhost(vhost: VhostPath, access: AccessDep) -> VhostOut:
    return VhostOut(name=await known_vhost(access.controller_admin(), vhost))


@router.put(
    "/vhosts/{vhost:path}",
    status_code=201,
    response_class=Response,
    responses={201: {"description": "created"}, 204: {"description": "already there"}},
)
async def put_vhost(vhost: VhostPath, access: AccessDep) -> Response:
    ctl = access.controller_admin()
    existed = _vhost(vhost) in await ctl.client.list_vhosts()
    await ctl.client.add_vhost(vhost)
    return Response(status_code=204 if existed else 201)


@router.delete("/vhosts/{vhost:path}", status_code=204)
async def delete_vhost(vhost: VhostPath, access: AccessDep) -> Response:
    """Deletes the vhost with its policies and declared topics; ``/`` cannot go (400)."""
    ctl = access.controller_admin()
    await known_vhost(ctl, vhost)

    async def still_there() -> bool:
        return vhost in await ctl.client.list_vhosts()

    await _delete(ctl.client.delete_vhost(vhost), still_there, f"vhost {vhost!r}")
    return Response(status_code=204)


async def _controller_nodes(access: ClusterAccess) -> list[dict[str, Any]]:
    """The nodes (containers) the controller places mirrors on; none without a controller
    or while it cannot answer (no quorum: when an operator most needs to see processes)."""
    if access.controllers:
        try:
            return await access.controller_admin().client.list_nodes()
        except HamqError as err:
            if status_of(err) != 503:
                raise
    return []


@router.get("/nodes", response_model=list[NodeOut])
async def list_nodes(access: AccessDep) -> list[NodeOut]:
    """The controller's nodes; where it has none (``hamq dev``'s default group, a cluster
    without nodes or controller), each broker member the name servers register."""
    nodes = await _controller_nodes(access)
    if not nodes:
        return [
            NodeOut(
                name=p["address"],
                running=p["alive"],
                address=p["address"],
                members=[NodeMember(**{k: p[k] for k in NodeMember.model_fields})],
                role=p["role"],
                pid=p["pid"],
            )
            for p in await broker_processes(access.admin())
        ]
    return [
        NodeOut(
            name=n["node"],
            running=n["alive"],
            address=n["address"],
            members=[NodeMember(**m) for m in n["members"]],
        )
        for n in sorted(nodes, key=lambda n: n["node"])
    ]


# -- overview and history ---------------------------------------------------------------------


def _groups(info: dict[str, Any]) -> list[GroupOut]:
    """Each broker group the name servers route, with its members (brokerId 0 = master)."""
    groups = []
    for name, entry in sorted(info["broker_addr_table"].items()):
        members = sorted((int(k), v) for k, v in entry["broker_addrs"].items())
        groups.append(
            GroupOut(
                broker_name=name,
                cluster_name=entry["cluster"],
                master_address=dict(members).get(0),
                members=[GroupMember(broker_id=i, address=a) for i, a in members],
            )
        )
    return groups


def _details(history: History, rate: str) -> RateDetails:
    samples = list(history.samples)
    return RateDetails(
        rate=getattr(samples[-1], rate) if samples else 0.0,
        samples=[RateSample(timestamp=s.at_ms, sample=getattr(s, rate)) for s in samples],
    )


async def _node_count(access: ClusterAccess) -> int:
    """The nodes the controller knows, else the broker processes (a container's members
    count once), as ``/api/nodes`` lists them."""
    nodes = await _controller_nodes(access)
    return len(nodes) if nodes else process_count(await broker_processes(access.admin()))


@router.get("/overview", response_model=Overview)
async def overview(access: AccessDep, history: HistoryDep) -> Overview:
    """The cluster at a glance; rates are the history sampler's (a few seconds old)."""
    admin = access.admin()
    info = await admin.cluster_info()
    topics = await admin.topic_list()
    latest = history.latest()
    groups = _groups(info)
    return Overview(
        cluster_name=", ".join(sorted(info["cluster_addr_table"])),
        node_count=await _node_count(access),
        object_totals=ObjectTotals(
            topics=len(topics),
            groups=len(groups),
            brokers=sum(len(g.members) for g in groups),
        ),
        message_stats=MessageStats(
            publish=latest.published if latest else 0,
            publish_details=_details(history, "publish_rate"),
            deliver_get=latest.delivered if latest else 0,
            deliver_get_details=_details(history, "deliver_rate"),
        ),
        queue_totals=QueueTotals(
            messages=await messages_held(admin, topics), lag=latest.lag if latest else 0
        ),
        groups=groups,
    )


@router.get("/history", response_model=HistoryOut)
async def get_history(
    kept: HistoryDep, age_s: Annotated[float, Query(gt=0, le=600)] = 600.0
) -> HistoryOut:
    """The series behind the console's charts, oldest first, ``[ms, value]`` pairs."""
    samples = kept.since(age_s, wall_ms())
    topics: dict[str, TopicSeries] = {}
    for s in samples:
        for topic, (pub, dlv) in s.topics.items():
            series = topics.setdefault(topic, TopicSeries(publish_rate=[], deliver_rate=[]))
            series.publish_rate.append((s.at_ms, pub))
            series.deliver_rate.append((s.at_ms, dlv))
    return HistoryOut(
        interval_s=kept.interval_s,
        series=HistorySeries(
            publish_rate=[(s.at_ms, s.publish_rate) for s in samples],
            deliver_rate=[(s.at_ms, s.deliver_rate) for s in samples],
            lag=[(s.at_ms, float(s.lag)) for s in samples],
            topics=topics,
        ),
    )
