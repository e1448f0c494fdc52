"""``hamq admin``: operator commands (RocketMQ's mqadmin)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator

import click

from hamq.aio import AsyncAdmin
from hamq.cli.common import (
    BadConfig,
    config_file_option,
    emit,
    json_option,
    namesrv_option,
    run_async,
)
from hamq.client.admin import AsyncControllerAdmin, controller_list
from hamq.config import BrokerConfig, load_config
from hamq.config_check import address
from hamq.errors import ConfigError, ControllerRefused, HamqError
from hamq.manage.consumers import consumer_group
from hamq.manage.groups import controller_members
from hamq.net.connection import connect
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import pack_body, unpack_body

# A standalone controller's default listen address (ControllerConfig.listen).
DEFAULT_CONTROLLER = "127.0.0.1:9878"
# A member's start: recovery, name-server registration, its first member-group sync.
CONTAINER_CHANGE_TIMEOUT_S = 60.0


@click.group()
def admin() -> None:
    """Operator commands."""


@admin.command("consumer-progress")
@click.option("--group", "-g", required=True, help="Consumer group.")
@namesrv_option
@json_option
@run_async
async def consumer_progress(group: str, namesrv: str, as_json: bool) -> None:
    """Lag per queue of a consumer group, and its connected clients."""
    client = AsyncAdmin(namesrv)
    try:
        progress = await consumer_group(client, group)
    finally:
        await client.close()
    emit(
        progress,
        as_json,
        lambda o: "\n".join(
            [f"members {', '.join(o['members']) or '-'}"]
            + [
                f"{'topic':<24} {'broker':<12} {'queue':>5} {'broker offset':>14} "
                f"{'consumer offset':>16} {'lag':>10}"
            ]
            + [
                f"{r['topic']:<24} {r['broker_name']:<12} {r['queue_id']:>5} "
                f"{r['broker_offset']:>14} {r['consumer_offset']:>16} {r['lag']:>10}"
                for r in o["queues"]
            ]
            + [f"total lag {o['total_lag']}"]
        ),
    )


@admin.command("spark-journals")
@click.option("--delete", "topic", default=None, help="Delete this journal topic.")
@click.option("--timeout", "timeout_s", default=10.0, show_default=True, help="Seconds to wait.")
@namesrv_option
@json_option
@run_async
async def spark_journals(topic: str | None, timeout_s: float, namesrv: str, as_json: bool) -> None:
    """The Spark sink's journals (HAMQ_SINK_*): sink, last micro-batch, age; or delete one
    whose query will never restart."""
    from hamq.spark.journal_admin import delete_journal, list_journals  # needs pyspark

    if topic is not None:
        try:
            await delete_journal(namesrv, topic, timeout_s)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--delete") from None
        emit({"deleted": topic}, as_json, lambda o: f"deleted {o['deleted']}")
        return
    rows = [row.as_dict() for row in await list_journals(namesrv, timeout_s)]
    emit(
        rows,
        as_json,
        lambda o: "\n".join(
            [f"{'topic':<35} {'group':<12} {'entries':>8} {'last batch':>10} {'age s':>10}"]
            + [
                f"{r['topic']:<35} {r['group'] or '-':<12} {r['entries']:>8} "
                f"{'-' if r['last_batch'] is None else r['last_batch']:>10} "
                f"{'-' if r['age_s'] is None else round(r['age_s']):>10}"
                + (f"  {r['error']}" if r["error"] else "")
                for r in o
            ]
        ),
    )


@admin.command("elect")
@click.option("--group", "-g", "broker_name", required=True, help="Broker group (brokerName).")
@click.option(
    "--member", "-m", "member_id", required=True, type=int, help="DLedger member id to make leader."
)
@namesrv_option
@json_option
@run_async
async def elect(broker_name: str, member_id: int, namesrv: str, as_json: bool) -> None:
    """Transfer a DLedger group's leadership to one member."""
    client = AsyncAdmin(namesrv)
    try:
        address = await client.elect(broker_name, member_id)
    finally:
        await client.close()
    emit(
        {"group": broker_name, "leader": member_id, "address": address},
        as_json,
        lambda o: f"member {o['leader']} ({o['address']}) now leads {o['group']}",
    )


def _controller_addrs(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    """``ADDR[,ADDR]`` checked here, so a typo is a usage error and not a traceback."""
    try:
        addrs = controller_list(value)
        for addr in addrs:
            address("--controller", addr)
    except (ValueError, ConfigError) as err:
        raise click.BadParameter(getattr(err, "message", str(err))) from None
    return addrs


controller_option = click.option(
    "--controller",
    "controllers",
    callback=_controller_addrs,
    default=lambda: os.environ.get("HAMQ_CONTROLLER", DEFAULT_CONTROLLER),
    show_default=f"$HAMQ_CONTROLLER or {DEFAULT_CONTROLLER}",
    help="Controller peer address(es), HOST:PORT separated by ','. A name server that "
    "embeds the controller answers on its own address.",
)
broker_name_option = click.option(
    "--broker-name", "-b", required=True, help="Broker group (brokerName)."
)
cluster_option = click.option(
    "--cluster", "-c", help="The group's cluster (default: the one the controller knows)."
)


@contextlib.asynccontextmanager
async def controller_admin(controllers: list[str]) -> AsyncIterator[AsyncControllerAdmin]:
    """The controller admin client; a refusal becomes one line with its CONTROLLER_* name
    and the controller's remark, exit code 1."""
    client = AsyncControllerAdmin(controllers)
    try:
        yield client
    except ControllerRefused as err:
        raise click.ClickException(f"{err.code.name}: {err.message}") from None
    finally:
        await client.close()


@admin.command("sync-state-set")
@broker_name_option
@controller_option
@json_option
@run_async
async def sync_state_set(broker_name: str, controllers: list[str], as_json: bool) -> None:
    """A controller-mode group: its master, epochs, SyncStateSet and members."""
    async with controller_admin(controllers) as client:
        group = await client.sync_state(broker_name)
    emit(group, as_json, _group_text)


@admin.command("elect-master")
@broker_name_option
@click.option(
    "--broker-id", type=int, help="The member to make master (default: the controller's pick)."
)
@cluster_option
@controller_option
@json_option
@run_async
async def elect_master(
    broker_name: str,
    broker_id: int | None,
    cluster: str | None,
    controllers: list[str],
    as_json: bool,
) -> None:
    """Elect a controller-mode group's master (from the alive SyncStateSet members)."""
    async with controller_admin(controllers) as client:
        info = await client.elect_master(broker_name, broker_id, cluster)
    emit(
        info,
        as_json,
        lambda o: (
            f"{o['broker_name']}: master {o['master_id']} at {o['master_addr']}, "
            f"master epoch {o['master_epoch']}; SyncStateSet {o['sync_state_set']} "
            f"(epoch {o['sync_state_set_epoch']})"
        ),
    )


@admin.command("controller-metadata")
@controller_option
@json_option
@run_async
async def controller_metadata(controllers: list[str], as_json: bool) -> None:
    """The controller peers, the Raft leader and its term."""
    async with controller_admin(controllers) as client:
        meta = await client.metadata()
    emit(meta, as_json, _metadata_text)


@admin.command("clean-broker-metadata")
@broker_name_option
@click.option(
    "--broker-ids",
    default="",
    help="Members to forget, comma-separated (default: the whole group).",
)
@click.option(
    "--clean-living-broker", is_flag=True, help="Also forget members that are still alive."
)
@cluster_option
@controller_option
@json_option
@run_async
async def clean_broker_metadata(
    broker_name: str,
    broker_ids: str,
    clean_living_broker: bool,
    cluster: str | None,
    controllers: list[str],
    as_json: bool,
) -> None:
    """Make the controller forget members of a group (dead ones unless told otherwise)."""
    try:
        ids = [int(i) for i in broker_ids.split(",") if i.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{broker_ids!r} is not a comma-separated list of ids", param_hint="--broker-ids"
        ) from None
    async with controller_admin(controllers) as client:
        done = await client.clean_broker_metadata(broker_name, ids, clean_living_broker, cluster)
    emit(
        done,
        as_json,
        lambda o: (
            f"{o['broker_name']} (cluster {o['cluster_name']}): the controller forgot "
            + (
                f"members {', '.join(map(str, o['broker_ids']))}"
                if o["broker_ids"]
                else "the group"
            )
        ),
    )


def _group_text(group: dict) -> str:
    head = (
        f"{group['broker_name']} (cluster {group['cluster_name']}): "
        + (
            f"master {group['master_id']} at {group['master_addr']}"
            if group["master_id"] is not None
            else "no master"
        )
        + f", master epoch {group['master_epoch']}; SyncStateSet "
        f"{sorted(group['sync_state_set'])} (epoch {group['sync_state_set_epoch']})"
    )
    rows = [
        f"{'id':>4}  {'address':<22} {'role':<7} {'alive':<6} {'in sync':<8} {'epoch':>6} "
        f"{'max offset':>14} {'confirm offset':>14}"
    ] + [
        f"{m['broker_id']:>4}  {m['address']:<22} {m['role']:<7} "
        f"{'yes' if m['alive'] else 'no':<6} {'yes' if m['in_sync'] else 'no':<8} "
        f"{m['epoch']:>6} {m['max_offset']:>14} {m['confirm_offset']:>14}"
        for m in controller_members(group)
    ]
    return "\n".join([head, *rows])


def _metadata_text(meta: dict) -> str:
    leader = (
        f"Raft leader {meta['leader_id']} at {meta['leader_addr']}"
        if meta.get("leader_id") is not None
        else "no Raft leader"
    )
    head = (
        f"controller peer {meta['self_id']} answered: {leader}, term {meta['term']}; "
        f"commit index {meta['commit_index']}, applied {meta['applied_index']}"
    )
    rows = [
        f"{peer_id:>4}  {addr}{'  (leader)' if peer_id == meta.get('leader_id') else ''}"
        for peer_id, addr in sorted(meta["peers"])
    ]
    return "\n".join([head, *rows])


@admin.group("container")
def container_admin() -> None:
    """Add and remove the members of a broker container (hamq container)."""


def host_port(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A ``HOST:PORT`` option's value, checked: a bad one is a usage error naming the flag."""
    try:
        address(param.opts[0], value)
    except ConfigError as err:
        raise click.BadParameter(err.message) from None
    return value


container_option = click.option(
    "--container",
    "container_addr",
    required=True,
    callback=host_port,
    help="The container's listen address (HOST:PORT).",
)


async def _container_request(addr: str, code: int, ext: dict, body: bytes = b"") -> dict:
    """One request to a container's port; the answer lists its members after the change."""
    conn = await connect(addr)
    try:
        frame = await conn.request(code, ext, body, timeout_s=CONTAINER_CHANGE_TIMEOUT_S)
    finally:
        conn.close()
    if frame.code != ResponseCode.SUCCESS:
        raise HamqError.for_code(frame.code, frame.remark)
    return unpack_body(frame.body) or {}


def _members_text(members: dict) -> str:
    return "\n".join(
        f"{m['broker_name']:<16} id {m['broker_id']:<3} {m['role']:<7} {m['listen']}"
        for m in members["members"]
    )


@container_admin.command("add-broker")
@container_option
@config_file_option("The new member's broker config file (its namesrv is the container's).")
@json_option
@run_async
async def add_broker(container_addr: str, config_path: str, as_json: bool) -> None:
    """Start a broker member in a running container (ADD_BROKER)."""
    try:
        config = load_config(BrokerConfig, config_path)
    except ConfigError as err:
        raise BadConfig(err.message) from None
    body = pack_body(dataclasses.asdict(config))
    members = await _container_request(
        container_addr, RequestCode.ADD_BROKER, {"config_path": config_path}, body
    )
    emit(members, as_json, _members_text)


@container_admin.command("remove-broker")
@container_option
@click.option("--broker-name", "-b", required=True, help="The member's brokerName.")
@click.option("--broker-id", "-i", required=True, type=int, help="The member's brokerId.")
@json_option
@run_async
async def remove_broker(
    container_addr: str, broker_name: str, broker_id: int, as_json: bool
) -> None:
    """Stop a container's member, as a broker process stops on SIGTERM (REMOVE_BROKER)."""
    members = await _container_request(
        container_addr,
        RequestCode.REMOVE_BROKER,
        {"broker_name": broker_name, "broker_id": broker_id},
    )
    emit(members, as_json, _members_text)
