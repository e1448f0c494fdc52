"""Issue 16 scope 4 (seed 003), real processes: a mirror that joins at the tail
(``ha_join = "tail"``, RabbitMQ's ``ha-sync-mode manual``) is unsynchronised and outside
the SyncStateSet until consumers pass its start; it leaves again when the need offset
drops below its start; SYNC_QUEUE copies it the history in batches of records while
producers keep sending and consumers keep reading; cancel sends it back to the tail.

One group of two members (controller embedded in the name server) for the module; the
steps run in order on it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

import hamq
from hamq import Message, SendStatus
from hamq.errors import HamqError
from hamq.protocol.codes import RequestCode
from harness import Cluster
from helpers import wait_for

GROUP = "mirror"
TOPIC = "Mirrored"
QUEUES = 2
HISTORY = 1500  # messages published before the mirror joins
BODY = bytes(1024)
BATCH = 16  # records per transfer while syncing
SETTLE_S = 30.0

# a mirrored-queue policy's group: controller mode, confirms from every synchronised mirror
MEMBER_SETTINGS = {
    "broker_name": GROUP,
    "enable_controller_mode": True,
    "all_ack_in_sync_state_set": True,
    # fast: elections, registrations, SyncStateSet checks (need offset), HA acks
    "controller_heartbeat_interval_ms": 300,
    "broker_heartbeat_interval_ms": 300,
    "sync_broker_metadata_period_ms": 500,
    "check_sync_state_set_period_ms": 200,
    "ha_send_heartbeat_interval_ms": 200,
}


class MirrorGroup:
    def __init__(self, c: Cluster) -> None:
        self.c = c
        c.start_namesrv(
            enable_controller_in_namesrv=True,
            scan_not_active_broker_interval_ms=300,
            broker_not_active_timeout_ms=2000,
        )
        c.start_broker("m1", controller_addr=c.namesrv_addrs, **MEMBER_SETTINGS)
        self.admin = hamq.Admin(c.namesrv)
        self.producer = hamq.Producer(c.namesrv)
        self.consumer = hamq.PullConsumer("g-drain", c.namesrv)

    def close(self) -> None:
        for client in (self.consumer, self.producer, self.admin):
            client.close()

    def ask(self, code: int, ext: dict | None = None) -> dict:
        core = self.admin.async_client.core
        frame = self.admin.submit(core.invoke(self.c.broker_addr("m1"), code, ext)).result(10)
        return frame.ext

    def status(self) -> dict:
        return self.ask(RequestCode.GET_MIRROR_STATUS)

    def mirror(self) -> dict | None:
        """The mirror's entry in the master's status, once it is attached."""
        slaves = self.status()["members"][1:]
        return slaves[0] if slaves else None

    def effective_sync_state_set(self) -> list[int]:
        """The master's effective SyncStateSet: a join counts there at the ack that made it."""
        info = self.admin.broker_runtime_info(self.c.broker_addr("m1"))
        return info["ha"]["effective_sync_state_set"]

    def catch_up(self) -> dict:
        """Publish a little and wait until the mirror acked the master's whole log: the
        master checked it for a join at that ack (``maybe_expand``)."""
        self.publish(10)
        return wait_for(
            lambda: (m := self.mirror()) and m["ack_offset"] == self.status()["master_end"] and m,
            SETTLE_S,
            "m2 caught up",
        )

    def publish(self, n: int) -> None:
        """``n`` single sends (one record each), pipelined, every one acknowledged."""
        done, failed = threading.Semaphore(0), []

        def sent(result, err) -> None:
            if err is not None or result.status is not SendStatus.SEND_OK:
                failed.append(err or result.status)
            done.release()

        for _ in range(n):
            self.producer.send_async(Message(TOPIC, BODY), sent)
        for _ in range(n):
            assert done.acquire(timeout=SETTLE_S)
        assert not failed, failed[:3]

    def commit_all(self, group: str, at_end: bool) -> None:
        """``group`` commits every queue's end (it consumed everything) or its start."""
        with hamq.PullConsumer(group, self.c.namesrv) as consumer:
            for mq in consumer.fetch_message_queues(TOPIC):
                offset = consumer.max_offset(mq) if at_end else consumer.min_offset(mq)
                consumer.commit_offset(mq, offset)


@pytest.fixture(scope="module")
def group(tmp_path_factory) -> Iterator[MirrorGroup]:
    c = Cluster(tmp_path_factory.mktemp("mirror"))
    try:
        g = MirrorGroup(c)
        try:
            yield g
        finally:
            g.close()
    finally:
        c.stop_all()


@pytest.fixture(scope="module")
def tail_mirror(group: MirrorGroup) -> dict:
    """m1 master with history, then m2 joining at the tail."""

    def topic_ready() -> bool:
        try:
            group.admin.create_topic(TOPIC, QUEUES)
            return True
        except HamqError:
            return False

    wait_for(topic_ready, SETTLE_S, "m1 master, the topic created")
    wait_for(lambda: group.ask(RequestCode.GET_MIRROR_STATUS), SETTLE_S, "m1 answers as master")
    group.publish(HISTORY)
    end = group.status()["master_end"]
    group.c.start_broker(
        "m2", controller_addr=group.c.namesrv_addrs, ha_join="tail", **MEMBER_SETTINGS
    )
    return wait_for(group.mirror, SETTLE_S, "m2 attached") | {"end_at_join": end}


def test_a_tail_mirror_starts_at_the_masters_end_and_stays_unsynchronised(group, tail_mirror):
    assert tail_mirror["log_start"] >= tail_mirror["end_at_join"] > 0
    for _ in range(5):  # caught up again and again, never admitted
        mirror = group.catch_up()
        assert mirror["broker_id"] not in group.effective_sync_state_set()
    status = group.status()
    master, mirror = status["members"]
    assert (master["address"], mirror["address"]) == tuple(map(group.c.broker_addr, ("m1", "m2")))
    assert status["need_offset"] < mirror["log_start"] and status["messages"] == HISTORY + 50
    assert not mirror["in_sync_state_set"] and not mirror["synchronised"], status
    assert not mirror["syncing"] and mirror["sync_progress"] == 0.0


def test_it_becomes_synchronised_once_consumers_pass_its_start(group, tail_mirror):
    group.commit_all("g-done", at_end=True)
    mirror = wait_for(
        lambda: (m := group.mirror()) and m["in_sync_state_set"] and m,
        SETTLE_S,
        "m2 in the SyncStateSet",
    )
    assert mirror["synchronised"] and mirror["log_start"] <= group.status()["need_offset"]


def test_it_leaves_when_the_need_offset_drops_below_its_start(group, tail_mirror):
    group.commit_all("g-new", at_end=False)  # a group that consumed nothing: all needed again
    wait_for(
        lambda: (m := group.mirror()) and not m["in_sync_state_set"],
        SETTLE_S,
        "m2 out of the SyncStateSet",
    )
    status = group.status()
    mirror = status["members"][1]
    assert status["need_offset"] < mirror["log_start"] and not mirror["synchronised"]


def test_cancel_sends_a_sync_back_to_the_tail(group, tail_mirror):
    before = group.mirror()
    assert group.ask(RequestCode.SYNC_QUEUE, {"batch_size": BATCH})["members"] == [
        before["broker_id"]
    ]
    assert group.mirror() is None or group.status()["members"][1]["syncing"]
    assert group.ask(RequestCode.SYNC_QUEUE, {"cancel": True})["members"] == [before["broker_id"]]
    mirror = wait_for(group.mirror, SETTLE_S, "m2 attached again")
    assert mirror["log_start"] >= before["log_start"] > 0  # the tail again, no history
    assert not mirror["syncing"] and not mirror["synchronised"]
    mirror = group.catch_up()
    assert mirror["broker_id"] not in group.effective_sync_state_set()
    assert not mirror["in_sync_state_set"] and not mirror["syncing"]


def test_sync_copies_the_history_in_batches_while_the_topic_serves(group, tail_mirror):
    sent_at: list[float] = []
    read_at: list[float] = []
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            try:
                if group.producer.send(Message(TOPIC, b"live")).status is SendStatus.SEND_OK:
                    sent_at.append(time.monotonic())
            except HamqError:
                time.sleep(0.05)

    def consume() -> None:
        queues = group.consumer.fetch_message_queues(TOPIC)
        offsets = {mq: group.consumer.max_offset(mq) for mq in queues}
        while not stop.is_set():
            for mq in queues:
                try:
                    got = group.consumer.pull(mq, offsets[mq], 32, suspend_timeout_ms=200)
                except HamqError:
                    continue
                offsets[mq] = got.next_begin_offset
                read_at.extend(time.monotonic() for _ in got.messages)

    threads = [threading.Thread(target=f, daemon=True) for f in (produce, consume)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: sent_at and read_at, SETTLE_S, "live traffic")
        begun = time.monotonic()
        affected = group.ask(RequestCode.SYNC_QUEUE, {"batch_size": BATCH})["members"]
        assert len(affected) == 1
        mirror = wait_for(
            lambda: (m := group.mirror()) and m["synchronised"] and m["in_sync_state_set"] and m,
            SETTLE_S,
            "m2 synchronised by the sync",
        )
        done = time.monotonic()
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert mirror["log_start"] == 0 and not mirror["syncing"] and mirror["sync_progress"] == 1.0
    # the topic kept serving: sends acknowledged and messages read while the mirror synced
    assert any(begun < t < done for t in sent_at) and any(begun < t < done for t in read_at)
    # at most BATCH records per transfer: the history (HISTORY + 50 records) took that
    # many batches at least, each a transfer the batch cut short
    assert mirror["sync_batches"] >= (HISTORY + 50) // BATCH - 1, mirror
