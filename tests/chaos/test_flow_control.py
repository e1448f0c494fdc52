"""Flow control on a mirrored group (issue 16, seed 003): a controller-mode group whose
sends wait for every member of the SyncStateSet (all-ack), one cluster for the module.

Credit: a pipelined producer floods the group and one synchronised mirror is frozen
(SIGSTOP) for ``FREEZE_S``: no send can be confirmed, so the master must stop reading the
producer once the sends waiting for acks hold ``max_unconfirmed_bytes`` — its commit log
grows by about the credit, not by everything the producer has in flight — and its
memory stays bounded (the HA window to the frozen mirror included). After SIGCONT every
acknowledged send is readable. Alarms: limits changed at run time (UPDATE_BROKER_CONFIG)
set off the disk and memory alarms; the producer sees ``blocked`` and its send waits,
neither refused nor stored, until the limits are raised again."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from controller_group import (
    MEMBERS,
    TOPIC,
    Ack,
    assert_acked_readable,
    body_of,
    commit_offset,
    module_group,
    read_all,
)

import hamq
from hamq import Message, SendStatus
from hamq.client.producer import AsyncProducer
from hamq.protocol.codes import RequestCode
from helpers import wait_for

MIB = 1024 * 1024
CREDIT = MIB  # max_unconfirmed_bytes of the members
BODY_REPEAT = 60  # a body of about 16 KiB
WINDOW = 1024  # the producer's sends in flight: about 16 MiB, far past the credit
SEND_TIMEOUT_S = 60.0  # no send may time out while the mirror is frozen
FREEZE_S = 12.0
RSS_GROWTH_BOUND = 200 * MIB
# What the master may store past the credit before it stops reading: one read of the
# producer's connection (at most 1 MiB) and the send that crossed the bound.
OVERSHOOT = 2 * MIB
SETTINGS = {
    "max_unconfirmed_bytes": CREDIT,
    # the frozen mirror stays in the SyncStateSet and its session open throughout: only
    # credit can hold the producer back
    "ha_max_time_slave_not_catchup_ms": 120_000,
    "ha_housekeeping_interval_ms": 120_000,
    "sync_flush_timeout_ms": 120_000,
}


def big_body(n: int) -> bytes:
    return body_of(n) * BODY_REPEAT


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    with module_group(tmp_path_factory, "flow", **SETTINGS) as g:
        yield g


class Flood(threading.Thread):
    """A pipelined producer: ``WINDOW`` sends in flight at all times, each acknowledged
    one noted with when its answer came."""

    def __init__(self, namesrv: str) -> None:
        super().__init__(daemon=True)
        self.namesrv = namesrv
        self.acks: list[Ack] = []
        self.failed: list[str] = []
        self.stop_flag = threading.Event()

    def acked_between(self, t0: float, t1: float) -> int:
        return sum(1 for a in self.acks if t0 <= a.at < t1)

    def run(self) -> None:
        asyncio.run(self._flood())

    async def _flood(self) -> None:
        producer = AsyncProducer(self.namesrv, send_timeout_s=SEND_TIMEOUT_S)
        room = asyncio.Semaphore(WINDOW)
        try:
            await producer.warm_up(TOPIC)
            for n in range(1_000_000):
                if self.stop_flag.is_set():
                    break
                await room.acquire()
                producer.send_async(Message(TOPIC, big_body(n)), self._answered(room, n))
            for _ in range(WINDOW):  # every send answered
                await asyncio.wait_for(room.acquire(), SEND_TIMEOUT_S + 10)
        finally:
            await producer.close()

    def _answered(self, room: asyncio.Semaphore, n: int):
        began = time.monotonic()

        def done(result, err) -> None:
            room.release()
            if err is None and result.status is SendStatus.SEND_OK:
                self.acks.append(
                    Ack(
                        big_body(n),
                        result.queue.queue_id,
                        result.queue_offset,
                        commit_offset(result.msg_id),
                        began,
                        time.monotonic(),
                    )
                )
            else:
                self.failed.append(repr(err) if err is not None else result.status.name)

        return done

    def finish(self) -> None:
        self.stop_flag.set()
        self.join(SEND_TIMEOUT_S + 20)
        assert not self.is_alive(), "the producer did not finish"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def test_a_frozen_mirror_holds_producers_back_by_credit_and_loses_nothing(group):
    master = group.master()
    mirror = sorted(m for m in MEMBERS if m != master)[0]
    pid = group.c.procs[master].pid
    flood = Flood(group.c.namesrv)
    flood.start()
    try:
        wait_for(lambda: len(flood.acks) >= 200, 60, "the flood under way")
        t0 = time.monotonic()
        time.sleep(2.0)  # a throughput sample: how many sends are acknowledged in 2 s
        before_per_s = flood.acked_between(t0, time.monotonic()) / 2.0
        rss_before = rss_bytes(pid)

        group.freeze(mirror)
        frozen_at = time.monotonic()
        log_at_freeze = group.log_end(master)
        rss_peak, held_at_most, out_of_credit = rss_before, 0, False
        while time.monotonic() - frozen_at < FREEZE_S:  # bounded: FREEZE_S of samples
            flow = group.info(master).get("flow", {})
            out_of_credit |= flow.get("out_of_credit", False)
            held_at_most = max(held_at_most, flow.get("unconfirmed_bytes", 0))
            rss_peak = max(rss_peak, rss_bytes(pid))
            time.sleep(0.2)
        stored_while_frozen = group.log_end(master) - log_at_freeze
        during_per_s = flood.acked_between(frozen_at + 1.0, time.monotonic()) / (FREEZE_S - 1)
        print(
            f"\nflow control: {before_per_s:.0f} acks/s before the freeze, {during_per_s:.1f} "
            f"during it; master stored {stored_while_frozen / MIB:.1f} MiB while frozen "
            f"(credit {CREDIT / MIB:.0f} MiB, producer window {WINDOW * len(big_body(0)) / MIB:.0f}"
            f" MiB); sends held at most {held_at_most / MIB:.1f} MiB; master RSS "
            f"{rss_before / MIB:.0f} -> peak {rss_peak / MIB:.0f} MiB "
            f"(+{(rss_peak - rss_before) / MIB:.0f} MiB)"
        )
        assert stored_while_frozen <= CREDIT + OVERSHOOT, "the master kept reading the producer"
        assert rss_peak - rss_before < RSS_GROWTH_BOUND
        assert during_per_s < before_per_s / 10
        assert out_of_credit, "the master never ran out of credit"
        assert held_at_most <= CREDIT + OVERSHOOT
    finally:
        group.thaw(mirror)
    thawed_at = time.monotonic()
    wait_for(lambda: flood.acked_between(thawed_at, 1e18) >= WINDOW, 60, "sends after the thaw")
    flood.finish()
    assert not flood.failed, f"sends failed: {flood.failed[:5]}"
    assert_acked_readable(flood.acks, read_all(group.c.namesrv))
    group.wait_full_sync_state_set()


def test_alarms_block_the_producer_until_the_limits_are_raised(group):
    master = group.master()
    addr = group.c.broker_addr(master)

    def limits(**values: int) -> list[str]:
        frame = group.invoke(addr, RequestCode.UPDATE_BROKER_CONFIG, values)
        return frame.ext["alarms"]

    with hamq.Producer(group.c.namesrv, send_timeout_s=SEND_TIMEOUT_S) as producer:
        assert producer.send(Message(TOPIC, body_of(-1))).status is SendStatus.SEND_OK
        assert producer.blocked is None
        assert limits(disk_free_limit_bytes=1 << 62) == ["disk"]  # more than any disk
        wait_for(lambda: producer.blocked == "disk", 10, "the producer told of the disk alarm")
        assert limits(memory_high_watermark_bytes=1) == ["memory", "disk"]
        wait_for(lambda: producer.blocked == "memory", 10, "the producer told of the memory alarm")
        assert group.info(master)["flow"]["blocked"] == "memory"

        log_end = group.log_end(master)
        answers: list = []
        producer.send_async(Message(TOPIC, body_of(-2)), lambda r, e: answers.append((r, e)))
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # watched for a second: it waits, unread
            assert not answers, f"a blocked send was answered: {answers}"
            time.sleep(0.1)
        assert group.log_end(master) == log_end

        assert limits(memory_high_watermark_bytes=0) == ["disk"]
        wait_for(lambda: producer.blocked == "disk", 10, "told the disk alarm still holds")
        assert not answers
        assert limits(disk_free_limit_bytes=0) == []
        wait_for(lambda: producer.blocked is None, 10, "the producer told of the unblock")
        wait_for(lambda: answers, 10, "the held send answered")
    result, err = answers[0]
    assert err is None and result.status is SendStatus.SEND_OK
    stored = read_all(group.c.namesrv)
    assert stored[(result.queue.queue_id, result.queue_offset)] == body_of(-2)
