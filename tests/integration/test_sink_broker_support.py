"""What the Spark sink needs from brokers (issue 19, items 4 and 5), against real processes.

A conditional send (``expected_queue_offset``) stores its message only if the queue ends
exactly there, atomically against racing senders, on an async master, a sync master with
its slave and a DLedger leader (where it is decided when the entry is applied).

END_TRANSACTION asked again after a decision: the same decision succeeds, the opposite is
refused (TransactionRolledBack / TransactionCommitted), from the op log, so also after a
restart and on the member a controller makes master after a kill -9."""

from __future__ import annotations

import asyncio
import time

import pytest

import hamq
from hamq import Message, MessageQueue, SendStatus, TransactionState
from hamq.broker.transaction.check import MAX_CHECKS_PER_ROUND
from hamq.client.producer import AsyncProducer
from hamq.errors import (
    InvalidArgument,
    QueueOffsetMismatch,
    TransactionCommitted,
    TransactionRolledBack,
)
from hamq.protocol.codes import RequestCode
from hamq.protocol.properties import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
)
from helpers import free_port, wait_for
from integration.test_controller_mode import TOPIC as CM_TOPIC
from integration.test_controller_mode import ControllerModeGroup, _ready

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


SINK_GROUP = "pg-sink"
COMMIT, ROLLBACK = TransactionState.COMMIT_MESSAGE, TransactionState.ROLLBACK_MESSAGE


def send_half(producer: hamq.Producer, topic: str, body: bytes, immunity_s: int = 3600) -> int:
    """A half message of the sink's producer group (immune to checks, as the sink's are);
    returns its half offset."""
    properties = {
        PROPERTY_TRANSACTION_PREPARED: "true",
        PROPERTY_PRODUCER_GROUP: SINK_GROUP,
        PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: str(immunity_s),
    }
    return producer.send(Message(topic, body, properties=properties)).queue_offset


def end(admin: hamq.Admin, addr: str, half: int, state: TransactionState) -> None:
    """END_TRANSACTION as a request, as the sink's driver sends it."""
    ext = {"group": SINK_GROUP, "tran_state_table_offset": half, "commit_or_rollback": state.value}
    admin.submit(admin.core.invoke(addr, RequestCode.END_TRANSACTION, ext)).result()


def assert_verdicts(admin: hamq.Admin, addr: str, committed: int, rolled_back: int) -> None:
    end(admin, addr, committed, COMMIT)
    end(admin, addr, rolled_back, ROLLBACK)
    with pytest.raises(TransactionRolledBack):
        end(admin, addr, rolled_back, COMMIT)
    with pytest.raises(TransactionCommitted):
        end(admin, addr, committed, ROLLBACK)


def test_end_transaction_verdicts_hold_across_a_restart(cluster_factory, drain_topic):
    c = start(cluster_factory, "async_master")
    with hamq.Producer(c.namesrv, SINK_GROUP) as producer, hamq.Admin(c.namesrv) as admin:
        committed = send_half(producer, TOPIC, b"committed")
        rolled_back = send_half(producer, TOPIC, b"rolled back")
        end(admin, c.broker_addr(), committed, COMMIT)
        end(admin, c.broker_addr(), rolled_back, ROLLBACK)
        assert_verdicts(admin, c.broker_addr(), committed, rolled_back)
        c.restart("broker")
        wait_for(lambda: admin.master_addrs(), SETTLE_S, "the broker back")
        assert_verdicts(admin, c.broker_addr(), committed, rolled_back)
    assert [body for _, body in drain_topic(c.namesrv, TOPIC)[0]] == [b"committed"]


def test_end_transaction_verdicts_hold_on_the_next_master(cluster_factory):
    """Controller mode: the decisions' op records reach the slaves; after a kill -9 of the
    master, its successor answers from them."""
    group = ControllerModeGroup(cluster_factory)
    try:
        master = _ready(group)
        with hamq.Producer(group.c.namesrv, SINK_GROUP) as producer:
            committed = send_half(producer, CM_TOPIC, b"committed")
            rolled_back = send_half(producer, CM_TOPIC, b"rolled back")
        end(group.admin, group.addr(master), committed, COMMIT)
        end(group.admin, group.addr(master), rolled_back, ROLLBACK)
        wait_for(lambda: group.caught_up(master), SETTLE_S, "both slaves holding the log")
        group.c.procs[master].kill9()
        successor = group.master(other_than=master)
        assert_verdicts(group.admin, group.addr(successor), committed, rolled_back)
    finally:
        group.close()


IMMUNE_HALVES = 8 * MAX_CHECKS_PER_ROUND
CHECK_INTERVAL_MS = 1000
CHECKS = {"transaction_check_interval_ms": CHECK_INTERVAL_MS, "transaction_timeout_ms": 500}
IN_FLIGHT = 512


async def _send_immune_halves(namesrv: str, n: int) -> None:
    producer = AsyncProducer(namesrv, SINK_GROUP)
    properties = {
        PROPERTY_TRANSACTION_PREPARED: "true",
        PROPERTY_PRODUCER_GROUP: SINK_GROUP,
        PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: "3600",
    }
    try:
        for first in range(0, n, IN_FLIGHT):
            await asyncio.gather(
                *(
                    producer.send(Message(TOPIC, b"sink", properties=properties))
                    for _ in range(first, min(n, first + IN_FLIGHT))
                )
            )
    finally:
        await producer.close()


def test_immune_sink_halves_never_delay_an_ordinary_producers_check(cluster_factory):
    """Thousands of the sink's halves pending (immune for an hour) before an ordinary
    producer's: each of its halves is checked within a check interval of its transaction
    timeout. (Read and counted in every round, the immune ones took eight rounds a cycle
    and the ordinary half waited for the cycle to reach it.)"""
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(**CHECKS)
    with hamq.Admin(c.namesrv) as admin:
        admin.create_topic(TOPIC, 1)
    asyncio.run(_send_immune_halves(c.namesrv, IMMUNE_HALVES))
    checked: dict[str, float] = {}

    def check(msg: Message) -> TransactionState:
        checked.setdefault(msg.keys, time.monotonic())
        return COMMIT

    bound_s = (CHECKS["transaction_timeout_ms"] + 2 * CHECK_INTERVAL_MS) / 1000
    with hamq.TransactionProducer(
        c.namesrv,
        "pg-ordinary",
        lambda msg, arg: TransactionState.UNKNOW,
        check,
        heartbeat_interval_s=0.3,
    ) as producer:
        for key in ("first", "second", "third"):
            sent = time.monotonic()
            producer.send_message_in_transaction(Message(TOPIC, b"ordinary", keys=key), None)
            wait_for(lambda key=key: key in checked, 60, f"half {key!r} checked")
            waited_s = checked[key] - sent
            assert waited_s <= bound_s, f"{key}: checked {waited_s:.1f} s after it was sent"


def test_a_decision_an_acting_master_took_keeps_its_verdict_on_the_returning_master(
    cluster_factory,
):
    """Item 5 across a failover: a half committed by the acting master (its master killed)
    is taken by the returning master at pre-online with its verdict, so a ROLLBACK of it
    there is refused. Before, decisions were kept without verdicts and the ROLLBACK was
    answered SUCCESS: a batch write's abort found its commit point "rolled back" and rolled
    the rest back, leaving the batch partly visible."""
    from test_escape import (
        TX_TOPIC,
        WAIT_S,
        end_transaction,
        master_of,
        prepare,
        read_group,
        start_groups,
    )

    c, _ = start_groups(cluster_factory, remote_escape=True, pre_online=True)
    _, _, halves = prepare(c)
    committed, half = halves["commit"]
    asyncio.run(end_transaction(c.namesrv, half, TransactionState.COMMIT_MESSAGE))
    assert read_group(c.namesrv, TX_TOPIC, "broker-b", 1, WAIT_S) == [committed]
    c.procs["a-master"].start()
    master = c.broker_addr("a-master")
    with hamq.Admin(c.namesrv) as admin:
        wait_for(
            lambda: master_of(admin, TX_TOPIC, "broker-a") == master,
            WAIT_S,
            "broker-a's master back online after pre-online",
        )
    with pytest.raises(TransactionCommitted):
        asyncio.run(end_transaction(c.namesrv, half, TransactionState.ROLLBACK_MESSAGE))
    asyncio.run(end_transaction(c.namesrv, half, TransactionState.COMMIT_MESSAGE))  # same: ok
