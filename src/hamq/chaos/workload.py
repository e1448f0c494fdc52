"""The chaos workload: producers sending unique, checksummed messages, the consumers of
``chaos/consumers.py``, and the final read after healing — each writing its history.

A producer alternates between the normal topic (key = the message id) and the ordered
topic (keys ``k<producer>-<j>``, the queue chosen by the client's selector from the key,
so a key stays in one queue). A few sends are in flight at once, never two of one key: a
key's next send starts only after its previous one's outcome, so a key's seq only grows in
the order sent, and a slow fault still leaves many operations in the history. The
client's own retries are off: one history operation is one request, and a send whose
outcome the client does not know stays indeterminate (``info``), not hidden by a retry.

Outcomes: ``ok`` only for SEND_OK; ``fail`` for refusals the broker gives before storing
anything (``REFUSED_BEFORE_STORING``) and for a connection that could not be opened;
everything else — timeouts, lost connections, FLUSH_DISK_TIMEOUT / FLUSH_SLAVE_TIMEOUT /
SLAVE_NOT_AVAILABLE (stored on the master, not as durable as promised), DLedger's
NOT_LEADER and SYSTEM_BUSY (a proposal whose commit was not seen) — is ``info``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hamq
from hamq.chaos.consumers import KINDS, ChaosConsumer, make_consumer
from hamq.chaos.history import (
    PAYLOAD_BYTES_MAX,
    PAYLOAD_BYTES_MIN,
    HistoryWriter,
    make_body,
    parse_body,
)
from hamq.client.consumer import AsyncPullConsumer, PullStatus
from hamq.client.message import MessageQueue, SendResult, SendStatus
from hamq.errors import (
    ConnectionLost,
    CrcMismatch,
    DiskFull,
    HamqError,
    InSyncReplicasNotEnough,
    InvalidArgument,
    MessageIllegal,
    NoPermission,
    QueueNotExist,
    ServiceNotAvailable,
    TopicNotExist,
)

log = logging.getLogger(__name__)

NORMAL_TOPIC = "chaos-normal"
ORDERED_TOPIC = "chaos-ordered"
TOPICS = {NORMAL_TOPIC: 8, ORDERED_TOPIC: 4}  # name -> queues (the runner creates them)
KEYS_PER_PRODUCER = 4  # ordered keys k<producer>-0..3
SEND_TIMEOUT_S = 2.0
# Mirrored mode: a SEND_OK is a confirm, held by every synchronised mirror; a mirror just
# placed on a loaded machine took over 3 s (tests/chaos/mirrored_cluster.py send_confirmed).
CONFIRM_TIMEOUT_S = 10.0
# Beyond the send timeout: a send whose callback never came (route lookups, connecting)
# is given up as indeterminate.
SEND_GRACE_S = 5.0
CLOSE_GRACE_S = 10.0
RATE_PER_PRODUCER = 100  # sends per second
MAX_IN_FLIGHT = 8  # per producer, never two of one key
IN_FLIGHT_POLL_S = 0.05  # how often a waiting producer looks for overdue sends
MAX_SENDS_PER_PRODUCER = 30_000  # five minutes at the rate: every run is bounded
DRAIN_POLL_S = 0.1
FINAL_PULL_BATCH = 256
FINAL_READ_GROUP = "chaos-final-read"
RETRY_WAIT_S = 0.2  # before asking again a cluster that did not answer

# Answers that mean the broker stored nothing: the request was refused at the door (topic
# or queue unknown, not writable here, malformed, not enough replicas in sync to take it,
# disk refused, no master to send to). Everything else may have been stored.
REFUSED_BEFORE_STORING: tuple[type[HamqError], ...] = (
    NoPermission,
    TopicNotExist,
    QueueNotExist,
    MessageIllegal,
    CrcMismatch,
    InvalidArgument,
    InSyncReplicasNotEnough,
    DiskFull,
    ServiceNotAvailable,
)

NEVER_CONNECTED = "cannot connect to "


def send_outcome(result: SendResult | None, err: BaseException | None) -> tuple[str, str]:
    """``(type, error)`` of a send's history line: ok, fail or info."""
    if err is None:
        assert result is not None
        if result.status is SendStatus.SEND_OK:
            return "ok", ""
        return "info", result.status.value
    name = type(err).__name__
    message = err.message if isinstance(err, HamqError) else str(err)
    refused = isinstance(err, REFUSED_BEFORE_STORING) or (
        # net/connection.py connect(): no connection, so the request never left
        isinstance(err, ConnectionLost) and message.startswith(NEVER_CONNECTED)
    )
    kind = "fail" if refused else "info"
    return kind, f"{name}: {message}"


@dataclass(frozen=True)
class SendPlan:
    """The i-th send of producer ``p``: which topic, key and body."""

    message_id: str
    seq: int
    topic: str
    key: str
    body: bytes

    @staticmethod
    def of(p: int, seq: int, seed: int, rng: random.Random) -> SendPlan:
        message_id = f"p{p}-{seq}"
        ordered = seq % 2 == 1
        topic = ORDERED_TOPIC if ordered else NORMAL_TOPIC
        key = f"k{p}-{(seq // 2) % KEYS_PER_PRODUCER}" if ordered else message_id
        payload_len = rng.randint(PAYLOAD_BYTES_MIN, PAYLOAD_BYTES_MAX)
        return SendPlan(message_id, seq, topic, key, make_body(message_id, seq, payload_len, seed))


@dataclass
class _InFlight:
    """A send invoked whose outcome is not recorded yet."""

    plan: SendPlan
    line: dict[str, Any]
    give_up_at: float  # time.monotonic() after which it is recorded indeterminate
    future: concurrent.futures.Future | None = None


class ChaosProducer:
    """One producer on a thread of its own, sending at a bounded rate until stopped. Up
    to ``MAX_IN_FLIGHT`` sends are outstanding (a slow fault does not stop the history),
    but never two of one key: a key's next send waits for its previous one's outcome."""

    def __init__(
        self,
        p: int,
        namesrv: str,
        history_dir: Path,
        seed: int,
        send_timeout_s: float,
        rate_per_s: float,
        max_sends: int,
    ) -> None:
        self.p = p
        self.namesrv = namesrv
        self.seed = seed
        self.send_timeout_s = send_timeout_s
        # the client answers every send within its timeout; past this one never will
        self._give_up_s = send_timeout_s + SEND_GRACE_S
        self.interval_s = 1.0 / rate_per_s
        self.max_sends = max_sends
        self.history = HistoryWriter(history_dir / f"producer-{p}.jsonl")
        self.acked: dict[str, set[str]] = {topic: set() for topic in TOPICS}
        # guards acked and in-flight sends; notified when a send's outcome is recorded
        self._changed = threading.Condition()
        self._in_flight: dict[str, _InFlight] = {}  # by key
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"chaos-producer-{p}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        # sends in flight end within their timeout and grace; closing the client in 5 s
        self._thread.join(timeout=self._give_up_s + CLOSE_GRACE_S)
        self.history.close()

    def acked_ids(self, topics: Iterable[str]) -> set[str]:
        with self._changed:
            return set().union(*(self.acked[t] for t in topics))

    def _run(self) -> None:
        rng = random.Random(f"{self.seed}/producer-{self.p}")
        with hamq.Producer(
            self.namesrv,
            group=f"chaos-producer-{self.p}",
            send_timeout_s=self.send_timeout_s,
            retry_times_when_send_failed=0,
        ) as producer:
            next_at = time.monotonic()
            for seq in range(self.max_sends):
                if self._stopping.wait(max(0.0, next_at - time.monotonic())):
                    break
                # no catching up after a stall: the rate stays bounded
                next_at = max(next_at + self.interval_s, time.monotonic())
                plan = SendPlan.of(self.p, seq, self.seed, rng)
                if not self._wait_until(lambda k=plan.key: self._may_send(k)):
                    break
                self._send(producer, plan)
            self._wait_until(lambda: not self._in_flight, stopping=False)

    def _may_send(self, key: str) -> bool:
        return key not in self._in_flight and len(self._in_flight) < MAX_IN_FLIGHT

    def _wait_until(self, ready: Callable[[], bool], stopping: bool = True) -> bool:
        """Wait (sends overdue given up meanwhile) until ``ready()``; False if the
        producer is stopped first (``stopping``) or, otherwise, once every send in flight
        was given up."""
        with self._changed:
            while not ready():
                if stopping and self._stopping.is_set():
                    return False
                now = time.monotonic()
                for op in [op for op in self._in_flight.values() if op.give_up_at <= now]:
                    if op.future is not None:
                        op.future.cancel()  # its callback, if it still comes, is ignored
                    self._outcome(op, None, TimeoutError(f"no outcome in {self._give_up_s} s"))
                self._changed.wait(IN_FLIGHT_POLL_S)
            return True

    def _send(self, producer: hamq.Producer, plan: SendPlan) -> None:
        ordered = plan.topic == ORDERED_TOPIC
        line = dict(op="send", id=plan.message_id, key=plan.key, topic=plan.topic)
        line.update(ordered=ordered, seq=plan.seq)
        op = _InFlight(plan, line, time.monotonic() + self._give_up_s)
        with self._changed:
            self.history.record(type="invoke", **line)
            self._in_flight[plan.key] = op
        message = hamq.Message(plan.topic, plan.body, keys=plan.key)
        if ordered:
            sending = producer.async_client.send_orderly(message, plan.key)
        else:
            sending = producer.async_client.send(message)
        op.future = producer.submit(sending)
        op.future.add_done_callback(lambda done: self._done(op, done))

    def _done(self, op: _InFlight, done: concurrent.futures.Future) -> None:
        """A send's future completed (on the client's event-loop thread)."""
        try:
            result, err = done.result(), None
        except concurrent.futures.CancelledError:
            return  # given up already: its outcome is recorded
        except Exception as exc:  # noqa: BLE001 - whatever it is, the outcome is its history line
            result, err = None, exc
        with self._changed:
            self._outcome(op, result, err)

    def _outcome(self, op: _InFlight, result: SendResult | None, err: BaseException | None) -> None:
        """Record ``op``'s one outcome (caller holds ``_changed``); later ones are ignored."""
        if self._in_flight.get(op.plan.key) is not op:
            return
        del self._in_flight[op.plan.key]
        kind, error = send_outcome(result, err)
        if kind == "ok":
            assert result is not None
            queue = f"{result.queue.broker_name}/{result.queue.queue_id}"
            self.history.record(type="ok", queue=queue, offset=result.queue_offset, **op.line)
            self.acked[op.plan.topic].add(op.plan.message_id)
        else:
            self.history.record(type=kind, error=error, **op.line)
        self._changed.notify_all()


class Workload:
    """Producers and consumers of one chaos run, their histories under ``history_dir``.
    ``confirms``: a send waits for its confirm (mirrored mode: every synchronised mirror
    holds it), so it is given ``CONFIRM_TIMEOUT_S``."""

    def __init__(
        self,
        namesrv: str,
        history_dir: Path,
        seed: int,
        *,
        confirms: bool = False,
        producers: int = 2,
        consumers: Iterable[str] = KINDS,
        rate_per_producer: float = RATE_PER_PRODUCER,
        max_sends_per_producer: int = MAX_SENDS_PER_PRODUCER,
    ) -> None:
        history_dir.mkdir(parents=True, exist_ok=True)
        timeout_s = CONFIRM_TIMEOUT_S if confirms else SEND_TIMEOUT_S
        self.producers = [
            ChaosProducer(
                p, namesrv, history_dir, seed, timeout_s, rate_per_producer, max_sends_per_producer
            )
            for p in range(producers)
        ]
        self.consumers: list[ChaosConsumer] = [
            make_consumer(
                kind,
                namesrv,
                (ORDERED_TOPIC,) if kind == "orderly" else tuple(TOPICS),
                history_dir,
                0,
            )
            for kind in consumers
        ]
        self._producers_stopped = False
        self._stopped = False

    def start(self) -> None:
        for consumer in self.consumers:
            consumer.start()
        for producer in self.producers:
            producer.start()

    def stop_producers(self) -> None:
        if not self._producers_stopped:
            self._producers_stopped = True
            for producer in self.producers:
                producer.stop()

    def acked(self) -> int:
        return len(self._acked_ids(TOPICS))

    def missing(self) -> dict[str, int]:
        """Per consumer kind the cluster serves: acknowledged ids of its topics it has not
        received yet."""
        return {
            c.kind: len(self._acked_ids(c.topics) - c.seen())
            for c in self.consumers
            if c.unsupported is None
        }

    def unsupported(self) -> dict[str, str]:
        """Consumer kinds the cluster refuses by design (pops on DLedger), and why."""
        return {c.kind: c.unsupported for c in self.consumers if c.unsupported is not None}

    def drain(self, timeout_s: float) -> dict[str, int]:
        """Let the consumers run until each received every acknowledged id of its topics,
        or ``timeout_s`` passed; returns what each still misses (all 0: drained). Kinds
        the cluster refuses (``unsupported``) are not waited for."""
        deadline = time.monotonic() + timeout_s
        missing = self.missing()
        while any(missing.values()) and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL_S)
            missing = self.missing()
        return missing

    def stop(self) -> None:
        """Stop every client (producers first); their histories are closed."""
        if self._stopped:
            return
        self._stopped = True
        self.stop_producers()
        for consumer in self.consumers:
            try:
                consumer.stop()
            except HamqError as err:  # a broker still down: the history is complete anyway
                log.warning("chaos %s consumer did not stop cleanly: %s", consumer.kind, err)

    def _acked_ids(self, topics: Iterable[str]) -> set[str]:
        topics = tuple(topics)
        return set().union(*(p.acked_ids(topics) for p in self.producers))


# -- the final read ----------------------------------------------------------------------


@dataclass
class QueueRead:
    """One read of a queue from its master: (offset, body) from its min to its max; body
    None where the broker refused the record for good (damaged, no intact copy)."""

    min_offset: int
    max_offset: int
    messages: list[tuple[int, bytes | None]]

    @property
    def complete(self) -> bool:
        return [o for o, _ in self.messages] == list(range(self.min_offset, self.max_offset))


def final_read(namesrv: str, topics: Iterable[str], path: Path, timeout_s: float) -> None:
    """Read every queue of every topic, from its minimum offset to its maximum, from the
    group's master, into ``path`` (``read`` lines). A queue is read again until two reads
    agree on its maximum and the second read every offset below it, or ``timeout_s``
    passed (then its last read is written: the checker sees what could be read)."""
    history = HistoryWriter(path)
    try:
        asyncio.run(_final_read(namesrv, tuple(topics), history, time.monotonic() + timeout_s))
    finally:
        history.close()


async def _final_read(
    namesrv: str, topics: tuple[str, ...], history: HistoryWriter, deadline: float
) -> None:
    for topic in topics:
        for mq in await _queues(namesrv, topic, deadline):
            for offset, body in await _read_stable(namesrv, mq, deadline):
                message_id, seq, valid = parse_body(body or b"")
                history.record(
                    op="read",
                    id=message_id,
                    topic=topic,
                    queue=f"{mq.broker_name}/{mq.queue_id}",
                    offset=offset,
                    valid=valid,
                    refused=body is None,
                    key=key_of(topic, message_id, seq),
                    seq=seq,
                )


def key_of(topic: str, message_id: str, seq: int) -> str:
    """The key a producer gave a message (``SendPlan.of``), from its id and seq."""
    if topic != ORDERED_TOPIC or not message_id.startswith("p"):
        return message_id
    return f"k{message_id[1:].split('-', 1)[0]}-{(seq // 2) % KEYS_PER_PRODUCER}"


async def _queues(namesrv: str, topic: str, deadline: float) -> list[MessageQueue]:
    reader = AsyncPullConsumer(FINAL_READ_GROUP, namesrv, SEND_TIMEOUT_S)
    try:
        while True:
            try:
                return await reader.fetch_message_queues(topic)
            except HamqError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(RETRY_WAIT_S)
    finally:
        await reader.close()


async def _read_stable(namesrv: str, mq: MessageQueue, deadline: float) -> list[tuple[int, bytes]]:
    last: QueueRead | None = None
    while True:
        try:
            read = await _read_from_master(namesrv, mq)
        except HamqError as err:
            log.info("final read of %s: %s", mq, err.message)
            read = None
        if read is not None and read.complete and last is not None:
            if read.max_offset == last.max_offset:
                return read.messages
        first_read = read is not None and last is None  # confirmed by the next at once
        last = read or last
        if time.monotonic() >= deadline:
            log.warning("final read of %s not stable before the deadline", mq)
            return last.messages if last is not None else []
        if not first_read:  # a queue still moving or missing offsets: not a busy loop
            await asyncio.sleep(RETRY_WAIT_S)


async def _read_from_master(namesrv: str, mq: MessageQueue) -> QueueRead | None:
    """One read of ``mq``, or None when the master did not answer every request. A new
    client each time: one that marked the master unreachable would ask a slave first."""
    reader = AsyncPullConsumer(FINAL_READ_GROUP, namesrv, SEND_TIMEOUT_S)
    try:
        route = await reader.core.route(mq.topic, refresh=True)
        master = route.master_addr(mq.broker_name)
        if master is None:
            return None
        min_offset = await reader.min_offset(mq)
        max_offset = await reader.max_offset(mq)
        messages: list[tuple[int, bytes | None]] = []
        offset = min_offset
        while offset < max_offset:
            try:
                result = await reader.pull(mq, offset, FINAL_PULL_BATCH)
            except CrcMismatch:
                # a damaged record the broker refuses for good (no intact copy): noted at
                # its place, and the rest of the queue still read
                messages.append((offset, None))
                offset += 1
                continue
            if result.status is not PullStatus.FOUND:
                break
            messages += [(m.queue_offset, m.body) for m in result.messages]
            offset = result.next_begin_offset
        # invoke_group asks a slave only after marking the master unreachable
        if not reader.core.reachable(master):
            return None
        return QueueRead(min_offset, max_offset, [m for m in messages if m[0] < max_offset])
    finally:
        await reader.close()
