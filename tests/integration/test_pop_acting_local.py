"""Local escape of pop records (seed 004, a broker container's case): an acting member's
CK/ACK record goes into the master of another group living in the same process, through
that broker's own pop service (no network), and a member that begins acting reads the
records of its broker name back from it. Two real Broker objects in one process, as a
container hosts them (not started: only their stores and pop services are used)."""

from __future__ import annotations

import asyncio

from hamq.broker.pop.escaped import ReviveEscape
from hamq.broker.pop.revive_log import ack_record, ck_record
from hamq.broker.server import Broker
from hamq.config import BrokerConfig
from hamq.net.counts import COUNTS

CK = ck_record("broker-a", "g", "T", 10**15, [(0, [0, 1], [0, 0])], 2**62 + 5)


def process(tmp_path):
    """(members, member(name, broker_name, role, broker_id, **settings)): real Brokers,
    each given the others as its siblings, as a container makes them."""
    members: list[Broker] = []

    def member(name: str, broker_name: str, role: str, broker_id: int, **settings) -> Broker:
        config = BrokerConfig(
            store_dir=str(tmp_path / name),
            broker_name=broker_name,
            broker_id=broker_id,
            broker_role=role,
            enable_slave_acting_master=True,
            namesrv=("127.0.0.1:1",),
            **settings,
        )
        members.append(Broker(config, siblings=lambda: members))
        return members[-1]

    return members, member


def close(members: list[Broker]) -> None:
    for m in members:
        m.store.close()
        m.store_lock.release()


def test_a_record_escapes_into_a_sibling_master_and_is_read_back(tmp_path):
    members, member = process(tmp_path)

    async def run() -> None:
        acting = member("a1", "broker-a", "slave", 1)
        master_b = member("b0", "broker-b", "async_master", 0)
        escape = ReviveEscape(acting.escape)
        before = COUNTS.escaped_local
        assert await escape.put(CK, None) == "broker-b"
        assert await escape.put(ack_record("broker-a", "g", [("T", 0, 0, 2**62 + 5)]), "broker-b")
        assert COUNTS.escaped_local == before + 2
        records = await escape.records_of("broker-a")
        assert [(r.kind, r.ck) for r in records] == [("ck", 2**62 + 5), ("ack", 1)]
        assert not list(master_b.pop.revive.replay(0))  # nothing under broker-b's own name
        close(members)

    asyncio.run(run())


def test_a_record_put_into_a_sync_flush_sibling_is_escaped_once_on_disk(tmp_path):
    """A record is escaped (its ack answered, the record taken off the queue) once it is
    as durable in the sibling master as that master's answer over the network would say:
    under sync flush, fsynced. Before, the local put returned with the record only in the
    page cache."""
    members, member = process(tmp_path)

    async def run() -> None:
        acting = member("a1", "broker-a", "slave", 1)
        master_b = member("b0", "broker-b", "async_master", 0, flush_disk_type="sync")
        put = asyncio.ensure_future(ReviveEscape(acting.escape).put(CK, None))
        for _ in range(20):  # the put's turns on the loop, its flusher not started
            await asyncio.sleep(0)
        assert not put.done(), "escaped before the sibling's sync flush"
        master_b.flush.start()
        assert await asyncio.wait_for(put, 5) == "broker-b"
        assert master_b.store.commitlog.flushed_offset == master_b.store.commitlog.max_offset
        await master_b.flush.stop()
        close(members)

    asyncio.run(run())
