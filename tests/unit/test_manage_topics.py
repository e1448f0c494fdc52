"""Which node a topic is declared through (``hamq admin declare-topic`` and ``PUT
/api/topics`` both ask ``declaring_node``)."""

from __future__ import annotations

import pytest

from hamq.errors import InvalidArgument, ServiceNotAvailable
from hamq.manage.topics import declaring_node

NODES = [
    {"node": "hamq@node3", "address": "127.0.0.1:3", "alive": True},
    {"node": "hamq@node1", "address": "127.0.0.1:1", "alive": False},
    {"node": "hamq@node2", "address": "127.0.0.1:2", "alive": True},
]


def test_default_is_the_first_alive_node_by_name():
    assert declaring_node(NODES, None)["node"] == "hamq@node2"
    assert declaring_node(NODES, "hamq@node3")["address"] == "127.0.0.1:3"


def test_a_named_node_must_exist_and_be_alive():
    with pytest.raises(InvalidArgument, match=r"no node named 'hamq@x' \(nodes: hamq@node1, "):
        declaring_node(NODES, "hamq@x")
    with pytest.raises(ServiceNotAvailable, match="node hamq@node1 is not alive"):
        declaring_node(NODES, "hamq@node1")
    with pytest.raises(ServiceNotAvailable, match="no node is alive"):
        declaring_node([n for n in NODES if not n["alive"]], None)
