"""A broker container's port and members under hostile input and operator mistakes, on real
processes (seed 004's BrokerContainer; issue 15 break-it review): ADD_BROKER is not
authenticated, so what a stranger may make the container write is bounded by its
``store_root``; stores that overlap are refused however they are spelled; a member whose
store cannot be opened lets go of it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import encode_frame_bytes, pack_body
from harness import Cluster

sys.path.insert(0, str(Path(__file__).parent))  # sibling test modules, as tests/chaos does
from test_container import create_topic, produce_and_consume, start_container, write_container


def add_broker(hamq_cli, container: str, config: Path):
    return hamq_cli("admin", "container", "add-broker", "--container", container, "-c", str(config))


def ask(raw_conn, address: str, code: int, ext: dict | None = None, body: bytes = b""):
    conn = raw_conn(address)
    conn.send(encode_frame_bytes(code, 1, ext=ext or {}, body=body))
    return conn.read_frame()


@pytest.fixture
def namesrv_cluster(cluster_factory) -> Cluster:
    c = cluster_factory()
    c.start_namesrv()
    return c


def test_a_container_without_store_root_takes_no_member_at_runtime(namesrv_cluster, hamq_cli):
    """ADD_BROKER has no authentication: by default nobody may add a member over the wire
    (its store_dir could be anywhere the process may write)."""
    c = namesrv_cluster
    proc, container = start_container(c, "container", [c.write_broker_config("a")])
    outside = c.root / "outside"
    b = c.write_broker_config("b", broker_name="broker-b", store_dir=str(outside))
    refused = add_broker(hamq_cli, container, b)
    assert refused.returncode == 1
    assert "this container takes no members at runtime: set store_root" in refused.stderr
    assert not outside.exists()
    assert proc.alive()


def test_a_runtime_member_writes_only_inside_store_root(namesrv_cluster, hamq_cli, tmp_path):
    c = namesrv_cluster
    stores = c.root / "stores"
    a = c.write_broker_config("a", store_dir=str(stores / "a"))
    proc, container = start_container(c, "container", [a], store_root=str(stores))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "lock").write_text("not hamq's")  # a file a stranger would have truncated
    (stores / "link").symlink_to(elsewhere)

    def refused(name: str, store_dir: str, expected: str) -> None:
        cfg = c.write_broker_config(name, broker_name="broker-b", store_dir=store_dir)
        result = add_broker(hamq_cli, container, cfg)
        assert result.returncode == 1, result.stdout
        assert expected in result.stderr, result.stderr

    refused("out", str(elsewhere), "is not inside the container's store_root")
    refused("via_link", str(stores / "link"), "is not inside the container's store_root")
    refused("up", str(stores / ".." / "up"), "is not inside the container's store_root")
    refused("root", str(stores), "is not inside the container's store_root")
    # inside the root, but among member a's files, or a's store spelled another way
    refused("nested", str(stores / "a" / "commitlog"), "overlaps the store of member broker-a")
    refused("same", str(stores / "a" / "."), "is already the store of member broker-a")
    assert (elsewhere / "lock").read_text() == "not hamq's"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["lock"]
    assert not (c.root / "up").exists()
    assert not (stores / "a" / "commitlog" / "lock").exists()

    fine = c.write_broker_config("fine", broker_name="broker-b", store_dir=str(stores / "b"))
    added = add_broker(hamq_cli, container, fine)
    assert added.returncode == 0, added.stderr
    create_topic(c.namesrv, "Confined", 2, {"broker-a", "broker-b"})
    assert produce_and_consume(c.namesrv, "Confined") == {"broker-a", "broker-b"}
    assert proc.alive()


def test_configured_members_with_overlapping_stores_are_refused(namesrv_cluster, hamq_cli):
    c = namesrv_cluster
    a = c.write_broker_config("a")
    inner = c.write_broker_config(
        "inner", broker_name="broker-b", store_dir=str(c.root / "a" / "consumequeue")
    )
    cfg = write_container(c, "container", [a, inner])
    result = hamq_cli("container", "-c", str(cfg), timeout=60)
    assert result.returncode == 2, result.stderr
    assert "overlaps the store of member broker-a id 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_member_whose_store_cannot_be_opened_lets_go_of_it(namesrv_cluster, hamq_cli):
    """Recovery fails on a broken store (a directory where its topic table belongs): the
    member is refused, and once the operator repaired the store it can be added (before,
    the failed member kept the store's lock for the container's life)."""
    c = namesrv_cluster
    a = c.write_broker_config("a")
    proc, container = start_container(c, "container", [a], store_root=str(c.root))
    broken = c.root / "b" / "topics.json"
    broken.mkdir(parents=True)
    b = c.write_broker_config("b", broker_name="broker-b")
    refused = add_broker(hamq_cli, container, b)
    assert refused.returncode == 1
    assert f"cannot open its store {c.root / 'b'}" in refused.stderr, refused.stderr
    assert "Is a directory" in refused.stderr
    broken.rmdir()
    added = add_broker(hamq_cli, container, b)
    assert added.returncode == 0, added.stderr
    create_topic(c.namesrv, "Repaired", 2, {"broker-a", "broker-b"})
    assert produce_and_consume(c.namesrv, "Repaired") == {"broker-a", "broker-b"}
    assert proc.alive()


def test_unknown_codes_on_the_container_port_are_not_supported(namesrv_cluster, raw_conn):
    c = namesrv_cluster
    _, container = start_container(c, "container", [c.write_broker_config("a")])
    answer = ask(raw_conn, container, RequestCode.SEND_MESSAGE, {"topic": "T"})
    assert answer.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED, answer
    answer = ask(raw_conn, container, RequestCode.ADD_BROKER, body=pack_body({7: "x"}))
    assert answer.code == ResponseCode.INVALID_ARGUMENT, answer
    assert "map of broker settings (names to values)" in answer.remark
