"""``hamq admin`` commands for mirrored-queue policies (seed 003): vhosts, policies, declared
topics and their mirrors, as rabbitmqctl names them.

A policy's definition is checked here, before anything is sent, so a typo is one line naming
the key and exit code 2 (bad usage), as rabbitmqctl refuses it; the controller checks it
again. What the commands read and do is ``hamq.manage``'s, shared with the web API; this
module is the command line around it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import click

from hamq.aio import AsyncAdmin
from hamq.cli.admin import controller_admin, controller_option
from hamq.cli.common import emit, json_option, namesrv_option, run_async
from hamq.cli.progress import progress
from hamq.cli.sync_progress import PERCENT, wait_synchronised
from hamq.errors import InvalidArgument
from hamq.manage.policies import set_policy as store_policy
from hamq.manage.queues import queue_rows
from hamq.manage.queues import sync_queue as sync_topic
from hamq.manage.topics import declare_topic as declare_in_cluster
from hamq.manage.topics import declaring_node
from hamq.policy.definition import (
    DEFAULT_VHOST,
    check_policy_name,
    check_stored_policy_name,
    check_vhost,
    make_policy,
)
from hamq.protocol.address import address
from hamq.protocol.controller_catalog import check_topic

# rabbitmqctl list_queues' columns that hamq answers, and its default pair.
QUEUE_COLUMNS = ("name", "policy", "pid", "slave_pids", "synchronised_slave_pids", "messages")
DEFAULT_QUEUE_COLUMNS = ("name", "messages")
SYNC_WAIT_S = 600.0  # sync-queue --wait's default bound


class BadDefinition(click.ClickException):
    """A definition or vhost that cannot be right: one line, exit code 2 (bad usage)."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


def _checked(check: Callable[[], object]) -> None:
    """Run ``check``; what it refuses is bad input (exit 2), never sent anywhere."""
    try:
        check()
    except InvalidArgument as err:
        raise BadDefinition(err.message) from None


def _vhost(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        _checked(lambda: check_vhost(value))
    return value


def _policy_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    _checked(lambda: check_policy_name(value))
    return value


def _existing_policy_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A policy to remove may have a name an older version accepted (see check_policy_name)."""
    _checked(lambda: check_stored_policy_name(value))
    return value


def _node_addr(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        _checked(lambda: address(value, "--node"))
    return value


vhost_option = click.option(
    "--vhost",
    "-p",
    default=DEFAULT_VHOST,
    show_default=True,
    callback=_vhost,
    help="Virtual host (rabbitmqctl -p).",
)


def _definition_text(row: Mapping[str, Any]) -> str:
    definition = row["definition"]
    return definition if isinstance(definition, str) else json.dumps(definition, sort_keys=True)


def _table(columns: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    """rabbitmqctl's output: a header line, then one tab-separated line per row."""
    return "\n".join("\t".join(map(str, line)) for line in [list(columns), *map(list, rows)])


# -- vhosts ---------------------------------------------------------------------------------


def _vhost_change(command: str, verb: str, doc: str) -> click.Command:
    """``add-vhost`` / ``delete-vhost``: one controller call named like the command."""
    call = command.replace("-", "_")

    @click.command(command, help=doc)
    @click.argument("name", callback=_vhost)
    @controller_option
    @json_option
    @run_async
    async def change(name: str, controllers: list[str], as_json: bool) -> None:
        async with controller_admin(controllers) as admin:
            await getattr(admin.client, call)(name)
        emit({"vhost": name}, as_json, lambda o: f"{verb} vhost {o['vhost']}")

    return change


add_vhost = _vhost_change("add-vhost", "added", "Create a virtual host.")
delete_vhost = _vhost_change(
    "delete-vhost", "deleted", "Delete a virtual host with its policies and topics."
)


@click.command("list-vhosts")
@controller_option
@json_option
@run_async
async def list_vhosts(controllers: list[str], as_json: bool) -> None:
    """The virtual hosts."""
    async with controller_admin(controllers) as admin:
        vhosts = sorted(await admin.client.list_vhosts())
    emit(vhosts, as_json, lambda o: _table(["name"], ([v] for v in o)))


@click.command("list-nodes")
@controller_option
@json_option
@run_async
async def list_nodes(controllers: list[str], as_json: bool) -> None:
    """The nodes (containers with a node name) the controller places mirrors on, as
    rabbitmqctl cluster_status names them (``hamq@host``)."""
    async with controller_admin(controllers) as admin:
        nodes = sorted(await admin.client.list_nodes(), key=lambda n: n["node"])
    emit(
        nodes,
        as_json,
        lambda o: _table(
            ["name", "address", "alive"],
            ([n["node"], n["address"], "yes" if n["alive"] else "no"] for n in o),
        ),
    )


# -- policies -------------------------------------------------------------------------------


@click.command("set-policy")
@click.argument("name", callback=_policy_name)
@click.argument("pattern")
@click.argument("definition_json")
@click.option("--priority", type=click.IntRange(-(2**31), 2**31 - 1), default=0, show_default=True)
@click.option("--apply-to", type=click.Choice(["topics", "all"]), default="topics")
@vhost_option
@controller_option
@json_option
@run_async
async def set_policy(
    name: str,
    pattern: str,
    definition_json: str,
    priority: int,
    apply_to: str,
    vhost: str,
    controllers: list[str],
    as_json: bool,
) -> None:
    """Set (or change) a policy: topics whose name matches PATTERN are mirrored as
    DEFINITION_JSON says (ha-mode, ha-params, ha-sync-mode, ...)."""
    try:
        raw = json.loads(definition_json)
    except ValueError as err:
        raise BadDefinition(f"DEFINITION_JSON is not JSON: {err}") from None
    except RecursionError:  # json's decoder recurses once per level of nesting
        raise BadDefinition("DEFINITION_JSON is nested too deeply") from None
    if not isinstance(raw, dict):
        raise BadDefinition("DEFINITION_JSON must be a JSON object of policy keys")
    try:
        policy = make_policy(vhost, name, pattern, raw, priority=priority, apply_to=apply_to)
    except InvalidArgument as err:
        raise BadDefinition(err.message) from None
    async with controller_admin(controllers) as admin:
        stored = await store_policy(admin, policy)
    emit(
        stored,
        as_json,
        lambda o: (
            f'set policy "{o["name"]}" for pattern "{o["pattern"]}" to '
            f"{json.dumps(o['definition'])} with priority {o['priority']} in vhost {o['vhost']}"
        ),
    )


@click.command("clear-policy")
@click.argument("name", callback=_existing_policy_name)
@vhost_option
@controller_option
@json_option
@run_async
async def clear_policy(name: str, vhost: str, controllers: list[str], as_json: bool) -> None:
    """Remove a policy (its topics move to the next matching policy, or to no mirrors)."""
    async with controller_admin(controllers) as admin:
        await admin.client.clear_policy(vhost, name)
    emit(
        {"vhost": vhost, "name": name},
        as_json,
        lambda o: f'cleared policy "{o["name"]}" in vhost {o["vhost"]}',
    )


@click.command("list-policies")
@click.option("--vhost", "-p", callback=_vhost, help="Only this virtual host (default: every one).")
@controller_option
@json_option
@run_async
async def list_policies(vhost: str | None, controllers: list[str], as_json: bool) -> None:
    """The policies, as rabbitmqctl list_policies prints them."""
    async with controller_admin(controllers) as admin:
        rows = await admin.client.list_policies(vhost)
    emit(
        rows,
        as_json,
        lambda o: _table(
            ["vhost", "name", "pattern", "apply-to", "definition", "priority"],
            (
                [r[k] for k in ("vhost", "name", "pattern", "apply_to")]
                + [_definition_text(r), r["priority"]]
                for r in o
            ),
        ),
    )


# -- topics ---------------------------------------------------------------------------------


@click.command("declare-topic")
@click.argument("name")
@vhost_option
@click.option(
    "--node",
    "node_addr",
    callback=_node_addr,
    help="Declare through this node (a container's listen address): it becomes the topic's "
    "home node, as for a client connected there (default: the first alive node by name).",
)
@click.option("--queues", type=click.IntRange(min=1), default=4, show_default=True)
@controller_option
@json_option
@run_async
async def declare_topic(
    name: str,
    vhost: str,
    node_addr: str | None,
    queues: int,
    controllers: list[str],
    as_json: bool,
) -> None:
    """Declare a topic: the policies decide which nodes hold it."""
    _checked(lambda: check_topic(vhost, name))
    if not node_addr:
        async with controller_admin(controllers) as admin:
            node_addr = declaring_node(await admin.client.list_nodes(), None)["address"]
    await declare_in_cluster(node_addr, vhost, name, queues)
    emit(
        {"vhost": vhost, "name": name, "queues": queues, "node": node_addr},
        as_json,
        lambda o: f"declared topic {o['name']} in vhost {o['vhost']} through {o['node']}",
    )


def _pid_text(pid: object) -> str:
    if isinstance(pid, list):
        return "[" + ", ".join(map(_pid_text, pid)) + "]"
    if isinstance(pid, dict):
        return f"<{pid['node'] or '?'} {pid['address']}>"
    return "" if pid is None else str(pid)


@click.command("list-queues")
@click.argument("columns", nargs=-1, type=click.Choice(QUEUE_COLUMNS))
@vhost_option
@controller_option
@namesrv_option
@json_option
@run_async
async def list_queues(
    columns: tuple[str, ...], vhost: str, controllers: list[str], namesrv: str, as_json: bool
) -> None:
    """Declared topics and their mirrors (rabbitmqctl list_queues): COLUMN is name, policy,
    pid (the master: node and address), slave_pids, synchronised_slave_pids or messages."""
    shown = columns or DEFAULT_QUEUE_COLUMNS
    reader = AsyncAdmin(namesrv)
    try:
        async with controller_admin(controllers) as admin:
            rows = await queue_rows(reader, admin, vhost)
    finally:
        await reader.close()
    picked = [{c: row[c] for c in shown} for row in rows]
    emit(picked, as_json, lambda o: _table(shown, ([_pid_text(r[c]) for c in shown] for r in o)))


# -- sync -----------------------------------------------------------------------------------


def _sync_command(command: str, cancel: bool, doc: str, said: str) -> click.Command:
    """``sync-queue`` / ``cancel-sync-queue``: SYNC_QUEUE to the topic's master."""

    @click.command(command, help=doc)
    @click.argument("name")
    @vhost_option
    @controller_option
    @json_option
    @run_async
    async def sync(
        name: str,
        vhost: str,
        controllers: list[str],
        as_json: bool,
        wait: bool = False,
        timeout: float = SYNC_WAIT_S,
    ) -> None:
        _checked(lambda: check_topic(vhost, name))
        async with controller_admin(controllers) as admin:
            done = await sync_topic(admin, vhost, name, cancel=cancel)
            if wait and done.get("members"):
                with progress(PERCENT, f"synchronising {name} (%)", not as_json) as advance:
                    await wait_synchronised(admin, done["group"], done["members"], timeout, advance)
        emit(
            done,
            as_json,
            lambda o: (
                f"{said} topic {o['name']} in vhost {o['vhost']}: "
                f"{len(o.get('members', ()))} unsynchronised mirror(s) of {o['group']}"
            ),
        )

    if not cancel:  # a cancel takes effect at once: nothing to wait for
        sync = click.option(
            "--timeout", default=SYNC_WAIT_S, show_default=True, help="With --wait: seconds."
        )(sync)
        sync = click.option(
            "--wait",
            is_flag=True,
            help="Return once the mirrors are synchronised (a progress bar on a terminal).",
        )(sync)
    return sync


sync_queue = _sync_command(
    "sync-queue",
    False,
    "Copy a topic's history to its unsynchronised mirrors (the topic keeps serving).",
    "synchronising",
)
cancel_sync_queue = _sync_command(
    "cancel-sync-queue",
    True,
    "Stop synchronising a topic's mirrors (they keep only what was sent after they joined).",
    "stopped synchronising",
)


POLICY_COMMANDS = (
    add_vhost,
    delete_vhost,
    list_vhosts,
    list_nodes,
    set_policy,
    clear_policy,
    list_policies,
    declare_topic,
    list_queues,
    sync_queue,
    cancel_sync_queue,
)
