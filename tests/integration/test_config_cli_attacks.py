"""What only the machine can tell about a config that passes every check — its port is taken,
its store directory is a file, the file is not UTF-8 — as the real ``hamq`` command meets
it: one line naming the key and the value, no traceback, exit code 2, and nothing created
on disk (the server used to fail half-started, its store already written)."""

from __future__ import annotations

import socket

import pytest

from hamq.config_check import show
from helpers import assert_config_refused, free_port


@pytest.fixture
def taken_port():
    """A port something else listens on for the test's length."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))
        sock.listen()
        yield sock.getsockname()[1]


def _broker_file(tmp_path, text: str):
    path = tmp_path / "broker.toml"
    path.write_text(f'store_dir = "{tmp_path / "store"}"\n{text}')
    return path


@pytest.mark.parametrize("key", ["listen", "ha_listen", "metrics_listen"])
def test_broker_whose_port_is_taken(tmp_path, hamq_cli, taken_port, key):
    own = {k: f"127.0.0.1:{free_port()}" for k in ("listen", "ha_listen", "metrics_listen")}
    own[key] = f"127.0.0.1:{taken_port}"
    path = _broker_file(tmp_path, "".join(f'{k} = "{v}"\n' for k, v in own.items()))
    result = hamq_cli("broker", "-c", str(path))
    assert_config_refused(
        result, f"{path}: {key} = '{own[key]}': cannot listen there: Address already in use"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["broker.toml"]


def test_namesrv_whose_port_is_taken(tmp_path, hamq_cli, taken_port):
    data = tmp_path / "namesrv"
    listen = f"127.0.0.1:{taken_port}"
    result = hamq_cli("namesrv", "--listen", listen, "--data", str(data))
    assert_config_refused(
        result, f"options: listen = '{listen}': cannot listen there: Address already in use"
    )
    assert not data.exists()


def test_broker_whose_store_dir_is_a_file(tmp_path, hamq_cli):
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    path = tmp_path / "broker.toml"
    path.write_text(f'store_dir = "{in_the_way / "store"}"\nlisten = "127.0.0.1:{free_port()}"\n')
    assert_config_refused(
        hamq_cli("broker", "-c", str(path)),
        # show(): a long value is cut, and a worker's tmp path (xdist) is long
        f"{path}: store_dir = {show(str(in_the_way / 'store'))}: "
        f"cannot be created: {in_the_way} is not a directory",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "broker.toml"]


def test_broker_file_that_is_not_utf8(tmp_path, hamq_cli):
    path = tmp_path / "broker.toml"
    path.write_bytes(b'broker_name = "caf\xe9"\n')
    assert_config_refused(
        hamq_cli("broker", "-c", str(path)),
        f"config file {path} is not valid TOML: not UTF-8 at byte 18",
    )
    assert [p.name for p in tmp_path.iterdir()] == ["broker.toml"]
