"""The placement driver against real processes: a controller embedded in a name server and
three containers that are nodes. A policy puts a topic in its group with members on as
many nodes as it asks; another topic under the policy joins that group; clearing the
policy moves the topic home (new writes there, the old queues read-only until drained,
then dropped). One cluster for the module: the tests run in order, each from where the
previous one left it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import hamq
from hamq import Message
from hamq.client.controller import ControllerClient
from hamq.client.core import TopicRoute
from hamq.errors import HamqError, TopicNotExist
from hamq.policy.placement import group_for_node, group_for_policy
from harness import Cluster
from helpers import free_port, wait_for

sys.path.insert(0, str(Path(__file__).parent))
from test_container import start_container

NODES = ("hamq@node1", "hamq@node2", "hamq@node3")
POLICY = "two"
GROUP = group_for_policy("/", POLICY)
FIRST, SECOND = "mirrored.one", "mirrored.two"
CONSUMER = "g-placement"
WAIT_S = 40.0  # members started, registered, elected; routes registered


def start_nodes(c: Cluster, nodes: tuple[str, ...], **controller) -> tuple[str, dict[str, str]]:
    """A name server embedding the controller (``controller`` settings), then a container
    per node name, each with a store root for the members added to it; the controller's
    address and each node's container address."""
    addr = f"127.0.0.1:{free_port()}"
    c.start_embedded_controller("namesrv", addr, **controller)
    containers = {}
    for node in nodes:
        name = node.split("@", 1)[1]
        (c.root / name).mkdir()
        _, containers[node] = start_container(
            c,
            name,
            [],
            node_name=node,
            controller_addr=[addr],
            store_root=str(c.root / name),
            node_heartbeat_interval_ms=300,
        )
    return addr, containers


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """The cluster, the controller's address, and the nodes' container addresses."""
    c = Cluster(tmp_path_factory.mktemp("placement"))
    try:
        controller, containers = start_nodes(
            c,
            NODES,
            placement_interval_ms=300,
            node_heartbeat_timeout_ms=2000,
            controller_heartbeat_timeout_ms=2000,
        )

        def registered() -> bool:
            try:
                listed = ask(controller, lambda client: client.list_nodes())
            except HamqError:  # no leader yet
                return False
            return {n["node"] for n in listed if n["alive"]} == set(NODES)

        # declarations name a home node, which the controller takes only once registered
        wait_for(registered, WAIT_S, "every node registered and alive")
        yield c, controller, containers
    finally:
        c.stop_all()


def ask(controller: str, call: Callable[[ControllerClient], Awaitable[Any]]) -> Any:
    async def run() -> Any:
        client = ControllerClient(controller)
        try:
            return await call(client)
        finally:
            await client.close()

    return asyncio.run(run())


def route(namesrv: str, topic: str) -> TopicRoute | None:
    with hamq.Admin(namesrv) as admin:
        try:
            return admin.topic_route(topic)
        except TopicNotExist:
            return None


def groups_of(namesrv: str, topic: str) -> tuple[set[str], set[str]]:
    """(groups with writable queues, groups with readable queues) of the topic's route."""
    r = route(namesrv, topic)
    if r is None:
        return set(), set()
    return {q.broker_name for q in r.write_queues}, {q.broker_name for q in r.read_queues}


def hosting_nodes(controller: str, group: str) -> set[str]:
    """The nodes whose heartbeat lists a member of ``group``."""
    listed = ask(controller, lambda client: client.list_nodes())
    return {
        n["node"] for n in listed for m in n["members"] if m["broker_name"] == group and n["alive"]
    }


def placed_in(controller: str, topic: str) -> str | None:
    placement = ask(controller, lambda client: client.get_placement())
    return next((t["group"] for t in placement["topics"] if t["topic"] == topic), None)


def declared(controller: str) -> set[str]:
    return {t["name"] for t in ask(controller, lambda client: client.list_topics())}


def send(namesrv: str, topic: str, count: int) -> set[str]:
    """The groups that stored the messages."""
    with hamq.Producer(namesrv) as producer:
        return {
            producer.send(Message(topic, f"m{i}".encode())).queue.broker_name for i in range(count)
        }


def consume_all(namesrv: str, topic: str, group: str) -> int:
    """Pull every queue of ``group`` to its end and commit there; how many were pulled."""
    pulled = 0
    with hamq.PullConsumer(CONSUMER, namesrv) as consumer:
        for mq in consumer.fetch_message_queues(topic):
            if mq.broker_name != group:
                continue
            offset = consumer.fetch_offset(mq) or consumer.min_offset(mq)
            while (result := consumer.pull(mq, offset, 100)).messages:
                pulled += len(result.messages)
                offset = result.next_begin_offset
            consumer.commit_offset(mq, offset)
    return pulled


def test_a_policy_of_exactly_two_puts_the_topic_in_one_group_on_two_nodes(nodes) -> None:
    c, controller, _ = nodes
    namesrv = c.namesrv
    definition = {"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic"}
    ask(controller, lambda c: c.set_policy("/", POLICY, r"^mirrored\.", definition))
    ask(controller, lambda c: c.declare_topic("/", FIRST, NODES[0]))

    wait_for(lambda: placed_in(controller, FIRST) == GROUP, WAIT_S, f"{FIRST} placed in {GROUP}")
    wait_for(lambda: len(hosting_nodes(controller, GROUP)) == 2, WAIT_S, f"{GROUP} on two nodes")
    wait_for(lambda: groups_of(namesrv, FIRST)[0] == {GROUP}, WAIT_S, f"{FIRST} routed to {GROUP}")
    assert send(namesrv, FIRST, 10) == {GROUP}
    assert consume_all(namesrv, FIRST, GROUP) == 10


def test_a_second_topic_under_the_policy_joins_its_group(nodes) -> None:
    c, controller, _ = nodes
    namesrv = c.namesrv
    ask(controller, lambda c: c.declare_topic("/", SECOND, NODES[1]))

    wait_for(lambda: groups_of(namesrv, SECOND)[0] == {GROUP}, WAIT_S, f"{SECOND} in {GROUP}")
    assert placed_in(controller, SECOND) == GROUP
    placement = ask(controller, lambda c: c.get_placement())
    assert [g["name"] for g in placement["groups"] if g["policy"] is not None] == [GROUP]
    assert len(hosting_nodes(controller, GROUP)) == 2


def test_clearing_the_policy_moves_the_topic_home_and_drops_it_once_drained(nodes) -> None:
    c, controller, _ = nodes
    namesrv = c.namesrv
    home = group_for_node(NODES[0])
    assert send(namesrv, FIRST, 5) == {GROUP}  # left unconsumed: the old placement drains
    ask(controller, lambda c: c.clear_policy("/", POLICY))

    # new writes go home; the old queues stay readable, not writable
    wait_for(lambda: groups_of(namesrv, FIRST) == ({home}, {home, GROUP}), WAIT_S, "moved home")
    assert send(namesrv, FIRST, 5) == {home}
    assert placed_in(controller, FIRST) == home
    assert consume_all(namesrv, FIRST, GROUP) == 5  # what was left behind is still served

    wait_for(lambda: groups_of(namesrv, FIRST) == ({home}, {home}), WAIT_S, "old placement dropped")
    second_home = group_for_node(NODES[1])  # never written: empty, dropped at once
    wait_for(
        lambda: groups_of(namesrv, SECOND) == ({second_home}, {second_home}),
        WAIT_S,
        f"{SECOND} home",
    )


def test_topics_deleted_through_the_controller_or_ownerless_leave_the_brokers(nodes) -> None:
    """DELETE_TOPIC changes only the controller's state: the driver takes the topic out of
    its group. An exclusive topic whose owner its alive node does not list (its
    connection gone without the delete reaching the controller) is deleted after a
    grace; one whose declaring connection is open stays."""
    c, controller, containers = nodes
    node, gone, ghost, held = NODES[1], "gone.one", "ghost.one", "held.one"
    home = group_for_node(node)
    ask(controller, lambda cl: cl.declare_topic("/", gone, node))
    wait_for(lambda: groups_of(c.namesrv, gone)[0] == {home}, WAIT_S, f"{gone} routed home")
    with (
        hamq.Admin("127.0.0.1:9") as admin,
        admin.declare_topic(containers[node], held, exclusive=True),
    ):
        owner = f"{node}/closed/1"
        ask(controller, lambda cl: cl.declare_topic("/", ghost, node, exclusive=True, owner=owner))
        ask(controller, lambda cl: cl.delete_topic("/", gone))
        wait_for(lambda: route(c.namesrv, gone) is None, WAIT_S, f"{gone} out of {home}")
        wait_for(lambda: ghost not in declared(controller), WAIT_S, f"{ghost} deleted")
        assert held in declared(controller)  # listed by its node all along
    wait_for(lambda: held not in declared(controller), WAIT_S, f"{held} deleted on close")


def test_an_exclusive_topic_goes_with_its_home_node(nodes) -> None:
    c, controller, containers = nodes
    node, topic = NODES[2], "exclusive.one"
    home = group_for_node(node)
    with (
        hamq.Admin("127.0.0.1:9") as admin,
        admin.declare_topic(containers[node], topic, exclusive=True),
    ):
        wait_for(lambda: groups_of(c.namesrv, topic)[0] == {home}, WAIT_S, f"{topic} routed home")
        c.procs[node.split("@", 1)[1]].kill9()
        wait_for(
            lambda: topic not in declared(controller), WAIT_S, f"{topic} deleted with its node"
        )
    assert {FIRST, SECOND} <= declared(controller)
