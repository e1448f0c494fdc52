"""A running ``Layout``: its processes started on their hosts, stopped, killed, paused and
started again by PID, and asked what the nemeses and the checker need (is every group
healthy, what is committed, where the members' commit logs are).

Each process is ``python -m hamq.cli.main <server> --config <file>`` run inside its host
(``Hosts.command``) with the disk and clock shims preloaded (``DiskFaults.env``), in a
session of its own, its stderr in ``hosts/<host>/<process>.log``. A thread per process
reads its stdout: the ready line it prints once it serves, then nothing more (a pipe left
unread would block a child that writes). The cluster talks to it only over the network, as
a client would: through the name servers' routes, the controllers and runtime info."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from hamq.chaos.hosts import BROKER_PORT, CONTAINER_PORT, DLEDGER_PORT, NAMESRV_PORT
from hamq.chaos.layout import GROUP, HA_PORT, MEMBERS, MIRROR_POLICY, Layout, Wiring
from hamq.cli.dev_cluster import node_name, wait_nodes_alive
from hamq.cli.dev_controller import group_whole, poll_until, wait_whole
from hamq.client.admin import AsyncAdmin
from hamq.client.controller import ControllerClient
from hamq.clock import monotonic_s
from hamq.config import dump_toml

if TYPE_CHECKING:
    from hamq.chaos.clock_faults import ClockFaults
    from hamq.chaos.disk_faults import DiskFaults
    from hamq.chaos.frame_proxy import FrameProxy
    from hamq.chaos.hosts import Hosts

READY_TIMEOUT_S = 60.0  # a process's ready line (a loaded 2-core machine, six processes)
STOP_GRACE_S = 10.0  # SIGTERM to SIGKILL
PROBE_INTERVAL_S = 0.2
SERVICES = {
    NAMESRV_PORT: "namesrv",
    BROKER_PORT: "client",
    HA_PORT: "ha",
    DLEDGER_PORT: "dledger",
    CONTAINER_PORT: "container",
}
T = TypeVar("T")


class ClusterFailed(Exception):
    """A process that did not start, or a cluster that did not become healthy in time."""


@dataclass
class _Running:
    popen: subprocess.Popen
    ready: threading.Event = field(default_factory=threading.Event)
    paused: bool = False


class Cluster:
    def __init__(
        self,
        layout: Layout,
        hosts: Hosts,
        disks: DiskFaults,
        run_dir: Path,
        clock: ClockFaults | None = None,
        tmpfs_mib: int | None = None,
    ) -> None:
        """``clock``: the run jumps clocks, so every process gets the faketime preload;
        ``tmpfs_mib``: each host's data on a tmpfs of that size (the disk-full nemesis)."""
        self.layout = layout
        self.hosts = hosts
        self.disks = disks
        self.run_dir = run_dir
        self.clock = clock
        self.tmpfs_mib = tmpfs_mib
        self.proxies: dict[str, FrameProxy] = {}  # "<process>/<service>" -> its proxy
        self._data_dirs: dict[str, Path] = {}  # host -> where its processes keep data
        self._running: dict[str, _Running] = {}
        self._wiring: Wiring | None = None

    # -- where things are ----------------------------------------------------------------

    @property
    def wiring(self) -> Wiring:
        if self._wiring is None:
            raise ClusterFailed("the cluster has not been started")
        return self._wiring

    @property
    def namesrv(self) -> str:
        """The name servers as clients reach them, ";"-joined."""
        return ";".join(self._reach(p, NAMESRV_PORT) for p in self.layout.namesrvs)

    @property
    def controllers(self) -> list[str]:
        return [self._reach(p, NAMESRV_PORT) for p in self.layout.controllers]

    def host_of(self, process: str) -> str:
        return self.layout.processes[process].host

    def processes_on(self, host: str) -> list[str]:
        return [name for name, p in self.layout.processes.items() if p.host == host]

    def host_dir(self, host: str) -> Path:
        """Everything of ``host``: its data, logs and shim files (what a power loss cuts)."""
        return self.disks.host_dir(host)

    def store_dir(self, process: str) -> Path:
        """The process's data: a broker's store, a name server's data, a node's store root
        (one store per group placed on it)."""
        return self._data_dirs[self.host_of(process)] / process

    def pid(self, process: str) -> int:
        return self._running[process].popen.pid

    def _reach(self, process: str, port: int) -> str:
        return self.wiring.reach(self.host_of(process), port)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Hosts, data directories, proxies, config files; then the name servers (with
        their controllers), then the members and nodes, each stage started at once and
        awaited (their ready lines)."""
        addresses = {h: self.hosts.add(h).address for h in self.layout.hosts}
        for h in self.layout.hosts:
            self._data_dirs[h] = self.disks.data_dir(h, self.tmpfs_mib)
        (self.run_dir / "configs").mkdir(parents=True, exist_ok=True)
        self._wiring = Wiring(addresses, self._start_proxies(addresses))
        for name, spec in self.layout.processes.items():
            settings = spec.settings(self._wiring, self.store_dir(name))
            self._config_path(name).write_text(dump_toml(settings))
        names = list(self.layout.processes)
        for stage in (self.layout.namesrvs, [n for n in names if n not in self.layout.namesrvs]):
            for name in stage:
                self._spawn(name)
            for name in stage:
                self._await_ready(name)

    def _start_proxies(self, addresses: dict[str, str]) -> dict[str, str]:
        """A proxied run: a FrameProxy on the runner's side for every service port; bind
        address -> proxy address."""
        if not self.layout.proxied:
            return {}
        from hamq.chaos.frame_proxy import FrameProxy

        proxied = {}
        for name, spec in self.layout.processes.items():
            for port in spec.ports:
                target = f"{addresses[spec.host]}:{port}"
                proxy = FrameProxy(f"{self.hosts.client_address}:0", target)
                self.proxies[f"{name}/{SERVICES[port]}"] = proxy
                proxied[target] = proxy.address
        return proxied

    def _config_path(self, process: str) -> Path:
        """Outside the host's directory: a power loss there would empty it (the runner
        writes it without the fsync shim, so its fsync is not on record)."""
        return self.run_dir / "configs" / f"{process}.toml"

    def _log_path(self, process: str) -> Path:
        return self.host_dir(self.host_of(process)) / f"{process}.log"

    def _spawn(self, process: str) -> None:
        spec = self.layout.processes[process]
        argv = [sys.executable, "-m", "hamq.cli.main", spec.server]
        argv += ["--config", str(self._config_path(process))]
        env = {
            **os.environ,
            **self.disks.env(spec.host, shim=True, clock=self.clock is not None),
        }
        with open(self._log_path(process), "ab") as log:  # the child holds its own descriptor
            popen = subprocess.Popen(
                self.hosts.command(spec.host, argv),
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        running = _Running(popen)
        self._running[process] = running
        threading.Thread(
            target=_read_ready, args=(running,), daemon=True, name=f"chaos-{process}"
        ).start()

    def _await_ready(self, process: str) -> None:
        running = self._running[process]
        deadline = monotonic_s() + READY_TIMEOUT_S
        while not running.ready.wait(PROBE_INTERVAL_S):
            if running.popen.poll() is not None or monotonic_s() > deadline:
                tail = self._log_path(process).read_text(errors="replace")[-2000:]
                code = running.popen.poll()
                why = f"exited with {code}" if code is not None else "not ready in time"
                raise ClusterFailed(f"{process} {why}; its log ends:\n{tail}")

    def is_running(self, process: str) -> bool:
        running = self._running.get(process)
        return running is not None and running.popen.poll() is None

    def kill9(self, process: str) -> None:
        """SIGKILL by PID, as a crash stops it (a paused process dies too)."""
        if self.is_running(process):
            running = self._running[process]
            os.kill(running.popen.pid, signal.SIGKILL)
            running.popen.wait()

    def start_process(self, process: str) -> None:
        """The process again from its config file, once it serves."""
        if self.is_running(process):
            raise ClusterFailed(f"{process} is running (pid {self.pid(process)})")
        self._spawn(process)
        self._await_ready(process)

    def pause(self, process: str) -> None:
        """SIGSTOP: a hung process, its sockets open."""
        if self.is_running(process):
            os.kill(self.pid(process), signal.SIGSTOP)
            self._running[process].paused = True

    def resume(self, process: str) -> None:
        if self.is_running(process) and self._running[process].paused:
            os.kill(self.pid(process), signal.SIGCONT)
        if process in self._running:
            self._running[process].paused = False

    def stop(self) -> None:
        """Every process, members before name servers: paused ones resumed (a stopped
        process cannot act on SIGTERM), SIGTERM, SIGKILL after ``STOP_GRACE_S``; then
        the proxies. Safe to call twice."""
        order = list(reversed(self._running))
        for name in order:
            self.resume(name)
        for name in order:
            if self.is_running(name):
                os.kill(self.pid(name), signal.SIGTERM)
        deadline = monotonic_s() + STOP_GRACE_S
        for name in order:
            popen = self._running[name].popen
            try:
                popen.wait(max(0.1, deadline - monotonic_s()))
            except subprocess.TimeoutExpired:
                os.kill(popen.pid, signal.SIGKILL)
                popen.wait()
        for proxy in self.proxies.values():
            proxy.close()

    # -- what the cluster says ---------------------------------------------------------

    def _ask(self, call: Callable[[AsyncAdmin, ControllerClient | None], Awaitable[T]]) -> T:
        """``call(admin, controller)`` on a fresh event loop (controller: None in the modes
        without controllers)."""

        async def run() -> T:
            admin = AsyncAdmin(self.namesrv)
            controller = ControllerClient(self.controllers) if self.controllers else None
            try:
                return await call(admin, controller)
            finally:
                await admin.close()
                if controller is not None:
                    await controller.close()

        return asyncio.run(run())

    def wait_healthy(self, timeout_s: float) -> None:
        """Every group has a writable master the name servers route, and its copies are
        in place: master-slave, both slaves transferring within haMaxGapNotInSync;
        controller and mirrored, the group whole (every member alive and in the
        SyncStateSet, ``group_whole``); dledger, every member following the routed
        leader. Mirrored also needs every node alive (its groups exist once topics do)."""

        async def healthy(admin: AsyncAdmin, controller: ControllerClient | None) -> None:
            mode = self.layout.mode
            if mode == "controller":
                assert controller is not None
                await wait_whole(controller, admin, GROUP, MEMBERS, timeout_s)
                return
            if mode == "mirrored":
                assert controller is not None
                nodes = {node_name(i) for i in range(1, len(self._nodes()) + 1)}
                await wait_nodes_alive(controller, nodes, timeout_s)

            async def check() -> tuple[bool | None, object]:
                groups = await self._groups(admin, controller)
                masters = await admin.master_addrs()
                unrouted = sorted(set(groups) - set(masters))
                if unrouted:
                    return None, f"no master routed for {unrouted}"
                for group in groups.values() if mode == "mirrored" else ():
                    if not group_whole(group, len(self._nodes())):
                        return None, group
                    if masters[group["broker_name"]] != group["master_addr"]:
                        return None, f"{group['broker_name']}'s master not routed yet"
                for group, master in masters.items() if mode != "mirrored" else ():
                    missing = await self._copies_missing(admin, group, master)
                    if missing:
                        return None, missing
                return True, None

            await poll_until(check, timeout_s, f"{mode} cluster not healthy")

        try:
            self._ask(healthy)
        except TimeoutError as err:
            raise ClusterFailed(str(err)) from None

    async def _copies_missing(self, admin: AsyncAdmin, group: str, master: str) -> str | None:
        """What a master-slave or DLedger group still lacks, None when nothing."""
        info = await admin.broker_runtime_info(master)
        ha = info["ha"]
        if self.layout.mode == "master-slave":
            slaves = len(self.layout.groups[group]) - 1
            if ha.get("in_sync_slaves") != slaves:
                return f"{group}: slaves in sync {ha.get('in_sync_slaves')} of {slaves}"
        if self.layout.mode == "dledger":
            for member in self.layout.groups[group]:
                addr = self._reach(member, BROKER_PORT)
                got = (await admin.broker_runtime_info(addr))["ha"]
                if got.get("leader_id") != ha["member_id"] or got["term"] != ha["term"]:
                    return f"{member} does not follow leader {ha['member_id']} yet: {got}"
        return None

    def create_topics(self, topics: dict[str, int]) -> None:
        """``topics`` (name -> queues) on every group's master, and routed; in mirrored
        mode the chaos policy first, then each topic declared through the first node,
        where the placement driver puts its group."""

        async def create(admin: AsyncAdmin, controller: ControllerClient | None) -> None:
            if self.layout.mode == "mirrored":
                assert controller is not None
                name, pattern, definition = MIRROR_POLICY
                await controller.set_policy("/", name, pattern, definition)
                node = self._reach(self._nodes()[0], CONTAINER_PORT)
                for topic, queues in topics.items():
                    await admin.declare_topic(node, topic, queue_nums=queues)
            else:
                for topic, queues in topics.items():
                    await admin.create_topic(topic, queues)
            for topic, queues in topics.items():

                async def routed(topic: str = topic, queues: int = queues) -> tuple:
                    route = await admin.core.route(topic, refresh=True)
                    return (True, None) if len(route.write_queues) >= queues else (None, route)

                await poll_until(routed, READY_TIMEOUT_S, f"{topic} not routed")

        self._ask(create)

    def masters(self) -> dict[str, str]:
        """Group -> the process the name servers route as its master (mirrored: the node
        hosting it)."""

        async def routed(admin: AsyncAdmin, _: ControllerClient | None) -> dict[str, str]:
            return await admin.master_addrs()

        return {group: self._process_at(addr) for group, addr in self._ask(routed).items()}

    def members(self) -> dict[str, list[str]]:
        """Group -> its members' processes (mirrored: the nodes holding a member)."""
        if self.layout.mode != "mirrored":
            return {g: list(ms) for g, ms in self.layout.groups.items()}
        groups = self._ask(self._groups)
        return {
            name: [self._process_at(m["address"]) for m in group["members"]]
            for name, group in groups.items()
        }

    def member_logs(self) -> dict[str, dict[str, Path]]:
        """Group -> member process -> its commit-log directory."""
        return {
            group: {
                p: self.store_dir(p) / group / "commitlog"
                if self.layout.mode == "mirrored"
                else self.store_dir(p) / "commitlog"
                for p in processes
            }
            for group, processes in self.members().items()
        }

    def committed_offsets(self) -> dict[str, int]:
        """Group -> commit-log bytes acknowledged sends may occupy, as its master reports
        them: single, what is fsynced; master-slave, what 2 members hold (the master's
        end and its slaves' acks); controller and mirrored, the confirm offset; dledger,
        the leader's log end (a DLedger member's commit log holds only committed
        entries)."""

        async def offsets(admin: AsyncAdmin, controller: ControllerClient | None) -> dict:
            groups = await self._groups(admin, controller)
            masters = await admin.master_addrs()
            return {
                g: _committed(self.layout.mode, await admin.broker_runtime_info(masters[g]))
                for g in groups
            }

        return self._ask(offsets)

    async def _groups(self, admin: AsyncAdmin, controller: ControllerClient | None) -> dict:
        """Group -> what the controller says of it (mirrored: the policies' groups), or
        the layout's members."""
        if self.layout.mode != "mirrored":
            return dict(self.layout.groups)
        assert controller is not None
        return {g["broker_name"]: g for g in await controller.sync_state_data()}

    def _nodes(self) -> list[str]:
        return [n for n, p in self.layout.processes.items() if p.server == "container"]

    def _process_at(self, address: str) -> str:
        """The member or node process serving ``address`` (a bind or a proxy address)."""
        bind = next((b for b, p in self.wiring.proxied.items() if p == address), address)
        ip = bind.rpartition(":")[0]
        host = next(h for h, a in self.wiring.addresses.items() if a == ip)
        return next(
            p for p in self.processes_on(host) if self.layout.processes[p].server != "namesrv"
        )


def _committed(mode: str, info: dict) -> int:
    ha = info["ha"]
    if mode == "single":
        return int(info["commitlog_flushed_offset"])
    if mode == "dledger":
        return int(info["commitlog_max_offset"])
    if mode == "master-slave":
        copies = sorted(
            [info["commitlog_max_offset"]]
            + [s["ack_offset"] for s in ha["slaves"] if s["state"] == "TRANSFER"],
            reverse=True,
        )
        return int(copies[1]) if len(copies) > 1 else 0
    return int(ha["confirm_offset"])


def _read_ready(running: _Running) -> None:
    """Reads a child's stdout to its end, setting ``ready`` at its ready line."""
    assert running.popen.stdout is not None
    with running.popen.stdout as out:
        for line in out:
            try:
                if json.loads(line).get("event") == "ready":
                    running.ready.set()
            except (ValueError, AttributeError):
                continue
