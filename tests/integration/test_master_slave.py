"""Master–slave replication with quorum writes and automatic in-sync degradation
(seed 000) on real processes: a master and two slaves, SIGSTOP for a hung ("fake dead")
slave, kill -9 for a dead master."""
from __future__ import annotations

import os
import signal
import time

import pytest

import hamq
from hamq import Message, SendStatus
from hamq.client.consumer import PullStatus
from hamq.config import StoreConfig
from hamq.errors import InSyncReplicasNotEnough
from hamq.protocol.message import decode_records
from hamq.store.message_store import MessageStore

from helpers import wait_for

NS_TIMEOUT_MS = 3000


def start_group(cluster_factory, slaves: int = 2, **master_settings):
    c = cluster_factory()
    c.start_namesrv(scan_not_active_broker_interval_ms=500,
                    broker_not_active_timeout_ms=NS_TIMEOUT_MS)
    settings = {"broker_role": "sync_master", "total_replicas": slaves + 1,
                "sync_flush_timeout_ms": 1000, **master_settings}
    c.start_broker("master", **settings)
    for i in range(1, slaves + 1):
        c.start_broker(f"slave{i}", broker_id=i, broker_role="slave",
                       total_replicas=slaves + 1)
    with hamq.Admin(c.namesrv) as admin:
        wait_for(lambda: len(_ha(admin, c)["slaves"]) == slaves and all(
            s["state"] == "TRANSFER" for s in _ha(admin, c)["slaves"]), 15, "slaves connected")
        admin.create_topic("Rep", 2)
    return c


def _ha(admin, c) -> dict:
    return admin.broker_runtime_info(c.broker_addr("master"))["ha"]


def read_store(path) -> dict[tuple[int, int], bytes]:
    """Every message in a (stopped) member's store, by (queue id, queue offset)."""
    store = MessageStore(StoreConfig(store_dir=str(path), disk_min_free_bytes=1))
    try:
        out = {}
        for (topic, qid), cq in store.queues.items():
            if topic != "Rep" or not len(cq):
                continue
            result = store.get_messages(topic, qid, cq.min_offset, 1 << 30, 1 << 40)
            for m in decode_records(result.records, 0, lambda h, i, o, p, b: (o, b)):
                out[(qid, m[0])] = m[1]
        return out
    finally:
        store.close()


def test_healthy_group_quorum_two_of_three_every_send_ok(cluster_factory):
    c = start_group(cluster_factory, in_sync_replicas=2)
    with hamq.Producer(c.namesrv) as producer:
        for i in range(100):
            assert producer.send(Message("Rep", b"m%d" % i)).status is SendStatus.SEND_OK
        batch = [Message("Rep", b"b%d" % i) for i in range(64)]
        assert producer.send_batch(batch).status is SendStatus.SEND_OK


def test_killed_master_loses_no_acknowledged_message(cluster_factory):
    c = start_group(cluster_factory, in_sync_replicas=2)
    acked: dict[tuple[int, int], bytes] = {}
    with hamq.Producer(c.namesrv) as producer:
        for i in range(300):
            body = os.urandom(200) + b"#%d" % i
            result = producer.send(Message("Rep", body))
            assert result.status is SendStatus.SEND_OK
            acked[(result.queue.queue_id, result.queue_offset)] = body
    c.procs["master"].kill9()  # right after the last acknowledgement
    # Consumers keep reading: the route falls over to a slave (slave read).
    with hamq.PullConsumer("after-failover", c.namesrv) as consumer:
        seen = {}
        for mq in consumer.fetch_message_queues("Rep"):
            offset = 0
            while (r := consumer.pull(mq, offset, 100)).status is PullStatus.FOUND:
                seen.update({(mq.queue_id, m.queue_offset): m.body for m in r.messages})
                offset = r.next_begin_offset
    assert seen, "nothing readable from the slaves"
    for name in ("slave1", "slave2"):
        c.procs[name].stop()
    on_slaves = [read_store(c.root / name) for name in ("slave1", "slave2")]
    for key, body in acked.items():
        assert any(s.get(key) == body for s in on_slaves), f"acknowledged {key} lost"
    for s in on_slaves:  # and what a slave has is exactly what was sent
        assert all(acked[k] == v for k, v in s.items())


def _send_for(producer, seconds: float) -> list[tuple[float, str]]:
    """Sends one message at a time for ``seconds``; (time, outcome) of each."""
    outcomes = []
    start = time.monotonic()
    i = 0
    while time.monotonic() - start < seconds:
        try:
            status = producer.send(Message("Rep", b"x%d" % i)).status.value
        except InSyncReplicasNotEnough:
            status = "IN_SYNC_REPLICAS_NOT_ENOUGH"
            time.sleep(0.1)
        outcomes.append((time.monotonic() - start, status))
        i += 1
    return outcomes


@pytest.mark.slow
def test_hung_slave_with_auto_degradation_sends_keep_succeeding(cluster_factory):
    c = start_group(cluster_factory, in_sync_replicas=3, min_in_sync_replicas=2,
                    enable_auto_in_sync_replicas=True)
    hung = c.procs["slave2"]
    with hamq.Producer(c.namesrv) as producer:
        assert producer.send(Message("Rep", b"before")).status is SendStatus.SEND_OK
        os.kill(hung.pid, signal.SIGSTOP)
        try:
            outcomes = _send_for(producer, 8.0)
        finally:
            os.kill(hung.pid, signal.SIGCONT)
    statuses = {s for _, s in outcomes}
    assert statuses <= {"SEND_OK", "FLUSH_SLAVE_TIMEOUT"}, statuses
    first_ok = next(t for t, s in outcomes if s == "SEND_OK")
    print(f"\nsends stalled {first_ok:.2f} s after the slave hung "
          f"(name-server timeout {NS_TIMEOUT_MS} ms)")
    assert first_ok < NS_TIMEOUT_MS / 1000 + 3.0
    assert all(s == "SEND_OK" for t, s in outcomes if t > first_ok + 1.5)


@pytest.mark.slow
def test_hung_slave_without_degradation_fails_then_recovers(cluster_factory):
    c = start_group(cluster_factory, in_sync_replicas=3, min_in_sync_replicas=2)
    hung = c.procs["slave2"]
    with hamq.Producer(c.namesrv) as producer:
        os.kill(hung.pid, signal.SIGSTOP)
        try:
            outcomes = _send_for(producer, 6.0)
        finally:
            os.kill(hung.pid, signal.SIGCONT)
        statuses = [s for _, s in outcomes]
        assert statuses[0] == "FLUSH_SLAVE_TIMEOUT"
        assert "IN_SYNC_REPLICAS_NOT_ENOUGH" in statuses
        assert "SEND_OK" not in statuses
        # After SIGCONT the slave catches up and is counted again.
        def ok_again():
            try:
                return producer.send(Message("Rep", b"after")).status is SendStatus.SEND_OK
            except InSyncReplicasNotEnough:
                return False
        wait_for(ok_again, 20, "sends to succeed after the slave resumed")


@pytest.mark.slow
def test_slave_restarted_after_missing_100mb_catches_up_and_rejoins(cluster_factory):
    c = start_group(cluster_factory, slaves=1, in_sync_replicas=2, min_in_sync_replicas=1,
                    enable_auto_in_sync_replicas=True)
    c.procs["slave1"].stop()
    body = os.urandom(1024)
    with hamq.Producer(c.namesrv) as producer:
        for _ in range(1600):  # 1600 x 64 KiB = 100 MiB, acknowledged by the master alone
            assert producer.send_batch([Message("Rep", body)] * 64).status is SendStatus.SEND_OK
    c.procs["slave1"].start()
    with hamq.Admin(c.namesrv) as admin:
        started = time.monotonic()
        wait_for(lambda: _ha(admin, c)["in_sync_slaves"] == 1, 60, "the slave back in sync")
        print(f"\nslave caught up 100 MiB in {time.monotonic() - started:.1f} s")
        behind = _ha(admin, c)["slaves"][0]["behind_bytes"]
        assert behind < 256 * 1024


def test_slave_ahead_of_its_master_refuses_to_continue(cluster_factory):
    """A slave holding bytes its master never had (the master's disk was replaced) must not
    be silently overwritten or extended: it suspends and says why."""
    c = start_group(cluster_factory, slaves=1, in_sync_replicas=1)
    with hamq.Producer(c.namesrv) as producer:
        for i in range(50):
            producer.send(Message("Rep", b"old%d" % i))
    with hamq.Admin(c.namesrv) as admin:
        wait_for(lambda: _ha(admin, c)["slaves"][0]["behind_bytes"] == 0, 10, "slave caught up")
        c.procs["master"].stop()
        import shutil
        shutil.rmtree(c.root / "master")  # a master that lost its disk comes back empty
        c.procs["master"].start()
        slave = c.broker_addr("slave1")
        ha = wait_for(lambda: (lambda h: h if h["state"] == "SUSPEND" else None)(
            admin.broker_runtime_info(slave)["ha"]), 15, "the slave to suspend")
    assert "diverged" in ha["diverged"]
    assert ha["replica_offset"] > 0  # its data is kept, not truncated
