"""``hamq dev --mode controller``: where the controller peers listen, what each server's
configuration says, and when the group counts as whole.

The failover defaults live here because ``hamq bench failover`` measures them. From a
master's ``kill -9`` to the first send its successor acknowledges, two waits add up:

- the controller declares the master dead after ``DEV_HEARTBEAT_TIMEOUT_MS`` without a
  heartbeat (members send one every ``DEV_HEARTBEAT_INTERVAL_MS`` to each peer); the
  election is then one Raft round on loopback and the promotion an epoch-file fsync;
- producers refresh the route when a send to the dead master fails; the name servers
  give the new master broker id 0 at its first registration, which carries its newer
  epoch (``namesrv/routes.py``), so their own liveness timeout plays no part.

1 s of controller silence is five heartbeats: a member whose event loop stalls for up to
0.8 s (seen on a loaded 2-core machine during fsync-heavy runs) is not declared dead, and
about a second is left for the rest of the 2 s target.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import click

from hamq.client.admin import AsyncAdmin
from hamq.client.controller import ControllerClient
from hamq.clock import monotonic_s
from hamq.errors import HamqError

DEV_HEARTBEAT_INTERVAL_MS = 200
DEV_HEARTBEAT_TIMEOUT_MS = 1000
# The first standalone peer listens on ControllerConfig's default port (9878 for port base
# 9876), two above the name server; embedded peers are the name servers, from port base up.
STANDALONE_PORT_OFFSET = 2
POLL_INTERVAL_S = 0.1
READY_TIMEOUT_S = 60.0  # three members register, elect and fill the SyncStateSet

T = TypeVar("T")


@dataclass(frozen=True)
class ControllerLayout:
    """The controller peers of a dev cluster: id -> listen address (Raft shares it)."""

    embedded: bool
    peers: dict[int, str]

    @staticmethod
    def of(port_base: int, count: int, embedded: bool) -> ControllerLayout:
        first = port_base if embedded else port_base + STANDALONE_PORT_OFFSET
        return ControllerLayout(
            embedded, {i: f"127.0.0.1:{first + i - 1}" for i in range(1, count + 1)}
        )

    @property
    def addrs(self) -> list[str]:
        return list(self.peers.values())

    def peer_settings(self, peer_id: int) -> dict:
        """One peer's config (but its data directory): a name server embedding the
        controller, or a standalone controller."""
        settings: dict[str, object] = {
            "listen": self.peers[peer_id],
            "controller_peers": [f"{i}@{addr}" for i, addr in self.peers.items()],
            "controller_self_id": peer_id,
            "controller_heartbeat_timeout_ms": DEV_HEARTBEAT_TIMEOUT_MS,
        }
        if self.embedded:
            settings["enable_controller_in_namesrv"] = True
        return settings

    def ready_peers(self, pids: dict[str, int], leader_id: int | None) -> list[dict]:
        """The peers as the ready line lists them, with their pids and the Raft leader."""
        return [
            {
                "id": peer_id,
                "address": addr,
                "pid": pids[addr],
                "embedded": self.embedded,
                "leader": peer_id == leader_id,
            }
            for peer_id, addr in self.peers.items()
        ]

    def broker_settings(self) -> dict:
        """What every member adds in controller mode: the controller elects, and a send is
        acknowledged once the whole SyncStateSet holds it (no acknowledged loss)."""
        return {
            "enable_controller_mode": True,
            "controller_addr": self.addrs,
            "controller_heartbeat_interval_ms": DEV_HEARTBEAT_INTERVAL_MS,
            "all_ack_in_sync_state_set": True,
        }


def group_whole(group: dict, replicas: int) -> bool:
    """A master, and every member registered, alive and in the SyncStateSet: the group can
    lose any one member, the master included, without losing an acknowledged send."""
    members = group.get("members", [])
    return (
        group.get("master_id") is not None
        and sum(1 for m in members if m["alive"]) == replicas
        and len(group.get("sync_state_set", [])) == replicas
    )


async def poll_until(
    check: Callable[[], Awaitable[tuple[T | None, object]]], timeout_s: float, what: str
) -> T:
    """``check()``'s value once it gives one (it answers (value or None, what is missing)),
    polled until ``timeout_s``; TimeoutError names ``what`` and the last thing missing."""
    deadline = monotonic_s() + timeout_s
    last: object = "no answer from the controller"
    while monotonic_s() < deadline:
        try:
            value, last = await check()
            if value is not None:
                return value
        except HamqError as err:
            last = f"{type(err).__name__}: {err.message}"
        await asyncio.sleep(POLL_INTERVAL_S)
    raise TimeoutError(f"{what} after {timeout_s} s; last: {last}")


async def wait_whole(
    controller: ControllerClient,
    admin: AsyncAdmin,
    broker_name: str,
    replicas: int,
    timeout_s: float,
) -> dict:
    """The group's sync-state data once it is whole and the name servers route its master
    (clients can send), polled until ``timeout_s``; TimeoutError names what was missing."""

    async def check() -> tuple[dict | None, object]:
        groups = await controller.sync_state_data([broker_name])
        group = next((g for g in groups if g["broker_name"] == broker_name), None)
        if group is None:
            return None, f"the controller knows no group {broker_name}"
        if not group_whole(group, replicas):
            return None, group
        if (await admin.master_addrs()).get(broker_name) != group["master_addr"]:
            return None, f"name servers do not route master {group['master_addr']} yet"
        return group, None

    return await poll_until(check, timeout_s, f"group {broker_name} not whole")


def controller_ready(
    layout: ControllerLayout,
    namesrv_addr: str,
    replicas: int,
    brokers: list[dict],
    pids: dict[str, int],
    timeout_s: float = READY_TIMEOUT_S,
) -> dict:
    """``hamq dev``'s ready line in controller mode, once the group is whole: each broker's
    controller-given id, role and epoch (updated in ``brokers``), and the controller peers
    with their pids and which one is the Raft leader."""

    async def ask() -> tuple[dict, dict]:
        controller = ControllerClient(layout.addrs)
        admin = AsyncAdmin(namesrv_addr)
        try:
            group = await wait_whole(controller, admin, "broker-a", replicas, timeout_s)
            return group, await controller.metadata()
        finally:
            await controller.close()
            await admin.close()

    try:
        group, meta = asyncio.run(ask())
    except TimeoutError as err:
        raise click.ClickException(f"{err}; see the logs") from None
    by_addr = {m["address"]: m for m in group["members"]}
    for broker in brokers:
        member = by_addr[broker["address"]]
        broker.update(
            broker_id=member["broker_id"],
            role="master" if member["broker_id"] == group["master_id"] else "slave",
            epoch=member["epoch"],
        )
    return {
        "controllers": layout.ready_peers(pids, meta.get("leader_id")),
        "master_epoch": group["master_epoch"],
        "sync_state_set": group["sync_state_set"],
    }
