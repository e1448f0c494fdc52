"""``hamq bench acting-master``: how soon a master–slave group whose master died is served
again by its slave acting master (seed 004), and how fast that acting master escapes a
backlog of due delay messages into another group's master.

The bench starts its own name server and two groups as child processes (A: a master and a
slave; B: a master), with slave acting master and remote escape on. Before the kill it
gives A (i) the backlog: ``escape_backlog`` timer messages all due at one instant after the
kill, and (ii) probes: one timer message due every ``PROBE_STEP_MS`` from the kill on. It
then ``kill -9``s A's master and measures, from the kill: (a) the route naming A's slave
brokerId 0, (b) the first LOCK_BATCH_MQ granting a queue of A, (c) the first probe stored in
B's master (only an escape puts it there); and the escape throughput: backlog messages
stored in B's master per second, counted with GET_MAX_OFFSET on B every ``POLL_S``, from the
last look that found none to the look that found them all. At the end B's backlog is read
back and checked for missing and repeated messages.
Every process the bench started is stopped by its PID.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hamq.aio import AsyncAdmin, AsyncProducer, AsyncPullConsumer, Message, MessageQueue, PullStatus
from hamq.cli.bench_timeline import Timeline
from hamq.cli.failover import READY_TIMEOUT_S, _ready_line, _topic_on_every_member
from hamq.cli.servers import _spawn, _stop_children
from hamq.clock import monotonic_s, wall_ms
from hamq.config import NamesrvConfig, dump_toml
from hamq.errors import HamqError
from hamq.net.tasks import cancel_all
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import pack_body, unpack_body

GROUP_A, GROUP_B = "broker-a", "broker-b"
BACKLOG_TOPIC, PROBE_TOPIC = "ActingBacklog", "ActingProbe"
LOCK_GROUP = "bench_acting_lock"
QUEUES = 4  # per group, of both topics
PROBE_STEP_MS = 100  # (c)'s resolution
PROBE_SPAN_MS = 60_000  # probes fall due this long after the kill
CALIBRATION_SENDS = 1000  # timer sends timed to choose the backlog's due time
FAR_FUTURE_MS = 3600_000  # the calibration's timers never fall due during a run
SETTLE_S = 5.0  # after the backlog's sends: probes, replication to the slave, the kill
SENDERS = 64  # sends in flight
POLL_S = 0.01  # between two looks at a route, a lock, B's offsets
READ_BATCH = 1024
SEQ_BYTES = 8  # each backlog body is its sequence number


@dataclass
class Servers:
    """The bench's name server and brokers: configs and logs under ``root``."""

    root: Path
    port_base: int
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    addrs: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def in_dir(data_dir: str | None, port_base: int) -> Servers:
        root = Path(data_dir or tempfile.mkdtemp(prefix="hamq-acting-")).resolve()
        root.mkdir(parents=True, exist_ok=True)
        return Servers(root, port_base)

    def start(self, name: str, command: str, settings: dict) -> None:
        (self.root / f"{name}.toml").write_text(dump_toml(settings))
        self.procs[name] = _spawn([command, "-c", str(self.root / f"{name}.toml")], self.root, name)
        self.addrs[name] = settings["listen"]
        try:
            _ready_line(self.procs[name], name, READY_TIMEOUT_S)
        except HamqError as err:  # the reason is the log's last line (a port in use, ...)
            lines = (self.root / f"{name}.log").read_text().strip().splitlines()
            last = lines[-1] if lines else "its log is empty"
            raise HamqError(f"{err.message}: {last}") from None

    def start_all(self, namesrv_settings: dict) -> None:
        namesrv = f"127.0.0.1:{self.port_base}"
        self.start(
            "namesrv",
            "namesrv",
            {"listen": namesrv, "data_dir": str(self.root / "namesrv"), **namesrv_settings},
        )
        members = [("a0", GROUP_A, 0), ("a1", GROUP_A, 1), ("b0", GROUP_B, 0)]
        for i, (name, group, broker_id) in enumerate(members, start=1):
            self.start(
                name,
                "broker",
                {
                    "cluster_name": "BenchCluster",
                    "broker_name": group,
                    "broker_id": broker_id,
                    "broker_role": "slave" if broker_id else "async_master",
                    "listen": f"127.0.0.1:{self.port_base + 10 * i}",
                    "ha_listen": f"127.0.0.1:{self.port_base + 10 * i + 1}",
                    "namesrv": [namesrv],
                    "store_dir": str(self.root / name),
                    "enable_slave_acting_master": True,
                    "enable_remote_escape": True,
                },
            )

    def kill9(self, name: str) -> None:
        self.procs[name].kill()  # SIGKILL to that PID
        self.procs[name].wait()

    def stop(self) -> None:
        _stop_children(list(self.procs.values()))


async def _routed_master(admin: AsyncAdmin, group: str) -> str | None:
    """The address the name server's route of PROBE_TOPIC names brokerId 0 of ``group``."""
    try:
        route = await admin.topic_route_raw(PROBE_TOPIC)
    except HamqError:
        return None
    for b in route["broker_datas"]:
        if b["broker_name"] == group:
            return {int(i): a for i, a in b["broker_addrs"].items()}.get(0)
    return None


async def _stored_count(admin: AsyncAdmin, addr: str, topic: str) -> int:
    """Messages of ``topic`` stored on the broker at ``addr`` (its queues' max offsets)."""
    frames = await asyncio.gather(
        *(
            admin.core.invoke(addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queue_id": q})
            for q in range(QUEUES)
        )
    )
    return sum(f.ext["offset"] for f in frames)


async def _until(probe: Callable, deadline: float) -> float | None:
    """Polls ``probe`` (a coroutine function) until it is true: the monotonic time it was,
    or None if the deadline came first."""
    while monotonic_s() < deadline:
        if await probe():
            return monotonic_s()
        await asyncio.sleep(POLL_S)
    return None


async def _send_all(producer: AsyncProducer, messages: list[tuple[Message, MessageQueue]]) -> float:
    """Sends every message (SENDERS in flight); the seconds it took."""
    started = monotonic_s()
    pending = iter(messages)

    async def sender() -> None:
        for message, mq in pending:
            await producer.send(message, mq)

    await asyncio.gather(*(sender() for _ in range(SENDERS)))
    return monotonic_s() - started


def _timers(topic: str, due_ms: Callable[[int], int], count: int) -> list:
    return [
        (
            Message(topic, i.to_bytes(SEQ_BYTES, "big"), deliver_time_ms=due_ms(i)),
            MessageQueue(topic, GROUP_A, i % QUEUES),
        )
        for i in range(count)
    ]


async def _wait_replicated(admin: AsyncAdmin, master: str, slave: str, deadline: float) -> None:
    end = (await admin.broker_runtime_info(master))["commitlog_max_offset"]

    async def caught_up() -> bool:
        return (await admin.broker_runtime_info(slave))["commitlog_max_offset"] >= end

    if await _until(caught_up, deadline) is None:
        raise HamqError(f"slave {slave} did not catch up with master {master} in time")


async def _first_lock(admin: AsyncAdmin, slave: str, deadline: float) -> float | None:
    """(b): the first LOCK_BATCH_MQ answered with a queue of A held, asked of A's slave
    once the route names it A's master (a client locks only on the routed master)."""
    client_id = f"bench-acting-{wall_ms()}"
    heartbeat = pack_body(
        {
            "client_id": client_id,
            "consumer_groups": [
                {
                    "group": LOCK_GROUP,
                    "message_model": "clustering",
                    "subscriptions": {BACKLOG_TOPIC: "*"},
                }
            ],
        }
    )
    queue = [BACKLOG_TOPIC, 0]

    async def locked() -> bool:
        addr = await _routed_master(admin, GROUP_A)
        if addr != slave:
            return False
        try:
            await admin.core.invoke(addr, RequestCode.HEART_BEAT, body=heartbeat)
            frame = await admin.core.invoke(
                addr,
                RequestCode.LOCK_BATCH_MQ,
                {"group": LOCK_GROUP, "client_id": client_id},
                pack_body([queue]),
            )
        except HamqError:
            return False
        return queue in (unpack_body(frame.body) or [])

    return await _until(locked, deadline)


@dataclass(frozen=True)
class Escape:
    """Measured conservatively: from the start of the last look that found B without a
    backlog message to the end of the one that found them all."""

    first_at: float  # monotonic time of that last empty look
    last_at: float  # ... and of the look that found them all (or the last growth seen)
    stored: int  # backlog messages B's master held at the end


@dataclass
class Stored:
    """Backlog messages B's master held at the last look (--plot and the bar follow it)."""

    count: int = 0


async def _escape(
    admin: AsyncAdmin, b_master: str, backlog: int, deadline: float, seen: Stored
) -> Escape | None:
    empty_at = last_at = 0.0
    while seen.count < backlog and monotonic_s() < deadline:
        looked_at = monotonic_s()
        count = await _stored_count(admin, b_master, BACKLOG_TOPIC)
        if not count:
            empty_at = looked_at
        elif count > seen.count:
            last_at, seen.count = monotonic_s(), count
        await asyncio.sleep(POLL_S)
    return Escape(empty_at, last_at, seen.count) if seen.count else None


async def _read_back(namesrv: str, b_master_count: int) -> tuple[int, int]:
    """(distinct, repeated) backlog sequence numbers stored in B."""
    seen: set[int] = set()
    repeated = 0
    consumer = AsyncPullConsumer("bench_acting_check", namesrv)
    try:
        for q in range(QUEUES):
            mq = MessageQueue(BACKLOG_TOPIC, GROUP_B, q)
            offset = await consumer.min_offset(mq)
            for _ in range(b_master_count // READ_BATCH + QUEUES + 1):
                result = await consumer.pull(mq, offset, READ_BATCH)
                if result.status is not PullStatus.FOUND:
                    break
                for m in result.messages:
                    seq = int.from_bytes(m.body[:SEQ_BYTES], "big")
                    repeated += seq in seen
                    seen.add(seq)
                offset = result.next_begin_offset
    finally:
        await consumer.close()
    return len(seen), repeated


async def measure(servers: Servers, backlog: int, max_seconds: float, timeline: Timeline) -> dict:
    """The run; ``timeline`` (on monotonic_s) follows the backlog stored in B from the kill
    and marks the kill and each measurement."""
    namesrv = servers.addrs["namesrv"]
    a_master, slave, b_master = (servers.addrs[n] for n in ("a0", "a1", "b0"))
    admin = AsyncAdmin(namesrv)
    producer = AsyncProducer(namesrv)
    tasks: list[asyncio.Task] = []
    try:
        deadline = monotonic_s() + max_seconds

        async def both_registered() -> bool:  # a topic is created on the masters registered
            return {GROUP_A, GROUP_B} <= set(await admin.master_addrs())

        if await _until(both_registered, deadline) is None:
            raise HamqError("the masters did not register with the name server in time")
        for topic in (BACKLOG_TOPIC, PROBE_TOPIC):
            await admin.create_topic(topic, QUEUES)
            await _topic_on_every_member(admin, topic, [a_master, slave, b_master])
        far = wall_ms() + FAR_FUTURE_MS
        took = await _send_all(
            producer, _timers(PROBE_TOPIC, lambda _: far, min(backlog, CALIBRATION_SENDS))
        )
        rate = min(backlog, CALIBRATION_SENDS) / max(took, 1e-3)
        due_ms = wall_ms() + int((1.5 * backlog / rate + SETTLE_S) * 1000)
        send_s = await _send_all(producer, _timers(BACKLOG_TOPIC, lambda _: due_ms, backlog))
        if wall_ms() > due_ms - SETTLE_S * 500:
            raise HamqError(
                f"the backlog's sends took {send_s:.1f} s, past its due time; the machine "
                "is slower than the calibration said: run again"
            )
        kill_ms = wall_ms() + 1000
        probes = PROBE_SPAN_MS // PROBE_STEP_MS
        await _send_all(
            producer,
            _timers(PROBE_TOPIC, lambda i: kill_ms + (i + 1) * PROBE_STEP_MS, probes),
        )
        await _wait_replicated(admin, a_master, slave, deadline)
        servers.kill9("a0")
        killed, killed_ms = monotonic_s(), wall_ms()
        deadline = killed + max_seconds
        escaped = Stored()
        timeline.follow(lambda: escaped.count)

        async def probe_escaped() -> bool:
            return await _stored_count(admin, b_master, PROBE_TOPIC) > 0

        async def acting_routed() -> bool:
            return await _routed_master(admin, GROUP_A) == slave

        tasks = [
            asyncio.create_task(_until(acting_routed, deadline)),
            asyncio.create_task(_first_lock(admin, slave, deadline)),
            asyncio.create_task(_until(probe_escaped, deadline)),
            asyncio.create_task(_escape(admin, b_master, backlog, deadline, escaped)),
        ]
        routed_at, locked_at, probe_at, escape = await asyncio.gather(*tasks)
        await timeline.stop()
        timeline.mark("kill -9 master", killed)
        for at, label in (
            (routed_at, "acting master in routes"),
            (locked_at, "first lock"),
            (probe_at, "first escaped delay msg"),
        ):
            if at is not None:
                timeline.mark(label, at)
        distinct, repeated = await _read_back(namesrv, escape.stored) if escape else (0, 0)
    finally:
        await timeline.stop()
        await cancel_all(tasks)
        await producer.close()
        await admin.close()

    def after_kill_ms(at: float | None) -> float | None:  # None: not within --max-seconds
        return None if at is None else round((at - killed) * 1000, 1)

    escape_s = escape.last_at - escape.first_at if escape else 0.0
    return {
        "bench": "acting_master",
        "acting_in_routes_ms": after_kill_ms(routed_at),
        "first_lock_ms": after_kill_ms(locked_at),
        "first_escaped_delay_ms": after_kill_ms(probe_at),
        "escape": {
            "backlog": backlog,
            "stored_in_b": escape.stored if escape else 0,
            "distinct": distinct,
            "repeated": repeated,
            "elapsed_s": round(escape_s, 3),
            "msgs_per_s": round(escape.stored / escape_s) if escape and escape_s > 0 else None,
            "due_after_kill_ms": due_ms - killed_ms,  # all due at once, then
            "started_after_kill_ms": after_kill_ms(escape.first_at if escape else None),
        },
        "backlog_send_msgs_per_s": round(backlog / send_s) if send_s else None,
    }


async def run_acting_bench(
    escape_backlog: int,
    port_base: int,
    data_dir: str | None,
    max_seconds: float,
    broker_not_active_timeout_ms: int,
    scan_not_active_broker_interval_ms: int,
    plot: str | None = None,
    escaped: Callable[[int], None] | None = None,
) -> dict:
    """The bench; ``escaped(n)`` as B's master is seen holding n more backlog messages,
    and with ``plot`` their rate from the kill on, with the kill and each measurement
    marked, drawn to that PNG."""
    timeline = Timeline(plot, escaped, clock=monotonic_s)
    servers = await asyncio.to_thread(Servers.in_dir, data_dir, port_base)
    namesrv_settings = {
        "support_acting_master": True,
        "broker_not_active_timeout_ms": broker_not_active_timeout_ms,
        "scan_not_active_broker_interval_ms": scan_not_active_broker_interval_ms,
    }
    try:
        await asyncio.to_thread(servers.start_all, namesrv_settings)
        result = await measure(servers, escape_backlog, max_seconds, timeline)
    finally:
        await asyncio.to_thread(servers.stop)
    clean = result["escape"]["distinct"] == escape_backlog and not result["escape"]["repeated"]
    if data_dir is None and clean:  # a run that lost or repeated a message keeps its logs
        await asyncio.to_thread(shutil.rmtree, servers.root, ignore_errors=True)
    e = result["escape"]
    timeline.draw(
        f"hamq bench acting-master: {e['stored_in_b']} of {escape_backlog} due delay msgs "
        f"escaped to B, {e['msgs_per_s']} msgs/s",
        "escaped to B, msgs/s",
    )
    result["params"] = {
        "escape_backlog": escape_backlog,
        "max_seconds": max_seconds,
        "data": data_dir,
        **namesrv_settings,
    }
    return result


# the defaults a name server runs with unless told otherwise
DEFAULT_NOT_ACTIVE_MS = NamesrvConfig.broker_not_active_timeout_ms
DEFAULT_SCAN_MS = NamesrvConfig.scan_not_active_broker_interval_ms


def _ms(value: float | None) -> str:
    return "not within --max-seconds" if value is None else f"{value} ms"


def acting_text(r: dict) -> str:
    e = r["escape"]
    rate = "none" if e["msgs_per_s"] is None else f"{e['msgs_per_s']} msgs/s"
    return (
        f"acting master after kill -9: in routes {_ms(r['acting_in_routes_ms'])}, first "
        f"lock {_ms(r['first_lock_ms'])}, first escaped delay message "
        f"{_ms(r['first_escaped_delay_ms'])}; escape of {e['backlog']} due delay messages: "
        f"{rate} ({e['stored_in_b']} in B in {e['elapsed_s']} s, {e['distinct']} distinct, "
        f"{e['repeated']} repeated)"
    )
