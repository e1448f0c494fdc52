"""The broker processes of a cluster as the name servers know them, for RabbitMQ's
``/api/nodes`` ("the processes of my cluster") where the controller places mirrors on no
nodes: ``hamq dev``'s default group of three, a master-slave or DLedger cluster, a broker
container. One row per registered member address; a container's members are one process,
so ``process_count`` counts them once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hamq.client.admin import AsyncAdmin
from hamq.manage.groups import member_role, member_rows


async def broker_processes(admin: AsyncAdmin) -> list[dict[str, Any]]:
    """Each registered member: ``address``, ``cluster_name``, ``broker_name``,
    ``broker_id`` (as registered, 0 = master), ``role`` (master, slave, or down when it
    does not answer), ``alive`` and ``pid`` (None when down)."""
    return [
        {
            "address": row["address"],
            "cluster_name": row["cluster"],
            "broker_name": row["broker_name"],
            "broker_id": row["broker_id"],
            "role": member_role(row),
            "alive": "error" not in row,
            "pid": row.get("pid"),
        }
        for row in await member_rows(admin)
    ]


def process_count(processes: Iterable[Mapping[str, Any]]) -> int:
    """Processes behind ``broker_processes`` rows: members on one host with one pid (a
    container's) count once; a member that does not answer counts as its own."""
    return len(
        {
            (p["address"].rpartition(":")[0], p["pid"]) if p["alive"] else p["address"]
            for p in processes
        }
    )
