"""Config values a hostile or careless user writes that used to pass every check and fail
only later — a traceback from inside the server, sometimes with its store already on disk —
or were silently replaced: each is a one-line ``ConfigError`` naming the key now."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hamq.cli.servers import dev
from hamq.config import BrokerConfig, NamesrvConfig, from_dict, load_config
from hamq.config_check import show
from hamq.errors import ConfigError


def refused(cls, **values) -> str:
    with pytest.raises(ConfigError) as info:
        from_dict(cls, values)
    assert "\n" not in info.value.message
    return info.value.message


def test_a_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_bytes(b'broker_name = "b\xff"\n')
    with pytest.raises(ConfigError) as info:
        load_config(BrokerConfig, path)
    assert info.value.message == (f"config file {path} is not valid TOML: not UTF-8 at byte 16")


@pytest.mark.parametrize("cls, key", [(BrokerConfig, "store_dir"), (NamesrvConfig, "data_dir")])
def test_a_directory_with_a_nul_character(cls, key):
    assert refused(cls, **{key: "store\0x"}) == (
        f"config: {key} = 'store\\x00x': must not contain a NUL character"
    )


@pytest.mark.parametrize(
    "key, value",
    [
        ("listen", "[::1]:10911"),  # brackets: no resolver takes them
        ("listen", " 127.0.0.1:10911"),
        ("ha_listen", "127.0.0.1 :10912"),
        ("metrics_listen", "999.1.1.1:9100"),
        ("listen", "bad_host!:10911"),
        ("namesrv", "127.0.0.1:9876;127.0.0.1:9877"),  # one string, two addresses
        ("namesrv", ["127.0.0.1:9876", "a..b:9876"]),
    ],
)
def test_an_address_whose_host_is_no_host(key, value):
    bad_one = value[-1] if isinstance(value, list) else value
    host = bad_one.rpartition(":")[0]
    assert refused(BrokerConfig, **{key: value}) == (
        f"config: {key} = {bad_one!r}: {host!r} is no host name or IP address "
        "(IPv6 without brackets)"
    )


@pytest.mark.parametrize(
    "listen", ["localhost:10911", "::1:10911", "0.0.0.0:10911", "my_host.local.:10911"]
)
def test_hosts_that_are_hosts_pass(listen):
    assert from_dict(BrokerConfig, {"listen": listen, "namesrv": [listen]}).listen == listen


def test_dev_total_replicas_zero_is_refused_not_replaced(tmp_path):
    # --data under a file: had the bad value passed, creating the cluster's directory would
    # have failed with a traceback instead (and on a good path, a cluster would have run).
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    result = CliRunner().invoke(
        dev, ["--mode", "single", "--data", str(in_the_way / "dev"), "--total-replicas", "0"]
    )
    assert result.exit_code == 2, result.output
    assert result.output == "config error: options: total_replicas = 0: must be > 0\n"
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_dev_data_under_a_file_is_refused(tmp_path):
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    result = CliRunner().invoke(dev, ["--mode", "single", "--data", str(in_the_way / "dev")])
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"config error: options: --data = {show(str(in_the_way / 'dev'))}: "
        f"cannot be created: {in_the_way} is not a directory\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]
