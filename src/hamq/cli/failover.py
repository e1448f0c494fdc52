"""``hamq bench failover``: how long a controller-mode group stops taking writes when its
master is killed, and whether any acknowledged write was lost.

The bench starts its own ``hamq dev --mode controller`` (so the failover defaults measured
are the ones ``hamq dev`` uses), keeps a steady stream of sends going, and ``kill -9``s
the current master ``kills`` times. Each sample is the time from the kill to the first
acknowledgement of a send *issued after* the kill: only the new master can give it. The
killed member is restarted and the group made whole again (every member alive and in the
SyncStateSet) before the next kill. At the end every acknowledged message is read back at
the queue offset its acknowledgement named and compared byte for byte. Every process the
bench started is stopped by its PID.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hamq.aio import AsyncAdmin, AsyncProducer, AsyncPullConsumer, Message, PullStatus
from hamq.cli.bench_timeline import Timeline
from hamq.cli.common import readable
from hamq.cli.dev_controller import READY_TIMEOUT_S as GROUP_READY_TIMEOUT_S
from hamq.cli.dev_controller import wait_whole
from hamq.cli.servers import READY_TIMEOUT_S as CHILD_READY_TIMEOUT_S
from hamq.client.controller import ControllerClient
from hamq.clock import monotonic_s
from hamq.errors import HamqError
from hamq.net.tasks import cancel_all
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import unpack_body

BROKER_NAME = "broker-a"  # the group hamq dev starts
READY_TIMEOUT_S = 120.0  # a member the bench restarted prints its ready line
WHOLE_TIMEOUT_S = 60.0  # a restarted member catches up and rejoins the SyncStateSet
FAILOVER_TIMEOUT_S = 30.0  # a kill with no acknowledged send after this is a failed sample
STOP_GRACE_S = 10.0
RETRY_PAUSE_S = 0.002  # between a failed send and the next: the sample's resolution
SEQ_BYTES = 8  # each body starts with its sequence number
QUEUES = 4


@dataclass
class Stream:
    """The steady stream of sends: each body is its sequence number and a shared pad, so
    a body read back is checked against the one sent without keeping the bodies."""

    producer: AsyncProducer
    topic: str
    pad: bytes
    acked: dict[int, tuple[int, int]] = field(default_factory=dict)  # seq: (queue id, offset)
    errors: int = 0
    first_error: str = ""
    kill_at: float | None = None  # perf_counter of the last kill
    first_ack: asyncio.Event = field(default_factory=asyncio.Event)
    first_ack_at: float = 0.0
    stopping: bool = False
    latencies: array | None = None  # seconds per acknowledged send, kept for --plot only
    _next_seq: int = 0

    def body(self, seq: int) -> bytes:
        return seq.to_bytes(SEQ_BYTES, "big") + self.pad

    def arm(self) -> None:
        """The next send issued from now on that is acknowledged ends the sample."""
        self.first_ack.clear()
        self.kill_at = time.perf_counter()

    async def sender(self) -> None:
        while not self.stopping:
            seq, self._next_seq = self._next_seq, self._next_seq + 1
            issued = time.perf_counter()
            try:
                result = await self.producer.send(Message(self.topic, self.body(seq)))
            except HamqError as err:
                self.errors += 1
                self.first_error = self.first_error or f"{type(err).__name__}: {err.message}"
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            self.acked[seq] = (result.queue.queue_id, result.queue_offset)
            if self.latencies is not None:
                self.latencies.append(time.perf_counter() - issued)
            if self.kill_at is not None and issued >= self.kill_at and not self.first_ack.is_set():
                self.first_ack_at = time.perf_counter()
                self.first_ack.set()


@dataclass
class DevCluster:
    """The ``hamq dev`` child, its ready line, and the members this bench restarted."""

    root: Path
    proc: subprocess.Popen
    ready: dict
    restarted: dict[str, subprocess.Popen] = field(default_factory=dict)  # address: process

    @staticmethod
    def start(
        data_dir: str | None, port_base: int, replicas: int, controllers: int, embedded: bool
    ) -> DevCluster:
        root = Path(data_dir or tempfile.mkdtemp(prefix="hamq-failover-")).resolve()
        root.mkdir(parents=True, exist_ok=True)
        args = ["--replicas", str(replicas), "--controllers", str(controllers)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "hamq.cli.main", "dev", "--mode", "controller", *args]
            + ["--data", str(root / "dev"), "--port-base", str(port_base)]
            + (["--embedded"] if embedded else ["--standalone"]),
            stdout=subprocess.PIPE,
            stderr=open(root / "dev.log", "ab"),  # noqa: SIM115 (the child holds it)
            start_new_session=True,
        )
        cluster = DevCluster(root, proc, {})
        try:
            timeout_s = dev_ready_timeout_s(replicas, controllers, embedded)
            cluster.ready = _ready_line(proc, "hamq dev", timeout_s)
        except HamqError as err:
            cluster.stop()  # hamq dev says which start missed its bound, if one did
            log = (root / "dev.log").read_text(errors="replace")[-2000:]
            raise HamqError(f"{err.message}; {root / 'dev.log'} ends:\n{log}") from None
        except BaseException:
            cluster.stop()
            raise
        return cluster

    @property
    def controllers(self) -> list[str]:
        return [c["address"] for c in self.ready["controllers"]]

    def pid_of(self, address: str) -> int:
        if address in self.restarted:
            return self.restarted[address].pid
        return next(b["pid"] for b in self.ready["brokers"] if b["address"] == address)

    def kill9(self, address: str) -> None:
        os.kill(self.pid_of(address), signal.SIGKILL)
        if address in self.restarted:  # hamq dev reaps the members it started
            self.restarted.pop(address).wait()

    def restart(self, address: str) -> None:
        """The member at ``address`` again, from the config hamq dev wrote for it."""
        name = next(b["name"] for b in self.ready["brokers"] if b["address"] == address)
        config = Path(self.ready["data"]) / f"{name}.toml"
        proc = subprocess.Popen(
            [sys.executable, "-m", "hamq.cli.main", "broker", "-c", str(config)],
            stdout=subprocess.PIPE,
            stderr=open(Path(self.ready["data"]) / f"{name}.log", "ab"),  # noqa: SIM115
            start_new_session=True,
        )
        self.restarted[address] = proc
        _ready_line(proc, name, READY_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM to what this bench started (hamq dev stops its own children), by PID."""
        procs = [*self.restarted.values(), self.proc]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = monotonic_s() + STOP_GRACE_S
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - monotonic_s()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def dev_ready_timeout_s(replicas: int, controllers: int, embedded: bool) -> float:
    """As long as ``hamq dev`` may take to be ready: it bounds each child's start and the
    group's election itself and exits naming what missed, so the bench waits for that verdict
    (a fixed 120 s gave up on a loaded CI machine while dev was still within its bounds)."""
    children = controllers + replicas + (0 if embedded else 1)  # + the standalone name server
    return children * CHILD_READY_TIMEOUT_S + GROUP_READY_TIMEOUT_S


def _ready_line(proc: subprocess.Popen, name: str, timeout_s: float) -> dict:
    deadline = monotonic_s() + timeout_s
    while monotonic_s() < deadline:
        line = proc.stdout.readline() if readable(proc.stdout, deadline - monotonic_s()) else b""
        if not line:
            break
        try:
            ready = json.loads(line)
        except ValueError:
            continue
        if ready.get("event") == "ready":
            return ready
    raise HamqError(f"{name} was not ready within {timeout_s} s (exit code {proc.poll()})")


async def _topic_on_every_member(admin: AsyncAdmin, topic: str, addrs: list[str]) -> None:
    """Slaves copy topic configs from the master every few seconds; a successor without
    the topic would refuse the stream, so the first kill waits for the copies."""
    deadline = monotonic_s() + WHOLE_TIMEOUT_S
    for addr in addrs:
        while True:
            frame = await admin.core.invoke(addr, RequestCode.GET_ALL_TOPIC_CONFIG)
            if topic in (unpack_body(frame.body) or {}):
                break
            if monotonic_s() > deadline:
                raise HamqError(f"member {addr} has no topic {topic} after {WHOLE_TIMEOUT_S} s")
            await asyncio.sleep(0.1)


async def _read_back(namesrv: str, stream: Stream) -> tuple[int, int]:
    """(missing, mismatched): acknowledged messages with nothing at their offset, or a
    different body there."""
    wanted: dict[int, dict[int, int]] = {}  # queue id: {offset: seq}
    for seq, (queue_id, offset) in stream.acked.items():
        wanted.setdefault(queue_id, {})[offset] = seq
    read: dict[tuple[int, int], bytes] = {}
    consumer = AsyncPullConsumer("bench_failover_check", namesrv)
    try:
        for mq in await consumer.fetch_message_queues(stream.topic):
            if mq.queue_id not in wanted:
                continue
            last = max(wanted[mq.queue_id])
            offset = await consumer.min_offset(mq)
            deadline = monotonic_s() + WHOLE_TIMEOUT_S
            while offset <= last and monotonic_s() < deadline:
                result = await consumer.pull(mq, offset, 256)
                if result.status is not PullStatus.FOUND:  # the confirm offset may lag
                    await asyncio.sleep(0.05)
                    continue
                for m in result.messages:
                    read[(mq.queue_id, m.queue_offset)] = m.body
                offset = result.next_begin_offset
    finally:
        await consumer.close()
    missing = mismatched = 0
    for queue_id, offsets in wanted.items():
        for offset, seq in offsets.items():
            body = read.get((queue_id, offset))
            if body is None:
                missing += 1
            elif body != stream.body(seq):
                mismatched += 1
    return missing, mismatched


@dataclass(frozen=True)
class Outcome:
    samples_s: list[float]  # kill -> first acknowledgement by the successor
    acked: int
    send_errors: int
    missing: int  # acknowledged, and nothing at the acknowledged offset
    mismatched: int  # acknowledged, and another body at the acknowledged offset
    elections: int  # master epochs the run went through; more than kills = a false failover


async def measure(
    cluster: DevCluster,
    kills: int,
    size: int,
    senders: int,
    topic: str,
    timeline: Timeline,
    killed: Callable[[int], None],
) -> Outcome:
    """The kill loop (a kill without a successor within ``FAILOVER_TIMEOUT_S`` raises),
    then the read-back check. ``timeline`` follows the stream and marks each kill and the
    new master's first acknowledgement; ``killed(1)`` after each sample."""
    namesrv, replicas = cluster.ready["namesrv"], len(cluster.ready["brokers"])
    controller = ControllerClient(cluster.controllers)
    admin = AsyncAdmin(namesrv)
    stream = Stream(AsyncProducer(namesrv), topic, os.urandom(max(0, size - SEQ_BYTES)))
    if timeline.plot is not None:
        stream.latencies = array("d")
    tasks: list[asyncio.Task] = []
    samples: list[float] = []
    try:
        await admin.create_topic(topic, QUEUES)
        await _topic_on_every_member(admin, topic, [b["address"] for b in cluster.ready["brokers"]])
        tasks = [asyncio.create_task(stream.sender()) for _ in range(senders)]
        timeline.follow(lambda: len(stream.acked), stream.latencies, lambda: stream.errors)
        first = await wait_whole(controller, admin, BROKER_NAME, replicas, WHOLE_TIMEOUT_S)
        for _ in range(kills):
            group = await wait_whole(controller, admin, BROKER_NAME, replicas, WHOLE_TIMEOUT_S)
            before = len(stream.acked)
            deadline = monotonic_s() + FAILOVER_TIMEOUT_S
            while len(stream.acked) == before:  # the stream flows through this master
                if monotonic_s() > deadline:
                    raise HamqError(f"no send acknowledged by a whole group; {stream.first_error}")
                await asyncio.sleep(0.01)
            master = group["master_addr"]
            stream.arm()
            cluster.kill9(master)
            try:
                await asyncio.wait_for(stream.first_ack.wait(), FAILOVER_TIMEOUT_S)
            except TimeoutError:
                raise HamqError(
                    f"no send acknowledged within {FAILOVER_TIMEOUT_S} s of killing master "
                    f"{master}; last error {stream.first_error}"
                ) from None
            samples.append(stream.first_ack_at - (stream.kill_at or 0.0))
            timeline.mark("kill -9 master", stream.kill_at)
            timeline.mark("new master acks", stream.first_ack_at)
            killed(1)
            await asyncio.to_thread(cluster.restart, master)
        last = await wait_whole(controller, admin, BROKER_NAME, replicas, WHOLE_TIMEOUT_S)
        stream.stopping = True
        await asyncio.gather(*tasks)
        await timeline.stop()
        missing, mismatched = await _read_back(namesrv, stream)
    finally:
        stream.stopping = True
        await timeline.stop()
        await cancel_all(tasks)
        await stream.producer.close()
        await admin.close()
        await controller.close()
    return Outcome(
        samples,
        len(stream.acked),
        stream.errors,
        missing,
        mismatched,
        last["master_epoch"] - first["master_epoch"],
    )


async def run_failover(
    kills: int,
    replicas: int,
    controllers: int,
    embedded: bool,
    port_base: int,
    data_dir: str | None,
    size: int,
    senders: int,
    topic: str,
    plot: str | None = None,
    killed: Callable[[int], None] = lambda n: None,
) -> dict:
    """The bench; with ``plot``, the stream's throughput and latency over the whole run
    with every kill and recovery marked, drawn to that PNG."""
    timeline = Timeline(plot)
    cluster = await asyncio.to_thread(
        DevCluster.start, data_dir, port_base, replicas, controllers, embedded
    )
    try:
        outcome = await measure(cluster, kills, size, senders, topic, timeline, killed)
    finally:
        await asyncio.to_thread(cluster.stop)
    # a run that lost a message keeps its logs
    if data_dir is None and not (outcome.missing or outcome.mismatched):
        await asyncio.to_thread(shutil.rmtree, cluster.root, ignore_errors=True)
    ms = sorted(round(s * 1000, 1) for s in outcome.samples_s)
    timeline.draw(
        f"hamq bench failover: {len(ms)} kill -9s of the master, failover median "
        f"{round(statistics.median(ms), 1)} ms, {outcome.acked:,} sends acked",
        "acked sends/s",
    )
    return {
        "bench": "failover",
        "kills": len(ms),
        "failover_ms": {"min": ms[0], "median": round(statistics.median(ms), 1), "max": ms[-1]},
        "samples_ms": ms,
        "acked": outcome.acked,
        "missing": outcome.missing,
        "mismatched": outcome.mismatched,
        "elections": outcome.elections,
        "send_errors": outcome.send_errors,
        "params": {
            "kills": kills,
            "replicas": replicas,
            "controllers": controllers,
            "embedded": embedded,
            "size": size,
            "senders": senders,
            "topic": topic,
            "data": data_dir,
        },
    }


def failover_text(r: dict) -> str:
    f = r["failover_ms"]
    return (
        f"failover over {r['kills']} kill -9s of the master: min {f['min']} ms, median "
        f"{f['median']} ms, max {f['max']} ms; {r['acked']} sends acknowledged, "
        f"{r['missing']} missing and {r['mismatched']} different when read back; "
        f"{r['elections']} elections"
    )
