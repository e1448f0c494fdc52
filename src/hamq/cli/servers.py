"""``hamq namesrv``, ``hamq controller``, ``hamq broker``, ``hamq container`` and ``hamq dev``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from hamq.broker.container import load_members, serve_container
from hamq.broker.server import serve_broker
from hamq.cli import dev_cluster, dev_container
from hamq.cli.common import BadConfig, config_file_option, readable, setup_logging
from hamq.cli.dev_controller import ControllerLayout, controller_ready
from hamq.cli.dev_web import WEB_PORT_OFFSET, check_web_listen, web_listen, web_ready
from hamq.client.sync import Admin
from hamq.clock import monotonic_s
from hamq.config import (
    BrokerConfig,
    ContainerConfig,
    ControllerConfig,
    NamesrvConfig,
    dump_toml,
    load_config,
)
from hamq.config_check import broker_binds, controller_binds, namesrv_binds
from hamq.controller_server.service import serve_controller
from hamq.errors import ConfigError, HamqError
from hamq.namesrv.server import serve_namesrv
from hamq.net.server import run_until_signalled
from hamq.preflight import can_create, check_can_start

READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0
# What a user evaluating hamq wants to see: a group that fails over on its own.
DEFAULT_CONTROLLER_REPLICAS = 3
DevConfig = BrokerConfig | ControllerConfig | NamesrvConfig | ContainerConfig
SERVER_CONFIGS: dict[str, type[NamesrvConfig | ControllerConfig]] = {
    "namesrv": NamesrvConfig,
    "controller": ControllerConfig,
}


def _load(cls, path, **overrides):
    try:
        return load_config(cls, path, **overrides)
    except ConfigError as err:
        raise BadConfig(err.message) from None


def _load_to_serve(cls, path, **overrides):
    """The config of the server this process runs, also checked against this machine."""
    config = _load(cls, path, **overrides)
    try:
        check_can_start(config)
    except ConfigError as err:
        raise BadConfig(f"{path or 'options'}: {err.message}") from None
    return config


@click.command()
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="TOML file with name server settings.",
)
@click.option("--listen", help="HOST:PORT to serve on (default 127.0.0.1:9876).")
@click.option("--data", "data_dir", help="Data directory.")
def namesrv(config_path: str | None, listen: str | None, data_dir: str | None) -> None:
    """Run a name server."""
    setup_logging()
    config = _load_to_serve(NamesrvConfig, config_path, listen=listen, data_dir=data_dir)
    run_until_signalled(lambda stop: serve_namesrv(config, stop))


@click.command()
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="TOML file with controller settings (controller_peers, controller_self_id, ...).",
)
@click.option("--listen", help="HOST:PORT to serve on (default 127.0.0.1:9878).")
@click.option("--data-dir", "data_dir", help="Raft log and snapshot directory.")
def controller(config_path: str | None, listen: str | None, data_dir: str | None) -> None:
    """Run one standalone controller peer."""
    setup_logging()
    config = _load_to_serve(ControllerConfig, config_path, listen=listen, data_dir=data_dir)
    run_until_signalled(lambda stop: serve_controller(config, stop))


@click.command()
@config_file_option("TOML file with broker settings (cluster_name, broker_name, listen, ...).")
def broker(config_path: str) -> None:
    """Run one broker member."""
    setup_logging()
    config = _load_to_serve(BrokerConfig, config_path)
    run_until_signalled(lambda stop: serve_broker(config, stop))


@click.command()
@config_file_option(
    "TOML file with container settings (listen, namesrv, brokers = member config files)."
)
def container(config_path: str) -> None:
    """Run a broker container: broker members of different groups in one process."""
    setup_logging()
    config = _load(ContainerConfig, config_path)
    try:
        members = load_members(config, config_path)
        run_until_signalled(lambda stop: serve_container(config, members, stop))
    except ConfigError as err:
        raise BadConfig(err.message) from None
    except HamqError as err:  # a member that did not start: the others were stopped
        raise click.ClickException(err.message) from None


@click.command()
@click.option(
    "--data",
    "data_dir",
    default="./.hamq-dev",
    show_default=True,
    help="Where the cluster keeps its data.",
)
@click.option(
    "--port-base",
    default=9876,
    show_default=True,
    help="The first name server's port; member i of the group listens on port-base + 1035 "
    "+ 10*i (its HA port one above).",
)
@click.option(
    "--mode",
    type=click.Choice(["single", "master-slave", "dledger", "controller", "container", "cluster"]),
    default="controller",
    show_default=True,
    help="One broker (the smallest setup); one group of a master and slaves; one DLedger "
    "(Raft) group; one group whose master the controller elects, again when it dies; two "
    "groups of a master and a slave hosted crosswise by two broker containers, with slave "
    "acting master; or nodes (containers hamq@node1..N) where the controller places groups "
    "by policy.",
)
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="--mode cluster: nodes (containers from port-base + 1001), beside --controllers "
    "name servers embedding the controller peers (from port-base).",
)
@click.option(
    "--controllers",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Controller peers (--mode controller): name servers from port-base up, or with "
    "--standalone controllers from port-base + 2.",
)
@click.option(
    "--embedded/--standalone",
    default=None,
    help="--mode controller: the controller peers are the name servers (from port-base up, "
    "enable_controller_in_namesrv; the default), or standalone `hamq controller`s beside "
    "one name server.",
)
@click.option(
    "--replicas",
    type=click.IntRange(min=1),
    help="Members of the group (master-slave: a master and replicas-1 slaves)  "
    f"[default: {DEFAULT_CONTROLLER_REPLICAS} in controller mode, else 1]",
)
@click.option(
    "--web-port",
    type=click.IntRange(1, 65535),
    help="Port of the HTTP API and web console, served by the first name server on "
    f"127.0.0.1  [default: port-base + {WEB_PORT_OFFSET}: above the name servers and "
    "controllers, below the containers (+1001 and up) and the members (+1035 and up)]",
)
@click.option(
    "--flush-disk-type", type=click.Choice(["async", "sync"]), default="async", show_default=True
)
@click.option(
    "--broker-role",
    type=click.Choice(["async_master", "sync_master"]),
    help="The master's role (default: sync_master in master-slave mode).",
)
@click.option("--total-replicas", type=int, help="totalReplicas (default: --replicas).")
@click.option(
    "--in-sync-replicas",
    type=int,
    default=1,
    show_default=True,
    help="inSyncReplicas: copies a send needs before it is acknowledged.",
)
@click.option(
    "--min-in-sync-replicas",
    type=int,
    default=1,
    show_default=True,
    help="minInSyncReplicas: the floor of automatic degradation.",
)
@click.option("--auto-degrade", is_flag=True, help="enableAutoInSyncReplicas.")
@click.option(
    "--ha-max-gap-not-in-sync",
    type=int,
    default=256 * 1024 * 1024,
    show_default=True,
    help="haMaxGapNotInSync (bytes): a slave further behind the master is not "
    "counted in sync (RocketMQ's default, 256 MiB).",
)
def dev(
    data_dir: str,
    port_base: int,
    mode: str,
    replicas: int | None,
    flush_disk_type: str,
    broker_role: str | None,
    total_replicas: int | None,
    in_sync_replicas: int,
    min_in_sync_replicas: int,
    auto_degrade: bool,
    ha_max_gap_not_in_sync: int,
    controllers: int,
    embedded: bool | None,
    nodes: int,
    web_port: int | None,
) -> None:
    """Run a local cluster (name servers, controllers, broker groups, broker containers) as
    child processes; the first name server serves the HTTP API and web console. By default
    a group of three whose master the controllers, embedded in the name servers, elect."""
    if replicas is None:
        replicas = DEFAULT_CONTROLLER_REPLICAS if mode == "controller" else 1
    if mode == "single" and replicas != 1:
        raise click.BadParameter("--replicas needs --mode master-slave", param_hint="--replicas")
    clustered = mode == "cluster"
    if embedded is not None and mode != "controller":
        raise click.BadParameter(
            "--embedded/--standalone needs --mode controller", param_hint="--embedded"
        )
    if mode in ("container", "cluster") and replicas != 1:
        raise click.BadParameter(
            f"--mode {mode} takes no --replicas (its groups are not started by hand)",
            param_hint="--replicas",
        )
    root = Path(data_dir).resolve()
    layout = (
        ControllerLayout.of(port_base, controllers, clustered or embedded is not False)
        if mode in ("controller", "cluster")
        else None
    )
    web = web_listen(port_base, web_port)
    namesrv_addrs = layout.addrs if layout and layout.embedded else [f"127.0.0.1:{port_base}"]
    namesrv_addr = ";".join(namesrv_addrs)
    members: dict[str, dict] = {}  # name: settings
    raft_peers = [
        f"{i}@127.0.0.1:{port_base + 1035 + 10 * (i - 1) + 2}" for i in range(1, replicas + 1)
    ]
    hosted = mode == "container"
    groups = dev_container.GROUPS if hosted else () if clustered else ("broker-a",)
    group_size = dev_container.GROUP_SIZE if hosted else replicas
    for index, (broker_name, broker_id) in enumerate(
        (g, i) for g in groups for i in range(group_size)
    ):
        name = f"{broker_name}-{broker_id + 1 if mode == 'dledger' else broker_id}"
        settings = {
            "cluster_name": "DevCluster",
            "broker_name": broker_name,
            "broker_id": broker_id,
            "broker_role": "slave"
            if broker_id
            else (
                broker_role
                or ("sync_master" if mode in ("master-slave", "container") else "async_master")
            ),
            "listen": f"127.0.0.1:{port_base + 1035 + 10 * index}",
            "namesrv": namesrv_addrs,
            "store_dir": str(root / name),
            "flush_disk_type": flush_disk_type,
            "total_replicas": group_size if total_replicas is None else total_replicas,
            "in_sync_replicas": in_sync_replicas,
            "min_in_sync_replicas": min_in_sync_replicas,
            "enable_auto_in_sync_replicas": auto_degrade,
            "ha_max_gap_not_in_sync": ha_max_gap_not_in_sync,
        }
        if mode == "dledger":  # members 1..n; whoever Raft elects registers as brokerId 0
            settings.update(
                broker_id=broker_id + 1,
                broker_role="async_master",
                replication_mode="dledger",
                dledger_self_id=broker_id + 1,
                dledger_peers=raft_peers,
            )
        if layout:
            settings.update(layout.broker_settings())
        if hosted:  # a masterless group's slave serves master-only work (seed 004)
            settings["enable_slave_acting_master"] = True
        members[name] = settings
    # name: (command, settings)
    peer_extra = dev_cluster.PEER_SETTINGS if clustered else {}
    servers = _server_configs(root, namesrv_addrs, layout, hosted, peer_extra, web)
    if hosted:
        containers = dev_container.container_settings(port_base, root, namesrv_addrs)
    elif clustered and layout:
        containers = dev_cluster.node_settings(port_base, root, namesrv_addrs, layout, nodes)
    else:
        containers = {}
    # a bad flag combination fails here, clearly, before anything starts
    configs: dict[str, DevConfig] = {
        **{name: _load(BrokerConfig, None, **s) for name, s in members.items()},
        **{name: _load(SERVER_CONFIGS[c], None, **s) for name, (c, s) in servers.items()},
        **{name: _load(ContainerConfig, None, **s) for name, s in containers.items()},
    }
    try:
        can_create("--data", data_dir)
        check_web_listen(web, _layout_binds(configs))
    except ConfigError as err:
        raise BadConfig(f"options: {err.message}") from None
    root.mkdir(parents=True, exist_ok=True)  # only once every config is known to be good
    for name, settings in [
        *members.items(),
        *((n, s) for n, (_, s) in servers.items()),
        *containers.items(),
    ]:
        (root / f"{name}.toml").write_text(dump_toml(settings))
    children: list[subprocess.Popen] = []
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        pids = {}  # listen address: pid
        for name, (command, settings) in servers.items():
            proc = _spawn([command, "-c", str(root / f"{name}.toml")], root, name)
            children.append(proc)
            _wait_ready(proc, name)
            pids[settings["listen"]] = proc.pid
        # a container runs its members: each member's pid is its container's
        for name, settings in containers.items():
            proc = _spawn(["container", "-c", str(root / f"{name}.toml")], root, name)
            children.append(proc)
            _wait_ready(proc, name)
            pids[settings["listen"]] = proc.pid
            for path in settings["brokers"]:
                pids[members[Path(path).stem]["listen"]] = proc.pid
        brokers = []
        for name, m in members.items():
            if not hosted:
                proc = _spawn(["broker", "-c", str(root / f"{name}.toml")], root, name)
                children.append(proc)
                _wait_ready(proc, name)
                pids[m["listen"]] = proc.pid
            brokers.append(
                {
                    "name": name,
                    "broker_name": m["broker_name"],
                    "broker_id": m["broker_id"],
                    "role": "dledger" if mode == "dledger" else m["broker_role"],
                    "address": m["listen"],
                    "pid": pids[m["listen"]],
                }
            )
        if mode in ("dledger", "container"):  # ready means routes point to every master
            for broker_name in groups:
                _wait_for_master(namesrv_addr, broker_name)
        ready = {
            "event": "ready",
            "mode": mode,
            "namesrv": namesrv_addr,
            "web": web_ready(web),
            "data": str(root),
            "namesrv_pid": pids[namesrv_addrs[0]],
            "brokers": brokers,
        }
        if clustered and layout:  # ready means every node is registered alive
            ready.update(dev_cluster.cluster_ready(layout, containers, pids))
        elif layout:  # ready means the group is whole: roles and epochs come from the controller
            ready.update(controller_ready(layout, namesrv_addr, replicas, brokers, pids))
        if hosted:
            ready["containers"] = [
                {
                    "name": name,
                    "address": settings["listen"],
                    "pid": pids[settings["listen"]],
                    "brokers": [Path(path).stem for path in settings["brokers"]],
                }
                for name, settings in containers.items()
            ]
        click.echo(json.dumps(ready))
        click.echo(
            f"hamq dev: console {ready['web']['url']} (127.0.0.1 only, no login yet); "
            f"connect with --namesrv {namesrv_addr}\n"
            f"hamq dev: or export HAMQ_NAMESRV='{namesrv_addr}'; logs in {root}; Ctrl-C stops",
            err=True,
        )
        for name, settings in containers.items() if hosted else ():
            click.echo(
                f"hamq dev: {name} at {settings['listen']} hosts "
                f"{', '.join(Path(p).stem for p in settings['brokers'])}; hamq admin container "
                f"remove-broker --container {settings['listen']} -b NAME -i ID stops one, "
                f"add-broker --container {settings['listen']} -c {root}/NAME-ID.toml adds it "
                "back (a member's store must be under the data directory)",
                err=True,
            )
        if clustered and layout:
            click.echo(
                f"hamq dev: hamq admin set-policy ha-all '^ha\\.' '{{\"ha-mode\":\"all\"}}' "
                f"--controller {','.join(layout.addrs)} mirrors topics named ha.*",
                err=True,
            )
        elif layout:
            master = next(b for b in brokers if b["role"] == "master")
            click.echo(
                f"hamq dev: broker-a's master is {master['address']}: kill -9 {master['pid']} "
                "and the controllers elect another; hamq admin sync-state-set -b broker-a "
                f"--controller {','.join(layout.addrs)} shows the group",
                err=True,
            )
        reported: set[int] = set()
        while not stopping:
            for child in children:
                if child.poll() is not None and child.pid not in reported:
                    reported.add(child.pid)
                    click.echo(
                        f"hamq dev: child pid {child.pid} exited with {child.returncode}", err=True
                    )
            if len(reported) == len(children):
                break
            time.sleep(0.2)
    finally:
        _stop_children(children)


def _server_configs(
    root: Path,
    namesrv_addrs: list[str],
    layout: ControllerLayout | None,
    acting: bool,
    peer_extra: dict,
    web: str,
) -> dict[str, tuple[str, dict]]:
    """Every server but the brokers and containers, in start order: name -> (command,
    settings). ``acting``: the name server routes a masterless group's slave as its master;
    ``peer_extra``: what each controller peer adds to its layout's settings; ``web``: where
    the first name server serves the HTTP API and web console."""
    servers: dict[str, tuple[str, dict]] = {}
    if not (layout and layout.embedded):
        servers["namesrv"] = ("namesrv", {"listen": namesrv_addrs[0]})
        if acting:
            servers["namesrv"][1]["support_acting_master"] = True
        if layout:  # standalone peers: the console's controller routes go to them
            servers["namesrv"][1]["web_controllers"] = layout.addrs
    if layout:
        command = "namesrv" if layout.embedded else "controller"
        for peer_id in layout.peers:
            servers[f"{command}-{peer_id}"] = (
                command,
                {**layout.peer_settings(peer_id), **peer_extra},
            )
    for name, (_, settings) in servers.items():
        settings["data_dir"] = str(root / name)
    next(s for c, s in servers.values() if c == "namesrv")["web_listen"] = web
    return servers


def _layout_binds(configs: dict[str, DevConfig]) -> dict[str, str]:
    """Every address the layout's servers listen on but the console's: "name's key" ->
    HOST:PORT (a container's members are in ``configs`` themselves)."""
    binds: dict[str, str] = {}
    for name, config in configs.items():
        if isinstance(config, BrokerConfig):
            found = broker_binds(config)
        elif isinstance(config, ControllerConfig):
            found = controller_binds(config)
        elif isinstance(config, NamesrvConfig):
            found = namesrv_binds(config)
            found.pop("web_listen", None)
        else:  # dev sets no metrics_listen on a container
            found = {"listen": config.listen}
        binds.update({f"{name}'s {key}": addr for key, addr in found.items()})
    return binds


def _spawn(args: list[str], root: Path, name: str) -> subprocess.Popen:
    log = open(root / f"{name}.log", "ab")  # noqa: SIM115 (the child process holds it)
    return subprocess.Popen(
        [sys.executable, "-m", "hamq.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )


def _wait_for_master(namesrv_addr: str, broker_name: str) -> None:
    deadline = monotonic_s() + READY_TIMEOUT_S
    with Admin(namesrv_addr) as admin:
        while monotonic_s() < deadline:
            if broker_name in admin.master_addrs():
                return
            time.sleep(0.1)
    raise click.ClickException(
        f"no leader of {broker_name} registered after {READY_TIMEOUT_S} s; see the broker logs"
    )


def _wait_ready(proc: subprocess.Popen, name: str) -> None:
    deadline = monotonic_s() + READY_TIMEOUT_S
    while monotonic_s() < deadline:
        if not readable(proc.stdout, deadline - monotonic_s()):
            break
        line = proc.stdout.readline()
        if not line:
            raise click.ClickException(
                f"{name} exited before it was ready (code {proc.wait()}); see its log"
            )
        try:
            if json.loads(line).get("event") == "ready":
                return
        except ValueError:
            continue
    raise click.ClickException(f"{name} not ready after {READY_TIMEOUT_S} s")


def _stop_children(children: list[subprocess.Popen]) -> None:
    for child in reversed(children):
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = monotonic_s() + STOP_GRACE_S
    for child in reversed(children):
        try:
            child.wait(max(0.1, deadline - monotonic_s()))
        except subprocess.TimeoutExpired:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
