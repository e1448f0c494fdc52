"""Attacks on a running member's role change (issue 13 review): what is in flight when a
master becomes a slave, what a promoted slave promises, and what a member that cut its
log (attaching to its successor) or never got its old master's last records still counts
as consumed or delivered. In process with a real name server, as test_role_services.py
(nothing triggers a master-slave role change yet but the role state itself)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hamq.broker.role import BrokerRole
from hamq.broker.server import Broker
from hamq.client.consumer import AsyncPullConsumer
from hamq.client.message import Message
from hamq.client.producer import AsyncProducer, SendStatus
from hamq.client.simple import AsyncSimpleConsumer
from hamq.client.transaction import AsyncTransactionProducer
from hamq.errors import HamqError, InSyncReplicasNotEnough
from hamq.protocol.transaction import TransactionState
from helpers import read_queue

sys.path.insert(0, str(Path(__file__).parent))  # sibling test modules, as tests/chaos does
from test_role_services import WAIT_S, slave_broker, start_namesrv, until

SLOW_FSYNC_S = 0.5
ANSWER_WITHIN_S = 5.0  # far below the producer's send timeout: an answer, not a timeout
DELAY_LEVEL = 2  # due in 5 s: long enough to hand mastership back before that


@dataclass
class Pair:
    """Two members of group "g" in this event loop: ``a`` master (topic T, one queue),
    ``b`` its slave, attached; a producer that does not retry."""

    namesrv: str
    a: Broker
    b: Broker
    producer: AsyncProducer
    running: list[Broker] = field(default_factory=list)

    async def stop(self, member: Broker) -> None:
        self.running.remove(member)
        await member.stop()

    async def send(self, bodies: list[bytes], **fields) -> list[bytes]:
        """Send each body to T (a message with ``fields``) until it is acknowledged (the
        route may still name the old master)."""
        deadline = asyncio.get_running_loop().time() + WAIT_S
        for body in bodies:
            while True:
                try:
                    message = Message("T", body, **fields)
                    if (await self.producer.send(message)).status is SendStatus.SEND_OK:
                        break
                except HamqError:
                    pass
                assert asyncio.get_running_loop().time() < deadline, f"{body!r} not acked"
                await asyncio.sleep(0.05)
        return bodies


@contextlib.asynccontextmanager
async def pair(tmp_path, sync_master: bool = False, **settings) -> AsyncIterator[Pair]:
    """``sync_master``: ``a`` is configured as the group's sync master (broker id 0), not
    a slave promoted at runtime."""
    namesrv, stop_namesrv, namesrv_task = await start_namesrv(tmp_path)
    a = (
        slave_broker(tmp_path, namesrv, 0, broker_role="sync_master", **settings)
        if sync_master
        else slave_broker(tmp_path, namesrv, 1, **settings)
    )
    b = slave_broker(tmp_path, namesrv, 2, **settings)
    producer = AsyncProducer(
        namesrv.listen, "p", send_timeout_s=30.0, retry_times_when_send_failed=0
    )
    members = Pair(namesrv.listen, a, b, producer)
    try:
        for member in (a, b):
            await member.start()
            members.running.append(member)
        await a.role.change(BrokerRole.MASTER, a.config.listen)
        a.topics.create("T", 1, 1, 6)
        await producer.start()
        await until(lambda: b.runtime_info()["ha"]["state"] == "TRANSFER", "b attached")
        yield members
    finally:
        await producer.close()
        for member in members.running:
            await member.stop()
        stop_namesrv.set()
        await namesrv_task


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 180))


async def partition(slave: Broker) -> None:
    """The slave hears nothing more from its master: no log, no metadata."""
    await slave.ha_slave.stop()
    await slave.slave_sync.stop()


async def hand_over(old: Broker, new: Broker) -> None:
    await old.role.change(BrokerRole.SLAVE, new.config.listen)
    await new.role.change(BrokerRole.MASTER, new.config.listen)


async def until_caught_up(slave: Broker, master: Broker) -> None:
    end = master.store.commitlog.max_offset
    await until(lambda: slave.store.commitlog.max_offset == end, "the slave caught up")


def bodies_in(member: Broker) -> list[bytes]:
    return sorted(bytes(m) for m in read_queue(member.store, "T").values())


def slow_fsync(broker: Broker) -> None:
    """A slow disk: every commit-log fsync of this broker takes SLOW_FSYNC_S longer, so a
    sync-flush send is still waiting for its fsync when the role changes."""
    commitlog = broker.store.commitlog
    detach_flush = commitlog.detach_flush

    def detached():
        flush = detach_flush()

        def slow():
            time.sleep(SLOW_FSYNC_S)
            return flush()

        return slow

    commitlog.detach_flush = detached


def test_sync_master_sends_waiting_for_fsync_are_answered_when_it_becomes_slave(tmp_path):
    """A sync master with sync flush answers a send once it is fsynced and a slave has
    it. Sends stored before the master became a slave whose fsync ends only after its HA
    master stopped must still be answered at once (an error: nothing ships them any
    more), never left waiting on the stopped HA master — the client would wait out its
    timeout, and a later promotion could ack them from offsets a slave's log since cut
    and refilled."""

    async def scenario() -> None:
        quorum = {"flush_disk_type": "sync", "total_replicas": 2, "in_sync_replicas": 2}
        async with pair(tmp_path, sync_master=True, **quorum) as p:
            await p.send([b"warm-up"])
            slow_fsync(p.a)
            log = p.a.store.commitlog
            end = log.max_offset
            bodies = [b"in flight %d" % i for i in range(20)]
            sends = [asyncio.create_task(p.producer.send(Message("T", b))) for b in bodies]
            try:
                await until(lambda: log.max_offset > end, "sends stored")
                assert log.flushed_offset < log.max_offset, "the sends wait for their fsync"
                await p.a.role.change(BrokerRole.SLAVE, p.b.config.listen)

                _, pending = await asyncio.wait(sends, timeout=ANSWER_WITHIN_S)
                assert not pending, f"{len(pending)} of {len(sends)} sends never answered"
            finally:
                for task in sends:
                    task.cancel()
            on_slave = bodies_in(p.b)
            for body, task in zip(bodies, sends, strict=True):
                if task.exception() is None and task.result().status is SendStatus.SEND_OK:
                    assert body in on_slave, f"{body!r} acknowledged but not on the slave"
            assert p.a.runtime_info()["role"]["errors"] == {}

    run(scenario)


def test_a_promoted_slave_acknowledges_only_what_in_sync_replicas_hold(tmp_path):
    """A member promoted at runtime is a sync master, as RocketMQ 5's controller makes
    every new master (``ReplicasManager.changeToMaster``): its ``in_sync_replicas`` decides
    how many copies a send needs before SEND_OK. Without its slave it must refuse the send;
    with it, an acknowledged send is on the slave the moment it is acknowledged."""

    async def scenario() -> None:
        async with pair(tmp_path, total_replicas=2, in_sync_replicas=2) as p:
            await p.b.ha_slave.stop()
            await until(lambda: not p.a.runtime_info()["ha"]["slaves"], "a lost its slave")
            with pytest.raises(InSyncReplicasNotEnough):
                await p.producer.send(Message("T", b"on the master alone"))
            assert read_queue(p.a.store, "T") == {}

            p.b.ha_slave.start()
            await until(lambda: p.b.runtime_info()["ha"]["state"] == "TRANSFER", "reattached")
            for i in range(20):
                body = b"on both %d" % i
                assert (await p.producer.send(Message("T", body))).status is SendStatus.SEND_OK
                assert body in bodies_in(p.b), body

    run(scenario)


def test_an_old_master_that_ran_ahead_is_cut_back_to_its_successor(tmp_path):
    """Async replication, four hand-overs: each time the link to the slave is cut, the
    master acknowledges sends the slave never gets, and mastership moves anyway (an
    acknowledged send on an async master alone is allowed to go). The old master's HA
    client must cut that tail when it attaches to its successor: the logs end identical,
    every send acknowledged while the slave was attached is on both, none of the cut ones
    is anywhere, nothing is stored twice, and no role service reports an error."""

    async def scenario() -> None:
        async with pair(tmp_path) as p:
            replicated: list[bytes] = []
            ahead: list[bytes] = []
            master, slave = p.a, p.b
            for round_ in range(4):
                await until(
                    lambda s=slave: s.runtime_info()["ha"]["state"] == "TRANSFER",
                    f"round {round_}: the slave attached",
                )
                replicated += await p.send([b"replicated %d.%d" % (round_, i) for i in range(20)])
                await until_caught_up(slave, master)
                await slave.ha_slave.stop()  # the link is cut: the master runs ahead
                ahead += await p.send([b"ahead %d.%d" % (round_, i) for i in range(10)])
                await hand_over(master, slave)
                await until(
                    lambda m=master: (
                        m.ha_slave.link.last_cut is not None
                        and m.runtime_info()["ha"]["state"] == "TRANSFER"
                    ),
                    f"round {round_}: the old master cut its tail and follows",
                )
                master.ha_slave.link.last_cut = None
                master, slave = slave, master
            await until_caught_up(slave, master)
            for member in (p.a, p.b):
                bodies = bodies_in(member)
                assert len(bodies) == len(set(bodies)), "a message is stored twice"
                assert set(replicated) <= set(bodies), "a replicated send was lost"
                assert not set(ahead) & set(bodies), "a cut send survived somewhere"
                assert member.runtime_info()["role"]["errors"] == {}
            assert read_queue(p.a.store, "T") == read_queue(p.b.store, "T")

    run(scenario)


def test_consumer_offsets_past_a_cut_do_not_skip_the_successors_messages(tmp_path):
    """A partitioned async master takes sends its slave never gets, and a consumer group
    consumes and commits them there; mastership moves to the slave, which takes other
    sends at the same queue offsets. When the old master attaches as a slave its tail is
    cut, and with it the offsets committed past the cut: they counted records that are
    gone. Else, master again, it hands the group an offset past the successor's
    acknowledged messages, which the group then never consumes."""

    async def scenario() -> None:
        async with pair(tmp_path) as p:
            consumer = AsyncPullConsumer("G", p.namesrv)
            try:
                await partition(p.b)
                await p.send([b"cut %d" % i for i in range(10)])
                (mq,) = await consumer.fetch_message_queues("T")
                assert len((await consumer.pull(mq, 0, 32)).messages) == 10
                await consumer.commit_offset(mq, 10)
                successor = await successor_after_a_cut(p)

                (mq,) = await consumer.fetch_message_queues("T")
                offset = await consumer.fetch_offset(mq)
                got = [bytes(m.body) for m in (await consumer.pull(mq, offset, 32)).messages]
                assert sorted(got) == successor, f"the group resumes at {offset}, gets {got}"
            finally:
                await consumer.close()

    run(scenario)


async def successor_after_a_cut(p: Pair, **fields) -> list[bytes]:
    """``a`` (partitioned from ``b``, its last records consumed or delivered) hands over
    to ``b``, which takes other sends at the same queue offsets (returned) and hands
    mastership back before they are due; ``a`` cut its tail to follow ``b``."""
    await hand_over(p.a, p.b)
    await until(lambda: p.a.ha_slave.link.last_cut is not None, "a cut its tail")
    successor = await p.send([b"successor %d" % i for i in range(10)], **fields)
    await until_caught_up(p.a, p.b)
    await hand_over(p.b, p.a)
    return sorted(successor)


def test_delay_progress_past_a_cut_does_not_skip_the_successors_delay_messages(tmp_path):
    """As with consumer offsets: a partitioned old master delivered delay messages its
    slave never got, so its delay progress counts records its cut removes. Its successor
    takes other delay messages at the same level-queue offsets; handed back mastership
    before they are due, the old master must still deliver each of them."""

    async def scenario() -> None:
        async with pair(tmp_path) as p:
            await partition(p.b)
            cut = sorted(await p.send([b"cut %d" % i for i in range(5)], delay_level=DELAY_LEVEL))
            await until(lambda: bodies_in(p.a) == cut, "a delivered its delay messages")
            successor = await successor_after_a_cut(p, delay_level=DELAY_LEVEL)
            assert bodies_in(p.a) == [], "b delivered before the hand-back: nothing tested"
            await until(lambda: bodies_in(p.a) == successor, "a delivers b's messages once")

    run(scenario)


def test_pop_progress_past_a_cut_does_not_skip_the_successors_messages(tmp_path):
    """As with consumer offsets, for a pop consumer group: the old master's pop state
    counts messages its cut removes; master again, it must still hand the group every
    message its successor acknowledged at the same queue offsets."""

    async def scenario() -> None:
        async with pair(tmp_path) as p:
            consumer = AsyncSimpleConsumer("G", p.namesrv, {"T": "*"}, await_duration_s=0.5)

            async def pop_and_ack(count: int) -> list[bytes]:
                got: list[bytes] = []
                deadline = asyncio.get_running_loop().time() + WAIT_S
                while len(got) < count and asyncio.get_running_loop().time() < deadline:
                    try:
                        messages = await consumer.receive(32, 60)
                    except HamqError:  # the route still names the old master
                        await asyncio.sleep(0.1)
                        continue
                    for message in messages:
                        got.append(bytes(message.body))
                        await consumer.ack(message)
                return sorted(got)

            try:
                await partition(p.b)
                cut = sorted(await p.send([b"cut %d" % i for i in range(10)]))
                await consumer.start()
                assert await pop_and_ack(10) == cut
                successor = await successor_after_a_cut(p)
                assert await pop_and_ack(10) == successor
            finally:
                await consumer.close()

    run(scenario)


def test_consumer_offsets_a_slave_took_past_its_log_do_not_skip_its_own_messages(tmp_path):
    """The slave's metadata sync took a consumer offset its HA link had not yet brought
    the messages for; then the old master is gone and the slave is promoted. Offsets past
    its queues count messages it will never have: its own next messages take those queue
    offsets, and the group must get them."""

    async def scenario() -> None:
        async with pair(tmp_path) as p:
            consumer = AsyncPullConsumer("G", p.namesrv)
            try:
                await p.b.ha_slave.stop()  # the HA link lags (here: stops); metadata sync goes on
                await p.send([b"lost with a %d" % i for i in range(10)])
                (mq,) = await consumer.fetch_message_queues("T")
                assert len((await consumer.pull(mq, 0, 32)).messages) == 10
                await consumer.commit_offset(mq, 10)
                await until(lambda: p.b.store.offsets.query("G", "T", 0) == 10, "b took it")

                await p.stop(p.a)  # the old master is gone
                await p.b.role.change(BrokerRole.MASTER, p.b.config.listen)
                successor = await p.send([b"successor %d" % i for i in range(10)])
                (mq,) = await consumer.fetch_message_queues("T")
                offset = await consumer.fetch_offset(mq)
                got = [bytes(m.body) for m in (await consumer.pull(mq, offset, 32)).messages]
                assert got == successor, f"the group resumes at {offset} and gets {got}"
            finally:
                await consumer.close()

    run(scenario)


def test_timer_progress_past_a_cut_does_not_skip_the_successors_timer_messages(tmp_path):
    """As with delay levels, for timer messages (a deliver time of their own)."""

    async def scenario() -> None:
        async with pair(tmp_path) as p:
            await partition(p.b)
            due = time.time() * 1000 + 2000
            cut = sorted(await p.send([b"cut %d" % i for i in range(5)], deliver_time_ms=int(due)))
            await until(lambda: bodies_in(p.a) == cut, "a delivered its timer messages")
            later = int(time.time() * 1000) + 8000
            successor = await successor_after_a_cut(p, deliver_time_ms=later)
            assert bodies_in(p.a) == [], "b delivered before the hand-back: nothing tested"
            await until(lambda: bodies_in(p.a) == successor, "a delivers b's messages once")

    run(scenario)


def test_checks_of_a_cut_half_message_do_not_count_for_the_successors(tmp_path):
    """A master counts the checks it sent for each half message (by half-queue offset)
    and rolls a half back after ``transaction_check_max``. Checks of a half its cut
    removed must not count for the successor's half at the same offset: that one gets
    its own checks, and commits on the second as its producer answers."""
    checks = {"transaction_check_max": 2, "transaction_timeout_ms": 300}
    interval = {"transaction_check_interval_ms": 2000}  # room to switch between rounds

    async def scenario() -> None:
        async with pair(tmp_path, **checks, **interval) as p:
            asked: list[bytes] = []

            def check(message: Message) -> TransactionState:
                asked.append(bytes(message.body))  # committed once asked a second time
                return (
                    TransactionState.COMMIT_MESSAGE
                    if asked.count(bytes(message.body)) > 1
                    else TransactionState.UNKNOW
                )

            producer = AsyncTransactionProducer(
                p.namesrv, "pg", lambda m, a: TransactionState.UNKNOW, check
            )
            try:
                await partition(p.b)
                await producer.send_message_in_transaction(Message("T", b"cut"))
                await until(lambda: asked == [b"cut"], "a checked its half once")
                await hand_over(p.a, p.b)
                await until(lambda: p.a.ha_slave.link.last_cut is not None, "a cut its tail")
                await until_sent(producer, b"successor")
                await until_caught_up(p.a, p.b)
                await hand_over(p.b, p.a)
                await until(lambda: bodies_in(p.a) == [b"successor"], "the successor committed")
            finally:
                await producer.close()

    run(scenario)


async def until_sent(producer: AsyncTransactionProducer, body: bytes) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while True:
        try:
            await producer.send_message_in_transaction(Message("T", body))
            return
        except HamqError:  # the route still names the old master
            assert asyncio.get_running_loop().time() < deadline, f"{body!r} never sent"
            await asyncio.sleep(0.05)
