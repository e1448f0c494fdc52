"""``hamq namesrv``, ``hamq broker`` and ``hamq dev``."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from hamq.broker.server import serve_broker
from hamq.cli.common import setup_logging
from hamq.config import BrokerConfig, NamesrvConfig, load_config
from hamq.errors import ConfigError
from hamq.namesrv.server import serve_namesrv
from hamq.net.server import run_until_signalled

READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0


def _load(cls, path, **overrides):
    try:
        return load_config(cls, path, **overrides)
    except ConfigError as err:
        raise click.ClickException(err.message) from None


@click.command()
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False),
              help="TOML file with name server settings.")
@click.option("--listen", help="HOST:PORT to serve on (default 127.0.0.1:9876).")
@click.option("--data", "data_dir", help="Data directory.")
def namesrv(config_path: str | None, listen: str | None, data_dir: str | None) -> None:
    """Run a name server."""
    setup_logging()
    config = _load(NamesrvConfig, config_path, listen=listen, data_dir=data_dir)
    run_until_signalled(lambda stop: serve_namesrv(config, stop))


@click.command()
@click.option("-c", "--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="TOML file with broker settings (cluster_name, broker_name, listen, ...).")
def broker(config_path: str) -> None:
    """Run one broker member."""
    setup_logging()
    config = _load(BrokerConfig, config_path)
    run_until_signalled(lambda stop: serve_broker(config, stop))


@click.command()
@click.option("--data", "data_dir", default="./.hamq-dev", show_default=True,
              help="Where the cluster keeps its data.")
@click.option("--port-base", default=9876, show_default=True,
              help="Name server port; the broker listens on port-base + 1035.")
@click.option("--flush-disk-type", type=click.Choice(["async", "sync"]), default="async",
              show_default=True)
def dev(data_dir: str, port_base: int, flush_disk_type: str) -> None:
    """Run a local cluster (a name server and a broker) as child processes."""
    root = Path(data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    namesrv_addr = f"127.0.0.1:{port_base}"
    broker_addr = f"127.0.0.1:{port_base + 1035}"
    broker_toml = root / "broker-a-0.toml"
    broker_toml.write_text(
        f'cluster_name = "DevCluster"\nbroker_name = "broker-a"\nbroker_id = 0\n'
        f'listen = "{broker_addr}"\nnamesrv = ["{namesrv_addr}"]\n'
        f'store_dir = "{root / "broker-a-0"}"\nflush_disk_type = "{flush_disk_type}"\n')
    children: list[subprocess.Popen] = []
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        ns = _spawn(["namesrv", "--listen", namesrv_addr, "--data", str(root / "namesrv")], root,
                    "namesrv")
        children.append(ns)
        _wait_ready(ns, "namesrv")
        br = _spawn(["broker", "-c", str(broker_toml)], root, "broker-a-0")
        children.append(br)
        _wait_ready(br, "broker-a-0")
        click.echo(json.dumps({
            "event": "ready", "namesrv": namesrv_addr, "data": str(root),
            "namesrv_pid": ns.pid,
            "brokers": [{"broker_name": "broker-a", "broker_id": 0, "role": "master",
                         "address": broker_addr, "pid": br.pid}],
        }), nl=True)
        click.echo(f"hamq dev: connect with --namesrv {namesrv_addr} "
                   f"(or export HAMQ_NAMESRV={namesrv_addr}); logs in {root}; Ctrl-C stops",
                   err=True)
        while not stopping:
            for child in children:
                if child.poll() is not None:
                    click.echo(f"hamq dev: child pid {child.pid} exited with {child.returncode}",
                               err=True)
                    stopping = True
            time.sleep(0.2)
    finally:
        _stop_children(children)


def _spawn(args: list[str], root: Path, name: str) -> subprocess.Popen:
    log = open(root / f"{name}.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "hamq.cli.main", *args],
                            stdout=subprocess.PIPE, stderr=log, start_new_session=True)


def _wait_ready(proc: subprocess.Popen, name: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        readable, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
        if not readable:
            break
        line = proc.stdout.readline()
        if not line:
            raise click.ClickException(f"{name} exited before it was ready "
                                       f"(code {proc.wait()}); see its log")
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
    deadline = time.monotonic() + STOP_GRACE_S
    for child in reversed(children):
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
