"""Publisher flow control (broker/flow.py, broker/alarms.py): the alarm state machine from
a table of readings; credit and blocking over real sockets on 127.0.0.1, a real server
whose handler holds every send the way the send path holds one waiting for acks."""

from __future__ import annotations

import asyncio

import pytest

from hamq.broker.alarms import (
    AlarmEdge,
    AlarmLimits,
    AlarmState,
    Reading,
    Resource,
    ResourceMonitor,
    read_rss_bytes,
)
from hamq.broker.flow import PublisherFlow
from hamq.client.producer import AsyncProducer
from hamq.config import BrokerConfig
from hamq.errors import InvalidArgument
from hamq.net.connection import Connection, connect, response_pieces
from hamq.net.metrics import REGISTRY, remove_gauges
from hamq.net.server import Server
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, FrameDecoder
from helpers import free_port, until

MIB = 1024 * 1024
ON, OFF = True, False

# (rss MiB, free MiB) -> edges, with a 100 MiB watermark and a 50 MiB disk limit, in order
ALARM_SCRIPT = [
    ((10, 500), []),
    ((99, 500), []),
    ((100, 500), [(Resource.MEMORY, ON)]),  # at the watermark
    ((150, 500), []),  # still on: no second edge
    ((150, 49), [(Resource.DISK, ON)]),
    ((50, 49), [(Resource.MEMORY, OFF)]),
    ((50, 50), [(Resource.DISK, OFF)]),  # at the limit is enough free space
    ((200, 10), [(Resource.MEMORY, ON), (Resource.DISK, ON)]),
    ((1, 1000), [(Resource.MEMORY, OFF), (Resource.DISK, OFF)]),
]


def test_alarms_go_on_and_off_once_per_crossing():
    state = AlarmState(AlarmLimits(100 * MIB, 50 * MIB))
    for (rss, free), expected in ALARM_SCRIPT:
        edges = state.check(Reading(rss * MIB, free * MIB))
        assert [(e.resource, e.on) for e in edges] == expected, (rss, free)
        assert all(isinstance(e, AlarmEdge) and "MiB" in e.detail for e in edges)
    assert state.blocked is None


def test_memory_blocks_first_and_a_zero_watermark_never_alarms():
    state = AlarmState(AlarmLimits(0, 50 * MIB))
    assert state.check(Reading(1 << 40, 10 * MIB)) == [
        AlarmEdge(Resource.DISK, ON, state.active[Resource.DISK])
    ]
    assert state.blocked is not None and state.blocked[0] == "disk"
    state.limits = AlarmLimits(MIB, 50 * MIB)  # UPDATE_BROKER_CONFIG lowers the watermark
    state.check(Reading(2 * MIB, 10 * MIB))
    assert state.blocked is not None and state.blocked[0] == "memory"
    assert "resident memory 2.0 MiB" in state.blocked[1]


def update(monitor: ResourceMonitor, **ext) -> list[str]:
    """UPDATE_BROKER_CONFIG through the monitor's handler; the alarms it answers."""
    request = Frame(RequestCode.UPDATE_BROKER_CONFIG, 7, 0, ext)
    pieces = monitor.update_config(None, request)  # type: ignore[arg-type] (no connection used)
    data = b"".join(bytes(p) for p in pieces)
    decoder = FrameDecoder()
    decoder.get_buffer(len(data))[: len(data)] = data
    (answer,) = decoder.buffer_updated(len(data))
    return answer.ext["alarms"]


def test_the_monitor_reads_this_process_and_takes_new_limits_at_once(tmp_path):
    flow = PublisherFlow(64 * MIB)
    monitor = ResourceMonitor(BrokerConfig(store_dir=str(tmp_path), disk_free_limit_bytes=0), flow)
    labels = {"broker_name": "flow-test", "broker_id": "0"}
    monitor.add_gauges(labels)
    try:
        monitor.check()
        assert flow.blocked is None and 10 * MIB < read_rss_bytes() < 10_000 * MIB
        assert update(monitor, memory_high_watermark_bytes=read_rss_bytes() // 2) == ["memory"]
        assert flow.blocked is not None and flow.blocked[0] == "memory"
        assert REGISTRY.get_sample_value("hamq_alarm", {**labels, "resource": "memory"}) == 1
        assert REGISTRY.get_sample_value("hamq_alarm", {**labels, "resource": "disk"}) == 0
        assert update(monitor, disk_free_limit_bytes=1 << 62, memory_high_watermark_bytes=0) == [
            "disk"
        ]
        assert flow.blocked is not None and flow.blocked[0] == "disk"
        for bad in ({"max_unconfirmed_bytes": 1}, {"disk_free_limit_bytes": -1}):
            with pytest.raises(InvalidArgument, match=next(iter(bad))):
                update(monitor, **bad)
        assert update(monitor, disk_free_limit_bytes=0) == [] and flow.blocked is None
    finally:
        remove_gauges(labels)
    assert REGISTRY.get_sample_value("hamq_alarm", {**labels, "resource": "memory"}) is None


class HoldingSends:
    """Holds every request as the send path holds one waiting for acks: it takes credit
    for the body and gives it back when answered."""

    def __init__(self, flow: PublisherFlow) -> None:
        self.flow = flow
        self.held: list[tuple[Connection, Frame]] = []
        self.seen = 0

    def handle(self, conn: Connection, frame: Frame) -> None:
        if frame.code == RequestCode.SEND_MESSAGE:
            if not conn.publishes:
                self.flow.publisher(conn)
            self.flow.take(len(frame.body))
            self.held.append((conn, frame))
            self.seen += 1
            return None
        return response_pieces(frame)

    def after_batch(self) -> None:
        pass

    def answer_all(self) -> None:
        held, self.held = self.held, []
        for conn, frame in held:
            self.flow.give(len(frame.body))
            conn.reply(response_pieces(frame))


async def serving(flow: PublisherFlow) -> tuple[HoldingSends, Server, str]:
    handler = HoldingSends(flow)
    server = Server(handler)
    server.on_connection_closed.append(flow.closed)
    address = f"127.0.0.1:{free_port()}"
    await server.start(address)
    return handler, server, address


BODY = b"x" * (64 * 1024)
SENDS = 64  # 4 MiB
CREDIT = 256 * 1024
# what one read may add past the bound before the connection is paused (reads of up to
# 1 MiB) and one more send
OVERSHOOT = MIB + len(BODY)


def test_credit_stops_reading_publishers_until_answers_bring_it_below_half():
    async def scenario() -> None:
        flow = PublisherFlow(CREDIT)
        handler, server, address = await serving(flow)
        client = await connect(address)
        try:
            futures = [
                client.request(RequestCode.SEND_MESSAGE, body=BODY, timeout_s=60)
                for _ in range(SENDS)
            ]
            rounds = 0
            while handler.seen < SENDS:
                rounds += 1
                assert rounds <= SENDS, "sends were not read as credit came back"
                await until(
                    lambda: flow.out_of_credit or handler.seen == SENDS, 30, "credit used up"
                )
                if flow.out_of_credit:
                    seen = handler.seen
                    await asyncio.sleep(0.05)  # a paused connection reads nothing more
                    assert handler.seen == seen
                    assert flow.unconfirmed_bytes <= CREDIT + OVERSHOOT
                handler.answer_all()
                assert flow.unconfirmed_bytes == 0 and not flow.out_of_credit
            assert rounds >= SENDS * len(BODY) // (CREDIT + OVERSHOOT)
            handler.answer_all()
            frames = await asyncio.wait_for(asyncio.gather(*futures), 30)
            assert len(frames) == SENDS  # nothing refused: every send was answered
            assert flow.credit_exhausted >= 2
        finally:
            client.close()
            await server.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("reason", ["memory", "disk"])
def test_an_alarm_blocks_publishers_only_and_tells_them(reason):
    async def scenario() -> None:
        flow = PublisherFlow(64 * MIB)
        handler, server, address = await serving(flow)
        producer = AsyncProducer("127.0.0.1:1")  # its handler: no name server is asked
        publisher = await connect(address, producer)
        reader = await connect(address)  # a consumer's connection: never held
        try:
            first = publisher.request(RequestCode.SEND_MESSAGE, body=b"a", timeout_s=60)
            await until(lambda: handler.seen == 1, 10, "the first send read")
            flow.block((reason, "over the limit"))
            await until(lambda: producer.blocked == reason, 10, "CONNECTION_BLOCKED")
            blocked = publisher.request(RequestCode.SEND_MESSAGE, body=b"b", timeout_s=60)
            await asyncio.wait_for(reader.request(RequestCode.HEART_BEAT), 10)
            handler.answer_all()
            await asyncio.wait_for(first, 10)
            await asyncio.sleep(0.1)  # the blocked send is not read, nor refused
            assert handler.seen == 1 and not blocked.done()
            flow.block(None)
            await until(lambda: producer.blocked is None, 10, "CONNECTION_UNBLOCKED")
            await until(lambda: handler.seen == 2, 10, "the blocked send read")
            handler.answer_all()
            await asyncio.wait_for(blocked, 10)
        finally:
            publisher.close()
            reader.close()
            await server.close()

    asyncio.run(scenario())


def test_a_publisher_connecting_during_an_alarm_is_told_and_held_after_its_first_send():
    async def scenario() -> None:
        flow = PublisherFlow(64 * MIB)
        handler, server, address = await serving(flow)
        flow.block(("disk", "free disk space 1.0 MiB, limit 50.0 MiB"))
        producer = AsyncProducer("127.0.0.1:1")
        publisher = await connect(address, producer)
        try:
            first = publisher.request(RequestCode.SEND_MESSAGE, body=b"a", timeout_s=60)
            await until(lambda: producer.blocked == "disk", 10, "CONNECTION_BLOCKED")
            second = publisher.request(RequestCode.SEND_MESSAGE, body=b"b", timeout_s=60)
            await asyncio.sleep(0.1)
            assert handler.seen == 1 and not second.done()
            flow.block(None)
            await until(lambda: handler.seen == 2, 10, "the held send read")
            handler.answer_all()
            await asyncio.wait_for(asyncio.gather(first, second), 10)
            publisher.close()
            await until(lambda: not flow.publishers, 10, "the closed publisher forgotten")
        finally:
            publisher.close()
            await server.close()

    asyncio.run(scenario())


def test_update_broker_config_names_keys_that_are_not_strings(tmp_path):
    """msgpack maps may have integer keys: the refusal names them, the limits stay."""
    monitor = ResourceMonitor(
        BrokerConfig(store_dir=str(tmp_path), disk_free_limit_bytes=0), PublisherFlow(MIB)
    )
    for ext in ({1: 2}, {1: 2, "max_unconfirmed_bytes": 3, "disk_free_limit_bytes": 1 << 62}):
        request = Frame(RequestCode.UPDATE_BROKER_CONFIG, 7, 0, ext)
        with pytest.raises(InvalidArgument, match="cannot change 1"):
            monitor.update_config(None, request)  # type: ignore[arg-type] (no connection used)
    assert monitor.state.limits.disk_free_limit_bytes == 0


def test_the_memory_alarm_clears_once_what_set_it_off_is_freed(tmp_path):
    """Bodies of 16 KiB freed but for one in 50 leave glibc's heap fragmented: RSS stays
    up until the allocator is asked to give memory back, so the alarm never cleared."""
    flow = PublisherFlow(MIB)
    monitor = ResourceMonitor(BrokerConfig(store_dir=str(tmp_path), disk_free_limit_bytes=0), flow)
    before = read_rss_bytes()
    bodies = [bytes([n % 251]) * (16 * 1024) for n in range(6400)]  # about 100 MiB
    assert update(monitor, memory_high_watermark_bytes=before + 50 * MIB) == ["memory"]
    kept = bodies[::50]
    del bodies
    monitor.check()
    assert flow.blocked is None, f"RSS {read_rss_bytes() / MIB:.0f} MiB after the free"
    assert len(kept) == 128


@pytest.mark.parametrize("credit", [1, 2])
def test_a_tiny_credit_still_lets_publishers_go_once_every_answer_is_out(credit):
    """With ``max_unconfirmed_bytes`` of 1 (the least the config takes), half the bound is 0
    and ``unconfirmed < 0`` never held: the first waiting send held its publisher for good."""

    async def scenario() -> None:
        flow = PublisherFlow(credit)
        handler, server, address = await serving(flow)
        client = await connect(address)
        try:
            for body in (b"x" * 10, b"y" * 2):
                sent = client.request(RequestCode.SEND_MESSAGE, body=body, timeout_s=30)
                await until(lambda: bool(handler.held), 10, "the send read")
                assert flow.out_of_credit
                handler.answer_all()
                assert flow.unconfirmed_bytes == 0 and not flow.out_of_credit
                await asyncio.wait_for(sent, 10)
        finally:
            client.close()
            await server.close()

    asyncio.run(scenario())
