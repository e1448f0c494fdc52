"""The chaos workload's consumers, one per kind of consumption, each in its own group and
with its own history: a pull consumer (explicit offsets), a push concurrent consumer, a
push orderly consumer (ordered topic only) and a pop (simple) consumer.

Each records ``receive`` for every message handed to it (id, ``<broker>/<qid>``, offset,
whether the body checks out) and ``ack`` once the broker took the acknowledgement (the
pull consumer's committed offset, the push consumers' CONSUME_SUCCESS, the pop ack). The
workload's ``drain`` asks each for the ids it saw.

A kind the cluster refuses outright (pops on DLedger groups: RequestCodeNotSupported)
stops with ``unsupported`` saying why, so the drain does not wait for it: a refusal by
design is not a fault.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path

import hamq
from hamq.chaos.history import HistoryWriter, parse_body
from hamq.client.consumer import PullStatus
from hamq.client.message import MessageExt, MessageQueue
from hamq.errors import HamqError, RequestCodeNotSupported

log = logging.getLogger(__name__)

KINDS = ("pull", "push", "orderly", "pop")
REQUEST_TIMEOUT_S = 2.0
PULL_BATCH = 32
IDLE_WAIT_S = 0.05  # between pull rounds that found nothing
ERROR_WAIT_S = 0.2  # after a failed request: the fault lasts a while
QUEUES_REFRESH_S = 2.0  # the pull consumer re-reads the topics' queues this often
POP_AWAIT_S = 0.5  # long polling of a pop: short, so stop() is prompt
POP_INVISIBLE_S = 10.0  # an unacked pop is redelivered after this
# push consumers: rebalances, heartbeats and commits within a second (a fault is seconds)
PUSH_SETTINGS = dict(
    heartbeat_interval_s=0.5,
    rebalance_interval_s=1.0,
    persist_offset_interval_s=0.5,
    pull_suspend_ms=500,
    consume_from_where="first",
)


class ChaosConsumer(ABC):
    """What every kind shares: its history, and the ids it received with a valid body."""

    kind: str

    def __init__(self, namesrv: str, topics: Iterable[str], history: Path, group: str) -> None:
        self.namesrv = namesrv
        self.topics = tuple(topics)
        self.group = group
        self.history = HistoryWriter(history)
        self._seen: set[str] = set()
        self._seen_lock = threading.Lock()
        self.unsupported: str | None = None  # why the cluster refuses this kind, if it does

    def seen(self) -> set[str]:
        with self._seen_lock:
            return set(self._seen)

    def received(self, message: MessageExt) -> str:
        message_id, _, valid = parse_body(message.body)
        self.history.record(
            op="receive",
            id=message_id,
            queue=f"{message.broker_name}/{message.queue_id}",
            offset=message.queue_offset,
            valid=valid,
        )
        if valid:
            with self._seen_lock:
                self._seen.add(message_id)
        return message_id

    def acked(self, message_ids: Iterable[str]) -> None:
        for message_id in message_ids:
            self.history.record(op="ack", id=message_id)

    @abstractmethod
    def start(self) -> None: ...

    def stop(self) -> None:
        self.history.close()


class _LoopConsumer(ChaosConsumer):
    """A consumer driven by a loop on a thread of its own."""

    def __init__(self, namesrv: str, topics: Iterable[str], history: Path, group: str) -> None:
        super().__init__(namesrv, topics, history, group)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"chaos-{group}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=REQUEST_TIMEOUT_S * 5)
        super().stop()

    @abstractmethod
    def _run(self) -> None: ...


class PullChaosConsumer(_LoopConsumer):
    """Pulls every queue of its topics from the group's committed offset (the queue's
    minimum at first), committing after each batch."""

    kind = "pull"

    def _run(self) -> None:
        offsets: dict[MessageQueue, int] = {}
        queues: list[MessageQueue] = []
        queues_at = float("-inf")  # time.monotonic() of the last look at the queues
        with hamq.PullConsumer(self.group, self.namesrv, timeout_s=REQUEST_TIMEOUT_S) as consumer:
            while not self._stopping.is_set():
                try:
                    if time.monotonic() - queues_at > QUEUES_REFRESH_S:
                        queues = [q for t in self.topics for q in consumer.fetch_message_queues(t)]
                        queues_at = time.monotonic()
                    found = sum(self._pull(consumer, mq, offsets) for mq in queues)
                except HamqError as err:
                    log.info("chaos pull consumer: %s", err.message)
                    self._stopping.wait(ERROR_WAIT_S)
                    continue
                if not found:
                    self._stopping.wait(IDLE_WAIT_S)

    def _pull(self, consumer: hamq.PullConsumer, mq: MessageQueue, offsets: dict) -> int:
        offset = offsets.get(mq)
        if offset is None:
            offset = consumer.fetch_offset(mq)
            offset = consumer.min_offset(mq) if offset is None else offset
        result = consumer.pull(mq, offset, PULL_BATCH)
        offsets[mq] = result.next_begin_offset
        if result.status is not PullStatus.FOUND:
            return 0
        ids = [self.received(m) for m in result.messages]
        consumer.commit_offset(mq, result.next_begin_offset)
        self.acked(ids)
        return len(ids)


class PopChaosConsumer(_LoopConsumer):
    """Pops (RocketMQ 5 simple consumption) and acks every message it receives."""

    kind = "pop"

    def _run(self) -> None:
        with hamq.SimpleConsumer(
            self.group,
            self.namesrv,
            dict.fromkeys(self.topics, "*"),
            await_duration_s=POP_AWAIT_S,
            timeout_s=REQUEST_TIMEOUT_S,
        ) as consumer:
            while not self._stopping.is_set():
                try:
                    for message in consumer.receive(PULL_BATCH, POP_INVISIBLE_S):
                        message_id = self.received(message)
                        consumer.ack(message)
                        self.acked([message_id])
                except RequestCodeNotSupported as err:
                    self.unsupported = err.message
                    log.warning("chaos pop consumer stops: %s", err.message)
                    return
                except HamqError as err:
                    log.info("chaos pop consumer: %s", err.message)
                    self._stopping.wait(ERROR_WAIT_S)


class PushChaosConsumer(ChaosConsumer):
    """A push consumer (concurrent, or orderly: one queue's messages one at a time, in
    queue order, under the broker's queue lock); its listener records and succeeds."""

    def __init__(
        self, namesrv: str, topics: Iterable[str], history: Path, group: str, orderly: bool
    ) -> None:
        super().__init__(namesrv, topics, history, group)
        self.kind = "orderly" if orderly else "push"
        self.orderly = orderly
        self._consumer: hamq.PushConsumer | None = None

    def start(self) -> None:
        consumer = hamq.PushConsumer(self.group, self.namesrv, **PUSH_SETTINGS)
        for topic in self.topics:
            consumer.subscribe(topic)
        consumer.register_message_listener(self._listen, orderly=self.orderly)
        consumer.start()
        self._consumer = consumer

    def _listen(self, messages: list[MessageExt]) -> object:
        self.acked([self.received(m) for m in messages])
        if self.orderly:
            return hamq.ConsumeOrderlyStatus.SUCCESS
        return hamq.ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.shutdown()
        super().stop()


def make_consumer(
    kind: str, namesrv: str, topics: Iterable[str], history_dir: Path, i: int
) -> ChaosConsumer:
    """The consumer of ``kind`` (``KINDS``), its history ``consumer-<kind>-<i>.jsonl``."""
    history = history_dir / f"consumer-{kind}-{i}.jsonl"
    group = f"chaos-{kind}-{i}"
    if kind == "pull":
        return PullChaosConsumer(namesrv, topics, history, group)
    if kind == "pop":
        return PopChaosConsumer(namesrv, topics, history, group)
    if kind in ("push", "orderly"):
        return PushChaosConsumer(namesrv, topics, history, group, orderly=kind == "orderly")
    raise ValueError(f"unknown consumer kind {kind!r}; known: {', '.join(KINDS)}")
