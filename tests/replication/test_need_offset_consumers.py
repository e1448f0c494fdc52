"""The need offset counts consumer groups the broker knows without an offset (seed 003):
a group subscribed in a heartbeat, or popping, that has not committed on a queue may
start at the queue's first entry, so the queue counts whole even where another group has
consumed it all. Over a real broker's store, consumer manager and HA master (not
started: nothing is dialled). An offset moved back refreshes the need offset within the
event-loop turn, not at the next check period."""

from __future__ import annotations

import asyncio

import pytest

from hamq.broker.clients import ConsumerGroupEntry, Heartbeat
from hamq.broker.mirror_sync import mirror_status
from hamq.broker.pop.state import PopQueueState
from hamq.broker.server import Broker
from hamq.config import BrokerConfig
from hamq.net.connection import Connection
from hamq.protocol.message import encode_batch, encode_message
from hamq.replication.need_offset import QueueProgress, first_needed
from helpers import free_port

MESSAGES = 10


def test_a_group_known_without_an_offset_needs_the_whole_queue():
    assert first_needed(QueueProgress(0, 100, (100,))) is None
    assert first_needed(QueueProgress(0, 100, (100,), unstarted=True)) == 0
    assert first_needed(QueueProgress(5, 100, (40, 70), unstarted=True)) == 5
    assert first_needed(QueueProgress(5, 5, (5,), unstarted=True)) is None  # empty


def mirrored_broker(tmp_path) -> Broker:
    return Broker(
        BrokerConfig(
            store_dir=str(tmp_path),
            disk_min_free_bytes=1,
            enable_controller_mode=True,
            controller_addr=("127.0.0.1:9",),  # never dialled: the broker is not started
            all_ack_in_sync_state_set=True,
            listen=f"127.0.0.1:{free_port()}",
            ha_listen=f"127.0.0.1:{free_port()}",
        )
    )


def fill(broker: Broker, topic: str, queue_id: int) -> list[int]:
    """``MESSAGES`` one-message records; each one's commit-log offset."""
    starts = []
    for i in range(MESSAGES):
        payload, crc = encode_batch([encode_message(f"m{i}".encode())])
        result = broker.store.put_batch(topic, queue_id, payload, 1, crc, born_timestamp_ms=i)
        starts.append(result.physical_offset)
    broker.store.commit()
    return starts


def need(broker: Broker) -> int:
    return mirror_status(broker.ha_master, "")["need_offset"]


def test_a_subscribed_or_popping_group_without_an_offset_keeps_the_queue_needed(tmp_path):
    async def scenario() -> None:
        broker = mirrored_broker(tmp_path)
        try:
            starts = fill(broker, "T", 0)
            end = broker.store.commitlog.max_offset
            broker.store.offsets.commit("A", "T", 0, MESSAGES, 0)  # A consumed everything
            assert need(broker) == end
            # B subscribes (connected, nothing committed yet): it may start at the first
            conn = Connection()
            entry = ConsumerGroupEntry("B", "clustering", {"T": "*"})
            broker.clients.heart_beat(conn, Heartbeat("b-1", [], [entry]), 0)
            assert need(broker) == starts[0]
            broker.store.offsets.commit("B", "T", 0, 4, 0)
            assert need(broker) == starts[4]
            broker.clients.connection_closed(conn)
            broker.store.offsets.commit("B", "T", 0, MESSAGES, 0)
            assert need(broker) == end
            # a pop group with state on the topic and no offset on a queue (queue 1 added
            # after its first pop): that queue counts whole
            starts1 = fill(broker, "T", 1)
            for group in ("A", "B"):
                broker.store.offsets.commit(group, "T", 1, MESSAGES, 0)
            broker.pop.states[("P", "T", 0)] = PopQueueState(MESSAGES)
            broker.store.offsets.commit("P", "T", 0, MESSAGES, 0)
            assert need(broker) == starts1[0]
        finally:
            broker.store.close()

    asyncio.run(scenario())


def rewind(broker: Broker) -> int:
    """An admin reset of A's offset to 3: the queue is needed from its fourth message."""
    broker.store.offsets.commit("A", "T", 0, 3, 0)
    return 3


def subscribe(broker: Broker) -> int:
    """Group B subscribes by heartbeat, nothing committed yet: needed from the first (a
    tail member catching up before the next check period joined the SyncStateSet under
    the old need offset, electable without the messages B reads first)."""
    entry = ConsumerGroupEntry("B", "clustering", {"T": "*"})
    broker.clients.heart_beat(Connection(), Heartbeat("b-1", [], [entry]), 0)
    return 0


@pytest.mark.parametrize("event", [rewind, subscribe])
def test_a_rewind_or_a_subscription_refreshes_the_need_offset_in_the_same_turn(tmp_path, event):
    async def scenario() -> None:
        broker = mirrored_broker(tmp_path)
        try:
            starts = fill(broker, "T", 0)
            broker.ha_master.start_epoch(1, broker_id=0)
            broker.store.offsets.commit("A", "T", 0, MESSAGES, 0)
            await asyncio.sleep(0)  # the refresh that first commit asked for runs
            sync_state_set = broker.ha_master.core.sync_state_set
            assert sync_state_set.need_offset == broker.store.commitlog.max_offset
            first = event(broker)
            await asyncio.sleep(0)  # the turn ends; no check period passes
            assert sync_state_set.need_offset == starts[first]
        finally:
            broker.store.close()

    asyncio.run(scenario())
