"""What a node's container makes of its requests before anything starts: ADD_BROKER
settings with port 0 or no listen / store (the placement driver sends those), and
DECLARE_TOPIC fields, each bad one refused naming the field."""

from __future__ import annotations

import socket

import pytest

from hamq.broker.container import fill_member, pick_ports
from hamq.broker.node import DEFAULT_QUEUE_NUMS, Declare
from hamq.config import ContainerConfig
from hamq.errors import ConfigError, InvalidArgument
from hamq.protocol.limits import MAX_QUEUE_NUMS


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def test_port_zero_gets_distinct_free_ports():
    picked = pick_ports({"broker_name": "g", "listen": "127.0.0.1:0", "ha_listen": "127.0.0.1:0"})
    ports = {port_of(picked["listen"]), port_of(picked["ha_listen"])}
    assert len(ports) == 2 and 0 not in ports
    for port in ports:  # free: the picking let go of them
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    assert picked["broker_name"] == "g"


def test_listen_port_zero_without_ha_listen_picks_both():
    """listen + 1, the default HA port, need not be free next to a picked port."""
    picked = pick_ports({"listen": "127.0.0.1:0"})
    assert picked["ha_listen"].startswith("127.0.0.1:") and port_of(picked["ha_listen"]) != 0
    assert picked["ha_listen"] != picked["listen"]


def test_given_ports_are_kept():
    values = {"listen": "127.0.0.1:10911", "ha_listen": "127.0.0.1:0"}
    picked = pick_ports(values)
    assert picked["listen"] == "127.0.0.1:10911" and port_of(picked["ha_listen"]) != 0
    assert pick_ports({"listen": "127.0.0.1:10911"}) == {"listen": "127.0.0.1:10911"}


def test_a_host_with_no_free_port_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="listen"):
        pick_ports({"listen": "192.0.2.1:0"})  # TEST-NET-1: no such address here


def test_the_container_fills_listen_and_store(tmp_path):
    container = ContainerConfig(store_root=str(tmp_path), member_host="127.0.0.1")
    filled = fill_member({"broker_name": "hamq.g1"}, container)
    assert filled == {
        "broker_name": "hamq.g1",
        "listen": "127.0.0.1:0",
        "store_dir": str(tmp_path / "hamq.g1"),
    }
    given = {"broker_name": "g", "listen": "127.0.0.1:7000", "store_dir": "/elsewhere"}
    assert fill_member(given, container) == given
    assert "store_dir" not in fill_member({"broker_name": "g"}, ContainerConfig())


def test_declare_fields():
    assert Declare.from_ext({"topic": "orders"}) == Declare(
        "/", "orders", False, DEFAULT_QUEUE_NUMS
    )
    ext = {"vhost": "v1", "topic": "t", "exclusive": True, "queue_nums": 8}
    assert Declare.from_ext(ext) == Declare("v1", "t", True, 8)


@pytest.mark.parametrize(
    ("ext", "field"),
    [
        ({}, "topic"),
        ({"topic": "a/b"}, "topic"),
        ({"topic": "t", "vhost": "a b"}, "vhost"),
        ({"topic": "t", "exclusive": "yes"}, "exclusive"),
        ({"topic": "t", "queue_nums": 0}, "queue_nums"),
        ({"topic": "t", "queue_nums": MAX_QUEUE_NUMS + 1}, "queue_nums"),
    ],
)
def test_bad_declare_is_refused_naming_the_field(ext, field):
    with pytest.raises(InvalidArgument, match=field):
        Declare.from_ext(ext)
