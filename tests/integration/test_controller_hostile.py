"""Hostile input to a real controller peer's catalog (seed 003, codes 1030-1043): a policy
pattern that makes a backtracking engine run for ages, malformed and oversize requests,
another process speaking for a registered node, system topic names. Each is refused or
answered at once, nothing already stored changes, and the peer keeps serving."""

from __future__ import annotations

import asyncio

import pytest

from hamq.client.controller import ControllerClient
from hamq.errors import ConnectionLost, ControllerRefused, HamqError, InvalidArgument
from hamq.protocol.codes import RequestCode
from harness import Cluster
from helpers import free_port

NODE = "hamq@node1"
NODE_ADDR = f"127.0.0.1:{free_port()}"
OTHER_ADDR = f"127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("hostile"))
    addr = f"127.0.0.1:{free_port()}"

    async def ready() -> None:
        client = ControllerClient([addr], timeout_s=20.0)
        try:
            await client.register_node(NODE, NODE_ADDR)
        finally:
            await client.close()

    try:  # stopped also when it never becomes ready
        cluster.start_controller(
            "controller1", addr, controller_election_timeout_ms=300, node_heartbeat_timeout_ms=3000
        )
        asyncio.run(ready())
        yield addr
    finally:
        cluster.stop_all()


def _run(addr: str, scenario) -> None:
    async def main() -> None:
        client = ControllerClient([addr], timeout_s=5.0)
        try:
            await scenario(client)
        finally:
            await client.close()

    asyncio.run(main())


def test_a_backtracking_pattern_does_not_hang_the_leader(controller):
    async def scenario(client: ControllerClient) -> None:
        await client.set_policy("/", "evil", "(a+)+$", {"ha-mode": "all"})
        await client.declare_topic("/", "a" * 100 + "-", NODE)
        # Python's re would take ~2**100 steps here, in LIST_TOPICS and each placement round
        topics = await client.list_topics()
        assert [(t["name"], t["policy"]) for t in topics] == [("a" * 100 + "-", None)]
        await client.clear_policy("/", "evil")
        await client.delete_topic("/", "a" * 100 + "-")

    _run(controller, scenario)


def test_another_address_cannot_speak_for_a_live_node(controller):
    async def beat(client: ControllerClient, addr: str) -> None:
        ext = {"node": NODE, "address": addr, "members": []}
        await client.request(RequestCode.CONTROLLER_NODE_HEARTBEAT, ext)

    async def scenario(client: ControllerClient) -> None:
        await beat(client, NODE_ADDR)
        with pytest.raises(ControllerRefused, match="registered at"):
            await beat(client, OTHER_ADDR)
        with pytest.raises(ControllerRefused, match="is alive at"):
            await client.register_node(NODE, OTHER_ADDR)
        with pytest.raises(ControllerRefused, match="cannot register there too"):
            await client.register_node("hamq@impostor", NODE_ADDR)
        nodes = await client.list_nodes()
        assert [(n["node"], n["address"], n["alive"]) for n in nodes] == [(NODE, NODE_ADDR, True)]

    _run(controller, scenario)


BAD_REQUESTS = [
    (RequestCode.CONTROLLER_ADD_VHOST, {"vhost": "v%x"}),
    (RequestCode.CONTROLLER_ADD_VHOST, {"vhost": "v" * 60_000}),
    (RequestCode.CONTROLLER_DELETE_VHOST, {"vhost": ["/"]}),
    (RequestCode.CONTROLLER_LIST_VHOSTS, None),
    (RequestCode.CONTROLLER_SET_POLICY, {"vhost": "/", "name": "p", "pattern": "(?=a)"}),
    (
        RequestCode.CONTROLLER_SET_POLICY,
        {
            "vhost": "/",
            "name": "p",
            "pattern": "(x{1000}){1000}",
            "definition": {"ha-mode": "all"},
            "priority": 0,
            "apply_to": "topics",
        },
    ),
    (RequestCode.CONTROLLER_CLEAR_POLICY, {"vhost": "/", "name": None}),
    (RequestCode.CONTROLLER_LIST_POLICIES, {"vhost": {"a": 1}}),
    (
        RequestCode.CONTROLLER_DECLARE_TOPIC,
        {"vhost": "/", "topic": "SCHEDULE_TOPIC_XXXX", "home_node": NODE, "exclusive": False}
        | {"queue_nums": 4, "owner": ""},
    ),
    (
        RequestCode.CONTROLLER_DECLARE_TOPIC,
        {"vhost": "nope", "topic": "t", "home_node": NODE, "exclusive": False}
        | {"queue_nums": 4, "owner": ""},
    ),
    (RequestCode.CONTROLLER_DELETE_TOPIC, {"vhost": "/", "topic": "%RETRY%g"}),
    (RequestCode.CONTROLLER_LIST_TOPICS, {"vhost": 7}),
    (RequestCode.CONTROLLER_REGISTER_NODE, {"node": "hamq@x" * 1000, "address": NODE_ADDR}),
    (
        RequestCode.CONTROLLER_NODE_HEARTBEAT,
        {"node": NODE, "address": NODE_ADDR, "members": [{}] * 5000},
    ),
    (RequestCode.CONTROLLER_LIST_NODES, []),
    (RequestCode.CONTROLLER_BROKER_SHUTDOWN, {"broker_id": 2**64 - 1, "epoch": -1}),
    (RequestCode.CONTROLLER_GET_PLACEMENT, {"x": "y"}),
]
# Past the header limit (protocol/limits.py MAX_HEADER_BYTES) a frame cannot be read as a
# request: the peer drops that connection, as for any code, and goes on serving.
OVERSIZE = [
    (RequestCode.CONTROLLER_SET_POLICY, {"vhost": "/", "name": "p" * 70_000}),
    (RequestCode.CONTROLLER_NODE_HEARTBEAT, {"node": NODE, "members": [{}] * 70_000}),
]


def test_malformed_requests_are_refused_and_nothing_changes(controller):
    async def scenario(client: ControllerClient) -> None:
        before = (
            await client.list_vhosts(),
            await client.list_policies(),
            await client.list_topics(),
        )
        for code, ext in BAD_REQUESTS:
            try:
                await client.request(code, ext)
            except (InvalidArgument, ControllerRefused):
                continue
            except HamqError as err:  # anything else (a timeout, a system error) is a defect
                raise AssertionError(f"code {code} {str(ext)[:80]}: {err!r}") from err
            assert code in (
                RequestCode.CONTROLLER_LIST_VHOSTS,
                RequestCode.CONTROLLER_LIST_NODES,
                RequestCode.CONTROLLER_GET_PLACEMENT,
            ), f"code {code} {str(ext)[:80]} was accepted"
        impatient = ControllerClient(client.addrs, timeout_s=0.5)  # it retries until then
        try:
            for code, ext in OVERSIZE:
                with pytest.raises(ConnectionLost):
                    await impatient.request(code, ext)
        finally:
            await impatient.close()
        after = (
            await client.list_vhosts(),
            await client.list_policies(),
            await client.list_topics(),
        )
        assert after == before

    _run(controller, scenario)


def test_a_list_past_what_a_frame_header_holds_still_answers(controller):
    """400 declared topics of long names are ~100 KB of rows, past the 64 KiB a header may
    hold: the answer goes in the body instead of dropping the client's connection."""
    names = [f"{'t' * 100}-{i:04d}" for i in range(400)]

    async def scenario(client: ControllerClient) -> None:
        await asyncio.gather(*(client.declare_topic("/", name, NODE) for name in names))
        assert sorted(t["name"] for t in await client.list_topics()) == names
        assert len(await client.list_vhosts()) == 1  # small answers stay in the header
        await asyncio.gather(*(client.delete_topic("/", name) for name in names))

    _run(controller, scenario)


def test_an_exclusive_topic_is_deleted_only_by_its_connection_or_an_admin(controller):
    async def delete(client: ControllerClient, topic: str, owner: str) -> None:
        ext = {"vhost": "/", "topic": topic, "owner": owner}
        await client.request(RequestCode.CONTROLLER_DELETE_TOPIC, ext)

    async def scenario(client: ControllerClient) -> None:
        await client.declare_topic("/", "mine", NODE, exclusive=True, owner="conn-1")
        await client.declare_topic("/", "mine-too", NODE, exclusive=True, owner="conn-1")
        with pytest.raises(ControllerRefused, match="exclusive to another connection"):
            await delete(client, "mine", "conn-2")
        assert {t["name"] for t in await client.list_topics()} == {"mine", "mine-too"}
        await delete(client, "mine", "conn-1")
        await delete(client, "mine-too", "")  # an admin, or the driver cleaning up
        assert await client.list_topics() == []

    _run(controller, scenario)
