"""Under sync flush consumers read only what fsyncs made durable (``MessageStore.reads_end``),
while the broker's own readers and held requests must not be hurt by that cap (found by a
review of 5b30a13): a timer or delay level due before its message's fsync was taken for a
message retention removed and never delivered; a pop held after the send it waits for slept
its whole poll time; a reader woken by the cap that raised ended the group commit, so every
later send timed out. Each fsync here is stalled, so the window between write and fsync is
wide and certain."""

from __future__ import annotations

import asyncio
import time
import zlib

import pytest

from hamq.broker.escape import EscapeBridge
from hamq.broker.pop.service import PopService
from hamq.broker.pull import PullProcessor
from hamq.broker.role import BrokerRole, RoleState
from hamq.broker.schedule.service import ScheduleMessageService
from hamq.broker.stored_message import read_messages
from hamq.broker.topics import TopicService
from hamq.config import BrokerConfig
from hamq.protocol.frame import Frame
from hamq.protocol.message import encode_message
from hamq.protocol.properties import PROPERTY_DELAY_TIME_LEVEL, PROPERTY_TIMER_DELIVER_MS
from hamq.store.flush import FlushService
from hamq.store.message_store import MessageStore

TOPIC = "T"
STALL_S = 1.5  # each commit-log fsync takes this long
DEADLINE_S = 20.0
POLL_MS = 60_000  # a pop not woken by the fsync would wait this long


class Member:
    """A sync-flush master's store, group commit (fsyncs stalled) and TOPIC on one queue."""

    def __init__(self, root) -> None:
        self.config = BrokerConfig(
            store_dir=str(root), flush_disk_type="sync", long_polling_max_wait_ms=POLL_MS
        )
        self.store = MessageStore(self.config)
        self.role = RoleState(BrokerRole.MASTER, 0)
        self.topics = TopicService(
            self.store, self.role, default_queue_nums=1, auto_create=False, on_change=lambda: None
        )
        self.topics.create(TOPIC, 1, 1, 6, notify=False)
        log = self.store.commitlog
        detach = log.detach_flush

        def stalled():
            job = detach()

            def run() -> int:
                time.sleep(STALL_S)
                return job()

            return run

        log.detach_flush = stalled  # type: ignore[method-assign]
        self.flush = FlushService(self.store)

    def put(self, body: bytes) -> None:
        payload = encode_message(body)
        self.store.put_batch(TOPIC, 0, payload, 1, zlib.crc32(payload), 0)
        self.store.commit()


async def until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("kind", ["timer", "delay level"])
def test_a_message_due_before_its_fsync_is_delivered(tmp_path, kind):
    member = Member(tmp_path)
    store = member.store

    async def run() -> list[bytes]:
        member.flush.start()
        schedule = ScheduleMessageService(
            store,
            member.flush,
            member.role,
            EscapeBridge(member.config),
            on_put=lambda topic, queue_id: None,
            after_put=store.commit,
            flush_interval_ms=10**6,
        )
        schedule.start()
        schedule.start_delivery()
        try:
            # due well before the fsync of the send that carries it ends
            props = (
                {PROPERTY_TIMER_DELIVER_MS: str(store.clock_ms() + 200)}
                if kind == "timer"
                else {PROPERTY_DELAY_TIME_LEVEL: "1"}
            )
            schedule.put_message(TOPIC, 0, props, b"due", 0)
            store.commit()
            durable: list[bool] = []
            member.flush.wait_flushed(store.commitlog.max_offset, durable.append)
            await until(lambda: durable, "the send's fsync")
            assert durable == [True]
            await until(lambda: store.readable_max_offset(TOPIC, 0) > 0, f"the {kind} delivered")
            return [m.body for m in read_messages(store, TOPIC, 0, 0, 10)]
        finally:
            await schedule.stop()
            await member.flush.stop()

    assert asyncio.run(run()) == [b"due"]


class Conn:
    is_closed = False

    def __init__(self) -> None:
        self.replies: list[list] = []

    def reply(self, pieces) -> None:
        self.replies.append(pieces)

    def reply_when_drained(self, answer) -> None:
        self.replies.append(answer())


def test_a_pop_that_comes_between_a_send_and_its_fsync_is_answered_by_the_fsync(tmp_path):
    """No pop was held when the message arrived, so no arrival wakes it: the cap rising
    must. Without that it is answered only when its poll time (60 s) runs out."""
    member = Member(tmp_path)
    store = member.store

    async def run() -> Conn:
        member.flush.start()
        pull = PullProcessor(store, member.topics, POLL_MS)
        pop = PopService(
            store,
            member.topics,
            member.flush,
            member.role,
            member.config,
            on_written=lambda: None,
            on_put=lambda topic, queue_id: None,
        )
        pull.watch_arrivals(pop.held, pop.serve_arrivals)
        await pop.start()
        conn = Conn()
        try:
            member.put(b"m")
            pull.message_arrived(TOPIC, 0)  # what a send does after its write
            pull.serve_arrivals()
            ext = {
                "group": "g",
                "topic": TOPIC,
                "queue_id": 0,
                "max_msgs": 1,
                "invisible_time_ms": 60_000,
                "poll_time_ms": POLL_MS,
            }
            answer = pop.pop(conn, Frame(200050, 1, ext=ext))
            assert answer is None, "served before its fsync"
            await until(lambda: conn.replies, "the pop answered once the send was fsynced")
            return conn
        finally:
            await pop.stop()
            await member.flush.stop()

    conn = asyncio.run(run())
    assert len(conn.replies) == 1
    assert b"m" in b"".join(bytes(p) for p in conn.replies[0] if isinstance(p, bytes | bytearray))


def test_a_reader_woken_by_the_cap_that_fails_does_not_stop_the_group_commit(tmp_path):
    member = Member(tmp_path)
    store = member.store
    calls: list[int] = []

    def failing_once() -> None:
        calls.append(store.reads_end)
        if len(calls) == 1:
            raise RuntimeError("a held pop's answer failed")

    store.read_cap_listeners.append(failing_once)

    async def run() -> list[bool]:
        member.flush.start()
        try:
            durable: list[bool] = []
            for n, body in enumerate((b"first", b"second"), 1):
                member.put(body)
                member.flush.wait_flushed(store.commitlog.max_offset, durable.append)
                await until(lambda n=n: len(durable) == n, "the send's fsync")
            return durable
        finally:
            await member.flush.stop()

    assert asyncio.run(run()) == [True, True]
    assert len(calls) >= 2
    assert store.readable_max_offset(TOPIC, 0) == 2
