"""What runs where in a chaos run: each replication mode in the configuration in which it
promises no acknowledged loss, every process on a test host of its own.

A layout names hosts and processes but no addresses: hosts get theirs when the run makes
them, and a proxied run puts a ``FrameProxy`` between each service and the processes that
reach it. So each process's settings are built from a ``Wiring`` (where a service binds and
where the others reach it) once the cluster knows both. The settings reuse ``hamq dev``'s
builders (controller peers, members in controller mode, nodes), with the chaos suite's own
changes: 256 KiB commit-log segments, so that the corrupt nemesis finds closed segments after
a few seconds of traffic, and members declared dead after about 2 s, so failovers fit in a
short run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hamq.chaos.hosts import BROKER_PORT, CONTAINER_PORT, DLEDGER_PORT, NAMESRV_PORT
from hamq.cli.dev_cluster import PEER_SETTINGS, node_config
from hamq.cli.dev_controller import ControllerLayout
from hamq.config import BrokerConfig, StoreConfig

MODES = ("single", "master-slave", "controller", "dledger", "mirrored")
CLUSTER_NAME = "ChaosCluster"
GROUP = "broker-a"
MEMBERS = 3
# mapped_file_size_commitlog: the workload writes about 60 KiB/s, so a short CI run of a few
# seconds closes segments too
SEGMENT_BYTES = 256 * 1024
HA_PORT = BROKER_PORT + 1  # BrokerConfig.ha_address: the listen port + 1
# Every topic of the workload ("chaos-normal", "chaos-ordered") is mirrored on every node
# and a new mirror copies the history before it counts as synchronised.
MIRROR_POLICY = ("chaos-ha", r"^chaos-", {"ha-mode": "all", "ha-sync-mode": "automatic"})
# A name server drops a silent member from its routes after 2 s (10 s by default).
NAMESRV_LIVENESS = {"scan_not_active_broker_interval_ms": 300, "broker_not_active_timeout_ms": 2000}
MEMBER_SETTINGS = {
    "cluster_name": CLUSTER_NAME,
    "mapped_file_size_commitlog": SEGMENT_BYTES,
    "broker_heartbeat_interval_ms": 500,
    "ha_send_heartbeat_interval_ms": 200,
    "sync_broker_member_group_period_ms": 300,
    "slave_sync_interval_ms": 500,
}
# An acknowledged send is on disk: a power loss (unfsynced data dropped) cannot take it.
SYNC_FLUSH = {"flush_disk_type": "sync"}
# A mirrored node's members (ContainerConfig.member_store): sync flush and small segments as
# in the other modes, and the disk guards the other modes' members keep by default, which
# the runner's tmpfs (TMPFS_MIB) is sized for, so a disk-full run starts with room to write.
NODE_MEMBER_STORE = {
    **SYNC_FLUSH,
    "mapped_file_size_commitlog": SEGMENT_BYTES,
    "disk_min_free_bytes": StoreConfig.disk_min_free_bytes,
    "disk_free_limit_bytes": BrokerConfig.disk_free_limit_bytes,
}


@dataclass(frozen=True)
class Wiring:
    """Where each service binds and where the other processes reach it: the same address,
    or in a proxied run the proxy in front of it (``proxied``: bind -> proxy address)."""

    addresses: dict[str, str]  # host -> the IP its processes bind
    proxied: dict[str, str] = field(default_factory=dict)

    def bind(self, host: str, port: int) -> str:
        return f"{self.addresses[host]}:{port}"

    def reach(self, host: str, port: int) -> str:
        addr = self.bind(host, port)
        return self.proxied.get(addr, addr)


@dataclass(frozen=True)
class ProcessSpec:
    """One process: the ``hamq`` server command it runs, on which host, the ports it serves
    (proxied in a proxied run) and its settings, built from the run's wiring and the
    directory holding its data."""

    host: str
    server: str  # "namesrv" | "broker" | "container"
    ports: tuple[int, ...]
    settings: Callable[[Wiring, Path], dict]


@dataclass(frozen=True)
class Layout:
    mode: str
    promise: str  # what zero-loss guarantee this configuration gives, one line
    hosts: list[str]
    processes: dict[str, ProcessSpec]
    groups: dict[str, list[str]]  # broker group -> its members' process names (mirrored:
    #   none here; the placement driver makes them, see Cluster.members)
    proxied: bool = False

    @property
    def namesrvs(self) -> list[str]:
        return [name for name, p in self.processes.items() if p.server == "namesrv"]

    @property
    def controllers(self) -> list[str]:
        """The name servers embedding controller peers (controller and mirrored modes)."""
        return self.namesrvs if self.mode in ("controller", "mirrored") else []


def layout_for(mode: str, proxied: bool = False) -> Layout:
    """``mode``'s promising configuration: single (sync flush), master-slave (sync master,
    2 of 3 copies), controller (all_ack_in_sync_state_set), dledger (Raft majority),
    mirrored (ha-mode all, automatic sync, confirms)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
    build = {
        "single": _single,
        "master-slave": _master_slave,
        "controller": _controller,
        "dledger": _dledger,
        "mirrored": _mirrored,
    }[mode]
    return dataclasses.replace(build(), proxied=proxied)


def _namesrv(host: str, extra: Callable[[Wiring], dict] | None = None) -> ProcessSpec:
    def settings(w: Wiring, data: Path) -> dict:
        return {
            "listen": w.bind(host, NAMESRV_PORT),
            "data_dir": str(data),
            **NAMESRV_LIVENESS,
            **(extra(w) if extra else {}),
        }

    return ProcessSpec(host, "namesrv", (NAMESRV_PORT,), settings)


def _peers(hosts: list[str]) -> list[ProcessSpec]:
    """Name servers embedding the controller peers, peer i on ``hosts[i - 1]``."""

    def peer(peer_id: int) -> Callable[[Wiring], dict]:
        def extra(w: Wiring) -> dict:
            settings = _controller_layout(w, hosts).peer_settings(peer_id)
            return {**settings, "listen": w.bind(hosts[peer_id - 1], NAMESRV_PORT)}

        return extra

    return [_namesrv(host, peer(i)) for i, host in enumerate(hosts, 1)]


def _controller_layout(w: Wiring, hosts: list[str]) -> ControllerLayout:
    """``hamq dev``'s controller peers, reached (Raft, members, admins) through the wiring."""
    return ControllerLayout(True, {i: w.reach(h, NAMESRV_PORT) for i, h in enumerate(hosts, 1)})


def _broker(
    host: str,
    namesrvs: list[str],
    extra: dict | Callable[[Wiring], dict],
    ports: tuple[int, ...] = (BROKER_PORT, HA_PORT),
) -> ProcessSpec:
    """A member on ``host`` serving ``ports``: its client port, and the HA port where
    slaves copy its log (not in single and dledger mode, whose members never use it)."""

    def settings(w: Wiring, data: Path) -> dict:
        values = {
            **MEMBER_SETTINGS,
            "broker_name": GROUP,
            "listen": w.bind(host, BROKER_PORT),
            "namesrv": [w.reach(h, NAMESRV_PORT) for h in namesrvs],
            "store_dir": str(data),
            **(extra(w) if callable(extra) else extra),
        }
        if w.proxied:  # peers and name servers are told the proxies, not the binds
            values["advertise"] = w.reach(host, BROKER_PORT)
            if HA_PORT in ports:
                values["ha_advertise"] = w.reach(host, HA_PORT)
        return values

    return ProcessSpec(host, "broker", ports, settings)


def _single() -> Layout:
    return Layout(
        "single",
        "sync flush: a send is acknowledged once fsynced",
        ["ns1", "m1"],
        {"ns1": _namesrv("ns1"), "m1": _broker("m1", ["ns1"], SYNC_FLUSH, (BROKER_PORT,))},
        {GROUP: ["m1"]},
    )


def _master_slave() -> Layout:
    members = [f"m{i}" for i in range(1, MEMBERS + 1)]
    replicas = {
        "total_replicas": MEMBERS,
        "in_sync_replicas": 2,
        "min_in_sync_replicas": 2,
        **SYNC_FLUSH,
    }
    processes = {"ns1": _namesrv("ns1")}
    for broker_id, m in enumerate(members):
        role = "slave" if broker_id else "sync_master"
        processes[m] = _broker(
            m, ["ns1"], {**replicas, "broker_id": broker_id, "broker_role": role}
        )
    return Layout(
        "master-slave",
        "sync_master, in_sync_replicas 2 of 3, sync flush: acknowledged once on 2 members' disks",
        ["ns1", *members],
        processes,
        {GROUP: members},
    )


def _controller() -> Layout:
    peers = ["n1", "n2", "n3"]
    members = [f"m{i}" for i in range(1, MEMBERS + 1)]
    in_controller_mode = {
        "controller_heartbeat_interval_ms": 300,
        "sync_broker_metadata_period_ms": 500,
        "check_sync_state_set_period_ms": 300,
        **SYNC_FLUSH,
    }

    def extra(w: Wiring) -> dict:
        return {**_controller_layout(w, peers).broker_settings(), **in_controller_mode}

    return Layout(
        "controller",
        "all_ack_in_sync_state_set, sync flush: acknowledged once every SyncStateSet member has it",
        [*peers, *members],
        {
            **dict(zip(peers, _peers(peers), strict=True)),
            **{m: _broker(m, peers, extra) for m in members},
        },
        {GROUP: members},
    )


def _dledger() -> Layout:
    members = [f"d{i}" for i in range(1, MEMBERS + 1)]

    def member(i: int) -> Callable[[Wiring], dict]:
        def extra(w: Wiring) -> dict:
            # its own Raft endpoint is where it binds; the others are reached
            peers = [
                f"{j}@{w.bind(d, DLEDGER_PORT) if j == i else w.reach(d, DLEDGER_PORT)}"
                for j, d in enumerate(members, 1)
            ]
            return {
                "broker_id": i,
                "replication_mode": "dledger",
                "dledger_self_id": i,
                "dledger_peers": peers,
                **SYNC_FLUSH,
            }

        return extra

    processes = {"ns1": _namesrv("ns1")}
    for i, d in enumerate(members, 1):
        processes[d] = _broker(d, ["ns1"], member(i), (BROKER_PORT, DLEDGER_PORT))
    return Layout(
        "dledger",
        "DLedger (Raft), sync flush: acknowledged once a majority has it on disk",
        ["ns1", *members],
        processes,
        {GROUP: members},
    )


def _mirrored() -> Layout:
    peers = ["n1", "n2", "n3"]
    nodes = [f"node{i}" for i in range(1, MEMBERS + 1)]

    def peer_extra(spec: ProcessSpec) -> ProcessSpec:
        def settings(w: Wiring, data: Path) -> dict:
            return {**spec.settings(w, data), **PEER_SETTINGS}

        return ProcessSpec(spec.host, spec.server, spec.ports, settings)

    def node(index: int) -> ProcessSpec:
        host = nodes[index - 1]

        def settings(w: Wiring, data: Path) -> dict:
            namesrvs = [w.reach(h, NAMESRV_PORT) for h in peers]
            config = node_config(
                index, w.bind(host, CONTAINER_PORT), data, namesrvs, _controller_layout(w, peers)
            )
            # the members the placement driver adds bind this host's address and run the
            # store of the other modes' members (the driver's settings name no store)
            return {**config, "member_host": w.addresses[host], "member_store": NODE_MEMBER_STORE}

        return ProcessSpec(host, "container", (CONTAINER_PORT,), settings)

    return Layout(
        "mirrored",
        "ha-mode all, ha-sync-mode automatic, confirms, sync flush: acknowledged once every "
        "synchronised mirror has it on disk",
        [*peers, *nodes],
        {
            **{h: peer_extra(p) for h, p in zip(peers, _peers(peers), strict=True)},
            **{h: node(i) for i, h in enumerate(nodes, 1)},
        },
        {},
    )
