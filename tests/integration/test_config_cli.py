"""A bad configuration as the user meets it: the real ``hamq`` command prints one line
naming the key, the value and what is allowed, no traceback, exits with code 2, and has
created nothing on disk (no store, no name server data, no ``hamq dev`` directory)."""

from __future__ import annotations

import socket

import pytest

from helpers import assert_config_refused as assert_refused


@pytest.mark.parametrize(
    "toml, expected",
    [
        (
            'flush_disk_type = "SOMETIMES"\n',
            "flush_disk_type = 'SOMETIMES': allowed values are async, sync",
        ),
        ('brokr_name = "b"\n', "unknown key 'brokr_name' (did you mean 'broker_name'?)"),
        ("broker_id = true\n", "broker_id = true: must be an integer"),
        ("in_sync_replicas = 2\n", "in_sync_replicas = 2: must not exceed total_replicas (1)"),
        (
            'replication_mode = "dledger"\ndledger_self_id = 1\n'
            'dledger_peers = ["1@127.0.0.1:20001"]\n'
            "dledger_election_timeout_ms = 50\n",
            "dledger_election_timeout_ms = 50: must be more than the Raft heartbeat interval (60)",
        ),
    ],
)
def test_broker_with_a_bad_config_file(tmp_path, hamq_cli, toml, expected):
    path = tmp_path / "bad.toml"
    path.write_text(f'store_dir = "{tmp_path / "store"}"\n{toml}')
    assert_refused(hamq_cli("broker", "-c", str(path)), f"{path}: {expected}")
    assert [p.name for p in tmp_path.iterdir()] == ["bad.toml"]


def test_namesrv_with_a_bad_listen_option_or_file(tmp_path, hamq_cli):
    data = tmp_path / "namesrv"
    assert_refused(
        hamq_cli("namesrv", "--listen", "127.0.0.1:99999", "--data", str(data)),
        "options: listen = '127.0.0.1:99999': must be HOST:PORT with a port in 1..65535",
    )
    path = tmp_path / "namesrv.toml"
    path.write_text(f'data_dir = "{data}"\nmax_route_entries = 0\n')
    assert_refused(
        hamq_cli("namesrv", "-c", str(path)), f"{path}: max_route_entries = 0: must be > 0"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["namesrv.toml"]


def test_dev_with_an_impossible_flag_combination(tmp_path, hamq_cli):
    data = tmp_path / "dev"
    assert_refused(
        hamq_cli(
            "dev",
            "--data",
            str(data),
            "--mode",
            "master-slave",
            "--replicas",
            "2",
            "--in-sync-replicas",
            "3",
        ),
        "options: in_sync_replicas = 3: must not exceed total_replicas (2)",
    )
    assert_refused(
        hamq_cli("dev", "--mode", "single", "--data", str(data), "--port-base", "65000"),
        "options: listen = '127.0.0.1:66035': must be HOST:PORT with a port in 1..65535",
    )
    assert not data.exists()


def test_dev_web_port_taken_or_in_the_layout(tmp_path, hamq_cli):
    """The console's port is checked before anything starts: one taken by another process,
    or one a server of the layout would take (a member binds only after the console runs)."""
    data = tmp_path / "dev"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_refused(
            hamq_cli("dev", "--mode", "single", "--data", str(data), "--web-port", str(port)),
            f"options: --web-port = '127.0.0.1:{port}': cannot listen there: "
            "Address already in use",
        )
    assert_refused(
        hamq_cli("dev", "--data", str(data), "--port-base", "20000", "--web-port", "21045"),
        "options: --web-port = '127.0.0.1:21045': is broker-a-1's listen too",
    )
    assert not data.exists()
