"""A pop group's offset reset is in the revive log (issue 17): a member rebuilding its pop
state (kill -9 before a checkpoint, a new master replaying the replicated log) restarts the
group's queues at the reset instead of going on from the acks before it; acting members
cannot escape a RESET record (it is a master's own)."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from hamq.broker.clients import ClientManager
from hamq.broker.consumer_admin import ConsumerAdmin
from hamq.broker.pop.revive_log import KIND_RESET, ReviveLog
from hamq.errors import DiskFull, InvalidArgument
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame
from hamq.store.disk import OsDisk
from unit.test_pop_revive import TOPIC, open_broker, pop, put


def test_a_replayed_reset_restarts_the_queue_and_its_offset(tmp_path):
    store, service = open_broker(tmp_path)
    put(store, 10)
    handles = pop(service, 6)
    service._ack("g", [[TOPIC, 0, o, ck] for o, ck in handles.items()])
    store.commit()
    assert store.offsets.query("g", TOPIC, 0) == 6
    store.offsets.commit("g", TOPIC, 0, 1, store.clock_ms())  # what consumer_admin does
    service.reset_offset("g", TOPIC, {0: 1})
    store.commit()
    store.close()  # as after kill -9: no checkpoint since the reset
    store2, service2 = open_broker(tmp_path)
    assert service2.states[("g", TOPIC, 0)].consume_offset == 1
    assert store2.offsets.query("g", TOPIC, 0) == 1
    assert sorted(pop(service2, 10)) == list(range(1, 10))  # 1..5 again, then the rest
    store2.close()


def test_a_reset_record_is_not_escaped(tmp_path):
    store, _ = open_broker(tmp_path, "broker-b")
    record = msgpack.packb(
        {"k": KIND_RESET, "b": "broker-a", "g": "g", "t": TOPIC, "e": [[0, 0]]},
        use_bin_type=True,
    )
    with pytest.raises(InvalidArgument, match="only CK and ACK"):
        ReviveLog(store, "broker-b").check_escaped(record)
    store.close()


class FullingDisk(OsDisk):
    """The OS's disk, but out of room once ``full`` is set (as the next disk check sees)."""

    full = False

    def usage(self, path: Path) -> tuple[int, int]:
        total, free = super().usage(path)
        return (total, 0) if self.full else (total, free)


def test_a_reset_the_disk_refuses_changes_nothing(tmp_path):
    """The RESET record is written before anything moves: a full disk refuses the reset as
    a whole (the operator retries), not after the offsets were reset with no notice sent
    to the live consumers (their next commit of the old position undid it)."""
    disk = FullingDisk()
    store, service = open_broker(tmp_path, disk=disk)
    put(store, 10)
    for queue_id in (0, 1):
        store.offsets.commit("g", TOPIC, queue_id, 0, store.clock_ms())
    pop(service, 4)
    store.offsets.commit("g", TOPIC, 0, 4, store.clock_ms())
    admin = ConsumerAdmin(
        "broker-a", store, service.topics, ClientManager(), service.reset_offset, lambda: None
    )
    disk.full = True
    store.check_disk()
    frame = Frame(
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
        1,
        ext={"group": "g", "topic": TOPIC, "timestamp_ms": 0},
    )
    with pytest.raises(DiskFull):
        admin.reset_offset(None, frame)  # type: ignore[arg-type]
    assert store.offsets.query("g", TOPIC, 0) == 4
    assert service.states[("g", TOPIC, 0)].pop_offset == 4
    store.close()
