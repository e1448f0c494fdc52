"""Every rule a configuration value must follow, in one place.

The config dataclasses call these checks when they are built, so a bad value — wrong type,
number out of range, string not among the allowed ones, or a combination that cannot work —
is a ``ConfigError`` before a server creates anything on disk or binds a port. Each message
names the key, the value given and what is allowed, in one line the CLI prints as it is.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import ipaddress
import re
import typing
from typing import TYPE_CHECKING, Any, NamedTuple

from hamq.errors import ConfigError
from hamq.namesrv.requests import MAX_HEARTBEAT_TIMEOUT_MS
from hamq.protocol.limits import MAX_BROKER_ID, MAX_MESSAGE_BYTES, MAX_QUEUE_NUMS
from hamq.protocol.message import validate_name
from hamq.raft.config import HEARTBEAT_INTERVAL_MS

if TYPE_CHECKING:
    from hamq.config import (
        BrokerConfig,
        ControllerConfig,
        ControllerSettings,
        NamesrvConfig,
        ServerConfig,
        StoreConfig,
    )

FLUSH_DISK_TYPES = ("async", "sync")
BROKER_ROLES = ("async_master", "sync_master", "slave")
HA_JOINS = ("history", "tail")
QUEUE_MASTER_LOCATORS = ("min-masters", "client-local", "random")
REPLICATION_MODES = ("master-slave", "dledger")
# Hosts that bind every interface: they collide with any other host on the same port.
_WILDCARD_HOSTS = ("0.0.0.0", "::")
# One label of a DNS name (RFC 1123; "_" too, as resolvers take it).
_HOST_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
# A value longer than this is cut in messages, which stay one line.
_SHOW_CHARS = 80


class Range(NamedTuple):
    """The numbers a key allows: ``low`` (excluded when ``low_open``) up to ``high``."""

    low: float
    high: float | None = None
    low_open: bool = False

    def allows(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and (self.high is None or value <= self.high)

    def __str__(self) -> str:
        if self.high is None:
            return f"must be {'>' if self.low_open else '>='} {self.low}"
        if self.low_open:
            return f"must be > {self.low} and <= {self.high}"
        return f"allowed {self.low}..{self.high}"


POSITIVE = Range(0, low_open=True)
NOT_NEGATIVE = Range(0)

SERVER_RANGES = {
    "max_connections": POSITIVE,
    "max_connections_per_address": POSITIVE,
    "connection_idle_timeout_ms": POSITIVE,
    "frame_read_timeout_ms": POSITIVE,
    "max_pending_response_bytes": POSITIVE,
    "max_held_bytes": POSITIVE,
}
STORE_RANGES = {
    "sync_flush_timeout_ms": POSITIVE,
    "flush_interval_commitlog_ms": POSITIVE,
    "flush_interval_consume_queue_ms": POSITIVE,
    "mapped_file_size_commitlog": POSITIVE,  # a larger record gets a segment of its own
    "file_reserved_hours": POSITIVE,
    "clean_resource_interval_ms": POSITIVE,
    "scrub_interval_ms": POSITIVE,
    "disk_max_used_space_ratio": Range(0, 1, low_open=True),
    "disk_min_free_bytes": NOT_NEGATIVE,  # 0: no guard
    "max_message_size": Range(1, MAX_MESSAGE_BYTES),  # no client encodes a larger body
}
BROKER_RANGES = {
    "broker_id": Range(0, MAX_BROKER_ID),  # the name server refuses larger ids
    "default_topic_queue_nums": Range(1, MAX_QUEUE_NUMS),
    "broker_heartbeat_interval_ms": POSITIVE,
    "register_broker_interval_ms": POSITIVE,
    # 0: the name server's default; it refuses a registration asking for more than its cap
    "broker_not_active_timeout_ms": Range(0, MAX_HEARTBEAT_TIMEOUT_MS),
    "long_polling_max_wait_ms": NOT_NEGATIVE,  # 0: a pull finding nothing answers at once
    "ha_send_heartbeat_interval_ms": POSITIVE,
    "ha_housekeeping_interval_ms": POSITIVE,
    "ha_transfer_batch_bytes": POSITIVE,
    "ha_window_bytes": POSITIVE,
    "total_replicas": POSITIVE,
    "in_sync_replicas": POSITIVE,
    "min_in_sync_replicas": POSITIVE,
    "ha_max_gap_not_in_sync": POSITIVE,
    "sync_broker_member_group_period_ms": POSITIVE,
    "slave_sync_interval_ms": POSITIVE,
    "dledger_self_id": Range(0, MAX_BROKER_ID),  # 0: not a DLedger member
    "dledger_election_timeout_ms": POSITIVE,
    "flush_delay_offset_interval_ms": POSITIVE,
    "transaction_check_interval_ms": POSITIVE,
    "transaction_timeout_ms": NOT_NEGATIVE,
    "transaction_check_max": POSITIVE,
    "pop_inflight_message_threshold": POSITIVE,
    "max_held_pops_per_queue": POSITIVE,
    "max_held_pops_per_connection": POSITIVE,
    "revive_interval_ms": POSITIVE,
    "rebalance_lock_max_live_time_ms": POSITIVE,
    "consumer_offset_update_version_step": POSITIVE,
    "delay_offset_update_version_step": POSITIVE,
    "controller_heartbeat_interval_ms": POSITIVE,
    "sync_broker_metadata_period_ms": POSITIVE,
    "check_sync_state_set_period_ms": POSITIVE,
    "ha_max_time_slave_not_catchup_ms": POSITIVE,
    "memory_high_watermark_bytes": NOT_NEGATIVE,  # 0: no memory alarm
    "disk_free_limit_bytes": NOT_NEGATIVE,
    "max_unconfirmed_bytes": POSITIVE,
}
CONTROLLER_RANGES = {
    "controller_self_id": Range(1, MAX_BROKER_ID),
    "controller_heartbeat_timeout_ms": POSITIVE,
    "controller_scan_interval_ms": POSITIVE,
    "controller_election_timeout_ms": POSITIVE,
    "controller_snapshot_interval_entries": POSITIVE,
    "node_heartbeat_timeout_ms": POSITIVE,
    "placement_interval_ms": POSITIVE,
}
NAMESRV_RANGES = {
    "scan_not_active_broker_interval_ms": POSITIVE,
    "broker_not_active_timeout_ms": POSITIVE,
    "max_route_entries": POSITIVE,
}


def show(value: Any) -> str:
    """A value as the user wrote it in TOML (``true``, a list), cut to fit one line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= _SHOW_CHARS else text[: _SHOW_CHARS - 3] + "..."


def bad(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{key} = {show(value)}: {allowed}")


def did_you_mean(word: str, choices: typing.Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or ``""``."""
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), by_lower, n=1)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


# -- one value -----------------------------------------------------------------------------


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


# What a field of each type accepts, and how to say so (to Python a bool is an int; to a
# config it is not).
_ACCEPTS: dict[type, tuple[tuple[type, ...], str]] = {
    bool: ((bool,), "must be true or false"),
    int: ((int,), "must be an integer"),
    float: ((int, float), "must be a number"),
    str: ((str,), "must be a string"),
}


def check_types(config: Any) -> None:
    """Every field holds its declared type."""
    hints = _hints(type(config))
    for field in dataclasses.fields(config):
        key, value, hint = field.name, getattr(config, field.name), hints[field.name]
        if typing.get_origin(hint) is tuple:  # a list of strings
            ok = isinstance(value, tuple) and all(isinstance(v, str) for v in value)
            allowed = "must be a list of strings"
        elif typing.get_origin(hint) is dict:  # a table of settings, each checked by its owner
            ok = isinstance(value, dict) and all(isinstance(k, str) for k in value)
            allowed = "must be a table of settings"
        else:
            types, allowed = _ACCEPTS[hint]
            ok = isinstance(value, types) and (hint is bool or not isinstance(value, bool))
        if not ok:
            raise bad(key, value, allowed)


def check_ranges(config: Any, ranges: dict[str, Range]) -> None:
    for key, allowed in ranges.items():
        value = getattr(config, key)
        if not allowed.allows(value):
            raise bad(key, value, str(allowed))


def one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise bad(
            key, value, f"allowed values are {', '.join(allowed)}" + did_you_mean(value, allowed)
        )


def address(key: str, value: str) -> tuple[str, int]:
    """``HOST:PORT`` as a server binds or dials it; returns (host, port). A host that is no
    name or IP address (a space, brackets, two addresses in one string) would only fail
    when the server binds or dials it."""
    host, _, port = value.rpartition(":")
    if not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise bad(key, value, "must be HOST:PORT with a port in 1..65535")
    if not _is_host(host):
        raise bad(key, value, f"{host!r} is no host name or IP address (IPv6 without brackets)")
    return host, int(port)


def _is_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        labels = host.removesuffix(".").split(".")
        return (
            len(host) <= 253
            and all(_HOST_LABEL.fullmatch(label) for label in labels)
            and not labels[-1].isdigit()  # "1.2.3" or "999.1.1.1": no address, no name
        )
    return True


def path(key: str, value: str) -> None:
    """A directory the server creates: the OS takes no empty path and no NUL in one."""
    if not value:
        raise bad(key, value, "must not be empty")
    if "\0" in value:
        raise bad(key, value, "must not contain a NUL character")


def name(key: str, value: str) -> None:
    """Cluster and broker names travel to the name server, which takes only safe names."""
    try:
        validate_name(value, key, error=ConfigError)
    except ConfigError as err:  # its message repeats the key and the value
        reason = err.message.removeprefix(key).lstrip().removeprefix(repr(value)).lstrip()
        raise bad(key, value, reason) from None


NODE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}@[A-Za-z0-9_.-]{1,128}")


def node_name(key: str, value: str) -> None:
    """A node name is RabbitMQ's ``rabbit@host`` shape: it goes into policies' ha-params."""
    if not NODE_NAME.fullmatch(value):
        raise bad(key, value, "must look like hamq@host (letters, digits, '_', '.', '-')")


def dledger_peers(specs: tuple[str, ...], key: str = "dledger_peers") -> dict[int, str]:
    """``ID@HOST:PORT`` entries as {member id: address}; ids >= 1, each id and address once.
    ``key`` names the setting in errors (``controller_peers`` has the same form)."""
    peers: dict[int, str] = {}
    for spec in specs:
        member, _, addr = spec.partition("@")
        if not member.isascii() or not member.isdigit() or not 1 <= int(member) <= MAX_BROKER_ID:
            raise bad(
                key,
                specs,
                f"entry {spec!r} must be ID@HOST:PORT with an ID in 1..{MAX_BROKER_ID}",
            )
        address(key, addr)
        if int(member) in peers:
            raise bad(key, specs, f"member id {member} is listed twice")
        if addr in peers.values():
            raise bad(key, specs, f"address {addr} is listed twice")
        peers[int(member)] = addr
    return peers


def _greater(config: Any, key: str, than: str) -> None:
    value, other = getattr(config, key), getattr(config, than)
    if not value > other:
        raise bad(key, value, f"must be more than {than} ({other})")


def _distinct_ports(binds: dict[str, str]) -> None:
    """The addresses one process listens on must not collide (the second bind would fail
    after the store is already open)."""
    seen: list[tuple[str, str, int]] = []
    for key, value in binds.items():
        host, port = address(key, value)
        for other_key, other_host, other_port in seen:
            if port == other_port and (
                host == other_host or host in _WILDCARD_HOSTS or other_host in _WILDCARD_HOSTS
            ):
                raise bad(key, value, f"collides with {other_key} ({other_host}:{other_port})")
        seen.append((key, host, port))


# -- one config class ----------------------------------------------------------------------


def check_server(config: ServerConfig) -> None:
    check_ranges(config, SERVER_RANGES)


def check_store(config: StoreConfig) -> None:
    path("store_dir", config.store_dir)
    one_of("flush_disk_type", config.flush_disk_type, FLUSH_DISK_TYPES)
    check_ranges(config, STORE_RANGES)


def check_namesrv(config: NamesrvConfig) -> None:
    path("data_dir", config.data_dir)
    check_ranges(config, NAMESRV_RANGES)
    check_controller_settings(config)
    for addr in config.web_controllers:
        address("web_controllers", addr)
    _distinct_ports(namesrv_binds(config))


def check_controller(config: ControllerConfig) -> None:
    path("data_dir", config.data_dir)
    check_controller_settings(config)
    _distinct_ports(controller_binds(config))


def check_controller_settings(config: ControllerSettings) -> None:
    """The controller peers' Raft endpoints and timeouts (standalone or embedded)."""
    check_ranges(config, CONTROLLER_RANGES)
    name("mirror_cluster_name", config.mirror_cluster_name)
    one_of(
        "default_queue_master_locator",
        config.default_queue_master_locator,
        QUEUE_MASTER_LOCATORS,
    )
    if config.controller_peers:
        peers = dledger_peers(config.controller_peers, "controller_peers")
        if config.controller_self_id not in peers:
            raise bad(
                "controller_self_id",
                config.controller_self_id,
                f"must be one of the controller_peers ids {sorted(peers)}",
            )
    if config.controller_election_timeout_ms <= HEARTBEAT_INTERVAL_MS:
        raise bad(
            "controller_election_timeout_ms",
            config.controller_election_timeout_ms,
            f"must be more than the Raft heartbeat interval ({HEARTBEAT_INTERVAL_MS})",
        )


def controller_binds(config: ControllerConfig) -> dict[str, str]:
    """Every address a standalone controller listens on, by the key that sets it."""
    binds = {"listen": config.listen}
    if config.metrics_listen:
        binds["metrics_listen"] = config.metrics_listen
    return binds


def namesrv_binds(config: NamesrvConfig) -> dict[str, str]:
    """Every address a name server listens on, by the key that sets it."""
    binds = {"listen": config.listen}
    if config.metrics_listen:
        binds["metrics_listen"] = config.metrics_listen
    if config.web_listen:
        binds["web_listen"] = config.web_listen
    return binds


def check_broker(config: BrokerConfig) -> None:
    name("cluster_name", config.cluster_name)
    name("broker_name", config.broker_name)
    one_of("broker_role", config.broker_role, BROKER_ROLES)
    one_of("replication_mode", config.replication_mode, REPLICATION_MODES)
    one_of("ha_join", config.ha_join, HA_JOINS)
    check_ranges(config, BROKER_RANGES)
    if not config.namesrv:
        raise bad("namesrv", config.namesrv, "must name at least one name server")
    for addr in config.namesrv:
        address("namesrv", addr)
    for key in ("advertise", "ha_advertise"):
        if getattr(config, key):
            address(key, getattr(config, key))
    if not config.ha_listen:
        _, port = address("listen", config.listen)
        if port == 65535:
            raise bad(
                "listen",
                config.listen,
                "port must be below 65535 when ha_listen is "
                "empty (the HA port is the listen port + 1)",
            )
    if config.replication_mode == "dledger":
        peers = dledger_peers(config.dledger_peers)
        if config.dledger_self_id not in peers:
            raise bad(
                "dledger_self_id",
                config.dledger_self_id,
                f"must be one of the dledger_peers ids {sorted(peers)}",
            )
        # a follower that hears no heartbeat within its election timeout starts an election
        if config.dledger_election_timeout_ms <= HEARTBEAT_INTERVAL_MS:
            raise bad(
                "dledger_election_timeout_ms",
                config.dledger_election_timeout_ms,
                f"must be more than the Raft heartbeat interval ({HEARTBEAT_INTERVAL_MS})",
            )
    # in controller mode the controller gives the id and the role: both settings are unused
    elif not config.enable_controller_mode and (config.broker_id == 0) == (
        config.broker_role == "slave"
    ):
        raise bad(
            "broker_id",
            config.broker_id,
            f"does not fit broker_role "
            f"{config.broker_role!r}: 0 is the master, slaves have ids >= 1",
        )
    _distinct_ports(broker_binds(config))
    if config.ha_transfer_batch_bytes > config.ha_window_bytes:
        raise bad(
            "ha_transfer_batch_bytes",
            config.ha_transfer_batch_bytes,
            f"must not exceed ha_window_bytes ({config.ha_window_bytes})",
        )
    if config.in_sync_replicas > config.total_replicas:
        raise bad(
            "in_sync_replicas",
            config.in_sync_replicas,
            f"must not exceed total_replicas ({config.total_replicas})",
        )
    if config.min_in_sync_replicas > config.in_sync_replicas:
        raise bad(
            "min_in_sync_replicas",
            config.min_in_sync_replicas,
            f"must not exceed in_sync_replicas ({config.in_sync_replicas})",
        )
    # a slave heard from at every heartbeat must never look silent to the master
    _greater(config, "ha_housekeeping_interval_ms", "ha_send_heartbeat_interval_ms")
    if config.broker_not_active_timeout_ms:  # or the name server drops us between heartbeats
        _greater(config, "broker_not_active_timeout_ms", "broker_heartbeat_interval_ms")
    # an elected master (Raft leader, controller's choice) replaces a lost one: no slave acts
    if config.enable_slave_acting_master and (
        config.enable_controller_mode or config.replication_mode != "master-slave"
    ):
        raise bad(
            "enable_slave_acting_master",
            True,
            "needs replication_mode 'master-slave' without enable_controller_mode "
            "(DLedger and the controller elect a new master instead)",
        )
    if config.enable_controller_mode:
        if config.replication_mode != "master-slave":
            raise bad(
                "enable_controller_mode",
                True,
                "needs replication_mode 'master-slave' (the controller elects among HA members)",
            )
        if not config.controller_addr:
            raise bad("controller_addr", (), "must name at least one controller")
        for addr in config.controller_addr:
            address("controller_addr", addr)


def broker_binds(config: BrokerConfig) -> dict[str, str]:
    """Every address a broker listens on, by the key that sets it."""
    binds = {"listen": config.listen}
    if config.ha_listen:
        binds["ha_listen"] = config.ha_listen
    else:
        binds["ha_listen (listen port + 1)"] = config.ha_address
    if config.metrics_listen:
        binds["metrics_listen"] = config.metrics_listen
    if config.replication_mode == "dledger":
        binds["dledger_peers (this member)"] = config.dledger_peer_map[config.dledger_self_id]
    return binds
