"""The revive log rebuilds pop state after a restart: from the revive log alone (kill -9
before any checkpoint) and from a checkpoint plus the records after it. Records of another
broker name are ignored (seed 004)."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from hamq.broker.pop.revive_log import ReviveLog
from hamq.broker.pop.service import PopService
from hamq.broker.role import BrokerRole, RoleState
from hamq.broker.topics import TopicService
from hamq.config import BrokerConfig
from hamq.protocol.frame import Frame
from hamq.protocol.message import encode_message
from hamq.sim.fs import DEFAULT_CAPACITY_BYTES, SimDisk
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore

TOPIC = "T"


def open_broker(
    root,
    broker_name: str = "broker-a",
    *,
    role: RoleState | None = None,
    escape=None,
    queues: int = 2,
    **store_kw,
) -> tuple[MessageStore, PopService]:
    """A member's store and pop service with TOPIC on ``queues`` queues (a master unless
    ``role`` says otherwise; ``escape`` puts an acting member's CK/ACK records)."""
    config = BrokerConfig(
        store_dir=str(root),
        broker_name=broker_name,
        long_polling_max_wait_ms=1000,
        pop_inflight_message_threshold=10_000,
        revive_interval_ms=1000,
    )
    store = MessageStore(config, **store_kw)
    role = role or RoleState(BrokerRole.MASTER, 0)
    topics = TopicService(
        store, role, default_queue_nums=queues, auto_create=False, on_change=lambda: None
    )
    if store.topics.get(TOPIC) is None:
        topics.create(TOPIC, queues, queues, 6, notify=False)
    pop = PopService(
        store,
        topics,
        FlushService(store),
        role,
        config,
        on_written=lambda: None,
        on_put=lambda topic, queue_id: None,
        escape=escape,
    )
    return store, pop


def put(store: MessageStore, n: int, queue_id: int = 0) -> None:
    for i in range(n):
        payload = encode_message(b"m%d" % i)
        store.put_batch(TOPIC, queue_id, payload, 1, zlib.crc32(payload), 0)
    store.commit()


def pop(
    service: PopService, max_msgs: int, invisible_ms: int = 60_000, queue_id: int = 0, **ext
) -> dict:
    frame = Frame(
        200050,
        1,
        ext={
            "group": "g",
            "topic": TOPIC,
            "queue_id": queue_id,
            "max_msgs": max_msgs,
            "invisible_time_ms": invisible_ms,
            **ext,
        },
    )
    service._answer(frame, hold=False)
    service.store.commit()
    return {o: ck for o, (_, _, ck) in service.states[("g", TOPIC, queue_id)].inflight.items()}


def state_of(service: PopService) -> list:
    return service.states[("g", TOPIC, 0)].to_wire()


def test_replay_without_checkpoint_rebuilds_state(tmp_path):
    store, service = open_broker(tmp_path)
    put(store, 10)
    handles = pop(service, 6)
    service._ack("g", [[TOPIC, 0, o, handles[o]] for o in (0, 1, 3)])
    store.commit()
    before = state_of(service)
    store.close()  # no PopService.stop(): as after kill -9, no checkpoint was written
    store2, service2 = open_broker(tmp_path)
    assert state_of(service2) == before
    assert store2.offsets.query("g", TOPIC, 0) == 2
    store2.close()


def test_checkpoint_plus_tail_replay(tmp_path):
    store, service = open_broker(tmp_path)
    put(store, 10)
    handles = pop(service, 4)
    service._write_checkpoint(service._snapshot())
    service._ack("g", [[TOPIC, 0, o, handles[o]] for o in (0, 2)])
    more = pop(service, 4)
    service._ack("g", [[TOPIC, 0, 5, more[5]]])
    store.commit()
    before = state_of(service)
    store.close()
    store2, service2 = open_broker(tmp_path)
    assert state_of(service2) == before
    assert sorted(service2.states[("g", TOPIC, 0)].inflight) == [1, 3, 4, 6, 7]
    store2.close()


def test_records_of_another_broker_name_are_ignored(tmp_path):
    store, _service = open_broker(tmp_path)
    put(store, 4)
    other = ReviveLog(store, "broker-b")
    other.append_ck("g", TOPIC, 10**15, [(0, [0, 1, 2, 3], [0, 0, 0, 0])])
    store.commit()
    store.close()
    store2, service2 = open_broker(tmp_path)
    assert ("g", TOPIC, 0) not in service2.states
    store2.close()


def test_a_checkpoint_encodes_only_the_queues_that_changed(tmp_path):
    store, service = open_broker(tmp_path)
    put(store, 4, queue_id=0)
    put(store, 4, queue_id=1)
    handles = pop(service, 4, queue_id=0)
    pop(service, 4, queue_id=1)
    first = {(g, t, q): wire for g, t, q, wire in service._snapshot()["queues"]}
    service._ack("g", [[TOPIC, 0, 0, handles[0]]])
    store.commit()
    second = {(g, t, q): wire for g, t, q, wire in service._snapshot()["queues"]}
    assert second[("g", TOPIC, 1)] is first[("g", TOPIC, 1)]  # untouched: not re-encoded
    assert second[("g", TOPIC, 0)] is not first[("g", TOPIC, 0)]
    assert second[("g", TOPIC, 0)][0] == 1  # the ack moved its consume offset
    store.close()


def test_a_failed_dead_letter_write_leaves_the_message_due(tmp_path):
    """The DLQ copy of a message past max_reconsume_times cannot be written (disk full):
    the message stays due, and goes to the DLQ once the disk has room; its deadline was
    taken and lost, so it was neither redelivered nor dead-lettered and pinned its queue."""
    now = [1_000_000]
    disk = SimDisk(clock=lambda: now[0] / 1000)
    store, service = open_broker(Path("/store"), disk=disk, clock_ms=lambda: now[0])
    put(store, 1)
    pop(service, 1, invisible_ms=100, max_reconsume_times=0)
    now[0] += 200  # its invisible time ran out: due past max_reconsume_times
    disk.capacity_bytes = disk.used_bytes()
    with pytest.raises(OSError):
        pop(service, 1, invisible_ms=100, max_reconsume_times=0)
    disk.capacity_bytes = DEFAULT_CAPACITY_BYTES
    assert pop(service, 1, invisible_ms=100, max_reconsume_times=0) == {}
    assert state_of(service)[:2] == [1, 1]  # acked: the consume offset moved past it
    assert store.max_offset("%DLQ%g", 0) == 1
    store.close()
