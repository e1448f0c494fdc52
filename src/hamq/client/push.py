"""The push consumer: a consumer group's members share a topic's queues (clustering) or each
read all of them (broadcasting); messages are pulled with long polling and handed to a
listener; progress is committed periodically and at shutdown.

- Rebalance is client-side, RocketMQ's average allocation over the ids the brokers report
  (GET_CONSUMER_LIST_BY_GROUP), every ``rebalance_interval_s`` and at once when a broker
  says the group changed (NOTIFY_CONSUMER_IDS_CHANGED).
- Concurrent listeners may answer RECONSUME_LATER: the message goes back to the broker
  (CONSUMER_SEND_MSG_BACK → ``%RETRY%<group>``, later ``%DLQ%<group>``) and the consumer
  moves on. The group's retry topic is subscribed automatically in clustering mode.
- Orderly listeners consume a queue only while holding its broker-side lock
  (LOCK_BATCH_MQ, renewed every ``lock_renew_interval_s``), one batch at a time; a
  failing batch is retried in place (SUSPEND_CURRENT_QUEUE_A_MOMENT), never skipped.

Sync listeners run in a thread pool (one hop per pulled batch), async ones on the loop.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from hamq.client.consumer import AsyncPullConsumer, PullStatus
from hamq.client.core import ClientCore
from hamq.client.message import MessageExt, MessageQueue
from hamq.client.rebalance import allocate_averagely, parse_tag_expression
from hamq.errors import ConnectionLost, HamqError, InvalidArgument, TopicNotExist
from hamq.net.connection import Connection
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, pack_body, unpack_body

log = logging.getLogger(__name__)

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
PULL_ERROR_BACKOFF_S = 1.0           # RocketMQ pullTimeDelayMillsWhenException is 3 s
SUSPEND_CURRENT_QUEUE_S = 1.0        # suspendCurrentQueueTimeMillis
LOCAL_LOCK_MAX_LIVE_S = 30.0         # REBALANCE_LOCK_MAX_LIVE_TIME on the client
CONSUME_THREADS = 20                 # consumeThreadMax
CONSUME_DRAIN_TIMEOUT_S = 10.0       # how long a dropped queue waits for its listener
LOCK_RETRY_S = 1.0                   # orderly: rebalance again soon when a lock was refused


class ConsumeConcurrentlyStatus(Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(Enum):
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


Listener = Callable[[list[MessageExt]], object]


@dataclass
class ProcessQueue:
    """One assigned queue: where consumption stands and the task pulling it."""
    mq: MessageQueue
    offset: int
    committed: int
    task: asyncio.Task | None = None
    locked_until: float = 0.0   # orderly: monotonic time the broker lock is trusted until
    dropped: bool = False
    abandoned: bool = False     # orderly: the batch in hand went stale (lock lost)
    # Set while no listener call is running: a dropped queue waits for it before its
    # offset is committed and its lock released, so no other member overlaps it.
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()


@dataclass
class _Subscription:
    expression: str
    tags: frozenset[str] | None = field(default=None)


class AsyncPushConsumer:
    def __init__(self, group: str, namesrv: str | Iterable[str],
                 message_model: str = "clustering", consume_from_where: str = "last",
                 pull_batch_size: int = 32, consume_message_batch_max_size: int = 1,
                 max_reconsume_times: int = 16, heartbeat_interval_s: float = 30.0,
                 rebalance_interval_s: float = 20.0, persist_offset_interval_s: float = 5.0,
                 lock_renew_interval_s: float = 20.0, pull_suspend_ms: int = 15_000,
                 offset_store_dir: str | None = None, client_id: str | None = None) -> None:
        if message_model not in ("clustering", "broadcasting"):
            raise InvalidArgument("message_model must be 'clustering' or 'broadcasting'")
        if consume_from_where not in ("last", "first"):
            raise InvalidArgument("consume_from_where must be 'last' or 'first'")
        self.group = group
        self.message_model = message_model
        self.consume_from_where = consume_from_where
        self.pull_batch_size = pull_batch_size
        self.consume_message_batch_max_size = consume_message_batch_max_size
        self.max_reconsume_times = max_reconsume_times
        self.heartbeat_interval_s = heartbeat_interval_s
        self.rebalance_interval_s = rebalance_interval_s
        self.persist_offset_interval_s = persist_offset_interval_s
        self.lock_renew_interval_s = lock_renew_interval_s
        self.pull_suspend_ms = pull_suspend_ms
        self.client_id = client_id or f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"
        self.core = ClientCore(namesrv)
        self.core.pool.handler = self  # brokers notify us of group changes
        self.puller = AsyncPullConsumer(group, core=self.core)
        self.subscriptions: dict[str, _Subscription] = {}
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}
        self.listener: Listener | None = None
        self.orderly = False
        self.offset_file = Path(offset_store_dir or Path.home() / ".hamq" / "offsets") / \
            f"{self.client_id.replace('@', '_')}-{group}.json" \
            if message_model == "broadcasting" else None
        self._rebalance_now = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._running = False
        self._suspended = False

    # -- configuration ---------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str = "*") -> None:
        self.subscriptions[topic] = _Subscription(expression, parse_tag_expression(expression))

    def register_message_listener(self, listener: Listener, orderly: bool = False) -> None:
        """``listener(messages)`` returns a ConsumeConcurrentlyStatus (or, with
        ``orderly``, a ConsumeOrderlyStatus); it may be a coroutine function."""
        self.listener = listener
        self.orderly = orderly

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        if self.listener is None or not self.subscriptions:
            raise InvalidArgument("subscribe to a topic and register a listener before start()")
        if self.message_model == "clustering":
            self.subscriptions.setdefault(RETRY_GROUP_TOPIC_PREFIX + self.group, _Subscription("*"))
        if not inspect.iscoroutinefunction(self.listener):
            self._executor = concurrent.futures.ThreadPoolExecutor(
                CONSUME_THREADS, thread_name_prefix=f"hamq-consume-{self.group}")
        self._running = True
        await self._send_heartbeats()
        await self._rebalance()
        self._tasks = [asyncio.create_task(self._heartbeat_loop()),
                       asyncio.create_task(self._rebalance_loop()),
                       asyncio.create_task(self._persist_loop())]
        if self.orderly:
            self._tasks.append(asyncio.create_task(self._lock_loop()))

    def suspend(self) -> None:
        """Stop handing messages to the listener (RocketMQ's ``suspend()``): the batch in
        hand stops at the next message, and offsets cover only what was consumed."""
        self._suspended = True

    def resume(self) -> None:
        self._suspended = False

    async def shutdown(self) -> None:
        """Stop pulling, commit progress, release locks, leave the group."""
        self._running = False
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for pq in list(self.process_queues.values()):
            await self._drop(pq)
        await self._persist_offsets()
        await self._unregister()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        await self.core.close()

    close = shutdown

    # -- RequestHandler: what brokers send us ----------------------------------------------
    def handle(self, conn: Connection, frame: Frame) -> list | None:
        if frame.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            self._rebalance_now.set()
            return None
        raise HamqError(f"consumer does not serve request code {frame.code}")

    def after_batch(self) -> None:
        pass

    # -- heartbeats -------------------------------------------------------------------------
    async def _broker_addrs(self) -> set[str]:
        addrs: set[str] = set()
        for topic in self.subscriptions:
            try:
                route = await self.core.route(topic)
            except HamqError:
                continue
            addrs.update(a for members in route.brokers.values() for a in members.values())
        return addrs

    def _heartbeat_body(self) -> bytes:
        return pack_body({"client_id": self.client_id, "consumer_groups": [{
            "group": self.group, "message_model": self.message_model,
            "subscriptions": {t: s.expression for t, s in self.subscriptions.items()}}]})

    async def _send_heartbeats(self) -> None:
        await self.core.heart_beat(await self._broker_addrs(), self._heartbeat_body())

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            await self._send_heartbeats()

    async def _unregister(self) -> None:
        for addr in await self._broker_addrs():
            try:
                await self.core.invoke(addr, RequestCode.UNREGISTER_CLIENT,
                                       {"client_id": self.client_id, "group": self.group})
            except HamqError:
                pass

    # -- rebalance --------------------------------------------------------------------------
    async def _rebalance_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._rebalance_now.wait(), self.rebalance_interval_s)
            except asyncio.TimeoutError:
                pass
            self._rebalance_now.clear()
            await self._send_heartbeats()  # new brokers of the topic learn about us too
            await self._rebalance()

    async def _rebalance(self) -> None:
        wanted: set[MessageQueue] = set()
        for topic in list(self.subscriptions):
            try:
                route = await self.core.route(topic, refresh=True)
            except TopicNotExist:
                continue  # e.g. the retry topic before the first message went back
            except HamqError as err:
                log.warning("rebalance of %s skipped: %s", topic, err.message)
                wanted.update(mq for mq in self.process_queues if mq.topic == topic)
                continue
            queues = sorted(route.read_queues)
            if self.message_model == "broadcasting":
                wanted.update(queues)
                continue
            ids = await self._consumer_ids(topic)
            if ids is None:
                wanted.update(mq for mq in self.process_queues if mq.topic == topic)
                continue
            wanted.update(allocate_averagely(queues, ids, self.client_id))
        for mq in [mq for mq in self.process_queues if mq not in wanted]:
            await self._drop(self.process_queues[mq])
        for mq in sorted(wanted - set(self.process_queues)):
            await self._add(mq)

    async def _consumer_ids(self, topic: str) -> list[str] | None:
        route = await self.core.route(topic)
        for addr in sorted(a for members in route.brokers.values() for a in members.values()):
            try:
                frame = await self.core.invoke(addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                               {"group": self.group})
            except HamqError:
                continue
            ids = unpack_body(frame.body) or []
            if self.client_id not in ids:  # the broker has not seen our heartbeat yet
                ids.append(self.client_id)
            return ids
        return None

    async def _add(self, mq: MessageQueue) -> None:
        pq = ProcessQueue(mq, 0, 0)
        if self.orderly:
            # RocketMQ: an orderly queue is taken only once its lock is ours, and its offset
            # read after that, so the previous owner's last commit is seen.
            await self._lock([pq])
            if pq.locked_until < time.monotonic():
                asyncio.get_running_loop().call_later(LOCK_RETRY_S, self._rebalance_now.set)
                return
        try:
            pq.offset = pq.committed = await self._start_offset(mq)
        except HamqError as err:
            log.warning("cannot start %s: %s", mq, err.message)
            if self.orderly:
                await self._unlock([pq])
            return
        self.process_queues[mq] = pq
        pq.task = asyncio.create_task(self._pull_loop(pq))
        log.info("%s now consumes %s from offset %d", self.client_id, mq, pq.offset)

    async def _drop(self, pq: ProcessQueue) -> None:
        pq.dropped = True
        self.process_queues.pop(pq.mq, None)
        try:
            await asyncio.wait_for(pq.idle.wait(), CONSUME_DRAIN_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning("listener still busy on %s after %s s; dropping it anyway", pq.mq,
                        CONSUME_DRAIN_TIMEOUT_S)
        if pq.task is not None:
            pq.task.cancel()
            await asyncio.gather(pq.task, return_exceptions=True)
        await self._commit(pq)
        if self.orderly:
            await self._unlock([pq])

    async def _start_offset(self, mq: MessageQueue) -> int:
        if self.offset_file is not None:
            stored = self._local_offsets().get(str(mq))
            if stored is not None:
                return stored
        else:
            committed = await self.puller.fetch_offset(mq)
            if committed is not None:
                return committed
        if self.consume_from_where == "first" or mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return await self.puller.min_offset(mq)
        return await self.puller.max_offset(mq)

    # -- pulling and consuming ----------------------------------------------------------------
    async def _pull_loop(self, pq: ProcessQueue) -> None:
        sub = self.subscriptions.get(pq.mq.topic) or _Subscription("*")
        while self._running and not pq.dropped:
            if self._suspended:
                await asyncio.sleep(SUSPEND_CURRENT_QUEUE_S)
                continue
            if self.orderly and not await self._ensure_locked(pq):
                await asyncio.sleep(SUSPEND_CURRENT_QUEUE_S)
                continue
            try:
                result = await self.puller.pull(pq.mq, pq.offset, self.pull_batch_size,
                                                self.pull_suspend_ms)
            except HamqError as err:
                log.debug("pull %s failed: %s", pq.mq, err.message)
                if isinstance(err, ConnectionLost):
                    pq.locked_until = 0.0  # a lost connection may have cost us the lock
                await asyncio.sleep(PULL_ERROR_BACKOFF_S)
                continue
            if result.status is PullStatus.OFFSET_ILLEGAL:
                pq.offset = result.next_begin_offset
                continue
            if result.status is not PullStatus.FOUND:
                continue
            messages = result.messages
            if sub.tags is not None:
                messages = [m for m in messages if m.tags in sub.tags]
            pq.idle.clear()
            try:
                if messages:
                    await self._consume(pq, messages)
                if not pq.dropped and not pq.abandoned:
                    pq.offset = result.next_begin_offset  # past filtered-out messages too
                pq.abandoned = False
            finally:
                pq.idle.set()

    async def _consume(self, pq: ProcessQueue, messages: list[MessageExt]) -> None:
        size = self.consume_message_batch_max_size
        chunks = [messages[i:i + size] for i in range(0, len(messages), size)]
        if self.orderly:
            for chunk in chunks:
                while True:
                    position = pq.offset
                    if self._suspended or not await self._ensure_locked(pq) \
                            or pq.offset != position:
                        pq.abandoned = True  # suspended, or the lock was lost: re-pull later
                        return
                    (status,) = await self._call_listener([chunk])
                    if status is ConsumeOrderlyStatus.SUCCESS:
                        break
                    if pq.dropped:
                        return
                    await asyncio.sleep(SUSPEND_CURRENT_QUEUE_S)  # retry in place
                pq.offset = chunk[-1].queue_offset + 1
            return
        statuses = await self._call_listener(chunks)  # shorter if suspended meanwhile
        for chunk, status in zip(chunks, statuses):
            if status is not ConsumeConcurrentlyStatus.CONSUME_SUCCESS:
                for msg in chunk:
                    await self._send_back(msg)
        if statuses:
            pq.offset = chunks[len(statuses) - 1][-1].queue_offset + 1
        if len(statuses) < len(chunks):
            pq.abandoned = True  # the rest is pulled again when consumption resumes

    async def _ensure_locked(self, pq: ProcessQueue) -> bool:
        """Orderly: hold the queue's broker lock. A lock that lapsed and is won back may have
        been someone else's meanwhile, so the offset moves up to the group's commit."""
        if pq.locked_until >= time.monotonic():
            return True
        await self._lock([pq])
        if pq.locked_until < time.monotonic():
            return False
        try:
            committed = await self.puller.fetch_offset(pq.mq)
        except HamqError:
            pq.locked_until = 0.0
            return False
        if committed is not None and committed > pq.offset:
            pq.offset = committed
        return True

    async def _call_listener(self, chunks: list[list[MessageExt]]) -> list[object]:
        listener = self.listener
        if self._executor is None:
            out = []
            for chunk in chunks:
                if self._suspended:
                    break
                out.append(await listener(chunk))
            return out

        def run_all() -> list[object]:
            out = []
            for chunk in chunks:
                if self._suspended:
                    break
                try:
                    out.append(listener(chunk))
                except Exception:  # a throwing listener means "try again later"
                    log.exception("listener failed on %d message(s)", len(chunk))
                    out.append(None)
            return out

        return await asyncio.get_running_loop().run_in_executor(self._executor, run_all)

    async def _send_back(self, msg: MessageExt) -> None:
        while self._running:
            try:
                await self.puller.send_back(msg, 0, self.max_reconsume_times)
                return
            except HamqError as err:  # keep the message here and try again
                log.warning("send back of %s failed: %s", msg.msg_id, err.message)
                await asyncio.sleep(PULL_ERROR_BACKOFF_S)

    # -- orderly locks ------------------------------------------------------------------------
    async def _lock_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lock_renew_interval_s)
            await self._lock(list(self.process_queues.values()))

    async def _lock(self, pqs: list[ProcessQueue]) -> None:
        until = time.monotonic() + LOCAL_LOCK_MAX_LIVE_S
        async for group, frame in self._lock_requests(RequestCode.LOCK_BATCH_MQ, pqs):
            held = {tuple(k) for k in unpack_body(frame.body) or []} if frame else set()
            for pq in group:
                pq.locked_until = until if (pq.mq.topic, pq.mq.queue_id) in held else 0.0

    async def _unlock(self, pqs: list[ProcessQueue]) -> None:
        async for group, _ in self._lock_requests(RequestCode.UNLOCK_BATCH_MQ, pqs):
            for pq in group:  # an unlock that failed lapses by itself on the broker
                pq.locked_until = 0.0

    async def _lock_requests(self, code: int, pqs: list[ProcessQueue]):
        """One LOCK/UNLOCK_BATCH_MQ per broker group; yields (its queues, answer or None)."""
        for broker_name, group in _by_broker(pqs).items():
            route = self.core.routes.get(group[0].mq.topic)
            addr = route.master_addr(broker_name) if route else None
            if addr is None:
                continue
            body = pack_body([[pq.mq.topic, pq.mq.queue_id] for pq in group])
            try:
                frame = await self.core.invoke(
                    addr, code, {"group": self.group, "client_id": self.client_id}, body)
            except HamqError as err:
                log.warning("%s on %s failed: %s", RequestCode(code).name, broker_name,
                            err.message)
                frame = None
            yield group, frame

    # -- offsets --------------------------------------------------------------------------------
    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(self.persist_offset_interval_s)
            await self._persist_offsets()

    async def _persist_offsets(self) -> None:
        if self.offset_file is not None:
            stored = self._local_offsets()
            stored.update({str(pq.mq): pq.offset for pq in self.process_queues.values()})
            self.offset_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.offset_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(stored, sort_keys=True))
            tmp.replace(self.offset_file)
            return
        for pq in list(self.process_queues.values()):
            await self._commit(pq)

    async def _commit(self, pq: ProcessQueue) -> None:
        if self.offset_file is not None or pq.offset == pq.committed:
            return
        try:
            await self.puller.commit_offset(pq.mq, pq.offset)
            pq.committed = pq.offset
        except HamqError as err:
            log.warning("commit of %s failed: %s", pq.mq, err.message)

    def _local_offsets(self) -> dict[str, int]:
        try:
            return json.loads(self.offset_file.read_text())
        except (OSError, ValueError):
            return {}


def _by_broker(pqs: list[ProcessQueue]) -> dict[str, list[ProcessQueue]]:
    groups: dict[str, list[ProcessQueue]] = {}
    for pq in pqs:
        groups.setdefault(pq.mq.broker_name, []).append(pq)
    return groups


__all__ = ["AsyncPushConsumer", "ConsumeConcurrentlyStatus", "ConsumeOrderlyStatus"]
