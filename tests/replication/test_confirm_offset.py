"""Controller-mode pieces over a real store: the epoch file the store keeps, the read cap
(readers never pass the confirm offset), held pulls woken as it rises, and the HA
master's side of the broker <-> HA contract (start_epoch, set_sync_state_set,
sync_state_set_change, confirm_offset, deposition)."""

from __future__ import annotations

import asyncio

import pytest

from hamq.broker.ha.member_group import MemberGroup
from hamq.broker.ha.service import HAMaster
from hamq.broker.pull import PullProcessor
from hamq.broker.role import BrokerRole, RoleState
from hamq.broker.topics import TopicService
from hamq.config import BrokerConfig, StoreConfig
from hamq.errors import ServiceNotAvailable
from hamq.net.connection import connect
from hamq.net.pool import ConnectionPool
from hamq.net.server import Server
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.message import encode_batch, encode_message
from hamq.store.epoch_file import EpochOrderError
from hamq.store.message_store import UNCAPPED, GetStatus, MessageStore
from hamq.store.metadata import TopicConfig
from helpers import free_port, until


def open_store(path) -> MessageStore:
    return MessageStore(StoreConfig(store_dir=str(path), disk_min_free_bytes=1))


def put(store: MessageStore, n: int, queue_id: int = 0) -> list[int]:
    """``n`` one-message records; returns each one's commit-log end."""
    ends = []
    for i in range(n):
        payload, crc = encode_batch([encode_message(f"m{i}".encode())])
        ends.append(store.put_batch("T", queue_id, payload, 1, crc, born_timestamp_ms=i).end_offset)
    store.commit()
    return ends


def test_the_store_keeps_its_epochs_across_a_restart_and_forgets_those_past_its_log(tmp_path):
    store = open_store(tmp_path)
    ends = put(store, 3)
    store.epochs.append(1, 0)
    store.epochs.append(2, ends[-1])  # an epoch with no record yet: kept on restart
    store.close()
    store = open_store(tmp_path)
    assert [(e.epoch, e.start_offset) for e in store.epochs.entries()] == [(1, 0), (2, ends[-1])]
    store.epochs.append(3, ends[-1] + 1000)  # names records the log lost (a power loss)
    store.close()
    store = open_store(tmp_path)
    assert store.epochs.last_epoch() == 2
    store.truncate_to(ends[0])  # a cut forgets the epochs starting at or after it
    assert [(e.epoch, e.start_offset) for e in store.epochs.entries()] == [(1, 0)]
    store.close()


def test_reads_stop_at_the_read_cap_and_an_offset_past_it_waits(tmp_path):
    store = open_store(tmp_path)
    ends = put(store, 5)
    store.set_read_cap(ends[1])  # two records confirmed
    got = store.get_messages("T", 0, 0, 32, 1 << 20)
    assert got.status is GetStatus.FOUND and got.next_begin_offset == 2 and got.max_offset == 2
    assert store.readable_max_offset("T", 0) == 2
    for offset in (2, 4, 5):  # not confirmed yet (a consumer may stand there already)
        got = store.get_messages("T", 0, offset, 32, 1 << 20)
        assert got.status is GetStatus.OFFSET_OVERFLOW_ONE and got.next_begin_offset == offset
    store.set_read_cap(UNCAPPED)
    assert store.get_messages("T", 0, 2, 32, 1 << 20).next_begin_offset == 5
    store.close()


def test_a_rising_read_cap_tells_its_listeners(tmp_path):
    store = open_store(tmp_path)
    told = []
    store.read_cap_listeners.append(lambda: told.append(store.read_cap))
    store.set_read_cap(10)  # from UNCAPPED: lower, nothing to wake
    store.set_read_cap(5)
    store.set_read_cap(20)
    assert told == [20]
    store.close()


@pytest.fixture
def ha_master(tmp_path):
    config = BrokerConfig(
        store_dir=str(tmp_path),
        disk_min_free_bytes=1,
        enable_controller_mode=True,
        controller_addr=("127.0.0.1:9",),  # never dialled here
        all_ack_in_sync_state_set=True,
        ha_max_time_slave_not_catchup_ms=1000,
        listen=f"127.0.0.1:{free_port()}",
        ha_listen=f"127.0.0.1:{free_port()}",
    )
    store = MessageStore(config)
    yield HAMaster(config, store, MemberGroup(config, ConnectionPool()))
    store.close()


def test_start_epoch_records_the_epoch_before_anything_and_refuses_an_older_one(ha_master):
    store = ha_master.store
    ends = put(store, 2)
    ha_master.start_epoch(4, broker_id=7)
    assert [(e.epoch, e.start_offset) for e in store.epochs.entries()] == [(4, ends[-1])]
    assert ha_master.epoch == 4 and ha_master.sync_state_set == {7}
    put(store, 1)
    ha_master.start_epoch(4)  # the same epoch again (a restarted master kept): continues
    assert store.epochs.last_epoch() == 4 and len(store.epochs.entries()) == 1
    with pytest.raises(EpochOrderError):
        ha_master.start_epoch(3)


def test_the_master_alone_confirms_its_log_and_all_ack_answers_at_once(ha_master):
    ha_master.start_epoch(1, broker_id=0)
    end = put(ha_master.store, 1)[0]
    assert ha_master.confirm_offset == end and ha_master.store.read_cap == UNCAPPED
    assert ha_master.check_quorum() >= 2  # all-ack: every send goes through the waiters


def test_a_member_in_the_set_caps_reads_until_it_acks_and_leaves_when_silent(ha_master):
    async def run():
        ha_master.start_epoch(1, broker_id=0)
        put(ha_master.store, 3)
        await ha_master.start()  # the sweep runs: waits are taken
        try:
            ha_master.set_sync_state_set(frozenset({0, 1}), epoch=1)
            assert ha_master.confirm_offset == 0 and ha_master.store.read_cap == 0
            answered = []
            ha_master.wait_for_acks(ha_master.store.commitlog.max_offset, 2, answered.append)
            assert answered == []  # member 1 never attached: it holds nothing we know of
            assert ha_master.sync_state_set_change(now_ms=0) == {0}  # not connected: shrink
            assert answered == []  # a shrink counts only once the controller applied it
            ha_master.set_sync_state_set(frozenset({0}), epoch=2)
            assert [s.value for s in answered] == ["PUT_OK"]
            assert ha_master.store.read_cap == UNCAPPED
        finally:
            await ha_master.stop()

    asyncio.run(run())


def test_a_deposed_master_refuses_sends_with_a_clear_error(ha_master):
    ha_master.start_epoch(2, broker_id=0)
    ha_master.core.learn_epoch(3)  # as a slave's handshake naming epoch 3 does
    assert ha_master.deposed
    with pytest.raises(ServiceNotAvailable, match="epoch 3 has begun"):
        ha_master.check_quorum()
    ha_master.start_epoch(5)  # elected again later: leads again
    assert not ha_master.deposed


class PullOnly:
    """A server that answers pulls only, as the broker's processor does (arrivals are
    served after each batch of reads)."""

    def __init__(self, pull: PullProcessor) -> None:
        self.pull = pull

    def handle(self, conn, frame):
        return self.pull.pull(conn, frame)

    def after_batch(self) -> None:
        self.pull.serve_arrivals()


def pull_server(store: MessageStore) -> tuple[PullProcessor, Server]:
    store.topics.put(TopicConfig("T", 1, 1), 0)
    topics = TopicService(
        store,
        RoleState(BrokerRole.MASTER, 0),
        default_queue_nums=1,
        auto_create=False,
        on_change=lambda: None,
    )
    pull = PullProcessor(store, topics, max_wait_ms=60_000)
    return pull, Server(PullOnly(pull))


def test_a_pull_held_behind_records_written_before_it_wakes_as_the_cap_rises(tmp_path):
    """The record is written before the pull comes (no held pull to tell of its arrival),
    then the pull finds it past the confirm offset and is held: the cap rising must wake
    it, not the end of its long poll (the last sends of a burst waited it out)."""

    async def run():
        store = open_store(tmp_path)
        pull, server = pull_server(store)
        addr = f"127.0.0.1:{free_port()}"
        await server.start(addr)
        conn = await connect(addr)
        try:
            store.set_read_cap(0)
            ends = put(store, 2)
            pull.message_arrived("T", 0)
            pull.serve_arrivals()
            held = conn.request(
                RequestCode.PULL_MESSAGE,
                {"topic": "T", "queue_id": 0, "queue_offset": 0, "suspend_timeout_ms": 60_000},
                timeout_s=60,
            )
            await until(lambda: ("T", 0) in pull._held, 5, "the pull held")
            store.set_read_cap(ends[1])
            answer = await asyncio.wait_for(held, 5)
            assert answer.code == ResponseCode.SUCCESS
            assert answer.ext["next_begin_offset"] == 2
        finally:
            conn.close()
            await server.close()
            pull.close()
            store.close()

    asyncio.run(run())


def test_a_held_pull_waits_for_the_confirm_offset_then_wakes_as_it_rises(tmp_path):
    """A record arrives past the confirm offset: the long poll stays held (it is not
    answered empty-handed), and is answered with it once the confirm offset covers it."""

    async def run():
        store = open_store(tmp_path)
        pull, server = pull_server(store)
        addr = f"127.0.0.1:{free_port()}"
        await server.start(addr)
        conn = await connect(addr)
        try:
            store.set_read_cap(0)
            held = conn.request(
                RequestCode.PULL_MESSAGE,
                {"topic": "T", "queue_id": 0, "queue_offset": 0, "suspend_timeout_ms": 10_000},
                timeout_s=10,
            )
            await until(lambda: ("T", 0) in pull._held, 5, "the pull held")
            ends = put(store, 2)
            pull.message_arrived("T", 0)
            pull.serve_arrivals()
            assert ("T", 0) in pull._held  # arrived, but not confirmed: still held
            store.set_read_cap(ends[0])
            answer = await asyncio.wait_for(held, 5)
            assert answer.code == ResponseCode.SUCCESS
            assert answer.ext["next_begin_offset"] == 1  # the confirmed record only
        finally:
            conn.close()
            await server.close()
            pull.close()
            store.close()

    asyncio.run(run())
