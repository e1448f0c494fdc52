"""Attacks on a running member's role change (issue 13 review): what is in flight when a
master becomes a slave, and what a promoted slave promises. In process with a real name
server, as test_role_services.py (nothing triggers a master-slave role change yet but the
role state itself)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from hamq.broker.role import BrokerRole
from hamq.broker.server import Broker
from hamq.client.consumer import AsyncPullConsumer
from hamq.client.message import Message
from hamq.client.producer import AsyncProducer, SendStatus
from hamq.client.simple import AsyncSimpleConsumer
from hamq.errors import HamqError, InSyncReplicasNotEnough
from helpers import read_queue

sys.path.insert(0, str(Path(__file__).parent))  # sibling test modules, as tests/chaos does
from test_role_services import WAIT_S, slave_broker, start_namesrv, until

SLOW_FSYNC_S = 0.5
ANSWER_WITHIN_S = 5.0  # far below the producer's send timeout: an answer, not a timeout


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
        namesrv, stop_namesrv, namesrv_task = await start_namesrv(tmp_path)
        slave = slave_broker(tmp_path, namesrv, 1)
        master = slave_broker(
            tmp_path,
            namesrv,
            0,
            broker_role="sync_master",
            flush_disk_type="sync",
            total_replicas=2,
            in_sync_replicas=2,
        )
        producer = AsyncProducer(
            namesrv.listen, "p", send_timeout_s=30.0, retry_times_when_send_failed=0
        )
        sends: list[asyncio.Task] = []
        try:
            await master.start()
            await slave.start()
            master.topics.create("T", 1, 1, 6)
            await producer.start()
            await until(lambda: slave.runtime_info()["ha"]["state"] == "TRANSFER", "attached")
            assert (await producer.send(Message("T", b"warm-up"))).status is SendStatus.SEND_OK

            slow_fsync(master)
            end = master.store.commitlog.max_offset
            bodies = [b"in flight %d" % i for i in range(20)]
            sends += [asyncio.create_task(producer.send(Message("T", b))) for b in bodies]
            await until(lambda: master.store.commitlog.max_offset > end, "sends stored")
            log = master.store.commitlog
            assert log.flushed_offset < log.max_offset, "the stored sends wait for their fsync"
            await master.role.change(BrokerRole.SLAVE, slave.config.listen)

            _, pending = await asyncio.wait(sends, timeout=ANSWER_WITHIN_S)
            assert not pending, f"{len(pending)} of {len(sends)} sends never answered"
            on_slave = {bytes(b) for b in read_queue(slave.store, "T").values()}
            for body, task in zip(bodies, sends, strict=True):
                if task.exception() is None and task.result().status is SendStatus.SEND_OK:
                    assert body in on_slave, f"{body!r} acknowledged but not on the slave"
            assert master.runtime_info()["role"]["errors"] == {}
        finally:
            for task in sends:
                task.cancel()
            await producer.close()
            await master.stop()
            await slave.stop()
            stop_namesrv.set()
            await namesrv_task

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_a_promoted_slave_acknowledges_only_what_in_sync_replicas_hold(tmp_path):
    """A member promoted at runtime is a sync master, as RocketMQ 5's controller makes
    every new master (``ReplicasManager.changeToMaster``): its ``in_sync_replicas`` decides
    how many copies a send needs before SEND_OK. Alone, it must refuse the send; with a
    slave attached, an acknowledged send is on that slave the moment it is acknowledged."""

    async def scenario() -> None:
        namesrv, stop_namesrv, namesrv_task = await start_namesrv(tmp_path)
        quorum = {"total_replicas": 2, "in_sync_replicas": 2}
        a, b = (
            slave_broker(tmp_path, namesrv, 1, **quorum),
            slave_broker(tmp_path, namesrv, 2, **quorum),
        )
        producer = AsyncProducer(namesrv.listen, "p", retry_times_when_send_failed=0)
        try:
            await a.start()
            await a.role.change(BrokerRole.MASTER, a.config.listen)
            a.topics.create("T", 1, 1, 6)
            await producer.start()
            with pytest.raises(InSyncReplicasNotEnough):
                await producer.send(Message("T", b"on the master alone"))
            assert read_queue(a.store, "T") == {}

            await b.start()
            await until(lambda: b.runtime_info()["ha"]["state"] == "TRANSFER", "b attached to a")
            for i in range(20):
                body = b"on both %d" % i
                assert (await producer.send(Message("T", body))).status is SendStatus.SEND_OK
                assert body in {bytes(m) for m in read_queue(b.store, "T").values()}, body
        finally:
            await producer.close()
            await a.stop()
            await b.stop()
            stop_namesrv.set()
            await namesrv_task

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_an_old_master_that_ran_ahead_is_cut_back_to_its_successor(tmp_path):
    """Async replication, four hand-overs: each time the link to the slave is cut, the
    master acknowledges sends the slave never gets, and mastership moves anyway (an
    acknowledged send on an async master alone is allowed to go). The old master's HA
    client must cut that tail when it attaches to its successor: the logs end identical,
    every send acknowledged while the slave was attached is on both, none of the cut ones
    is anywhere, nothing is stored twice, and no role service reports an error."""

    async def scenario() -> None:
        namesrv, stop_namesrv, namesrv_task = await start_namesrv(tmp_path)
        a, b = slave_broker(tmp_path, namesrv, 1), slave_broker(tmp_path, namesrv, 2)
        producer = AsyncProducer(namesrv.listen, "p", retry_times_when_send_failed=0)
        replicated: list[bytes] = []
        ahead: list[bytes] = []
        sent = 0

        async def send_until(acked: list[bytes], count: int, prefix: bytes) -> None:
            nonlocal sent
            goal = len(acked) + count
            while len(acked) < goal:
                bodies = [b"%s%06d" % (prefix, sent + i) for i in range(10)]
                sent += 10
                results = await asyncio.gather(
                    *(producer.send(Message("T", body)) for body in bodies),
                    return_exceptions=True,
                )
                acked += [
                    body
                    for body, r in zip(bodies, results, strict=True)
                    if not isinstance(r, BaseException) and r.status is SendStatus.SEND_OK
                ]

        try:
            await a.start()
            await b.start()
            await a.role.change(BrokerRole.MASTER, a.config.listen)
            a.topics.create("T", 1, 1, 6)
            await producer.start()
            master, slave = a, b
            for round_ in range(4):
                await until(
                    lambda s=slave: s.runtime_info()["ha"]["state"] == "TRANSFER",
                    f"round {round_}: the slave attached",
                )
                await send_until(replicated, 20, b"replicated")
                end = master.store.commitlog.max_offset
                await until(lambda s=slave, e=end: s.store.commitlog.max_offset == e, "caught up")
                await slave.ha_slave.stop()  # the link is cut: the master runs ahead
                await send_until(ahead, 10, b"ahead")
                await master.role.change(BrokerRole.SLAVE, slave.config.listen)
                await slave.role.change(BrokerRole.MASTER, slave.config.listen)
                await until(
                    lambda m=master: (
                        m.ha_slave.link.last_cut is not None
                        and m.runtime_info()["ha"]["state"] == "TRANSFER"
                    ),
                    f"round {round_}: the old master cut its tail and follows",
                )
                master.ha_slave.link.last_cut = None
                master, slave = slave, master
            await until(
                lambda: a.store.commitlog.max_offset == b.store.commitlog.max_offset,
                "both logs equal",
            )
            for member in (a, b):
                bodies = [bytes(m) for m in read_queue(member.store, "T").values()]
                assert len(bodies) == len(set(bodies)), "a message is stored twice"
                assert set(replicated) <= set(bodies), "a replicated send was lost"
                assert not set(ahead) & set(bodies), "a cut send survived somewhere"
                assert member.runtime_info()["role"]["errors"] == {}
            assert read_queue(a.store, "T") == read_queue(b.store, "T")
        finally:
            await producer.close()
            await a.stop()
            await b.stop()
            stop_namesrv.set()
            await namesrv_task

    asyncio.run(asyncio.wait_for(scenario(), 180))


def test_consumer_offsets_past_a_cut_do_not_skip_the_successors_messages(tmp_path):
    """A partitioned async master takes sends its slave never gets, and a consumer group
    consumes and commits them there; mastership moves to the slave, which takes other
    sends at the same queue offsets. When the old master attaches as a slave its tail is
    cut, and with it the offsets committed past the cut: they counted records that are
    gone. Else, master again, it hands the group an offset past the successor's
    acknowledged messages, which the group then never consumes."""

    async def scenario() -> None:
        namesrv, stop_namesrv, namesrv_task = await start_namesrv(tmp_path)
        a, b = slave_broker(tmp_path, namesrv, 1), slave_broker(tmp_path, namesrv, 2)
        producer = AsyncProducer(namesrv.listen, "p", retry_times_when_send_failed=0)
        consumer = AsyncPullConsumer("G", namesrv.listen)

        async def send(prefix: bytes) -> list[bytes]:
            bodies = [b"%s %d" % (prefix, i) for i in range(10)]
            await until_sent(producer, bodies)
            return bodies

        try:
            await a.start()
            await b.start()
            await a.role.change(BrokerRole.MASTER, a.config.listen)
            a.topics.create("T", 1, 1, 6)
            await producer.start()
            await until(lambda: b.runtime_info()["ha"]["state"] == "TRANSFER", "b attached")
            await send(b"replicated")
            end = a.store.commitlog.max_offset
            await until(lambda: b.store.commitlog.max_offset == end, "b caught up")
            await b.ha_slave.stop()  # a partition: b hears nothing more from a
            await b.slave_sync.stop()
            await send(b"cut")
            (mq,) = await consumer.fetch_message_queues("T")
            assert len((await consumer.pull(mq, 0, 32)).messages) == 20
            await consumer.commit_offset(mq, 20)

            await a.role.change(BrokerRole.SLAVE, b.config.listen)
            await b.role.change(BrokerRole.MASTER, b.config.listen)
            await until(lambda: a.ha_slave.link.last_cut is not None, "a cut its tail")
            successor = await send(b"successor")
            end = b.store.commitlog.max_offset
            await until(lambda: a.store.commitlog.max_offset == end, "a caught up")
            await b.role.change(BrokerRole.SLAVE, a.config.listen)
            await a.role.change(BrokerRole.MASTER, a.config.listen)

            (mq,) = await consumer.fetch_message_queues("T")
            offset = await consumer.fetch_offset(mq)
            got = [bytes(m.body) for m in (await consumer.pull(mq, offset, 32)).messages]
            assert got == successor, f"the group resumes at {offset} and gets {got}"
        finally:
            await consumer.close()
            await producer.close()
            await a.stop()
            await b.stop()
            stop_namesrv.set()
            await namesrv_task

    asyncio.run(asyncio.wait_for(scenario(), 120))


async def until_sent(producer: AsyncProducer, bodies: list[bytes], delay_level: int = 0) -> None:
    """Send each body to topic T until it is acknowledged (the route may still name the
    old master)."""
    deadline = asyncio.get_running_loop().time() + 20
    for body in bodies:
        while True:
            try:
                if (
                    await producer.send(Message("T", body, delay_level=delay_level))
                ).status is SendStatus.SEND_OK:
                    break
            except HamqError:
                pass
            assert asyncio.get_running_loop().time() < deadline, f"{body!r} never acknowledged"
            await asyncio.sleep(0.05)


def test_delay_progress_past_a_cut_does_not_skip_the_successors_delay_messages(tmp_path):
    """As with consumer offsets: a partitioned old master delivered delay messages its
    slave never got, so its delay progress counts records its cut removes. Its successor
    takes other delay messages at the same level-queue offsets; handed back mastership
    before they are due, the old master must still deliver each of them."""

    async def scenario() -> None:
        namesrv, stop_namesrv, namesrv_task = await start_namesrv(tmp_path)
        a, b = slave_broker(tmp_path, namesrv, 1), slave_broker(tmp_path, namesrv, 2)
        producer = AsyncProducer(namesrv.listen, "p", retry_times_when_send_failed=0)
        level = 2  # due in 5 s: long enough to hand mastership back before that

        def delivered(member: Broker) -> list[bytes]:
            return sorted(bytes(m) for m in read_queue(member.store, "T").values())

        try:
            await a.start()
            await b.start()
            await a.role.change(BrokerRole.MASTER, a.config.listen)
            a.topics.create("T", 1, 1, 6)
            await producer.start()
            await until(lambda: b.runtime_info()["ha"]["state"] == "TRANSFER", "b attached")
            await b.ha_slave.stop()  # a partition: b hears nothing more from a
            await b.slave_sync.stop()
            cut = [b"cut %d" % i for i in range(5)]
            await until_sent(producer, cut, delay_level=level)
            await until(lambda: delivered(a) == cut, "a delivered its delay messages")

            await a.role.change(BrokerRole.SLAVE, b.config.listen)
            await b.role.change(BrokerRole.MASTER, b.config.listen)
            await until(lambda: a.ha_slave.link.last_cut is not None, "a cut its tail")
            successor = [b"successor %d" % i for i in range(5)]
            await until_sent(producer, successor, delay_level=level)
            end = b.store.commitlog.max_offset
            await until(lambda: a.store.commitlog.max_offset == end, "a caught up")
            assert delivered(a) == [], "b delivered before the hand-back: nothing tested"
            await b.role.change(BrokerRole.SLAVE, a.config.listen)
            await a.role.change(BrokerRole.MASTER, a.config.listen)

            await until(lambda: delivered(a) == successor, "a delivers b's delay messages once")
        finally:
            await producer.close()
            await a.stop()
            await b.stop()
            stop_namesrv.set()
            await namesrv_task

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_pop_progress_past_a_cut_does_not_skip_the_successors_messages(tmp_path):
    """As with consumer offsets, for a pop consumer group: the old master's pop state
    counts messages its cut removes; master again, it must still hand the group every
    message its successor acknowledged at the same queue offsets."""

    async def scenario() -> None:
        namesrv, stop_namesrv, namesrv_task = await start_namesrv(tmp_path)
        a, b = slave_broker(tmp_path, namesrv, 1), slave_broker(tmp_path, namesrv, 2)
        producer = AsyncProducer(namesrv.listen, "p", retry_times_when_send_failed=0)
        consumer = AsyncSimpleConsumer("G", namesrv.listen, {"T": "*"}, await_duration_s=0.5)

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
            await a.start()
            await b.start()
            await a.role.change(BrokerRole.MASTER, a.config.listen)
            a.topics.create("T", 1, 1, 6)
            await producer.start()
            await until(lambda: b.runtime_info()["ha"]["state"] == "TRANSFER", "b attached")
            await b.ha_slave.stop()  # a partition: b hears nothing more from a
            await b.slave_sync.stop()
            cut = sorted(b"cut %d" % i for i in range(10))
            await until_sent(producer, cut)
            await consumer.start()
            assert await pop_and_ack(10) == cut

            await a.role.change(BrokerRole.SLAVE, b.config.listen)
            await b.role.change(BrokerRole.MASTER, b.config.listen)
            await until(lambda: a.ha_slave.link.last_cut is not None, "a cut its tail")
            successor = sorted(b"successor %d" % i for i in range(10))
            await until_sent(producer, successor)
            end = b.store.commitlog.max_offset
            await until(lambda: a.store.commitlog.max_offset == end, "a caught up")
            await b.role.change(BrokerRole.SLAVE, a.config.listen)
            await a.role.change(BrokerRole.MASTER, a.config.listen)

            assert await pop_and_ack(10) == successor
        finally:
            await consumer.close()
            await producer.close()
            await a.stop()
            await b.stop()
            stop_namesrv.set()
            await namesrv_task

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_consumer_offsets_a_slave_took_past_its_log_do_not_skip_its_own_messages(tmp_path):
    """The slave's metadata sync took a consumer offset its HA link had not yet brought
    the messages for; then the old master is gone and the slave is promoted. Offsets past
    its queues count messages it will never have: its own next messages take those queue
    offsets, and the group must get them."""

    async def scenario() -> None:
        namesrv, stop_namesrv, namesrv_task = await start_namesrv(tmp_path)
        a, b = slave_broker(tmp_path, namesrv, 1), slave_broker(tmp_path, namesrv, 2)
        producer = AsyncProducer(namesrv.listen, "p", retry_times_when_send_failed=0)
        consumer = AsyncPullConsumer("G", namesrv.listen)
        try:
            await a.start()
            await b.start()
            await a.role.change(BrokerRole.MASTER, a.config.listen)
            a.topics.create("T", 1, 1, 6)
            await producer.start()
            await until(lambda: b.runtime_info()["ha"]["state"] == "TRANSFER", "b attached")
            await b.ha_slave.stop()  # the HA link lags (here: stops); metadata sync goes on
            await until_sent(producer, [b"lost with a %d" % i for i in range(10)])
            (mq,) = await consumer.fetch_message_queues("T")
            assert len((await consumer.pull(mq, 0, 32)).messages) == 10
            await consumer.commit_offset(mq, 10)
            await until(lambda: b.store.offsets.query("G", "T", 0) == 10, "b synced the offset")

            await a.stop()  # the old master is gone
            a = None
            await b.role.change(BrokerRole.MASTER, b.config.listen)
            successor = [b"successor %d" % i for i in range(10)]
            await until_sent(producer, successor)
            (mq,) = await consumer.fetch_message_queues("T")
            offset = await consumer.fetch_offset(mq)
            got = [bytes(m.body) for m in (await consumer.pull(mq, offset, 32)).messages]
            assert got == successor, f"the group resumes at {offset} and gets {got}"
        finally:
            await consumer.close()
            await producer.close()
            if a is not None:
                await a.stop()
            await b.stop()
            stop_namesrv.set()
            await namesrv_task

    asyncio.run(asyncio.wait_for(scenario(), 120))
