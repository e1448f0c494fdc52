"""Wall-clock jumps on a quorum master-slave group (sync_master, in_sync_replicas 2 of 3,
sync flush) and its name server, each process under libfaketime on its own faketime file:
a process's wall clock may say anything (NTP step, resumed VM) and none decides whether a
member is alive or a slave in sync (hamq.clock: monotonic for liveness). So while each
process's clock in turn jumps forward and back by 60..600 s the master keeps acknowledging
sends — no refusal (InSyncReplicasNotEnough), no gap longer than ACK_GAP_S, both slaves in
sync at the end of every jump — and everything acknowledged is readable where it was."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import hamq
from hamq import Message
from hamq.chaos.clock_faults import LIBFAKETIME
from hamq.chaos.disk_faults import DiskFaults
from hamq.client.consumer import PullStatus
from hamq.errors import HamqError
from helpers import topic_routed, wait_for

pytestmark = pytest.mark.skipif(not LIBFAKETIME.exists(), reason="libfaketime not installed")

TOPIC = "ClockJump"
QUEUES = 4
NAMESRV = "ns1"
MEMBERS = ("m1", "m2", "m3")  # m1 the sync master
JUMPS_S = (63, -155, 600, -600)
JUMP_HOLD_S = 3.0  # each jump lasts this long (sends keep flowing), then the clock is reset
ACK_GAP_S = 2.0  # no real outage here: a longer gap between acks is a broken member
# one send at a time takes a few ms on loopback, even on a loaded machine; a clock setup
# that slows a process's thread hand-offs (libfaketime's monotonic fix) makes ~5/s
MIN_ACKS_PER_WINDOW = 30
SEND_TIMEOUT_S = 3.0
GROUP = {
    "total_replicas": 3,
    "in_sync_replicas": 2,
    "min_in_sync_replicas": 2,
    "flush_disk_type": "sync",
    "broker_heartbeat_interval_ms": 500,
    "ha_send_heartbeat_interval_ms": 200,
    "sync_broker_member_group_period_ms": 300,
}


def start_group(c, disks: DiskFaults, monkeypatch) -> None:
    """The name server and each member on their own faketime file (host = process name)."""
    with clock_of(NAMESRV, disks, monkeypatch):
        c.start_namesrv(
            NAMESRV, scan_not_active_broker_interval_ms=300, broker_not_active_timeout_ms=2000
        )
    for broker_id, member in enumerate(MEMBERS):
        with clock_of(member, disks, monkeypatch):
            c.start_broker(
                member,
                broker_id=broker_id,
                broker_role="slave" if broker_id else "sync_master",
                **GROUP,
            )


@contextmanager
def clock_of(host: str, disks: DiskFaults, monkeypatch) -> Iterator[None]:
    """The harness starts a server with os.environ: ``host``'s libfaketime variables."""
    with monkeypatch.context() as env:
        for name, value in disks.env(host, shim=False, clock=True).items():
            env.setenv(name, value)
        yield


def in_sync_slaves(admin: hamq.Admin, addr: str) -> int:
    return admin.broker_runtime_info(addr)["ha"]["in_sync_slaves"]


def test_wall_clock_jumps_on_any_member_refuse_no_send_and_lose_nothing(
    cluster_factory, tmp_path, monkeypatch
):
    c = cluster_factory()
    disks = DiskFaults(tmp_path / "run")
    try:
        start_group(c, disks, monkeypatch)
        acked: dict[bytes, tuple[int, int]] = {}
        refused: list[str] = []
        gaps: list[tuple[str, float]] = []
        dropped: list[str] = []  # windows at whose end a slave was out of sync
        slow: list[tuple[str, int]] = []  # windows with fewer than MIN_ACKS_PER_WINDOW acks
        with (
            hamq.Admin(c.namesrv) as admin,
            hamq.Producer(
                c.namesrv, send_timeout_s=SEND_TIMEOUT_S, retry_times_when_send_failed=0
            ) as producer,
        ):
            admin.create_topic(TOPIC, QUEUES)
            wait_for(lambda: topic_routed(admin, TOPIC), 15, "the topic routed")
            master = c.broker_addr("m1")
            wait_for(lambda: in_sync_slaves(admin, master) == 2, 15, "both slaves in sync")
            last_ack = time.monotonic()
            for member in (*MEMBERS, NAMESRV):
                for jump_s in JUMPS_S:
                    window = f"{member} {jump_s:+d}s"
                    disks.clock.jump(member, jump_s)
                    acked_before = len(acked)
                    until = time.monotonic() + JUMP_HOLD_S
                    while time.monotonic() < until:
                        body = b"%d-%s" % (len(acked), window.encode())
                        try:
                            result = producer.send(Message(TOPIC, body))
                        except HamqError as err:
                            refused.append(f"{window}: {err}")
                            continue
                        now = time.monotonic()
                        if now - last_ack > ACK_GAP_S:
                            gaps.append((window, round(now - last_ack, 2)))
                        last_ack = now
                        acked[body] = (result.queue.queue_id, result.queue_offset)
                    if len(acked) - acked_before < MIN_ACKS_PER_WINDOW:
                        slow.append((window, len(acked) - acked_before))
                    if in_sync_slaves(admin, master) != 2:
                        dropped.append(window)
                    disks.clock.reset(member)
        assert not refused, f"{len(refused)} sends refused, first: {refused[:3]}"
        assert not gaps, f"acknowledgements stalled: {gaps}"
        assert not slow, f"acknowledgements slowed to a crawl: {slow}"
        assert not dropped, f"a slave fell out of sync under a clock jump: {dropped}"
        print(f"{len(acked)} acknowledged in {len(JUMPS_S) * (len(MEMBERS) + 1)} jump windows")
        readable = read_all(c.namesrv)
        read_at = {body: (queue_id, offset) for body, (queue_id, offset, _) in readable.items()}
        missing = [body for body, where in acked.items() if read_at.get(body) != where]
        assert acked and not missing, f"{len(missing)} of {len(acked)} acked lost: {missing[:5]}"
        # the jumps were real: the master stamped what it stored under its own +600 s
        ahead = [skew for body, (_, _, skew) in readable.items() if body.endswith(b"m1 +600s")]
        assert ahead and min(ahead) > 500_000, ahead[:5]
    finally:
        c.stop_all()
        disks.close()


def read_all(namesrv: str) -> dict[bytes, tuple[int, int, int]]:
    """Every message of TOPIC -> (queue id, queue offset, store time - born time in ms),
    each queue from its minimum."""
    got: dict[bytes, tuple[int, int, int]] = {}
    with hamq.PullConsumer("g-clock-jump", namesrv) as consumer:
        for mq in consumer.fetch_message_queues(TOPIC):
            offset = consumer.min_offset(mq)
            while (result := consumer.pull(mq, offset, 500)).status is PullStatus.FOUND:
                for m in result.messages:
                    skew = m.store_timestamp_ms - m.born_timestamp_ms
                    got[m.body] = (mq.queue_id, m.queue_offset, skew)
                offset = result.next_begin_offset
    return got
