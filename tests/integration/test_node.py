"""Nodes against real processes: a name server with an embedded controller and two
containers that are nodes (``node_name``). Nodes register and heartbeat the members they
host; ADD_BROKER with port 0 starts a member on ports the container picks; REMOVE_BROKER
keeps the store unless asked; an exclusive topic declared through a node goes when its
connection closes; the same topic name in two vhosts holds two sets of messages; a killed
node is reported dead. One cluster for the module: the tests run in order."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

import hamq
from hamq import Message
from hamq.cli.admin import _container_request
from hamq.client.consumer import PullStatus
from hamq.client.controller import ControllerClient
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import pack_body
from harness import Cluster
from helpers import accepts, wait_for

sys.path.insert(0, str(Path(__file__).parent))
from test_placement_driver import start_nodes

NODES = ("hamq@n1", "hamq@n2")
CLUSTER = "node-test"  # not the placement driver's cluster: these groups are the test's own
WAIT_S = 30.0


@pytest.fixture(scope="module")
def node_cluster(tmp_path_factory):
    """The cluster, the controller's address and each node's container address."""
    c = Cluster(tmp_path_factory.mktemp("nodes"))
    try:
        controller, containers = start_nodes(
            c, NODES, node_heartbeat_timeout_ms=1500, controller_heartbeat_timeout_ms=2000
        )
        yield c, controller, containers
    finally:
        c.stop_all()


def controller_says(controller: str, method: str, *args):
    """``ControllerClient.<method>(*args)``'s answer."""

    async def run():
        client = ControllerClient(controller)
        try:
            return await getattr(client, method)(*args)
        finally:
            await client.close()

    return asyncio.run(run())


def nodes_seen(controller: str) -> dict[str, dict]:
    return {n["node"]: n for n in controller_says(controller, "list_nodes")}


def container(addr: str, code: int, ext: dict | None = None, body: bytes = b"") -> dict:
    return asyncio.run(_container_request(addr, code, ext or {}, body))


def add_member(addr: str, group: str, **settings) -> dict:
    """A member of ``group`` on the node (listen and store left to the container unless
    given); the member's entry in the answer."""
    values = {"broker_name": group, "cluster_name": CLUSTER, **settings}
    answer = container(addr, RequestCode.ADD_BROKER, body=pack_body(values))
    return next(m for m in answer["members"] if m["broker_name"] == group)


def in_controller_mode(controller: str) -> dict:
    return {"enable_controller_mode": True, "controller_addr": [controller]}


def test_nodes_register_and_are_alive(node_cluster):
    c, controller, containers = node_cluster

    def both_alive():
        seen = nodes_seen(controller)
        return all(seen.get(n, {}).get("alive") for n in NODES) and seen

    seen = wait_for(both_alive, WAIT_S, "both nodes registered and alive")
    assert {n: seen[n]["address"] for n in NODES} == containers
    assert [c.procs[f"n{i}"].ready["node"] for i in (1, 2)] == list(NODES)  # its ready line


def test_add_broker_with_port_zero_starts_a_member_on_real_ports(node_cluster):
    c, controller, containers = node_cluster
    n1 = containers[NODES[0]]
    member = add_member(
        n1,
        "solo-a",
        listen="127.0.0.1:0",
        ha_listen="127.0.0.1:0",
        **in_controller_mode(controller),
    )
    ports = [int(member[key].rpartition(":")[2]) for key in ("listen", "ha_listen")]
    assert all(ports) and ports[0] != ports[1]
    assert accepts(member["listen"])
    # the store the container chose: <store_root>/<group>
    assert (c.root / "n1" / "solo-a" / "broker_metadata.json").exists()

    def hosted():
        listed = nodes_seen(controller)[NODES[0]]["members"]
        return [m for m in listed if m["broker_name"] == "solo-a"]

    (listed,) = wait_for(hosted, WAIT_S, "node n1's heartbeat lists solo-a")
    # its id is the controller's, and the controller knows it at its real address
    assert (listed["broker_id"], listed["address"]) == (member["broker_id"], member["listen"])
    (group,) = controller_says(controller, "sync_state_data", ["solo-a"])
    assert member["broker_id"] in {m["broker_id"] for m in group["members"]}
    with hamq.Admin(c.namesrv) as admin:
        masters = wait_for(lambda: admin.master_addrs(CLUSTER), WAIT_S, "solo-a elected")
    assert masters == {"solo-a": member["listen"]} and accepts(member["ha_listen"])


def test_same_topic_name_in_two_vhosts_holds_different_messages(node_cluster):
    c, _, containers = node_cluster
    add_member(containers[NODES[1]], "plain-b", cluster_name="vhost-test")  # a plain master
    for vhost in ("/", "v1"):
        with hamq.Admin(c.namesrv, vhost=vhost) as admin:
            admin.create_topic("shared", queue_nums=2, cluster="vhost-test")
    sent = {}
    for vhost in ("/", "v1"):
        with hamq.Producer(c.namesrv, vhost=vhost) as producer:
            sent[vhost] = {f"{vhost}-{i}".encode() for i in range(10)}
            queues = {producer.send(Message("shared", body)).queue.topic for body in sent[vhost]}
            assert queues == {"shared"}  # the user's name, not the wire one
    for vhost in ("/", "v1"):
        got, topics = set(), set()
        with hamq.PullConsumer("g-vhost", c.namesrv, vhost=vhost) as consumer:
            for mq in consumer.fetch_message_queues("shared"):
                result = consumer.pull(mq, 0, 100)
                if result.status is PullStatus.FOUND:
                    got |= {m.body for m in result.messages}
                    topics |= {m.topic for m in result.messages}
        assert (got, topics) == (sent[vhost], {"shared"})
    with hamq.Admin(c.namesrv, vhost="v1") as admin:
        assert "shared" in admin.topic_list()


def test_exclusive_topic_goes_when_its_connection_closes(node_cluster):
    _, controller, containers = node_cluster
    n1 = containers[NODES[0]]

    def declared() -> dict[str, dict]:
        return {t["name"]: t for t in controller_says(controller, "list_topics", "/")}

    with hamq.Admin("127.0.0.1:9") as admin:  # no name server asked: the node only
        assert not admin.declare_topic(n1, "kept").exclusive
        with admin.declare_topic(n1, "mine", exclusive=True) as handle:
            assert handle.answer["home_node"] == NODES[0]
            mine = declared()["mine"]
            assert (mine["exclusive"], mine["home_node"]) == (True, NODES[0]) and mine["owner"]
    wait_for(lambda: "mine" not in declared(), WAIT_S, "the exclusive topic deleted")
    assert declared()["kept"]["home_node"] == NODES[0]  # a durable one stays


def test_remove_broker_keeps_the_store_unless_asked(node_cluster):
    c, controller, containers = node_cluster
    n1, n2 = (containers[n] for n in NODES)
    member = add_member(n2, "solo-b", **in_controller_mode(controller))
    assert not member["listen"].endswith(":0") and (c.root / "n2" / "solo-b").is_dir()
    ext = {"broker_name": "solo-b", "broker_id": member["broker_id"], "delete_store": True}
    after = container(n2, RequestCode.REMOVE_BROKER, ext)["members"]
    assert [m["broker_name"] for m in after] == ["plain-b"]
    assert not (c.root / "n2" / "solo-b").exists()
    (solo_a,) = (
        m for m in nodes_seen(controller)[NODES[0]]["members"] if m["broker_name"] == "solo-a"
    )
    ext = {"broker_name": "solo-a", "broker_id": solo_a["broker_id"]}
    assert all(
        m["broker_name"] != "solo-a"
        for m in container(n1, RequestCode.REMOVE_BROKER, ext)["members"]
    )
    assert (c.root / "n1" / "solo-a" / "broker_metadata.json").exists()
    assert not accepts(solo_a["address"])


def test_a_node_rejoins_a_group_that_gave_its_stored_id_to_another_member(node_cluster):
    """A node back with the store of a member that was cleaned away while it was down,
    whose id the controller has since given to another member: it joins under a new id
    (the id on disk was refused for good, and the group could never be placed there)."""
    c, controller, containers = node_cluster
    n1, n2 = (containers[n] for n in NODES)
    mode = in_controller_mode(controller)
    assert add_member(n1, "stale", **mode)["broker_id"] == 1
    old = add_member(n2, "stale", **mode)["broker_id"]
    container(n2, RequestCode.REMOVE_BROKER, {"broker_name": "stale", "broker_id": old})
    controller_says(controller, "clean_broker_data", CLUSTER, "stale", [old], True)
    # the id goes to another member (elsewhere on n2's disk), alive or not
    other = add_member(n2, "stale", store_dir=str(c.root / "n2" / "other"), **mode)
    assert other["broker_id"] == old
    ext = {"broker_name": "stale", "broker_id": old, "delete_store": True}
    container(n2, RequestCode.REMOVE_BROKER, ext)
    rejoined = add_member(n2, "stale", **mode)  # <store_root>/stale: the stale store
    assert rejoined["broker_id"] not in (1, old)
    (group,) = controller_says(controller, "sync_state_data", ["stale"])
    assert rejoined["broker_id"] in {m["broker_id"] for m in group["members"]}


def test_a_killed_node_is_reported_not_alive(node_cluster):
    c, controller, _ = node_cluster
    c.procs["n2"].kill9()
    wait_for(lambda: not nodes_seen(controller)[NODES[1]]["alive"], WAIT_S, "n2 reported dead")
    assert nodes_seen(controller)[NODES[0]]["alive"]


def test_a_restarted_node_starts_its_placed_members_again(node_cluster):
    """A node killed and started again comes back with the members ADD_BROKER put in the
    stores it gave them (the rejoined member of ``stale`` from above, same id), not the
    ones removed on purpose (``solo-b``, store deleted; ``solo-a``, store kept)."""
    c, controller, _ = node_cluster
    stored = json.loads((c.root / "n2" / "stale" / "broker_metadata.json").read_text())
    rejoined = stored["broker_id"]
    c.restart("n2")

    def back():
        seen = nodes_seen(controller)[NODES[1]]
        listed = {(m["broker_name"], m["broker_id"]) for m in seen["members"]}
        return seen["alive"] and ("stale", rejoined) in listed and listed

    listed = wait_for(back, WAIT_S, "n2 back with its placed member")
    assert not {"solo-a", "solo-b", "plain-b"} & {name for name, _ in listed}
