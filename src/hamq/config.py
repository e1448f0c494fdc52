"""Typed, frozen configuration per role, read from TOML.

Each field's comment gives the RocketMQ name it corresponds to. Unknown keys are errors here;
every other rule (types, ranges, allowed values, combinations) is in ``config_check`` and
runs whenever a config is built, so a bad one never reaches a server (RocketMQ's loaders
silently ignore what they do not understand; we do not).
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hamq import config_check as check
from hamq.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class ServerConfig:
    """Limits of every port a server process listens on (client, HA and Raft ports), so a
    client that opens, trickles or never reads cannot exhaust its memory."""

    max_connections: int = 4096  # per listening port; more are closed at once
    max_connections_per_address: int = 512  # per client IP address, per port
    connection_idle_timeout_ms: int = 120_000  # serverChannelMaxIdleTimeSeconds: nothing read
    #   and nothing written for this long closes the connection
    frame_read_timeout_ms: int = 30_000  # a frame begun must be complete within this
    max_pending_response_bytes: int = 16 * 1024 * 1024  # answers not yet read by the peer, per
    #   connection, past which its requests are not read until it catches up
    max_held_bytes: int = 256 * 1024 * 1024  # unfinished frames and unread answers of all
    #   connections of a port, past which connections holding more than 256 KiB wait

    def __post_init__(self) -> None:
        check.check_types(self)
        check.check_server(self)


@dataclass(frozen=True)
class StoreConfig:
    store_dir: str = "./store"  # storePathRootDir
    flush_disk_type: str = "async"  # flushDiskType (ASYNC_FLUSH / SYNC_FLUSH)
    sync_flush_timeout_ms: int = 5000  # syncFlushTimeout
    flush_interval_commitlog_ms: int = 500  # flushIntervalCommitLog
    flush_interval_consume_queue_ms: int = 1000  # flushIntervalConsumeQueue
    mapped_file_size_commitlog: int = 256 * 1024 * 1024  # mappedFileSizeCommitLog (1 GiB there)
    file_reserved_hours: float = 72.0  # fileReservedTime
    clean_resource_interval_ms: int = 10_000  # cleanResourceInterval
    scrub_interval_ms: int = 5000  # how often closed commit-log segments changed since
    #   they were written (or opened from disk) are CRC-checked, a bounded chunk a pass
    disk_max_used_space_ratio: float = 0.95  # diskMaxUsedSpaceRatio: refuse writes above
    disk_min_free_bytes: int = 64 * 1024 * 1024  # refuse writes with less free space than this
    max_message_size: int = 4 * 1024 * 1024  # maxMessageSize

    def __post_init__(self) -> None:
        check.check_types(self)
        check.check_store(self)


@dataclass(frozen=True)
class BrokerConfig(StoreConfig, ServerConfig):
    cluster_name: str = "DefaultCluster"  # brokerClusterName
    broker_name: str = "broker-a"  # brokerName
    broker_id: int = 0  # brokerId (0 = master)
    broker_role: str = "async_master"  # brokerRole
    listen: str = "127.0.0.1:10911"  # listenPort (and host)
    advertise: str = ""  # brokerIP1 (and port): the address registered and told to peers,
    #   when they reach this broker through a proxy or NAT; "" = listen
    namesrv: tuple[str, ...] = ("127.0.0.1:9876",)  # namesrvAddr
    default_topic_queue_nums: int = 4  # defaultTopicQueueNums
    auto_create_topic_enable: bool = False  # autoCreateTopicEnable
    broker_heartbeat_interval_ms: int = 1000  # brokerHeartbeatInterval
    register_broker_interval_ms: int = 30_000  # registerNameServerPeriod
    broker_not_active_timeout_ms: int = 0  # brokerNotActiveTimeoutMillis; 0 = namesrv's
    long_polling_max_wait_ms: int = 15_000  # longPollingEnable's upper bound
    metrics_listen: str = ""  # HOST:PORT of /metrics (Prometheus), "" = off
    # -- master-slave replication (seed 000, RIP-34) ----------------------------------
    ha_listen: str = ""  # haListenPort; "" = listen port + 1
    ha_advertise: str = ""  # brokerIP2 (and port): the HA address told to peers; "" = the
    #   HA address it listens on
    ha_send_heartbeat_interval_ms: int = 1000  # haSendHeartbeatInterval
    ha_housekeeping_interval_ms: int = 20_000  # haHousekeepingInterval
    ha_transfer_batch_bytes: int = 1024 * 1024  # haTransferBatchSize
    ha_window_bytes: int = 8 * 1024 * 1024  # bytes in flight to one slave (flow control)
    total_replicas: int = 1  # totalReplicas
    in_sync_replicas: int = 1  # inSyncReplicas
    min_in_sync_replicas: int = 1  # minInSyncReplicas
    enable_auto_in_sync_replicas: bool = False  # enableAutoInSyncReplicas
    ha_max_gap_not_in_sync: int = 256 * 1024 * 1024  # haMaxGapNotInSync (RocketMQ's default)
    sync_broker_member_group_period_ms: int = 1000  # syncBrokerMemberGroupPeriod
    slave_sync_interval_ms: int = 3000  # SlaveSynchronize: metadata from the master
    # -- DLedger commit log (seed 002) ----------------------------------------------------
    replication_mode: str = "master-slave"  # "dledger" = enableDLegerCommitLog
    dledger_self_id: int = 0  # dLegerSelfId (1-based here)
    dledger_peers: tuple[str, ...] = ()  # dLegerPeers: "ID@HOST:PORT" raft endpoints
    dledger_election_timeout_ms: int = 1000  # a follower's wait before campaigning;
    #   an unanswered APPEND is resent after 2/5 of it (large batches under load need time)
    # -- delay and timer messages ------------------------------------------------------
    flush_delay_offset_interval_ms: int = 10_000  # flushDelayOffsetInterval
    # -- transaction messages ----------------------------------------------------------
    transaction_check_interval_ms: int = 30_000  # transactionCheckInterval
    transaction_timeout_ms: int = 6_000  # transactionTimeOut: check half messages older
    transaction_check_max: int = 15  # transactionCheckMax: then roll back
    # -- pop consumption ----------------------------------------------------------------
    pop_inflight_message_threshold: int = 10_000  # popInflightMessageThreshold (per queue)
    max_held_pops_per_queue: int = 1024  # popPollingSize: more are answered at once
    max_held_pops_per_connection: int = 1024  # the same, per client connection
    revive_interval_ms: int = 1000  # reviveInterval: pop state checkpoint
    # -- ordered consumption ------------------------------------------------------------
    rebalance_lock_max_live_time_ms: int = 60_000  # rocketmq.broker.rebalance.lockMaxLiveTime
    #   must outlive the clients' own lease (30 s by default)
    # -- controller mode (seed 001) -----------------------------------------------------
    enable_controller_mode: bool = False  # enableControllerMode: the controller elects
    controller_addr: tuple[str, ...] = ()  # controllerAddr: every controller peer's listen
    controller_heartbeat_interval_ms: int = 300  # to the controller (brokerHeartbeatInterval)
    sync_broker_metadata_period_ms: int = 2000  # syncBrokerMetadataPeriod: poll replica info,
    #   the safety net for a lost role-change notification
    check_sync_state_set_period_ms: int = 1000  # checkSyncStateSetPeriod: expand / shrink
    ha_max_time_slave_not_catchup_ms: int = 15_000  # haMaxTimeSlaveNotCatchup
    all_ack_in_sync_state_set: bool = False  # allAckInSyncStateSet: zero loss
    # -- slave acting master (seed 004, RIP-32; master-slave mode) ------------------------
    enable_slave_acting_master: bool = False  # enableSlaveActingMaster: with no master, the
    #   alive member with the smallest broker id serves master-only operations read-only
    enable_remote_escape: bool = False  # enableRemoteEscape: escape to another process's master
    lock_in_strict_mode: bool = False  # lockInStrictMode: a queue lock needs a majority
    skip_pre_online: bool = False  # skipPreOnline: a returning master registers at once
    consumer_offset_update_version_step: int = 500  # consumerOffsetUpdateVersionStep
    delay_offset_update_version_step: int = 200  # delayOffsetUpdateVersionStep
    # mirrored-queue policies (seed 003)
    ha_join: str = "history"  # an empty member's first HA transfer: "history" copies the
    #   master's whole retained log (ha-sync-mode automatic), "tail" starts at its end
    #   (manual: an unsynchronised mirror until consumers pass its start or sync-queue)
    memory_high_watermark_bytes: int = 0  # vm_memory_high_watermark: RSS at which publishers
    #   are blocked (CONNECTION_BLOCKED) until it falls; 0 = off
    disk_free_limit_bytes: int = 50 * 1024 * 1024  # disk_free_limit: free space under which
    #   publishers are blocked (RabbitMQ's default)
    max_unconfirmed_bytes: int = 64 * 1024 * 1024  # credit: bytes of sends waiting for
    #   replica acks, past which the broker stops reading producers' connections

    def __post_init__(self) -> None:
        check.check_types(self)
        check.check_server(self)
        check.check_store(self)
        check.check_broker(self)

    @property
    def dledger_peer_map(self) -> dict[int, str]:
        return check.dledger_peers(self.dledger_peers)

    @property
    def ha_address(self) -> str:
        if self.ha_listen:
            return self.ha_listen
        host, _, port = self.listen.rpartition(":")
        return f"{host}:{int(port) + 1}"

    @property
    def broker_addr(self) -> str:
        """Where others reach this broker: what it registers and announces."""
        return self.advertise or self.listen

    @property
    def ha_server_addr(self) -> str:
        """Where slaves reach this broker's HA port: what it registers and announces."""
        return self.ha_advertise or self.ha_address


@dataclass(frozen=True)
class ControllerSettings:
    """What a controller peer needs, standalone (``ControllerConfig``) or embedded in a name
    server (``NamesrvConfig`` with ``enable_controller_in_namesrv``)."""

    controller_peers: tuple[str, ...] = ()  # controllerDLegerPeers: "ID@HOST:PORT", each
    #   peer's listen address (Raft traffic shares it); empty = one peer, this one
    controller_self_id: int = 1  # controllerDLegerSelfId
    controller_heartbeat_timeout_ms: int = 1500  # controllerHeartBeatTimeoutMills: a member
    #   not heard from for this long is dead; a dead master is replaced
    controller_scan_interval_ms: int = 100  # scanNotActiveBrokerInterval (controller side)
    controller_election_timeout_ms: int = 1000  # the controller peers' own Raft election
    controller_snapshot_interval_entries: int = 1000  # snapshot the state every N applied
    enable_elect_unclean_master: bool = False  # enableElectUncleanMaster: may lose messages
    notify_broker_role_changed: bool = True  # notifyBrokerRoleChanged
    # mirrored-queue policies (seed 003)
    mirror_cluster_name: str = "hamq"  # the cluster of the groups the placement driver makes
    node_heartbeat_timeout_ms: int = 5000  # a node (container) not heard from is down
    placement_interval_ms: int = 1000  # how often the leader reconciles policies and nodes
    default_queue_master_locator: str = "client-local"  # queue_master_locator: min-masters,
    #   client-local or random, for policies that do not set queue-master-locator


@dataclass(frozen=True)
class ControllerConfig(ControllerSettings, ServerConfig):
    listen: str = "127.0.0.1:9878"  # brokers' and admins' requests
    data_dir: str = "./controller"  # Raft log, hard state and snapshots
    metrics_listen: str = ""  # HOST:PORT of /metrics, "" = off

    def __post_init__(self) -> None:
        check.check_types(self)
        check.check_server(self)
        check.check_controller(self)


@dataclass(frozen=True)
class NamesrvConfig(ControllerSettings, ServerConfig):
    listen: str = "127.0.0.1:9876"  # listenPort
    data_dir: str = "./namesrv"  # kvConfigPath's directory
    scan_not_active_broker_interval_ms: int = 5000  # scanNotActiveBrokerInterval
    broker_not_active_timeout_ms: int = 10_000  # brokerNotActiveTimeoutMillis
    max_route_entries: int = 1_000_000  # live members plus (topic, group) routes held (about
    #   0.5 KiB each), past which a registration that would add more is SYSTEM_BUSY
    metrics_listen: str = ""  # HOST:PORT of /metrics, "" = off
    web_listen: str = ""  # HOST:PORT of the management HTTP API and web console (web/),
    #   "" = off; not authenticated yet, so keep it on 127.0.0.1
    web_controllers: tuple[str, ...] = ()  # HOST:PORT of every controller peer the web API
    #   manages policies, vhosts and elections through; () = this name server's embedded
    #   peers (none without an embedded controller: those routes answer 503)
    enable_controller_in_namesrv: bool = False  # enableControllerInNamesrv (recommended)
    support_acting_master: bool = False  # supportActingMaster: route a masterless group's
    #   smallest-id alive member as brokerId 0, read-only (seed 004)

    def __post_init__(self) -> None:
        check.check_types(self)
        check.check_server(self)
        check.check_namesrv(self)


@dataclass(frozen=True)
class ContainerConfig(ServerConfig):
    """A ``BrokerContainer`` (``broker/container.py``): several broker members of different
    groups in one process. Each member keeps its own config file (its own listen, HA and
    store addresses); the container gives every member its ``namesrv``, as RocketMQ's
    BrokerContainer sets each inner broker's namesrvAddr from its own."""

    listen: str = "127.0.0.1:10811"  # the container's own port: ADD_BROKER / REMOVE_BROKER
    namesrv: tuple[str, ...] = ("127.0.0.1:9876",)  # namesrvAddr, shared by every member
    brokers: tuple[str, ...] = ()  # brokerConfigPaths: member config files, started in
    #   order; relative paths are relative to this file's directory
    metrics_listen: str = ""  # HOST:PORT of /metrics for the whole process, "" = off;
    #   members' gauges carry broker_name and broker_id labels (members set none of their own)
    store_root: str = ""  # a member added at runtime (ADD_BROKER, which is not authenticated)
    #   keeps its store_dir inside this directory (a relative path is, like store_dir, the
    #   container's working directory's); "" = no member is added at runtime
    node_name: str = ""  # "hamq@host": this container is a node the controller places
    #   policy groups on (seed 003); "" = not a node
    controller_addr: tuple[str, ...] = ()  # every controller peer's listen, for a node
    node_heartbeat_interval_ms: int = 1000  # a node's heartbeat to every controller peer
    member_host: str = "127.0.0.1"  # where members the controller adds listen (the
    #   container picks their ports)
    member_store: dict[str, Any] = dataclasses.field(default_factory=dict)  # a table of
    #   MEMBER_STORE_KEYS every member runs with, over its own settings (as namesrv is):
    #   the placement driver asks for none, so a node's members get their store here

    def __post_init__(self) -> None:
        check.check_types(self)
        check.check_server(self)
        check.address("listen", self.listen)
        if self.store_root:
            check.path("store_root", self.store_root)
        if self.metrics_listen:
            check.address("metrics_listen", self.metrics_listen)
        if not self.namesrv:
            raise check.bad("namesrv", self.namesrv, "must name at least one name server")
        for addr in self.namesrv:
            check.address("namesrv", addr)
        for path in self.brokers:
            check.path("brokers", path)
        if len(set(self.brokers)) != len(self.brokers):
            raise check.bad("brokers", self.brokers, "lists a member config file twice")
        check.check_ranges(self, {"node_heartbeat_interval_ms": check.POSITIVE})
        if self.node_name:
            check.node_name("node_name", self.node_name)
            if not self.controller_addr:
                raise check.bad(
                    "controller_addr", self.controller_addr, "a node needs its controller peers"
                )
        for addr in self.controller_addr:
            check.address("controller_addr", addr)
        self._check_member_store()

    def _check_member_store(self) -> None:
        """Only ``MEMBER_STORE_KEYS``, each judged by ``BrokerConfig``'s own rules."""
        for key in self.member_store:
            if key not in MEMBER_STORE_KEYS:
                raise ConfigError(
                    f"member_store.{key}: unknown key{check.did_you_mean(key, MEMBER_STORE_KEYS)}"
                    f"; a container sets only {', '.join(MEMBER_STORE_KEYS)}"
                )
        try:
            BrokerConfig(**self.member_store)
        except ConfigError as err:
            raise ConfigError(f"member_store.{err.message}") from None


# The store settings a container may set for all its members (ContainerConfig.member_store).
MEMBER_STORE_KEYS = (
    "flush_disk_type",
    "sync_flush_timeout_ms",
    "mapped_file_size_commitlog",
    "disk_min_free_bytes",
    "disk_free_limit_bytes",
)


def load_config(cls: type[T], path: str | Path | None = None, **overrides: Any) -> T:
    """Read ``path`` (TOML) into ``cls``; ``overrides`` (non-None values) win."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                values = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        except UnicodeDecodeError as exc:  # TOML is UTF-8; tomllib lets this one through
            raise ConfigError(
                f"config file {path} is not valid TOML: not UTF-8 at byte {exc.start}"
            ) from None
    values.update({k: v for k, v in overrides.items() if v is not None})
    return from_dict(cls, values, source=str(path or "options"))


def from_dict(cls: type[T], values: dict[str, Any], source: str = "config") -> T:
    """Build ``cls`` from TOML values; every error names ``source`` (the file or "options")."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in values:
        if key not in fields:
            raise ConfigError(f"{source}: unknown key {key!r}{check.did_you_mean(key, fields)}")
    try:
        return cls(**{key: _from_toml(value, hints[key]) for key, value in values.items()})
    except ConfigError as err:
        raise ConfigError(f"{source}: {err.message}") from None


def _from_toml(value: Any, hint: Any) -> Any:
    """TOML's spelling of a field's type: an array (or one string) for a tuple of strings,
    an integer for a float. Anything else is passed on for ``check_types`` to judge."""
    if typing.get_origin(hint) is tuple and isinstance(value, str):
        return (value,)
    if typing.get_origin(hint) is tuple and isinstance(value, list):
        return tuple(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def dump_toml(values: dict[str, Any]) -> str:
    """Flat TOML for the generated configs of ``hamq dev`` (strings, numbers, booleans,
    lists of strings, inline tables of those)."""
    return "".join(f"{key} = {_toml_value(value)}\n" for key, value in values.items())


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(json.dumps(str(v)) for v in value) + "]"
    if isinstance(value, dict):  # an inline table (member_store)
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value))
