"""``HAMaster`` and ``HASlave`` over loopback TCP (issue 14): under sync flush a slave's ack
counts a send only once the slave fsynced it (bug A), and in controller mode the confirm
offset reaches the slaves without one empty transfer per send in one-at-a-time traffic.
Seed 003: a sync-queue never empties the log of a member the controller may still elect."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable

from hamq.broker.ha.member_group import MASTER_ID, MemberGroup
from hamq.broker.ha.service import HAMaster, HASlave
from hamq.clock import monotonic_ms
from hamq.config import BrokerConfig
from hamq.net.pool import ConnectionPool
from hamq.protocol.codes import RequestCode
from hamq.protocol.message import encode_message
from hamq.replication.master import ReplicaStatus
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore
from helpers import free_port, until

SENDS = 40


def configs(
    tmp_path, master_role: str = "async_master", **common
) -> tuple[BrokerConfig, BrokerConfig]:
    master = BrokerConfig(
        store_dir=str(tmp_path / "m"),
        broker_role=master_role,
        listen=f"127.0.0.1:{free_port()}",
        ha_listen=f"127.0.0.1:{free_port()}",
        disk_min_free_bytes=1,
        **common,
    )
    slave = BrokerConfig(
        store_dir=str(tmp_path / "s"),
        broker_id=1,
        broker_role="slave",
        listen=f"127.0.0.1:{free_port()}",
        ha_listen=f"127.0.0.1:{free_port()}",
        disk_min_free_bytes=1,
        **common,
    )
    return master, slave


async def send_one_at_a_time(
    ha_master: HAMaster, on_acked: Callable[[int, ReplicaStatus], None]
) -> None:
    """SENDS sends, each waiting for the slave's ack before the next (as `bench latency`)."""
    store = ha_master.store
    for i in range(SENDS):
        payload = encode_message(b"send %d" % i)
        end = store.put_batch("T", 0, payload, 1, zlib.crc32(payload), 0).end_offset
        store.commit()
        ha_master.new_data()
        acked = asyncio.get_running_loop().create_future()

        def answered(status: ReplicaStatus, end: int = end, acked=acked) -> None:
            on_acked(end, status)
            acked.set_result(status)

        ha_master.wait_for_acks(end, 2, answered)
        assert await asyncio.wait_for(acked, 10) is ReplicaStatus.PUT_OK


async def run_group(
    master_cfg: BrokerConfig, slave_cfg: BrokerConfig, scenario, controller: bool = False
) -> None:
    master_store, slave_store = MessageStore(master_cfg), MessageStore(slave_cfg)
    pool = ConnectionPool()
    slave_members = MemberGroup(slave_cfg, pool)
    slave_members.broker_addrs = {MASTER_ID: master_cfg.listen}
    slave_members.ha_addrs = {MASTER_ID: master_cfg.ha_address}
    slave_members.controller_master = master_cfg.listen
    slave_flush = FlushService(slave_store)
    ha_master = HAMaster(master_cfg, master_store, MemberGroup(master_cfg, pool))
    ha_slave = HASlave(slave_cfg, slave_store, slave_members, lambda arrived: None, slave_flush)
    if controller:
        ha_master.start_epoch(1, broker_id=MASTER_ID)
        ha_master.set_sync_state_set(frozenset({MASTER_ID, 1}), epoch=1)
    slave_flush.start()
    await ha_master.start()
    ha_slave.start()
    try:
        await until(lambda: ha_slave.status()["state"] == "TRANSFER", 10, "slave attached")
        await scenario(ha_master, ha_slave)
    finally:
        await ha_slave.stop()
        await ha_master.stop()
        await slave_flush.stop()
        await pool.close()
        master_store.close()
        slave_store.close()


def test_a_sync_flush_slave_acks_a_send_only_once_it_fsynced_it(tmp_path) -> None:
    master_cfg, slave_cfg = configs(
        tmp_path, "sync_master", total_replicas=2, in_sync_replicas=2, flush_disk_type="sync"
    )
    durable_at_ack: list[tuple[int, int]] = []

    async def scenario(ha_master: HAMaster, ha_slave: HASlave) -> None:
        def on_acked(end: int, status: ReplicaStatus) -> None:
            durable_at_ack.append((end, ha_slave.store.durable_offset))

        await send_one_at_a_time(ha_master, on_acked)

    asyncio.run(run_group(master_cfg, slave_cfg, scenario))
    assert len(durable_at_ack) == SENDS
    assert all(end <= durable for end, durable in durable_at_ack), durable_at_ack


def test_the_confirm_offset_reaches_the_slave_without_an_empty_transfer_per_send(
    tmp_path,
) -> None:
    master_cfg, slave_cfg = configs(
        tmp_path,
        enable_controller_mode=True,
        controller_addr=("127.0.0.1:9",),  # never dialled here
        all_ack_in_sync_state_set=True,
    )
    transfers = {"empty": 0, "data": 0}

    async def scenario(ha_master: HAMaster, ha_slave: HASlave) -> None:
        handle = ha_slave.handle

        def counting(conn, frame):
            if frame.code == RequestCode.HA_TRANSFER:
                transfers["data" if frame.body else "empty"] += 1
            return handle(conn, frame)

        ha_slave.handle = counting  # type: ignore[method-assign]
        await send_one_at_a_time(ha_master, lambda end, status: None)
        # with no more traffic, the slave's reads reach what the whole set holds
        await until(
            lambda: ha_slave.store.read_cap == ha_master.confirm_offset,
            5,
            "the slave's read cap reaches the confirm offset",
        )
        assert ha_master.confirm_offset == ha_master.store.commitlog.max_offset

    asyncio.run(run_group(master_cfg, slave_cfg, scenario, controller=True))
    assert transfers["data"] >= SENDS
    assert transfers["empty"] < SENDS // 2, transfers


def put(store: MessageStore, n: int) -> None:
    for i in range(n):
        payload = encode_message(b"m%d" % i)
        store.put_batch("T", 0, payload, 1, zlib.crc32(payload), 0)
    store.commit()


def test_a_sync_of_a_set_member_waits_until_the_shrink_is_applied(tmp_path) -> None:
    """An offset reset drops the need offset below a tail-joined member's log start and
    sync-queue comes before the controller applied the shrink: the member keeps its whole
    log (an election may still promote it) and restarts from the need offset only after."""
    master_cfg, slave_cfg = configs(
        tmp_path,
        master_role="sync_master",
        enable_controller_mode=True,
        controller_addr=("127.0.0.1:9",),  # never dialled here
        all_ack_in_sync_state_set=True,
        ha_join="tail",
    )

    history = MessageStore(master_cfg)  # before the mirror joins: not in its log
    put(history, SENDS)
    tail_start = history.commitlog.max_offset
    history.close()

    async def scenario(ha_master: HAMaster, ha_slave: HASlave) -> None:
        slave_log, offsets = ha_slave.store.commitlog, ha_master.store.offsets
        assert slave_log.min_offset == tail_start > 0
        offsets.commit("g", "T", 0, SENDS, 0)  # all consumed: the mirror is synchronised
        ha_master.sync_state_set_change(monotonic_ms())
        ha_master.set_sync_state_set(frozenset({MASTER_ID, 1}), epoch=2)
        offsets.commit("g", "T", 0, 0, 0)  # an offset reset: the history is needed again
        assert ha_master.sync_mirrors(4) == [1]
        put(ha_master.store, 1)
        ha_master.new_data()
        end = ha_master.store.commitlog.max_offset
        await until(lambda: slave_log.max_offset == end, 10, "slave replicates on")
        assert slave_log.min_offset == tail_start > 0  # whole: it may still be elected
        ha_master.set_sync_state_set(frozenset({MASTER_ID}), epoch=3)  # the shrink applied
        await until(lambda: slave_log.min_offset == 0, 10, "slave restarted at the need offset")
        await until(lambda: slave_log.max_offset == end, 10, "slave synced the history")

    asyncio.run(run_group(master_cfg, slave_cfg, scenario, controller=True))
