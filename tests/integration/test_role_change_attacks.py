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
from hamq.client.message import Message
from hamq.client.producer import AsyncProducer, SendStatus
from hamq.errors import InSyncReplicasNotEnough
from helpers import read_queue

sys.path.insert(0, str(Path(__file__).parent))  # sibling test modules, as tests/chaos does
from test_role_services import slave_broker, start_namesrv, until

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
