"""What the Spark sink needs from brokers (issue 19, items 4 and 5), against real processes.

A conditional send (``expected_queue_offset``) stores its message only if the queue ends
exactly there, atomically against racing senders, on an async master, a sync master with
its slave and a DLedger leader (where it is decided when the entry is applied)."""

from __future__ import annotations

import asyncio

import pytest

import hamq
from hamq import Message, MessageQueue, SendStatus
from hamq.client.producer import AsyncProducer
from hamq.errors import InvalidArgument, QueueOffsetMismatch
from helpers import free_port, wait_for

TOPIC = "Sink"
GROUP = "broker-a"
ROUNDS = 12
SETTLE_S = 30.0


def _async_master(c) -> None:
    c.start_broker()


def _sync_master(c) -> None:
    c.start_broker(broker_role="sync_master")
    c.start_broker("slave", broker_id=1, broker_role="slave")


def _dledger_leader(c) -> None:
    raft = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    peers = [f"{i + 1}@{addr}" for i, addr in enumerate(raft)]
    for i in range(3):
        c.start_broker(
            f"d{i + 1}", replication_mode="dledger", dledger_self_id=i + 1, dledger_peers=peers
        )


MODES = {"async_master": _async_master, "sync_master": _sync_master, "dledger": _dledger_leader}


def start(cluster_factory, mode: str):
    c = cluster_factory()
    c.start_namesrv()
    MODES[mode](c)
    with hamq.Admin(c.namesrv) as admin:
        wait_for(lambda: admin.master_addrs(), SETTLE_S, "a master registered")
        admin.create_topic(TOPIC, 1)
        wait_for(lambda: admin.topic_route(TOPIC).write_queues, SETTLE_S, "the topic routed")
    return c


async def _race(namesrv: str, rounds: int) -> list[list[object]]:
    """``rounds`` rounds of two producers sending at once, both expecting the offset the
    queue ended at after the previous round; each round's two outcomes."""
    mq = MessageQueue(TOPIC, GROUP, 0)
    producers = [AsyncProducer(namesrv, f"pg-race-{i}") for i in range(2)]
    outcomes = []
    try:
        for p in producers:
            await p.warm_up(TOPIC)
        for n in range(rounds):
            outcomes.append(
                await asyncio.gather(
                    *(
                        p.send(Message(TOPIC, f"{n}-{i}".encode()), mq, expected_queue_offset=n)
                        for i, p in enumerate(producers)
                    ),
                    return_exceptions=True,
                )
            )
    finally:
        for p in producers:
            await p.close()
    return outcomes


@pytest.mark.parametrize("mode", sorted(MODES))
def test_racing_conditional_sends_store_exactly_one(cluster_factory, mode, drain_topic):
    c = start(cluster_factory, mode)
    for n, pair in enumerate(asyncio.run(_race(c.namesrv, ROUNDS))):
        won = [r for r in pair if not isinstance(r, BaseException)]
        lost = [r for r in pair if isinstance(r, BaseException)]
        assert len(won) == 1, f"round {n}: {pair}"
        assert won[0].status is SendStatus.SEND_OK and won[0].queue_offset == n
        assert isinstance(lost[0], QueueOffsetMismatch), f"round {n}: {pair}"
        assert lost[0].end_offset == n + 1  # the winner's message is the queue's end
    stored = drain_topic(c.namesrv, TOPIC)[0]
    assert [(offset, body.split(b"-")[0]) for offset, body in stored] == [
        (n, str(n).encode()) for n in range(ROUNDS)
    ]


def test_a_mismatch_stores_nothing_and_says_where_the_queue_ends(cluster_factory, drain_topic):
    c = start(cluster_factory, "async_master")
    mq = MessageQueue(TOPIC, GROUP, 0)
    with hamq.Producer(c.namesrv, "pg-cas") as producer:
        assert producer.send(Message(TOPIC, b"a"), mq, expected_queue_offset=0).queue_offset == 0
        producer.send(Message(TOPIC, b"unconditional"), mq)
        for stale in (0, 1, 5):
            with pytest.raises(QueueOffsetMismatch) as caught:
                producer.send(Message(TOPIC, b"stale"), mq, expected_queue_offset=stale)
            assert caught.value.end_offset == 2
        with pytest.raises(InvalidArgument, match="needs the queue"):
            producer.send(Message(TOPIC, b"where?"), expected_queue_offset=2)
        assert producer.send(Message(TOPIC, b"b"), mq, expected_queue_offset=2).queue_offset == 2
    assert [body for _, body in drain_topic(c.namesrv, TOPIC)[0]] == [b"a", b"unconditional", b"b"]
