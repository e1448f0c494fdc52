"""Master–slave replication with quorum writes and automatic in-sync degradation
(seed 000) on real processes: a master and two slaves, SIGSTOP for a hung ("fake dead")
slave, kill -9 for a dead master."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
import tomllib

import pytest

import hamq
from hamq import Message, SendStatus
from hamq.client.consumer import PullStatus
from hamq.config import StoreConfig
from hamq.errors import HamqError, InSyncReplicasNotEnough
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import encode_frame_bytes
from hamq.protocol.message import decode_records
from hamq.store.message_store import MessageStore
from helpers import wait_for

NS_TIMEOUT_MS = 3000


def start_group(cluster_factory, slaves: int = 2, **master_settings):
    c = cluster_factory()
    c.start_namesrv(
        scan_not_active_broker_interval_ms=500, broker_not_active_timeout_ms=NS_TIMEOUT_MS
    )
    settings = {
        "broker_role": "sync_master",
        "total_replicas": slaves + 1,
        "sync_flush_timeout_ms": 1000,
        **master_settings,
    }
    c.start_broker("master", **settings)
    for i in range(1, slaves + 1):
        c.start_broker(f"slave{i}", broker_id=i, broker_role="slave", total_replicas=slaves + 1)
    with hamq.Admin(c.namesrv) as admin:
        wait_for(
            lambda: (
                len(_ha(admin, c)["slaves"]) == slaves
                and all(s["state"] == "TRANSFER" for s in _ha(admin, c)["slaves"])
            ),
            15,
            "slaves connected",
        )
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
    seen = _pull_all(c.namesrv, "after-failover")
    assert seen, "nothing readable from the slaves"
    for name in ("slave1", "slave2"):
        c.procs[name].stop()
    on_slaves = [read_store(c.root / name) for name in ("slave1", "slave2")]
    for key, body in acked.items():
        assert any(s.get(key) == body for s in on_slaves), f"acknowledged {key} lost"
    for s in on_slaves:  # and what a slave has is exactly what was sent
        assert all(acked[k] == v for k, v in s.items())


HELD_SENDS = 50


class FreezeAtAck:
    """Pipelined sends to a master whose slaves are held (SIGSTOP). At the first SEND_OK
    the slaves are frozen for good and the master killed -9, so the slaves' stores keep
    what they held at that moment (a slave let run would still take what was on the wire
    when the master died)."""

    def __init__(self, master, slaves) -> None:
        self.master, self.slaves = master, slaves
        self.acked: dict[tuple[int, int], bytes] = {}
        self.frozen = threading.Event()
        self.answered = threading.Semaphore(0)
        self.lock = threading.Lock()  # a release and the freeze never interleave
        self.signal_slaves(signal.SIGSTOP)

    def signal_slaves(self, signum: int) -> None:
        for slave in self.slaves:
            os.kill(slave.pid, signum)

    def release_slaves(self) -> None:
        with self.lock:
            if not self.frozen.is_set():
                self.signal_slaves(signal.SIGCONT)

    def send(self, producer, body: bytes) -> None:
        def done(result, err) -> None:
            if err is None and result.status is SendStatus.SEND_OK:
                with self.lock:
                    if not self.frozen.is_set():
                        self.signal_slaves(signal.SIGSTOP)
                        os.kill(self.master.pid, signal.SIGKILL)
                        self.frozen.set()
                self.acked[(result.queue.queue_id, result.queue_offset)] = body
            self.answered.release()

        producer.send_async(Message("Rep", body), done)

    def held_sends_stored(self, namesrv: str, count: int) -> bool:
        """The master stored all ``count`` sends, or it answered one (and is dead now)."""
        try:
            with hamq.PullConsumer("g-count", namesrv) as consumer:
                stored = sum(consumer.max_offset(mq) for mq in consumer.fetch_message_queues("Rep"))
        except HamqError:
            stored = -1
        return self.frozen.is_set() or stored == count


def test_an_acknowledged_quorum_send_is_on_a_slave_the_moment_it_is_acknowledged(cluster_factory):
    """SEND_OK under in_sync_replicas = 2 means a slave holds the message already. The
    slaves are held (SIGSTOP) while the master takes a series of sends, then let go; at the
    first acknowledgement they are frozen again and the master killed, and every message
    acknowledged must be in a slave's store. A master that answered before a slave
    acknowledged answers while the slaves are held, and its messages are on no slave."""
    c = start_group(cluster_factory, in_sync_replicas=2, sync_flush_timeout_ms=20_000)
    master, slaves = c.procs["master"], [c.procs["slave1"], c.procs["slave2"]]
    with hamq.Producer(c.namesrv, retry_times_when_send_failed=0) as producer:
        sends = FreezeAtAck(master, slaves)
        for i in range(HELD_SENDS):
            sends.send(producer, os.urandom(1000) + b"#%d" % i)
        wait_for(
            lambda: sends.held_sends_stored(c.namesrv, HELD_SENDS),
            15,
            "the master to store every held send",
        )
        sends.release_slaves()
        for _ in range(HELD_SENDS):  # each send is answered, or fails with the master
            assert sends.answered.acquire(timeout=30), "a send never completed"
    assert sends.frozen.is_set() and sends.acked, "nothing was acknowledged"
    master.popen.wait(10)
    for slave in slaves:
        slave.kill9()  # frozen since the first acknowledgement: their stores as they were
    on_slaves = [read_store(c.root / name) for name in ("slave1", "slave2")]
    lost = [k for k, body in sends.acked.items() if not any(s.get(k) == body for s in on_slaves)]
    assert not lost, f"{len(lost)} of {len(sends.acked)} acknowledged sends on no slave"


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
    c = start_group(
        cluster_factory,
        in_sync_replicas=3,
        min_in_sync_replicas=2,
        enable_auto_in_sync_replicas=True,
    )
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
    print(
        f"\nsends stalled {first_ok:.2f} s after the slave hung "
        f"(name-server timeout {NS_TIMEOUT_MS} ms)"
    )
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
    # In sync again only within 256 KiB, not the default 256 MiB the slave starts within.
    c = start_group(
        cluster_factory,
        slaves=1,
        in_sync_replicas=2,
        min_in_sync_replicas=1,
        enable_auto_in_sync_replicas=True,
        ha_max_gap_not_in_sync=256 * 1024,
    )
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


def _pull_all(namesrv: str, group: str) -> dict[tuple[int, int], bytes]:
    """Every message of topic Rep the group's readable members serve."""
    with hamq.PullConsumer(group, namesrv) as consumer:
        seen = {}
        for mq in consumer.fetch_message_queues("Rep"):
            offset = 0
            while (r := consumer.pull(mq, offset, 100)).status is PullStatus.FOUND:
                seen.update({(mq.queue_id, m.queue_offset): m.body for m in r.messages})
                offset = r.next_begin_offset
    return seen


def _commit_log(path) -> bytes:
    store = MessageStore(StoreConfig(store_dir=str(path), disk_min_free_bytes=1))
    try:
        log = store.commitlog
        return bytes(log.read_range(log.min_offset, log.max_offset))
    finally:
        store.close()


def _lose_tail(path, keep_records: int) -> int:
    """What a power loss does to a master with async flush: its commit log (and the
    checkpoint and queues that vouch for it) back to an earlier record boundary."""
    store = MessageStore(StoreConfig(store_dir=str(path), disk_min_free_bytes=1))
    try:
        cut = sorted(p for cq in store.queues.values() for p in cq.phys)[keep_records]
        store.truncate_to(cut)
        return cut
    finally:
        store.close()


def _caught_up(admin, c) -> bool:
    ha = _ha(admin, c)
    return [(s["state"], s["behind_bytes"]) for s in ha["slaves"]] == [("TRANSFER", 0)]


def test_slave_holding_a_tail_its_master_lost_takes_the_masters_records(cluster_factory):
    """Defect 2 of issue 10: the slave kept its copy of the tail the master lost and, once
    the master had written past it, continued at its own end: different messages at the
    same offsets, counted in sync. It must cut back to where both logs agree."""
    c = start_group(cluster_factory, slaves=1, broker_role="async_master")
    with hamq.Producer(c.namesrv) as producer, hamq.Admin(c.namesrv) as admin:
        for i in range(100):
            producer.send(Message("Rep", b"before-%03d" % i))
        wait_for(lambda: _caught_up(admin, c), 15, "slave caught up")
        slave_end = _ha(admin, c)["slaves"][0]["ack_offset"]
        c.procs["master"].stop()
        cut = _lose_tail(c.root / "master", keep_records=60)
        c.procs["master"].start()
        # Other messages at the lost offsets and past the slave's end; the same sizes, so
        # the slave's end is also a record boundary of the master's new log.
        for i in range(100):
            producer.send(Message("Rep", b"after--%03d" % i))
        wait_for(lambda: _caught_up(admin, c), 30, "slave caught up with the new master log")
        slave_ha = admin.broker_runtime_info(c.broker_addr("slave1"))["ha"]
    c.procs["master"].stop()
    on_master = read_store(c.root / "master")
    served = _pull_all(c.namesrv, "read-from-the-slave")  # the master is down: slave reads
    assert served == on_master
    c.procs["slave1"].stop()
    master_log, slave_log = _commit_log(c.root / "master"), _commit_log(c.root / "slave1")
    assert len(master_log) > slave_end
    assert slave_log == master_log
    assert slave_ha.get("last_cut") == {"offset": cut, "bytes": slave_end - cut}
    assert "cutting" in (c.root / "slave1.log").read_text()


def test_slave_ahead_of_a_master_that_lost_its_disk_follows_the_master(cluster_factory):
    """A slave holding bytes its master no longer has (the master's disk was replaced) cuts
    them, loudly, instead of keeping different records at offsets the master reuses."""
    c = start_group(cluster_factory, slaves=1, in_sync_replicas=1)
    with hamq.Producer(c.namesrv) as producer, hamq.Admin(c.namesrv) as admin:
        for i in range(50):
            producer.send(Message("Rep", b"old%d" % i))
        wait_for(lambda: _caught_up(admin, c), 10, "slave caught up")
        c.procs["master"].stop()
        shutil.rmtree(c.root / "master")  # a master that lost its disk comes back empty
        c.procs["master"].start()
        admin.create_topic("Rep", 2)
        for i in range(5):
            producer.send(Message("Rep", b"new%d" % i))
        wait_for(lambda: _caught_up(admin, c), 15, "slave following the new log")
        slave_ha = admin.broker_runtime_info(c.broker_addr("slave1"))["ha"]
    assert slave_ha["last_cut"]["offset"] == 0
    for name in ("master", "slave1"):
        c.procs[name].stop()
    assert _commit_log(c.root / "slave1") == _commit_log(c.root / "master")


def test_a_stale_session_of_a_slave_is_closed_when_it_handshakes_again(cluster_factory, raw_conn):
    """Defect 7 of issue 10: a half-open session (the slave crashed, its old connection not
    yet noticed) stayed next to the new one and counted as a second in-sync replica."""
    c = start_group(cluster_factory, slaves=1, in_sync_replicas=2)
    ha_addr = tomllib.loads((c.root / "master.toml").read_text())["ha_listen"]
    stale = raw_conn(ha_addr)  # poses as slave 1 with an empty log
    stale.send(
        encode_frame_bytes(
            RequestCode.HA_HANDSHAKE, 1, ext={"broker_id": 1, "attach": 0, "proof": None}
        )
    )
    assert stale.read_frame().ext == {"start_offset": 0}
    # The real slave 1 reconnects (its session was the one replaced) and replaces ours.
    assert stale.closed_by_server()
    with hamq.Admin(c.namesrv) as admin:
        wait_for(lambda: _caught_up(admin, c), 10, "slave 1 back")
        assert _ha(admin, c)["in_sync_slaves"] == 1


def test_slave_behind_what_retention_removed_restarts_at_the_masters_first_byte(cluster_factory):
    """A slave stopped while attached, and retention removed the segments it was to
    receive next: the master cannot ship them, so it must end the session (the slave then
    handshakes again and restarts at the master's first byte). It used to read the log at
    a negative position on every ack, and the slave, still heartbeating, never caught up."""
    segment = 64 * 1024
    c = start_group(
        cluster_factory,
        slaves=1,
        broker_role="async_master",
        mapped_file_size_commitlog=segment,
        ha_window_bytes=segment,
        ha_transfer_batch_bytes=16 * 1024,
        file_reserved_hours=1.0 / 3600,
        clean_resource_interval_ms=200,
    )
    slave = c.procs["slave1"]
    with hamq.Producer(c.namesrv) as producer, hamq.Admin(c.namesrv) as admin:
        producer.send(Message("Rep", b"first"))
        wait_for(lambda: _caught_up(admin, c), 10, "slave caught up")
        os.kill(slave.pid, signal.SIGSTOP)
        try:
            for i in range(10 * segment // 1000):
                producer.send(Message("Rep", b"%06d" % i + bytes(994)))
            # the segments the slave has not received are older than the retention time
            time.sleep(1.5)
            producer.send(Message("Rep", b"last"))
            wait_for(
                lambda: (
                    admin.broker_runtime_info(c.broker_addr("master"))["commitlog_min_offset"]
                    > 3 * segment
                ),
                10,
                "retention on the master",
            )
        finally:
            os.kill(slave.pid, signal.SIGCONT)
        wait_for(lambda: _caught_up(admin, c), 15, "slave restarted at the master's log")
        info = admin.broker_runtime_info(c.broker_addr("slave1"))
    assert info["commitlog_min_offset"] > 3 * segment  # it did restart there
    for name in ("master", "slave1"):
        c.procs[name].stop()
    master_log, slave_log = _commit_log(c.root / "master"), _commit_log(c.root / "slave1")
    assert master_log.endswith(slave_log) or slave_log.endswith(master_log)
