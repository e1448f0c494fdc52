"""EscapeBridge's choice of target (seed 004): a master of another group of the same
cluster, in this process first, with the topic writable; over the network only queues of
other groups with a master; no target at all is a clear error and puts nothing."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from hamq.broker.escape import EscapeBridge, local_targets, remote_queues
from hamq.broker.server import Broker
from hamq.broker.stored_message import read_messages
from hamq.broker.topics import TopicService
from hamq.client.core import TopicRoute
from hamq.config import BrokerConfig
from hamq.errors import ServiceNotAvailable
from hamq.protocol.message import encode_message, encode_properties
from hamq.store.metadata import PERM_READ, PERM_READ_WRITE

TOPIC = "EscT"


def member(tmp_path, name: str, broker_id: int = 0, cluster: str = "C", **settings) -> Broker:
    """A broker as a container holds it (not started: its store and send path only)."""
    config = BrokerConfig(
        cluster_name=cluster,
        broker_name=name,
        broker_id=broker_id,
        broker_role="slave" if broker_id else "async_master",
        store_dir=str(tmp_path / f"{cluster}-{name}-{broker_id}"),
        **settings,
    )
    return Broker(config)


def with_topic(broker: Broker, perm: int = PERM_READ_WRITE) -> Broker:
    # installed as slave sync installs its master's topics (a slave creates none)
    broker.topics.install(TopicService.build(TOPIC, 2, 2, perm), notify=False)
    return broker


def names(brokers) -> list[tuple[str, int]]:
    return [(b.config.broker_name, b.role.broker_id) for b in brokers]


def test_local_targets_are_masters_of_other_groups_with_the_topic(tmp_path):
    own = with_topic(member(tmp_path, "a", 1))
    b = with_topic(member(tmp_path, "b"))
    siblings = [
        own,
        with_topic(member(tmp_path, "a")),  # own group's master: not another group
        b,
        with_topic(member(tmp_path, "c", 1)),  # a slave
        member(tmp_path, "d"),  # no such topic
        with_topic(member(tmp_path, "e"), PERM_READ),  # read-only topic
        with_topic(member(tmp_path, "f", cluster="other")),  # another cluster
    ]
    assert names(local_targets(siblings, "C", "a", TOPIC, None)) == [("b", 0)]
    assert names(local_targets(siblings, "C", "a", TOPIC, "b")) == [("b", 0)]
    assert local_targets(siblings, "C", "a", TOPIC, "c") == []
    for broker in siblings:
        broker.store.close()


def test_remote_queues_are_other_groups_with_a_writable_master():
    wire = {
        "broker_datas": [
            {"broker_name": "a", "broker_addrs": {"0": "h:1"}},  # own group (acting)
            {"broker_name": "b", "broker_addrs": {"0": "h:2", "1": "h:3"}},
            {"broker_name": "c", "broker_addrs": {"1": "h:4"}},  # no master
            {"broker_name": "d", "broker_addrs": {"0": "h:5"}},
        ],
        "queue_datas": [
            {"broker_name": n, "perm": p, "read_queue_nums": 2, "write_queue_nums": 2}
            for n, p in (("a", PERM_READ), ("b", PERM_READ_WRITE), ("c", 6), ("d", 6))
        ],
    }
    route = TopicRoute.from_wire(TOPIC, wire)
    assert {(q.broker_name, q.queue_id) for q in remote_queues(route, "a", None)} == {
        ("b", 0),
        ("b", 1),
        ("d", 0),
        ("d", 1),
    }
    assert {q.broker_name for q in remote_queues(route, "d", None)} == {"b"}
    assert {q.broker_name for q in remote_queues(route, "a", "d")} == {"d"}
    assert remote_queues(route, "a", "c") == []


def test_local_put_goes_through_the_sibling_and_no_target_is_an_error(tmp_path):
    own = with_topic(member(tmp_path, "a", 1))
    b = with_topic(member(tmp_path, "b"))
    asyncio.run(asyncio.wait_for(put_locally(own, b), 10))
    for broker in (own, b):
        broker.store.close()


async def put_locally(own: Broker, b: Broker) -> None:
    payload = encode_message(b"body", encode_properties({"KEYS": "k"}))
    bridge = EscapeBridge(own.config, lambda: [own, b])
    result = await bridge.put(TOPIC, payload * 3, count=3)
    assert (result.broker_name, result.local, result.queue_offset) == ("b", True, 0)
    stored = read_messages(b.store, TOPIC, result.queue_id, 0, 10)
    assert [(m.body, m.properties["KEYS"]) for m in stored] == [(b"body", "k")] * 3
    assert own.store.commitlog.max_offset == 0

    lonely = EscapeBridge(own.config, lambda: [own])  # remote escape off: nowhere to go
    with pytest.raises(ServiceNotAvailable, match="enable_remote_escape"):
        await lonely.put(TOPIC, payload)
    await asyncio.gather(bridge.close(), lonely.close())


def test_an_unexpected_error_in_an_escape_is_retried_not_the_end_of_its_level(tmp_path):
    """A bug raising something other than a HamqError (a malformed answer, say) ended the
    level's escape task: its due messages stayed undelivered until acting restarted."""
    own = with_topic(member(tmp_path, "a", 1))
    b = with_topic(member(tmp_path, "b"))
    asyncio.run(asyncio.wait_for(escape_past_a_bug(own, b), 10))
    for broker in (own, b):
        broker.store.close()


async def escape_past_a_bug(own: Broker, b: Broker) -> None:
    schedule = own.schedule
    bridge = EscapeBridge(own.config, lambda: [own, b])
    puts = 0

    async def failing_once(*args, **kwargs):
        nonlocal puts
        puts += 1
        if puts == 1:
            raise KeyError("queue_offset")
        return await EscapeBridge.put(bridge, *args, **kwargs)

    bridge.put = failing_once  # type: ignore[method-assign]
    schedule.escape = bridge
    acknowledged = asyncio.Event()
    payload = encode_message(b"due", encode_properties({"KEYS": "k"}))
    schedule._escapes[3] = deque([([(TOPIC, payload)], acknowledged.set)])
    await schedule._escape_all(3)
    assert acknowledged.is_set() and puts == 2
    assert [m.body for m in read_messages(b.store, TOPIC, 0, 0, 10)] + [
        m.body for m in read_messages(b.store, TOPIC, 1, 0, 10)
    ] == [b"due"]
    await bridge.close()
