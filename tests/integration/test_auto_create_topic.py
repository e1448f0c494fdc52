"""A producer's first sends to a topic nobody created, through auto-create
(auto_create_topic_enable; RocketMQ's TBW102 template route): each is stored and answered
within its send timeout, on a broker of its own and on a container member (seed 004).
Once, the producer looked the route up again before every attempt and never sent."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import hamq
from hamq import Message
from hamq.client.message import SendStatus
from hamq.client.producer import AsyncProducer
from hamq.errors import TopicNotExist
from hamq.namesrv.routes import AUTO_CREATE_TOPIC_KEY_TOPIC
from helpers import wait_for

sys.path.insert(0, str(Path(__file__).parent))  # sibling test modules, as tests/chaos does
from test_container import start_container

SEND_TIMEOUT_S = 3.0
# every attempt (the first and retry_times_when_send_failed=2 more) within the send timeout
SEND_BOUND_S = 3 * SEND_TIMEOUT_S + 5
WAIT_S = 20


def routed(namesrv: str, topic: str) -> bool:
    with hamq.Admin(namesrv) as admin:
        try:
            return bool(admin.topic_route(topic).write_queues)
        except TopicNotExist:
            return False


async def send_all(namesrv: str, topics: list[str]) -> list[hamq.SendResult]:
    producer = AsyncProducer(namesrv, send_timeout_s=SEND_TIMEOUT_S)
    try:
        return [
            await asyncio.wait_for(producer.send(Message(t, t.encode())), SEND_BOUND_S)
            for t in topics
        ]
    finally:
        await producer.close()


def sends_to_new_topics(namesrv: str, drain_topic) -> set[str]:
    """Two sends to each of two never-created topics (the second after the template route
    was marked for a new lookup) are stored and read back; the groups that stored them."""
    wait_for(lambda: routed(namesrv, AUTO_CREATE_TOPIC_KEY_TOPIC), WAIT_S, "the TBW102 route")
    topics = ["NeverCreated1", "NeverCreated1", "NeverCreated2", "NeverCreated2"]
    results = asyncio.run(send_all(namesrv, topics))
    assert [r.status for r in results] == [SendStatus.SEND_OK] * len(topics)
    for topic in set(topics):
        wait_for(lambda t=topic: routed(namesrv, t), WAIT_S, f"the route of {topic}")
        bodies = [b for queue in drain_topic(namesrv, topic).values() for _, b in queue]
        assert bodies == [topic.encode()] * 2
    return {r.queue.broker_name for r in results}


def test_a_broker_auto_creates_the_topic_of_a_first_send(cluster_factory, drain_topic):
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(auto_create_topic_enable=True)
    assert sends_to_new_topics(c.namesrv, drain_topic) == {"broker-a"}


def test_a_container_member_auto_creates_beside_one_that_does_not(cluster_factory, drain_topic):
    """Only broker-a publishes TBW102, so the new topics live there alone; both members
    may act as master (seed 004), which changes nothing for their masters."""
    c = cluster_factory()
    c.start_namesrv()
    a = c.write_broker_config(
        "a", broker_name="broker-a", auto_create_topic_enable=True, enable_slave_acting_master=True
    )
    b = c.write_broker_config("b", broker_name="broker-b", enable_slave_acting_master=True)
    start_container(c, "container", [a, b])
    assert sends_to_new_topics(c.namesrv, drain_topic) == {"broker-a"}
