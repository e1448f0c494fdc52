"""The push consumer: a consumer group's members share a topic's queues (clustering) or each
read all of them (broadcasting); messages are pulled with long polling and handed to a
listener; progress is committed periodically and at shutdown.

- Rebalance is client-side, RocketMQ's average allocation over the ids the brokers report
  (GET_CONSUMER_LIST_BY_GROUP), every ``rebalance_interval_s`` and at once when a broker
  says the group changed (NOTIFY_CONSUMER_IDS_CHANGED).
- Concurrent listeners may answer RECONSUME_LATER (or raise): in clustering mode the message
  goes back for a retry (``client/retry.py``) and the consumer moves on; a message that
  could not be handed back is kept and consumed again here, and the committed offset stays
  below it. The group's retry topic is subscribed automatically in clustering mode.
  Broadcasting members drop failures with a warning, as RocketMQ does: a retry topic is
  shared by the group, so no other member would read it for them.
- Orderly listeners consume a queue only while holding its broker-side lock
  (LOCK_BATCH_MQ, renewed every ``lock_renew_interval_s``), one batch at a time; a
  failing batch is retried in place (SUSPEND_CURRENT_QUEUE_A_MOMENT), never skipped. A
  queue is unlocked only after its listener returned.

- With ``cancel_on_ha_failover=True`` (RabbitMQ's ``x-cancel-on-ha-failover``), a rebalance
  whose route shows another master for a broker group of the subscribed topics
  (``master_watch.py``) cancels the consumer: its queues are released (committed), it
  leaves the group (so the other members take its queues) and ``on_cancel(reason)`` is
  called, or a warning logged. ``start()`` again, or ``subscribe`` and the next rebalance,
  resumes. Without it the consumer reads on transparently (the new master, or a slave
  meanwhile). The notice comes within a rebalance interval of the route change.

Sync listeners run in a thread pool (one hop per pulled batch), async ones on the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import fcntl
import inspect
import json
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from hamq.client.consumer import AsyncPullConsumer, PullStatus
from hamq.client.core import ROUTE_REFRESH_INTERVAL_S, ClientCore
from hamq.client.master_watch import MasterWatch, failover_notice
from hamq.client.message import MessageExt, MessageQueue
from hamq.client.rebalance import allocate_averagely, parse_tag_expression
from hamq.client.retry import SendBack
from hamq.clock import monotonic_s, wall_ms
from hamq.errors import ConnectionLost, HamqError, InvalidArgument, TopicNotExist
from hamq.net.connection import Connection
from hamq.net.tasks import PeriodicTask
from hamq.policy.definition import DEFAULT_VHOST, wire_name
from hamq.protocol.codes import RequestCode
from hamq.protocol.frame import Frame, pack_body, unpack_body
from hamq.protocol.properties import (
    DEFAULT_MAX_RECONSUME_TIMES,
    PROPERTY_RECONSUME_TIME,
    RETRY_GROUP_TOPIC_PREFIX,
)

log = logging.getLogger(__name__)

PULL_ERROR_BACKOFF_S = 1.0  # RocketMQ pullTimeDelayMillsWhenException is 3 s
SUSPEND_CURRENT_QUEUE_S = 1.0  # suspendCurrentQueueTimeMillis
LOCAL_LOCK_MAX_LIVE_S = 30.0  # REBALANCE_LOCK_MAX_LIVE_TIME on the client
CONSUME_THREADS = 20  # consumeThreadMax
CONSUME_DRAIN_TIMEOUT_S = 10.0  # how long a dropped concurrent queue waits for its listener
AWAIT_TERMINATION_S = 30.0  # awaitTerminationMillisWhenShutdown
STOP_LOOPS_TIMEOUT_S = 5.0  # shutdown: the lock loop to end
LOCK_RETRY_S = 1.0  # orderly: ask again for a lock that was refused
RECONSUME_KEPT_S = 5.0  # submitConsumeRequestLater: retry of a kept message
KEPT_MAX = 1000  # pullThresholdForQueue: no pulls while this many wait
CONSUME_TIMESTAMP_AGO_MS = 30 * 60_000  # consumeTimestamp: half an hour before start
DEFAULT_INSTANCE_NAME = "DEFAULT"  # RocketMQ's instanceName default


class ConsumeConcurrentlyStatus(Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(Enum):
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


Listener = Callable[[list[MessageExt]], object]
CancelCallback = Callable[[str], object]  # on_cancel(reason); may be a coroutine function


@dataclass
class ProcessQueue:
    """One assigned queue: where consumption stands and the task pulling it."""

    mq: MessageQueue
    offset: int  # next offset to pull
    committed: int | None  # last offset committed (None: the group has none yet)
    task: asyncio.Task | None = None
    locked_until: float = 0.0  # orderly: monotonic time the broker lock is trusted until
    # orderly: the connection the lock was granted on; once it closed the broker may have
    # restarted and forgotten the lock (and granted it to another), so it is asked again.
    lock_conn: Connection | None = None
    dropped: bool = False  # no longer ours: finish the batch in hand, then release
    # an operator's reset (RESET_CONSUMER_CLIENT_OFFSET): what the release commits instead,
    # also when the notice comes while a rebalance or shutdown is releasing the queue
    reset_to: int | None = None
    abandoned: bool = False  # orderly: the batch in hand went stale (lock lost)
    # Messages whose hand-back failed: consumed again here at ``retry_at``; the
    # committed offset stays below the first of them.
    kept: list[MessageExt] = field(default_factory=list)
    retry_at: float = 0.0
    # Set while no listener call is running: a dropped queue waits for it before its
    # offset is committed and its lock released, so no other member overlaps it.
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def consumed(self) -> int:
        """The offset that may be committed: below every message not yet done with."""
        return min(self.kept[0].queue_offset, self.offset) if self.kept else self.offset

    async def wait_idle(self) -> None:
        while not self.idle.is_set():
            await self.idle.wait()


@dataclass
class _Subscription:
    expression: str
    tags: frozenset[str] | None = field(default=None)


class AsyncPushConsumer:
    def __init__(
        self,
        group: str,
        namesrv: str | Iterable[str],
        message_model: str = "clustering",
        consume_from_where: str = "last",
        consume_timestamp_ms: int | None = None,
        pull_batch_size: int = 32,
        consume_message_batch_max_size: int = 1,
        max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES,
        heartbeat_interval_s: float = 30.0,
        rebalance_interval_s: float = 20.0,
        persist_offset_interval_s: float = 5.0,
        lock_renew_interval_s: float = 20.0,
        lock_max_live_s: float = LOCAL_LOCK_MAX_LIVE_S,
        pull_suspend_ms: int = 15_000,
        poll_name_server_interval_s: float = ROUTE_REFRESH_INTERVAL_S,
        await_termination_s: float = AWAIT_TERMINATION_S,
        offset_store_dir: str | None = None,
        instance_name: str = DEFAULT_INSTANCE_NAME,
        client_id: str | None = None,
        cancel_on_ha_failover: bool = False,
        on_cancel: CancelCallback | None = None,
        vhost: str = DEFAULT_VHOST,
    ) -> None:
        if message_model not in ("clustering", "broadcasting"):
            raise InvalidArgument("message_model must be 'clustering' or 'broadcasting'")
        if consume_from_where not in ("last", "first", "timestamp"):
            raise InvalidArgument("consume_from_where must be 'last', 'first' or 'timestamp'")
        if not instance_name or "/" in instance_name or instance_name.startswith("."):
            raise InvalidArgument(f"instance_name {instance_name!r} must be a plain file name")
        self.group = wire_name(vhost, group)  # on the wire (``client/core.py``)
        self.message_model = message_model
        self.consume_from_where = consume_from_where
        self.consume_timestamp_ms = (
            consume_timestamp_ms
            if consume_timestamp_ms is not None
            else wall_ms() - CONSUME_TIMESTAMP_AGO_MS
        )
        self.pull_batch_size = pull_batch_size
        self.consume_message_batch_max_size = consume_message_batch_max_size
        self.max_reconsume_times = max_reconsume_times
        self.lock_renew_interval_s = lock_renew_interval_s
        self.lock_max_live_s = lock_max_live_s
        self.pull_suspend_ms = pull_suspend_ms
        self.await_termination_s = await_termination_s
        self.client_id = client_id or f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"
        self.core = ClientCore(
            namesrv, route_refresh_interval_s=poll_name_server_interval_s, vhost=vhost
        )
        self.core.pool.handler = self  # brokers notify us of group changes
        self.puller = AsyncPullConsumer(group, core=self.core)
        self.send_back = SendBack(self.puller, self.core.namesrv, max_reconsume_times)
        self.subscriptions: dict[str, _Subscription] = {}
        # Assigned queues, and dropped ones until they are released.
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}
        self.listener: Listener | None = None
        self.orderly = False
        # Broadcasting progress is local; the file is named after the instance, not the
        # process, so a restarted member continues where it stopped (RocketMQ's
        # LocalFileOffsetStore names it after host@instanceName, instanceName "DEFAULT").
        self.offset_file = (
            Path(offset_store_dir or Path.home() / ".hamq" / "offsets")
            / instance_name
            / f"{self.group}.json"
            if message_model == "broadcasting"
            else None
        )
        self._offset_file_lock: int | None = None  # broadcasting: the file is ours alone
        self._refused: set[MessageQueue] = set()  # orderly: wanted, but locked by another
        self._releases: set[asyncio.Task] = set()
        self._heartbeats = PeriodicTask(
            f"heartbeat of consumer group {group}", heartbeat_interval_s, self._send_heartbeats
        )
        # every interval, and at once when a broker says the group changed
        self._rebalances = PeriodicTask(
            f"rebalance of consumer group {group}", rebalance_interval_s, self._rebalance_round
        )
        self._persists = PeriodicTask(
            f"offset persist of consumer group {group}",
            persist_offset_interval_s,
            self._persist_all,
        )
        self._take_refused = PeriodicTask(
            f"lock retry of consumer group {group}", LOCK_RETRY_S, self._take_refused_queues
        )
        self._lock_task: asyncio.Task | None = None
        self._adding: set[MessageQueue] = set()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._running = False
        self._suspended = False
        self._watch = MasterWatch() if cancel_on_ha_failover else None
        self.on_cancel = on_cancel
        self.cancelled: str | None = None  # the reason, while cancelled by a failover

    # -- configuration ---------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic`` (from start, or from the next rebalance); a consumer cancelled
        by a failover resumes at the next rebalance."""
        self.subscriptions[self.core.wire(topic)] = _Subscription(
            expression, parse_tag_expression(expression)
        )
        self.cancelled = None

    def register_message_listener(self, listener: Listener, orderly: bool = False) -> None:
        """``listener(messages)`` returns a ConsumeConcurrentlyStatus (or, with
        ``orderly``, a ConsumeOrderlyStatus); it may be a coroutine function. A listener
        that raises is answered as RECONSUME_LATER / SUSPEND_CURRENT_QUEUE_A_MOMENT."""
        self.listener = listener
        self.orderly = orderly

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Start consuming; a started consumer cancelled by a failover resumes now."""
        if self._running:
            self.cancelled = None
            await self._rebalance_round()
            return
        if self.listener is None or not self.subscriptions:
            raise InvalidArgument("subscribe to a topic and register a listener before start()")
        if self.message_model == "clustering":
            self.subscriptions.setdefault(RETRY_GROUP_TOPIC_PREFIX + self.group, _Subscription("*"))
        else:
            self._lock_offset_file()
        if not inspect.iscoroutinefunction(self.listener):
            self._executor = concurrent.futures.ThreadPoolExecutor(
                CONSUME_THREADS, thread_name_prefix=f"hamq-consume-{self.group}"
            )
        self._running = True
        await self._send_heartbeats()
        await self._rebalance()
        for duty in self._duties():
            duty.start()
        if self.orderly:
            self._lock_task = asyncio.create_task(self._lock_loop())

    def suspend(self) -> None:
        """Stop handing messages to the listener (RocketMQ's ``suspend()``): the batch in
        hand stops at the next message, and offsets cover only what was consumed."""
        self._suspended = True

    def resume(self) -> None:
        self._suspended = False

    async def shutdown(self) -> None:
        """Stop pulling, let the listeners finish (their failures are still handed back),
        commit progress, release locks, leave the group. A queue whose listener is still
        running after ``await_termination_s`` is neither committed nor unlocked: its lock
        lapses on the broker, never under a running listener."""
        self._running = False
        # not the lock loop: locks stay renewed while listeners finish
        await asyncio.gather(*(duty.stop() for duty in self._duties()))
        for pq in list(self.process_queues.values()):
            if not pq.dropped:  # a dropped one is being released already
                self._release_later(pq)
        if self._releases:
            _, pending = await asyncio.wait(self._releases, timeout=self.await_termination_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for pq in self.process_queues.values():
            log.warning("listener still busy on %s at shutdown: left uncommitted and locked", pq.mq)
            if pq.task is not None:
                pq.task.cancel()
        if self._lock_task is not None:
            self._lock_task.cancel()
            # Bounded: asyncio.wait_for (3.11) can swallow a cancel that meets a
            # completion, so the loop also stops by itself once nothing is left to renew.
            await asyncio.wait([self._lock_task], timeout=STOP_LOOPS_TIMEOUT_S)
        await self._unregister()
        if self._executor is not None:
            # Not waited for: a listener still running was given up on above (its queue
            # committed below its batch, or left uncommitted), and may never return.
            self._executor.shutdown(wait=False, cancel_futures=True)
        await self.send_back.close()
        await self.core.close()
        if self._offset_file_lock is not None:
            os.close(self._offset_file_lock)  # releases the flock
            self._offset_file_lock = None

    close = shutdown

    def _lock_offset_file(self) -> None:
        """A second member of the group on this host with the same instance name would
        share the offset file: each would overwrite the other's progress, and a restarted
        one would start past messages only the other consumed. Refused instead."""
        self.offset_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.offset_file.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InvalidArgument(
                f"broadcasting offsets {self.offset_file} are in use by another member of "
                f"group {self.group!r} on this host: give each its own instance_name"
            ) from None
        self._offset_file_lock = fd

    # -- RequestHandler: what brokers send us ----------------------------------------------
    def handle(self, conn: Connection, frame: Frame) -> list | None:
        if frame.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            self._rebalances.wake()
            return None
        if frame.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
            self._reset_offsets(unpack_body(frame.body))
            return None
        raise HamqError(f"consumer does not serve request code {frame.code}")

    def after_batch(self) -> None:
        pass

    def _reset_offsets(self, notice: object) -> None:
        """An operator reset the group's offsets (RESET_CONSUMER_CLIENT_OFFSET): each of
        these queues is released as at a rebalance, but at the new offset, which it
        commits again once the batch in hand is done (so a commit of the old position
        sent before the notice arrived does not stand); the next rebalance takes it again
        from there."""
        if not isinstance(notice, dict) or notice.get("group") != self.group:
            return
        offsets = notice.get("offsets") or {}
        for mq, pq in list(self.process_queues.items()):
            if mq.topic != notice.get("topic") or mq.broker_name != notice.get("broker_name"):
                continue
            offset = offsets.get(mq.queue_id)
            if isinstance(offset, int):
                log.info("%s: offset of %s reset to %d", self.client_id, mq, offset)
                pq.reset_to = offset
                if not pq.dropped:  # else being released: it commits reset_to
                    self._release_later(pq)

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
        return pack_body(
            {
                "client_id": self.client_id,
                "consumer_groups": [
                    {
                        "group": self.group,
                        "message_model": self.message_model,
                        "subscriptions": {t: s.expression for t, s in self.subscriptions.items()},
                    }
                ],
            }
        )

    async def _send_heartbeats(self) -> None:
        if self.cancelled is None:  # a cancelled consumer left the group
            await self.core.heart_beat(await self._broker_addrs(), self._heartbeat_body())

    async def _unregister(self) -> None:
        for addr in await self._broker_addrs():
            try:
                await self.core.invoke(
                    addr,
                    RequestCode.UNREGISTER_CLIENT,
                    {"client_id": self.client_id, "group": self.group},
                )
            except HamqError:
                pass

    # -- rebalance --------------------------------------------------------------------------
    def _duties(self) -> list[PeriodicTask]:
        return [self._heartbeats, self._rebalances, self._persists] + (
            [self._take_refused] if self.orderly else []
        )

    async def _rebalance_round(self) -> None:
        await self._send_heartbeats()  # new brokers of the topic learn about us too
        try:
            await self._rebalance()
        except HamqError as err:  # the next round tries again
            log.warning("rebalance of %s failed: %s", self.group, err.message)

    async def _rebalance(self) -> None:
        if self.cancelled is not None:
            return
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
            changed = self._watch.observe(route) if self._watch is not None else []
            if changed:
                await self._cancel(failover_notice(self.group, changed[0]))
                return
            queues = sorted(route.read_queues)
            if self.message_model == "broadcasting":
                wanted.update(queues)
                continue
            ids = await self._consumer_ids(route)
            if ids is None:
                wanted.update(mq for mq in self.process_queues if mq.topic == topic)
                continue
            wanted.update(allocate_averagely(queues, ids, self.client_id))
        self._refused &= wanted
        for mq, pq in list(self.process_queues.items()):
            if mq not in wanted and not pq.dropped:
                self._release_later(pq)
        for mq in sorted(wanted - set(self.process_queues)):
            await self._add(mq)

    async def _cancel(self, reason: str) -> None:
        """A failover cancelled the consumer (module docstring): its queues are released
        as at shutdown, it leaves the group, and the application is told."""
        self.cancelled = reason
        self._refused.clear()  # not asked for again: the lock retry would take them
        for pq in list(self.process_queues.values()):
            if not pq.dropped:
                self._release_later(pq)
        if self._releases:  # committed before the others take the queues over
            await asyncio.wait(set(self._releases))
        await self._unregister()
        if self.on_cancel is None:
            log.warning("%s cancelled: %s", self.client_id, reason)
            return
        try:
            result = self.on_cancel(reason)
            if inspect.isawaitable(result):
                await result
        except Exception:  # the application's callback must not end the rebalance task
            log.exception("on_cancel of consumer group %s raised", self.group)

    async def _consumer_ids(self, route) -> list[str] | None:
        for addr in sorted(a for members in route.brokers.values() for a in members.values()):
            try:
                frame = await self.core.invoke(
                    addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"group": self.group}
                )
            except HamqError:
                continue
            ids = unpack_body(frame.body) or []
            if self.client_id not in ids:  # the broker has not seen our heartbeat yet
                ids.append(self.client_id)
            return ids
        return None

    async def _add(self, mq: MessageQueue) -> None:
        # a rebalance and a lock retry may both want it; none after shutdown or a cancel
        if mq in self._adding or not self._running or self.cancelled is not None:
            return
        self._adding.add(mq)
        try:
            await self._take(mq)
        finally:
            self._adding.discard(mq)

    async def _take(self, mq: MessageQueue) -> None:
        pq = ProcessQueue(mq, 0, None)
        if self.orderly:
            # RocketMQ: an orderly queue is taken only once its lock is ours, and its offset
            # read after that, so the previous owner's last commit is seen.
            await self._lock([pq])
            if pq.locked_until < monotonic_s():
                self._refused.add(mq)  # asked again by _take_refused_loop, not a rebalance
                return
            self._refused.discard(mq)
        try:
            pq.committed = await self._committed_offset(mq)
            pq.offset = pq.committed if pq.committed is not None else await self._first_offset(mq)
        except HamqError as err:
            log.warning("cannot start %s: %s", mq, err.message)
            started = False
        else:
            started = self._running and self.cancelled is None  # not if stopped meanwhile
        if not started:
            if self.orderly:
                await self._unlock([pq])
            return
        self.process_queues[mq] = pq
        pq.task = asyncio.create_task(self._pull_loop(pq))
        log.info("%s now consumes %s from offset %d", self.client_id, mq, pq.offset)

    def _release_later(self, pq: ProcessQueue) -> None:
        pq.dropped = True
        task = asyncio.create_task(self._release(pq))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, pq: ProcessQueue) -> None:
        """A dropped queue: wait for the listener (an orderly one as long as it runs, its
        lock renewed meanwhile — RocketMQ keeps the lock when ``tryLock`` of the consume
        lock fails), stop pulling, commit (``reset_to`` instead, after a reset), unlock,
        forget the queue."""
        try:
            if self.orderly:
                await pq.wait_idle()
            else:  # the offset never passes the batch in hand: committing is safe anyway
                await asyncio.wait_for(pq.wait_idle(), CONSUME_DRAIN_TIMEOUT_S)
        except TimeoutError:
            log.warning(
                "listener still busy on %s after %s s; dropping it anyway",
                pq.mq,
                CONSUME_DRAIN_TIMEOUT_S,
            )
        if pq.task is not None:
            pq.task.cancel()
            await asyncio.gather(pq.task, return_exceptions=True)
        if pq.reset_to is not None:
            pq.offset, pq.kept, pq.committed = pq.reset_to, [], None
        await self._commit(pq)
        if self.orderly:
            await self._unlock([pq])
        if self.process_queues.get(pq.mq) is pq:
            del self.process_queues[pq.mq]
        if self._running:
            self._rebalances.wake()  # the queue may be wanted again meanwhile

    async def _committed_offset(self, mq: MessageQueue) -> int | None:
        if self.offset_file is not None:
            return self._local_offsets().get(str(mq))
        return await self.puller.fetch_offset(mq)

    async def _first_offset(self, mq: MessageQueue) -> int:
        """Where a group without a committed offset starts (consume_from_where); the first
        commit of the queue records it, so a restart or a new owner starts there too."""
        if self.consume_from_where == "first" or mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return await self.puller.min_offset(mq)
        if self.consume_from_where == "timestamp":
            return await self.puller.search_offset(mq, self.consume_timestamp_ms)
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
            wait_s = pq.retry_at - monotonic_s()
            if pq.kept and wait_s <= 0:
                await self._consume_batch(pq, self._reconsume_kept, pq)
                continue
            if len(pq.kept) >= KEPT_MAX:  # flow control: no new messages until some are done
                await asyncio.sleep(wait_s)
                continue
            suspend_ms = (
                self.pull_suspend_ms
                if not pq.kept
                else min(self.pull_suspend_ms, int(wait_s * 1000))
            )
            try:
                result = await self.puller.pull(pq.mq, pq.offset, self.pull_batch_size, suspend_ms)
            except HamqError as err:
                log.debug("pull %s failed: %s", pq.mq, err.message)
                if isinstance(err, ConnectionLost):
                    pq.locked_until = 0.0  # a lost connection may have cost us the lock
                await asyncio.sleep(PULL_ERROR_BACKOFF_S)
                continue
            if result.status is PullStatus.OFFSET_ILLEGAL:
                pq.offset = result.next_begin_offset
                continue
            if result.status is not PullStatus.FOUND or pq.dropped or not self._running:
                continue
            messages = result.messages
            if sub.tags is not None:
                messages = [m for m in messages if m.tags in sub.tags]
            await self._consume_batch(
                pq, self._consume_pulled, pq, messages, result.next_begin_offset
            )

    async def _consume_batch(self, pq: ProcessQueue, consume, *args) -> None:
        pq.idle.clear()
        try:
            await consume(*args)
        finally:
            pq.idle.set()

    async def _consume_pulled(
        self, pq: ProcessQueue, messages: list[MessageExt], next_offset: int
    ) -> None:
        if messages:
            await self._consume(pq, messages)
        if not pq.abandoned:
            pq.offset = next_offset  # past filtered-out messages too
        pq.abandoned = False

    async def _consume(self, pq: ProcessQueue, messages: list[MessageExt]) -> None:
        size = self.consume_message_batch_max_size
        chunks = [messages[i : i + size] for i in range(0, len(messages), size)]
        if self.orderly:
            await self._consume_orderly(pq, chunks)
            return
        statuses = await self._call_listener(chunks)  # shorter if suspended meanwhile
        for chunk, status in zip(chunks, statuses):
            if status is not ConsumeConcurrentlyStatus.CONSUME_SUCCESS:
                await self._failed(pq, chunk)
        if statuses:
            pq.offset = chunks[len(statuses) - 1][-1].queue_offset + 1
        if len(statuses) < len(chunks):
            pq.abandoned = True  # the rest is pulled again when consumption resumes

    async def _consume_orderly(self, pq: ProcessQueue, chunks: list[list[MessageExt]]) -> None:
        for chunk in chunks:
            while True:
                position = pq.offset
                if (
                    pq.dropped
                    or self._suspended
                    or not await self._ensure_locked(pq)
                    or pq.offset != position
                ):
                    pq.abandoned = True  # dropped, suspended or the lock lost: re-pull later
                    return
                (status,) = await self._call_listener([chunk])
                if status is ConsumeOrderlyStatus.SUCCESS:
                    break
                _count_reconsume(chunk)  # RocketMQ: each in-place retry is a reconsume
                if pq.dropped:
                    pq.abandoned = True
                    return
                await asyncio.sleep(SUSPEND_CURRENT_QUEUE_S)  # retry in place
            # Committed before the lock is given up (the queue is released only after
            # this returns), so the next owner does not repeat a batch that succeeded.
            pq.offset = chunk[-1].queue_offset + 1

    async def _failed(self, pq: ProcessQueue, chunk: list[MessageExt]) -> None:
        """A concurrent listener failed on ``chunk``: what could not be handed back is kept."""
        not_taken = await self._hand_back(pq, chunk)
        if not_taken and not pq.kept:
            pq.retry_at = monotonic_s() + RECONSUME_KEPT_S
        pq.kept += not_taken

    async def _hand_back(self, pq: ProcessQueue, chunk: list[MessageExt]) -> list[MessageExt]:
        """Clustering: hand each message back and return those that could not be;
        broadcasting: drop them (RocketMQ logs and drops)."""
        if self.message_model == "broadcasting":
            log.warning(
                "broadcasting: %d message(s) of %s failed and are dropped", len(chunk), pq.mq
            )
            return []
        not_taken = []
        for msg in chunk:
            if not await self.send_back(msg):
                _count_reconsume([msg])
                not_taken.append(msg)
        return not_taken

    async def _reconsume_kept(self, pq: ProcessQueue) -> None:
        """The kept messages stay in ``pq.kept`` (so the committed offset stays below them)
        until their listener succeeded or a hand-back took them."""
        size = self.consume_message_batch_max_size
        chunks = [pq.kept[i : i + size] for i in range(0, len(pq.kept), size)]
        statuses = await self._call_listener(chunks)
        still: list[MessageExt] = []
        for i, chunk in enumerate(chunks):
            if i >= len(statuses):
                still += chunk  # suspended meanwhile
            elif statuses[i] is not ConsumeConcurrentlyStatus.CONSUME_SUCCESS:
                still += await self._hand_back(pq, chunk)
        pq.kept = still
        pq.retry_at = monotonic_s() + RECONSUME_KEPT_S

    async def _ensure_locked(self, pq: ProcessQueue) -> bool:
        """Orderly: hold the queue's broker lock. A lock that lapsed and is won back may have
        been someone else's meanwhile, so the offset moves up to the group's commit."""
        if (
            pq.locked_until >= monotonic_s()
            and pq.lock_conn is not None
            and not pq.lock_conn.is_closed
        ):
            return True
        await self._lock([pq])
        if pq.locked_until < monotonic_s():
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
        """The listener's answer per chunk (fewer if suspended meanwhile); a listener that
        raised answers None, which every caller treats as a failure to retry."""
        listener = self.listener
        if self._executor is None:
            out = []
            for chunk in chunks:
                if self._suspended:
                    break
                try:
                    out.append(await listener(chunk))
                except Exception:
                    log.exception("listener failed on %d message(s)", len(chunk))
                    out.append(None)
            return out

        def run_all() -> list[object]:
            out = []
            for chunk in chunks:
                if self._suspended:
                    break
                try:
                    out.append(listener(chunk))
                except Exception:
                    log.exception("listener failed on %d message(s)", len(chunk))
                    out.append(None)
            return out

        return await asyncio.get_running_loop().run_in_executor(self._executor, run_all)

    # -- orderly locks ------------------------------------------------------------------------
    async def _lock_loop(self) -> None:
        while self._running or self.process_queues:  # renewed until every queue is released
            await asyncio.sleep(self.lock_renew_interval_s)
            await self._lock(list(self.process_queues.values()))

    async def _take_refused_queues(self) -> None:
        """A refused lock is asked for again on its own, not by a whole rebalance (which
        would also heartbeat every broker and refresh every route each second)."""
        for mq in sorted(self._refused - set(self.process_queues)):
            await self._add(mq)

    async def _lock(self, pqs: list[ProcessQueue]) -> None:
        until = monotonic_s() + self.lock_max_live_s
        async for group, frame, addr in self._lock_requests(RequestCode.LOCK_BATCH_MQ, pqs):
            held = {tuple(k) for k in unpack_body(frame.body) or []} if frame else set()
            conn = self.core.pool.get_ready(addr)
            for pq in group:
                pq.locked_until = until if (pq.mq.topic, pq.mq.queue_id) in held else 0.0
                pq.lock_conn = conn

    async def _unlock(self, pqs: list[ProcessQueue]) -> None:
        async for group, _, _ in self._lock_requests(RequestCode.UNLOCK_BATCH_MQ, pqs):
            for pq in group:  # an unlock that failed lapses by itself on the broker
                pq.locked_until = 0.0

    async def _lock_requests(self, code: int, pqs: list[ProcessQueue]):
        """One LOCK/UNLOCK_BATCH_MQ per broker group; yields (its queues, answer or None,
        the master's address)."""
        for broker_name, group in _by_broker(pqs).items():
            route = self.core.routes.get(group[0].mq.topic)
            addr = route.master_addr(broker_name) if route else None
            if addr is None:
                continue
            body = pack_body([[pq.mq.topic, pq.mq.queue_id] for pq in group])
            try:
                frame = await self.core.invoke(
                    addr, code, {"group": self.group, "client_id": self.client_id}, body
                )
            except HamqError as err:
                log.warning("%s on %s failed: %s", RequestCode(code).name, broker_name, err.message)
                frame = None
                if code == RequestCode.LOCK_BATCH_MQ:
                    # A restarted broker (or one whose connection to us closed) locks only
                    # for clients that heartbeat to it: heartbeat now, not a period later.
                    await self.core.heart_beat([addr], self._heartbeat_body())
            yield group, frame, addr

    # -- offsets --------------------------------------------------------------------------------
    async def _persist_all(self) -> None:
        await self._persist_offsets(list(self.process_queues.values()))

    async def _persist_offsets(self, pqs: list[ProcessQueue]) -> None:
        if self.offset_file is None:
            for pq in pqs:
                await self._commit(pq)
            return
        stored = self._local_offsets()
        stored.update({str(pq.mq): pq.consumed for pq in pqs})
        self.offset_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.offset_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(stored, sort_keys=True))
        tmp.replace(self.offset_file)

    async def _commit(self, pq: ProcessQueue) -> None:
        offset = pq.consumed
        if offset == pq.committed:
            return
        if self.offset_file is not None:
            await self._persist_offsets([pq])
            pq.committed = offset
            return
        try:
            await self.puller.commit_offset(pq.mq, offset)
            pq.committed = offset
        except HamqError as err:
            log.warning("commit of %s failed: %s", pq.mq, err.message)

    def _local_offsets(self) -> dict[str, int]:
        try:
            return json.loads(self.offset_file.read_text())
        except (OSError, ValueError):
            return {}


def _count_reconsume(messages: list[MessageExt]) -> None:
    """One more reconsume time, on the local copies (RocketMQ's setReconsumeTimes)."""
    for msg in messages:
        msg.properties[PROPERTY_RECONSUME_TIME] = str(msg.reconsume_times + 1)


def _by_broker(pqs: list[ProcessQueue]) -> dict[str, list[ProcessQueue]]:
    groups: dict[str, list[ProcessQueue]] = {}
    for pq in pqs:
        groups.setdefault(pq.mq.broker_name, []).append(pq)
    return groups


__all__ = ["AsyncPushConsumer", "ConsumeConcurrentlyStatus", "ConsumeOrderlyStatus"]
