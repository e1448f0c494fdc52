"""Three nodes ready for mirrored-queue policies (seed 003), started the way an operator
starts them: ``hamq dev --mode cluster --nodes 3`` (name servers embedding the controller
peers, containers ``hamq@node1..3``). The admin commands run in this process through the
CLI (``hamq admin ...``), so the tests read what an operator reads.

A node is killed by its container's PID and started again from the config file ``hamq dev``
wrote, by this harness (the dev process does not restart children); the dev process stops
the rest by PID when the module ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from acting_cluster import read_topic
from click.testing import CliRunner

import hamq
from hamq import SendStatus
from hamq.cli.common import readable
from hamq.cli.dev_container import CONTAINER_PORT_OFFSET
from hamq.cli.dev_web import WEB_PORT_OFFSET
from hamq.cli.main import cli
from hamq.errors import HamqError
from harness import Proc
from helpers import free_port_base, pid_alive, wait_for

NODES = 3
PEERS = 3
PLACEMENT_TIMEOUT_S = 30.0  # a group's members started, registered and synchronised
CONFIRM_TIMEOUT_S = 10.0  # a send's confirm (send_confirmed)
READY_TIMEOUT_S = 120.0  # three name servers, three nodes registered (a loaded machine)
# hamq dev lays its ports out from --port-base: the peers from it, the web console at +1000,
# node k at +1000+k.
DEV_PORT_OFFSETS = (
    *range(PEERS),
    WEB_PORT_OFFSET,
    *(CONTAINER_PORT_OFFSET + k for k in range(1, NODES + 1)),
)


@dataclass
class MirroredCluster:
    root: Path
    dev: subprocess.Popen
    ready: dict  # hamq dev's ready line
    nodes: dict[str, dict] = field(default_factory=dict)  # name: {address, pid, config}
    restarted: dict[str, Proc] = field(default_factory=dict)  # nodes this harness started

    @staticmethod
    def start(root: Path) -> MirroredCluster:
        dev = subprocess.Popen(
            [
                *(sys.executable, "-m", "hamq.cli.main", "dev", "--mode", "cluster"),
                *("--nodes", str(NODES), "--controllers", str(PEERS)),
                *("--data", str(root / "data")),
                *("--port-base", str(free_port_base(DEV_PORT_OFFSETS))),
            ],
            stdout=subprocess.PIPE,
            stderr=open(root / "dev.log", "wb"),  # noqa: SIM115 (the child holds it)
            start_new_session=True,
        )
        line = dev.stdout.readline() if readable(dev.stdout, READY_TIMEOUT_S) else b""
        if not line:
            _stop(dev)
            raise RuntimeError(f"hamq dev not ready: {(root / 'dev.log').read_text()[-3000:]}")
        cluster = MirroredCluster(root, dev, json.loads(line))
        for node in cluster.ready["nodes"]:
            short = node["name"].split("@", 1)[1]
            cluster.nodes[node["name"]] = {
                **node,
                "config": root / "data" / f"{short}.toml",
            }
        return cluster

    @property
    def namesrv(self) -> str:
        return self.ready["namesrv"]

    @property
    def controllers(self) -> str:
        return ",".join(c["address"] for c in self.ready["controllers"])

    # -- the operator's commands ------------------------------------------------------------

    def admin(self, *args: str, expect_exit: int = 0) -> str:
        """``hamq admin ARGS --controller ...`` in this process; its standard output."""
        result = CliRunner().invoke(cli, ["admin", *args, "--controller", self.controllers])
        assert result.exit_code == expect_exit, (args, result.output, result.exception)
        return result.stdout

    def queues(self, vhost: str = "/") -> dict[str, dict]:
        """``list-queues`` with every column, by topic name."""
        out = self.admin(
            "list-queues",
            "name",
            "policy",
            "pid",
            "slave_pids",
            "synchronised_slave_pids",
            "messages",
            "--vhost",
            vhost,
            "--namesrv",
            self.namesrv,
            "--json",
        )
        return {row["name"]: row for row in json.loads(out)}

    def placed(self, topic: str, want, what: str, timeout_s: float = PLACEMENT_TIMEOUT_S):
        """The topic's list-queues row once ``want(row)`` holds."""

        def check():
            row = self.queues().get(topic)
            return row if row and want(row) else None

        return wait_for(check, timeout_s, f"{topic}: {what}")

    def declare(self, topic: str, node: str) -> None:
        self.admin("declare-topic", topic, "--node", self.nodes[node]["address"])

    # -- nodes ----------------------------------------------------------------------------

    def kill9(self, node: str) -> None:
        """SIGKILL the node's container, as a crash would stop it."""
        self._signal(node, signal.SIGKILL)

    def shutdown(self, node: str) -> None:
        """SIGTERM the node's container: its members tell the controller they are leaving."""
        self._signal(node, signal.SIGTERM)

    def _signal(self, node: str, signum: int) -> None:
        """``signum`` to the node's container by PID (hamq dev's child, or one this harness
        started again), until it is gone."""
        pid = self.nodes[node]["pid"]
        os.kill(pid, signum)
        proc = self.restarted.get(node)
        if proc is not None:
            proc.popen.wait(20)
        wait_for(lambda: not pid_alive(pid), 20, f"{node} (pid {pid}) gone")

    def restart(self, node: str) -> None:
        """The node again, from its config file, until the controller counts it alive."""
        short = node.split("@", 1)[1]
        proc = Proc(
            short, ["container", "-c", str(self.nodes[node]["config"])], self.root / f"{short}.log"
        )
        self.restarted[node] = proc.start()
        self.nodes[node]["pid"] = proc.pid
        wait_for(lambda: node in self.alive_nodes(), 20, f"{node} registered alive")

    def alive_nodes(self) -> set[str]:
        return {n["node"] for n in json.loads(self.admin("list-nodes", "--json")) if n["alive"]}

    def stop(self) -> None:
        """The nodes this harness started, then hamq dev (which stops its own children);
        whatever it started that is still alive after that is killed by PID."""
        for proc in self.restarted.values():
            proc.stop()
        _stop(self.dev)
        for pid in [c["pid"] for c in self.ready["controllers"]] + [
            n["pid"] for n in self.nodes.values()
        ]:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def _stop(dev: subprocess.Popen) -> None:
    dev.send_signal(signal.SIGTERM)
    try:
        dev.wait(20)
    except subprocess.TimeoutExpired:
        dev.kill()
        dev.wait()


def node_of(pid: dict | None) -> str | None:
    return pid["node"] if pid else None


def nodes_of(pids: list[dict]) -> set[str]:
    return {p["node"] for p in pids}


# -- sends and reads ----------------------------------------------------------------------


def send_confirmed(namesrv: str, topic: str, count: int, tag: str) -> set[bytes]:
    """``count`` sends, each acknowledged SEND_OK (held by every synchronised mirror). A
    confirm waits for every synchronised mirror, and a mirror just placed on a loaded 2-core
    machine took over the default 3 s (a timeout in 2 of 6 runs): the tests are about what
    survives, so they give a confirm ``CONFIRM_TIMEOUT_S``; a send never answered still fails."""
    acked: set[bytes] = set()
    with hamq.Producer(namesrv, send_timeout_s=CONFIRM_TIMEOUT_S) as producer:
        for i in range(count):
            body = f"{tag}-{i:05d}".encode()
            assert producer.send(hamq.Message(topic, body)).status is SendStatus.SEND_OK
            acked.add(body)
    return acked


def bodies(namesrv: str, topic: str) -> set[bytes]:
    """Every body the topic serves now, in every group that holds it."""
    return {m.body for got in read_topic(namesrv, topic).values() for m in got}


def wait_readable(namesrv: str, topic: str, want: set[bytes], timeout_s: float = 20.0) -> None:
    """Every body of ``want`` read back from the topic's master(s)."""

    def check() -> bool:
        try:
            return want <= bodies(namesrv, topic)
        except HamqError:  # no route or no master yet
            return False

    wait_for(check, timeout_s, f"every acknowledged send to {topic} readable")
