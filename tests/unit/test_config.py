"""Config validation: every class of bad value is a ``hamq.errors.ConfigError`` whose one-line
message names the key, the value and what is allowed, raised while the config is built —
before a server could create its store — and the Raft core refuses with the same class."""

from __future__ import annotations

import dataclasses

import pytest

from hamq import errors, raft
from hamq.config import (
    BrokerConfig,
    ControllerConfig,
    NamesrvConfig,
    ServerConfig,
    StoreConfig,
    load_config,
)
from hamq.config_check import (
    BROKER_RANGES,
    CONTROLLER_RANGES,
    NAMESRV_RANGES,
    SERVER_RANGES,
    STORE_RANGES,
)
from hamq.errors import ConfigError
from hamq.raft.config import HEARTBEAT_INTERVAL_MS, RaftConfig

DLEDGER = {
    "replication_mode": "dledger",
    "dledger_self_id": 1,
    "dledger_peers": ["1@127.0.0.1:20001", "2@127.0.0.1:20011"],
}


def load_toml(tmp_path, text: str) -> BrokerConfig:
    """Load ``text`` as a broker config file in an otherwise empty directory, its
    ``store_dir`` inside it; the directory must still hold only the file afterwards."""
    path = tmp_path / "broker.toml"
    path.write_text(f'store_dir = "{tmp_path / "store"}"\n{text}')
    try:
        return load_config(BrokerConfig, path)
    finally:
        assert [p.name for p in tmp_path.iterdir()] == ["broker.toml"]


def refused(tmp_path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_toml(tmp_path, text)
    message = info.value.message
    assert "\n" not in message and message.startswith(f"{tmp_path / 'broker.toml'}: ")
    return message.split(": ", 1)[1]


def test_one_config_error_class_in_the_code_base():
    assert raft.ConfigError is errors.ConfigError
    with pytest.raises(errors.ConfigError):
        RaftConfig(
            node_id=1,
            member_ids=(1,),
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
            election_timeout_ms=HEARTBEAT_INTERVAL_MS,
        )


def test_unknown_key_suggests_the_closest():
    with pytest.raises(ConfigError) as info:
        load_config(BrokerConfig, brokr_name="b")
    assert info.value.message == "options: unknown key 'brokr_name' (did you mean 'broker_name'?)"


def test_unknown_key_in_a_file(tmp_path):
    assert (
        refused(tmp_path, 'flush_disk_typ = "sync"\n')
        == "unknown key 'flush_disk_typ' (did you mean 'flush_disk_type'?)"
    )
    assert refused(tmp_path, "zzz = 1\n") == "unknown key 'zzz'"


# Each class of bad value in a broker's config file, with the exact one-line message.
BAD_FILES = {
    "wrong type": [
        ('broker_id = "zero"', "broker_id = 'zero': must be an integer"),
        ("broker_id = true", "broker_id = true: must be an integer"),
        ("total_replicas = false", "total_replicas = false: must be an integer"),
        ("auto_create_topic_enable = 1", "auto_create_topic_enable = 1: must be true or false"),
        ("namesrv = [1, 2]", "namesrv = [1, 2]: must be a list of strings"),
        (
            "mapped_file_size_commitlog = 1.5",
            "mapped_file_size_commitlog = 1.5: must be an integer",
        ),
        ("file_reserved_hours = true", "file_reserved_hours = true: must be a number"),
        ("broker_name = 7", "broker_name = 7: must be a string"),
    ],
    "out of range": [
        ("sync_flush_timeout_ms = 0", "sync_flush_timeout_ms = 0: must be > 0"),
        ("max_connections = -1", "max_connections = -1: must be > 0"),
        (
            "disk_max_used_space_ratio = 1.5",
            "disk_max_used_space_ratio = 1.5: must be > 0 and <= 1",
        ),
        ("disk_min_free_bytes = -1", "disk_min_free_bytes = -1: must be >= 0"),
        ("broker_id = 1024", "broker_id = 1024: allowed 0..1023"),
        ("default_topic_queue_nums = 5000", "default_topic_queue_nums = 5000: allowed 1..1024"),
        ("max_message_size = 8388608", "max_message_size = 8388608: allowed 1..4194304"),
        (
            "broker_not_active_timeout_ms = 3600000",
            "broker_not_active_timeout_ms = 3600000: allowed 0..600000",
        ),
    ],
    "not an allowed value": [
        (
            'flush_disk_type = "SOMETIMES"',
            "flush_disk_type = 'SOMETIMES': allowed values are async, sync",
        ),
        (
            'flush_disk_type = "SYNC"',
            "flush_disk_type = 'SYNC': allowed values are async, sync (did you mean 'sync'?)",
        ),
        (
            'broker_role = "master"',
            "broker_role = 'master': allowed values are async_master, sync_master, slave "
            "(did you mean 'sync_master'?)",
        ),
        (
            'replication_mode = "raft"',
            "replication_mode = 'raft': allowed values are master-slave, dledger",
        ),
    ],
    "bad string": [
        ('listen = "host:"', "listen = 'host:': must be HOST:PORT with a port in 1..65535"),
        (
            'namesrv = ["127.0.0.1:9876", "nohost"]',
            "namesrv = 'nohost': must be HOST:PORT with a port in 1..65535",
        ),
        ("namesrv = []", "namesrv = []: must name at least one name server"),
        ('metrics_listen = "x"', "metrics_listen = 'x': must be HOST:PORT with a port in 1..65535"),
        ('advertise = "proxy"', "advertise = 'proxy': must be HOST:PORT with a port in 1..65535"),
        (
            'ha_advertise = "proxy:0"',
            "ha_advertise = 'proxy:0': must be HOST:PORT with a port in 1..65535",
        ),
        (
            'broker_name = "a/b"',
            "broker_name = 'a/b': contains '/'; allowed: letters, digits and % | _ - .",
        ),
        ('cluster_name = ""', "cluster_name = '': must not be empty"),
    ],
    "impossible combination": [
        (
            "in_sync_replicas = 3\ntotal_replicas = 2",
            "in_sync_replicas = 3: must not exceed total_replicas (2)",
        ),
        (
            "min_in_sync_replicas = 2\ntotal_replicas = 3",
            "min_in_sync_replicas = 2: must not exceed in_sync_replicas (1)",
        ),
        (
            "ha_transfer_batch_bytes = 2048\nha_window_bytes = 1024",
            "ha_transfer_batch_bytes = 2048: must not exceed ha_window_bytes (1024)",
        ),
        (
            "ha_housekeeping_interval_ms = 1000",
            "ha_housekeeping_interval_ms = 1000: must be more than ha_send_heartbeat_interval_ms "
            "(1000)",
        ),
        (
            "broker_not_active_timeout_ms = 500",
            "broker_not_active_timeout_ms = 500: must be more than broker_heartbeat_interval_ms "
            "(1000)",
        ),
        (
            'broker_id = 1\nbroker_role = "sync_master"',
            "broker_id = 1: does not fit broker_role 'sync_master': 0 is the master, slaves have "
            "ids >= 1",
        ),
        (
            'broker_role = "slave"',
            "broker_id = 0: does not fit broker_role 'slave': "
            "0 is the master, slaves have ids >= 1",
        ),
        (
            'listen = "127.0.0.1:65535"',
            "listen = '127.0.0.1:65535': port must be below 65535 when ha_listen is empty (the HA "
            "port is the listen port + 1)",
        ),
        (
            'metrics_listen = "0.0.0.0:10912"',
            "metrics_listen = '0.0.0.0:10912': collides with ha_listen (listen port + 1) "
            "(127.0.0.1:10912)",
        ),
        (
            'ha_listen = "127.0.0.1:10911"',
            "ha_listen = '127.0.0.1:10911': collides with listen (127.0.0.1:10911)",
        ),
    ],
}


@pytest.mark.parametrize(
    "lines, message",
    [
        pytest.param(lines, message, id=f"{kind}: {lines}")
        for kind, cases in BAD_FILES.items()
        for lines, message in cases
    ],
)
def test_a_bad_value_is_refused_naming_key_value_and_allowed(tmp_path, lines, message):
    assert refused(tmp_path, lines + "\n") == message


@pytest.mark.parametrize("listen", ["127.0.0.1:99999", "9876", "127.0.0.1:0", "h:x"])
def test_name_server_listen_address(listen):
    """A server must not start on (or report) an address it cannot bind as written."""
    with pytest.raises(ConfigError) as info:
        load_config(NamesrvConfig, listen=listen)
    assert (
        info.value.message
        == f"options: listen = {listen!r}: must be HOST:PORT with a port in 1..65535"
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"dledger_election_timeout_ms": HEARTBEAT_INTERVAL_MS},
            f"dledger_election_timeout_ms = {HEARTBEAT_INTERVAL_MS}: must be more than the Raft "
            f"heartbeat interval ({HEARTBEAT_INTERVAL_MS})",
        ),
        (
            {"dledger_self_id": 3},
            "dledger_self_id = 3: must be one of the dledger_peers ids [1, 2]",
        ),
        (
            {"dledger_peers": ["1@127.0.0.1:20001", "1@127.0.0.1:20011"]},
            "dledger_peers = ['1@127.0.0.1:20001', '1@127.0.0.1:20011']: "
            "member id 1 is listed twice",
        ),
        (
            {"dledger_peers": ["1@127.0.0.1:20001", "2@127.0.0.1:20001"]},
            "dledger_peers = ['1@127.0.0.1:20001', '2@127.0.0.1:20001']: address 127.0.0.1:20001 "
            "is listed twice",
        ),
        (
            {"dledger_peers": ["x@127.0.0.1:20001"]},
            "dledger_peers = ['x@127.0.0.1:20001']: entry 'x@127.0.0.1:20001' must be "
            "ID@HOST:PORT with an ID in 1..1023",
        ),
        (
            {"dledger_peers": ["1@127.0.0.1:10911"]},
            "dledger_peers (this member) = '127.0.0.1:10911': collides with listen "
            "(127.0.0.1:10911)",
        ),
    ],
)
def test_impossible_dledger_group(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(BrokerConfig, **{**DLEDGER, **overrides})
    assert info.value.message == f"options: {message}"


def test_the_shortest_allowed_election_timeout_makes_a_valid_raft_config():
    """What BrokerConfig accepts, the Raft core accepts too: the DLedger driver resends an
    APPEND after 2/5 of the election timeout."""
    config = load_config(
        BrokerConfig, **DLEDGER, dledger_election_timeout_ms=HEARTBEAT_INTERVAL_MS + 1
    )
    election_ms = config.dledger_election_timeout_ms
    RaftConfig(
        config.dledger_self_id,
        tuple(sorted(config.dledger_peer_map)),
        election_timeout_ms=election_ms,
        push_timeout_ms=election_ms * 2 // 5,
    )


def test_checks_run_however_the_config_is_built():
    """Not only the TOML loader: a config built in Python is checked the same way."""
    with pytest.raises(ConfigError, match=r"^broker_id = true: must be an integer$"):
        BrokerConfig(broker_id=True)
    with pytest.raises(ConfigError, match=r"^flush_disk_type = 'x': allowed values"):
        StoreConfig(flush_disk_type="x")
    with pytest.raises(ConfigError, match=r"^store_dir = '': must not be empty$"):
        StoreConfig(store_dir="")
    with pytest.raises(ConfigError, match=r"^max_held_bytes = 0: must be > 0$"):
        ServerConfig(max_held_bytes=0)
    with pytest.raises(ConfigError, match=r"^max_route_entries = 0: must be > 0$"):
        NamesrvConfig(max_route_entries=0)
    with pytest.raises(ConfigError, match=r"^metrics_listen = '127.0.0.1:9876': collides"):
        NamesrvConfig(metrics_listen="127.0.0.1:9876")
    with pytest.raises(ConfigError, match=r"^web_controllers = 'x': must be HOST:PORT"):
        NamesrvConfig(web_controllers=("x",))


def test_long_values_are_cut_to_keep_one_line():
    with pytest.raises(ConfigError) as info:
        BrokerConfig(broker_name="x" * 300)
    assert len(info.value.message) < 160
    assert info.value.message.endswith("is 300 characters, more than the limit of 255")


def test_valid_file_loads(tmp_path):
    config = load_toml(
        tmp_path, 'flush_disk_type = "sync"\nfile_reserved_hours = 2\nnamesrv = "a:1"\n'
    )
    assert (config.flush_disk_type, config.file_reserved_hours, config.namesrv) == (
        "sync",
        2.0,
        ("a:1",),
    )
    assert load_config(BrokerConfig, **DLEDGER).dledger_peer_map == {
        1: "127.0.0.1:20001",
        2: "127.0.0.1:20011",
    }


def test_unreadable_or_broken_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(BrokerConfig, tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("broker_id = = 1\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(BrokerConfig, tmp_path / "bad.toml")


@pytest.mark.parametrize(
    "cls, ranges",
    [
        (ServerConfig, SERVER_RANGES),
        (StoreConfig, {**STORE_RANGES}),
        (BrokerConfig, {**SERVER_RANGES, **STORE_RANGES, **BROKER_RANGES}),
        (NamesrvConfig, {**SERVER_RANGES, **NAMESRV_RANGES, **CONTROLLER_RANGES}),
        (ControllerConfig, {**SERVER_RANGES, **CONTROLLER_RANGES}),
    ],
)
def test_every_number_has_a_range(cls, ranges):
    """A number added to a config without a range would go unchecked."""
    numbers = {f.name for f in dataclasses.fields(cls) if f.type in ("int", "float")}
    assert numbers == set(ranges)
