"""Broker groups as an operator sees them: each member's role, epoch and offsets, the
group's master epoch, SyncStateSet and confirm offset, and electing a master.

Two sources tell the same story from two sides: the controller's sync-state data (its
decisions, and members that are down but still in the group) and each registered member's
runtime info (what the member itself runs). A group the controller knows is read from the
controller; a DLedger or master-slave group, or a controller group when no controller is
configured, from its members."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any
from weakref import WeakKeyDictionary

from hamq.client.admin import AsyncAdmin, AsyncControllerAdmin
from hamq.clock import monotonic_s
from hamq.errors import BrokerNotFound, HamqError, InvalidArgument, ServiceNotAvailable

CONTROLLER = "controller"
DLEDGER = "dledger"
MASTER_SLAVE = "master_slave"
# The runtime info's broker_role of a member that is its group's writer.
_WRITER_ROLES = frozenset({"sync_master", "async_master", "leader"})
_DLEDGER_ROLES = frozenset({"leader", "follower"})
MEMBER_ROWS_FRESH_S = 1.0
# Per admin client: when its last member_rows round began, and that round.
_rounds: WeakKeyDictionary[AsyncAdmin, tuple[float, asyncio.Future[list[dict[str, Any]]]]] = (
    WeakKeyDictionary()
)


async def member_rows(admin: AsyncAdmin) -> list[dict[str, Any]]:
    """Every member the name servers register (``cluster``, ``broker_name``, ``broker_id``
    as registered, ``address``) with its runtime info, or ``error`` when it did not answer;
    asked all at once, so one member that hangs costs one timeout.

    Callers of one admin share a round begun less than ``MEMBER_ROWS_FRESH_S`` ago: the
    console's overview asks ``/api/overview``, ``/api/nodes`` and ``/api/groups`` together
    every few seconds, and each asked every member on the name server's loop."""
    now = monotonic_s()
    began, round_ = _rounds.get(admin, (0.0, None))
    if round_ is None or now - began >= MEMBER_ROWS_FRESH_S:
        round_ = asyncio.ensure_future(_member_rows(admin))
        _rounds[admin] = (now, round_)
        round_.add_done_callback(lambda done: _forget_failed(admin, done))
    return await asyncio.shield(round_)  # one caller gone leaves the round to the others


def _forget_failed(admin: AsyncAdmin, done: asyncio.Future[list[dict[str, Any]]]) -> None:
    """A round that failed is not handed to later callers: they ask again."""
    failed = done.cancelled() or done.exception() is not None
    if failed and _rounds.get(admin, (0.0, None))[1] is done:
        del _rounds[admin]


async def _member_rows(admin: AsyncAdmin) -> list[dict[str, Any]]:
    info = await admin.cluster_info()
    members = [
        (entry["cluster"], name, int(broker_id), addr)
        for name, entry in sorted(info["broker_addr_table"].items())
        for broker_id, addr in sorted(entry["broker_addrs"].items())
    ]
    runtimes = await asyncio.gather(*(_runtime(admin, addr) for *_, addr in members))
    return [
        {
            "cluster": cluster,
            "broker_name": name,
            "broker_id": broker_id,
            "address": addr,
            **runtime,
        }
        for (cluster, name, broker_id, addr), runtime in zip(members, runtimes)
    ]


async def _runtime(admin: AsyncAdmin, addr: str) -> dict[str, Any]:
    try:
        return await admin.broker_runtime_info(addr)
    except HamqError as err:
        return {"error": err.message}


def controller_members(group: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A controller group's members by id, each with its ``role`` (the controller's master,
    a slave, or ``down``: a member that is not alive plays no part, whatever the controller
    last decided for it) and ``in_sync`` (in the SyncStateSet)."""
    in_sync = set(group["sync_state_set"])
    return [
        {
            **m,
            "role": _role(m["alive"], m["broker_id"] == group["master_id"]),
            "in_sync": m["broker_id"] in in_sync,
        }
        for m in sorted(group["members"], key=lambda m: m["broker_id"])
    ]


def _role(alive: bool, writer: bool) -> str:
    return "down" if not alive else "master" if writer else "slave"


def member_role(row: Mapping[str, Any]) -> str:
    """A ``member_rows`` row's role as the member itself reports it (down: no answer)."""
    return _role("error" not in row, row.get("broker_role") in _WRITER_ROLES)


async def broker_groups(
    admin: AsyncAdmin,
    controllers: AsyncControllerAdmin | None,
    broker_names: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """Every broker group (or those named), by name; see ``group_view`` for each one's
    fields. ``controllers`` None: groups are read from their members only."""
    wanted = set(broker_names)
    rows, known = await asyncio.gather(
        member_rows(admin),
        controllers.client.sync_state_data(sorted(wanted)) if controllers else _no_groups(),
    )
    by_name: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_name.setdefault(row["broker_name"], []).append(row)
    decided = {g["broker_name"]: g for g in known}
    names = sorted(
        (set(by_name) | set(decided)) & wanted if wanted else set(by_name) | set(decided)
    )
    return [group_view(name, by_name.get(name, []), decided.get(name)) for name in names]


async def _no_groups() -> list[dict[str, Any]]:
    return []


async def broker_group(
    admin: AsyncAdmin, controllers: AsyncControllerAdmin | None, broker_name: str
) -> dict[str, Any]:
    """One group; ``BrokerNotFound`` when neither the name servers nor the controller
    know it."""
    for group in await broker_groups(admin, controllers, [broker_name]):
        return group
    raise BrokerNotFound(f"no broker group {broker_name}")


def group_view(
    broker_name: str, rows: list[dict[str, Any]], decided: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A group from its members' ``member_rows`` and the controller's sync-state data for
    it (None: not a controller group, or no controller configured): ``cluster_name``,
    ``mode``, ``master_id``, ``master_addr``, ``master_epoch``, ``sync_state_set``,
    ``sync_state_set_epoch``, ``confirm_offset`` (None where the mode has none) and
    ``members``: each ``broker_id``, ``addr``, ``role``, ``broker_role`` (as the member
    reports it), ``alive``, ``in_sync``, ``epoch``, ``max_offset``, ``confirm_offset``,
    ``error`` (why its runtime info is missing)."""
    runtime = {row["address"]: row for row in rows}
    if decided is not None:
        members = [
            _member(m["broker_id"], m["address"], runtime.get(m["address"]))
            | {
                "role": m["role"],
                "alive": m["alive"],
                "in_sync": m["in_sync"],
                "epoch": m["epoch"],
                "max_offset": m["max_offset"],
                "confirm_offset": m["confirm_offset"],
            }
            for m in controller_members(decided)
        ]
        master = next((m for m in members if m["role"] == "master"), None)
        return {
            "cluster_name": decided["cluster_name"],
            "broker_name": broker_name,
            "mode": CONTROLLER,
            "master_id": decided["master_id"],
            "master_addr": decided["master_addr"],
            "master_epoch": decided["master_epoch"],
            "sync_state_set": sorted(decided["sync_state_set"]),
            "sync_state_set_epoch": decided["sync_state_set_epoch"],
            "confirm_offset": None if master is None else master["confirm_offset"],
            "members": members,
        }
    members = sorted(
        (_member(_own_id(row), row["address"], row) for row in rows),
        key=lambda m: m["broker_id"],
    )
    master = next((m for m in members if m["role"] == "master"), None)
    own = {} if master is None else runtime[master["addr"]]
    replicas = own.get("controller") or {}
    roles = {m["broker_role"] for m in members}
    return {
        "cluster_name": rows[0]["cluster"],
        "broker_name": broker_name,
        "mode": CONTROLLER if replicas else DLEDGER if roles & _DLEDGER_ROLES else MASTER_SLAVE,
        "master_id": None if master is None else master["broker_id"],
        "master_addr": None if master is None else master["addr"],
        "master_epoch": None if master is None else master["epoch"],
        "sync_state_set": replicas.get("sync_state_set"),
        "sync_state_set_epoch": replicas.get("sync_state_set_epoch"),
        "confirm_offset": None if master is None else master["confirm_offset"],
        "members": members,
    }


def _own_id(row: Mapping[str, Any]) -> int:
    """The member's own id, the one elections name: a DLedger member's id in its Raft
    group, a controller-mode member's controller id (its master registers as 0)."""
    ha = row.get("ha") or {}
    if "member_id" in ha:
        return int(ha["member_id"])
    role = row.get("role")
    return role["broker_id"] if isinstance(role, dict) else row["broker_id"]


def _member(broker_id: int, addr: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    """A member as its runtime info shows it (``row`` None: not registered, so silent)."""
    if row is None or "error" in row:
        return {
            "broker_id": broker_id,
            "addr": addr,
            "role": "down",
            "broker_role": None,
            "alive": False,
            "in_sync": None,
            "epoch": None,
            "max_offset": None,
            "confirm_offset": None,
            "error": "not registered" if row is None else row["error"],
        }
    replicas = row.get("controller") or {}
    ha = row.get("ha") or {}
    return {
        "broker_id": broker_id,
        "addr": addr,
        "role": member_role(row),
        "broker_role": row["broker_role"],
        "alive": True,
        "in_sync": broker_id in replicas["sync_state_set"] if replicas else None,
        "epoch": row["role"]["epoch"],
        "max_offset": row["commitlog_max_offset"],
        "confirm_offset": replicas.get("confirm_offset", ha.get("confirm_offset")),
        "error": None,
    }


async def elect_master(
    admin: AsyncAdmin,
    controllers: AsyncControllerAdmin | None,
    broker_name: str,
    broker_id: int,
) -> dict[str, Any]:
    """Make ``broker_id`` its group's master: the controller elects it in a controller
    group, a DLedger group transfers its leadership; a master-slave group has no
    election. The group as it stands afterwards."""
    group = await broker_group(admin, controllers, broker_name)
    if group["mode"] == MASTER_SLAVE:
        raise InvalidArgument(f"{broker_name} is a master-slave group: it has no elections")
    if group["mode"] == CONTROLLER:
        if controllers is None:
            raise ServiceNotAvailable(
                f"{broker_name} is a controller group: no controller configured"
            )
        await controllers.elect_master(broker_name, broker_id, group["cluster_name"])
    else:
        await admin.elect(broker_name, broker_id)
    _rounds.pop(admin, None)  # not a round of runtime info begun before the election
    return await broker_group(admin, controllers, broker_name)
