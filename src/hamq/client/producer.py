"""The asyncio producer.

Sends are callback-driven underneath (``send_async``): with a cached route and an open
connection a send is one frame written and one callback later — no task or future per
message, so thousands can be in flight. ``send``/``send_batch`` wrap that in a future.
Retriable failures move to another queue, preferring another broker group
(``retry_times_when_send_failed``, RocketMQ's retryTimesWhenSendFailed).

Every message gets a UNIQ_KEY (RocketMQ's client-generated id) when it is encoded: a send
retried after a timeout carries the same bytes, so a consumer can recognise the copy.

A broker in a memory or disk alarm blocks its publishers (RabbitMQ's connection.blocked):
it tells them with a one-way CONNECTION_BLOCKED and reads nothing more from them until
CONNECTION_UNBLOCKED. ``blocked`` says why sends wait meanwhile; they are not refused.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import zlib
from collections.abc import Callable, Iterable

from hamq.client.core import ClientCore, TopicRoute
from hamq.client.message import UNIQ_KEY_CHARS, Message, MessageQueue, SendResult, SendStatus
from hamq.clock import monotonic_s, wall_ms
from hamq.errors import (
    ConnectionLost,
    HamqError,
    InvalidArgument,
    RequestCodeNotSupported,
    RequestTimeout,
    ServiceNotAvailable,
    TopicNotExist,
)
from hamq.namesrv.routes import AUTO_CREATE_TOPIC_KEY_TOPIC
from hamq.net.connection import Connection
from hamq.net.tasks import spawn
from hamq.policy.definition import DEFAULT_VHOST
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame
from hamq.protocol.limits import MAX_BATCH_MESSAGES
from hamq.protocol.message import encode_batch, validate_topic

log = logging.getLogger(__name__)

SendCallback = Callable[[SendResult | None, HamqError | None], None]

ROUTE_RETRY_DELAY_S = 0.1
UNCONDITIONAL = -1  # a send without expected_queue_offset (the broker's too)

_STATUS_BY_CODE = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


class UniqKeys:
    """UNIQ_KEY values, unique per message of this process (RocketMQ's
    MessageClientIDSetter): 20 hex digits naming the producer (random, so two processes
    never share them, and the pid), then a 12-digit counter."""

    def __init__(self) -> None:
        self._prefix = f"{os.urandom(6).hex()}{os.getpid() & 0xFFFFFFFF:08x}".upper()
        assert len(self._prefix) == UNIQ_KEY_CHARS - 12
        self._counter = itertools.count()

    def next(self) -> str:
        # 12 hex digits last for 2**48 messages of one process.
        return f"{self._prefix}{next(self._counter):012X}"


class AsyncProducer:
    def __init__(
        self,
        namesrv: str | Iterable[str],
        group: str = "DEFAULT_PRODUCER",
        send_timeout_s: float = 3.0,
        retry_times_when_send_failed: int = 2,
        vhost: str = DEFAULT_VHOST,
    ) -> None:
        self.core = ClientCore(namesrv, send_timeout_s, vhost=vhost)
        self.group = self.core.wire(group)
        self.send_timeout_s = send_timeout_s
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self._next_queue = itertools.count()
        self._uniq_keys = UniqKeys()
        self._stale: set[str] = set()  # topics whose route must be refreshed before use
        self._refreshing: dict[str, asyncio.Future] = {}
        self._blocked: dict[Connection, str] = {}  # broker connections blocked, and why
        self.core.pool.handler = self  # brokers tell us CONNECTION_(UN)BLOCKED

    @property
    def blocked(self) -> str | None:
        """Why a broker blocks this producer's sends ("memory" or "disk"), or None."""
        # (read from any thread: the sync Producer's; a closed connection blocks nothing)
        return next((r for c, r in list(self._blocked.items()) if not c.is_closed), None)

    # -- requests from brokers (RequestHandler) --------------------------------------------
    def handle(self, conn: Connection, frame: Frame) -> list | None:
        for closed in [c for c in self._blocked if c.is_closed]:
            del self._blocked[closed]  # its replacement starts unblocked
        if frame.code == RequestCode.CONNECTION_BLOCKED:
            reason = str(frame.ext.get("reason", "?"))
            self._blocked[conn] = reason
            log.warning(
                "broker %s blocks this producer's sends (%s alarm: %s); they wait",
                conn.peer,
                reason,
                frame.ext.get("detail", ""),
            )
        elif frame.code == RequestCode.CONNECTION_UNBLOCKED:
            if self._blocked.pop(conn, None) is not None:
                log.warning("broker %s unblocked this producer's sends", conn.peer)
        else:
            raise RequestCodeNotSupported(f"a producer does not take request code {frame.code}")
        return None

    def after_batch(self) -> None:
        pass

    async def start(self) -> None:
        """Nothing to open eagerly; kept so the lifecycle reads like RocketMQ's."""

    async def close(self) -> None:
        await self.core.close()

    # -- public API ---------------------------------------------------------------------
    async def send(
        self,
        message: Message,
        queue: MessageQueue | None = None,
        expected_queue_offset: int | None = None,
    ) -> SendResult:
        """Send one message (to ``queue``, else to the next queue of its topic's route).

        ``expected_queue_offset`` makes the send conditional (a compare-and-set on the
        queue's end, ``broker/conditional.py``; it needs ``queue``): the broker stores the
        message only if ``queue``'s next offset is exactly that when it orders the put, so
        of several senders expecting one offset at most one succeeds; otherwise it raises
        ``QueueOffsetMismatch`` whose ``end_offset`` is the queue's next offset then, and
        nothing was stored. Such a send is never retried, on this queue or another: a
        ``RequestTimeout`` or ``ConnectionLost`` means the outcome is unknown (the message
        may be stored at ``expected_queue_offset``, or not at all); read that offset of the
        queue from its master to learn which.
        """
        return await self._as_future(
            message.topic,
            [self.encode(message)],
            RequestCode.SEND_MESSAGE,
            queue,
            _conditional(queue, expected_queue_offset),
        )

    async def send_orderly(self, message: Message, sharding_key: str | bytes) -> SendResult:
        """Send to the queue chosen by ``sharding_key`` (a stable hash), so one key's
        messages stay in one queue, in order (RocketMQ's MessageQueueSelector by key).
        Retries stay on that queue: moving would reorder the key."""
        return await self.send(message, await self.select_queue(message.topic, sharding_key))

    async def select_queue(self, topic: str, sharding_key: str | bytes) -> MessageQueue:
        key = sharding_key.encode() if isinstance(sharding_key, str) else sharding_key
        queues = (await self._route(self.core.wire(topic))).write_queues
        return self.core.user_queue(queues[zlib.crc32(key) % len(queues)])

    async def send_batch(
        self, messages: list[Message], queue: MessageQueue | None = None
    ) -> SendResult:
        """All messages must share one topic; they are stored as one record, in order."""
        if not messages:
            raise InvalidArgument("send_batch needs at least one message")
        if len(messages) > MAX_BATCH_MESSAGES:
            raise InvalidArgument(f"a batch holds at most {MAX_BATCH_MESSAGES} messages")
        topic = messages[0].topic
        if any(m.topic != topic for m in messages):
            raise InvalidArgument("all messages of a batch must have the same topic")
        if len(messages) > 1 and any(m.delay_level or m.deliver_time_ms for m in messages):
            # RocketMQ does not batch them either: each waits in the schedule topic alone.
            raise InvalidArgument(
                "delay and timer messages cannot be batched; send them one at a time"
            )
        return await self._as_future(
            topic, [self.encode(m) for m in messages], RequestCode.SEND_BATCH_MESSAGE, queue
        )

    def send_async(
        self, message: Message, callback: SendCallback, queue: MessageQueue | None = None
    ) -> None:
        """Send without waiting; ``callback(result, error)`` runs on the event loop."""
        self.send_encoded_async(message.topic, [self.encode(message)], callback, queue)

    def send_encoded_async(
        self,
        topic: str,
        encoded: list[bytes],
        callback: SendCallback,
        queue: MessageQueue | None = None,
    ) -> None:
        payload, crc = encode_batch(encoded)
        self.send_payload_async(topic, payload, crc, len(encoded), callback, queue)

    def send_payload_async(
        self,
        topic: str,
        payload: bytes,
        crc: int,
        count: int,
        callback: SendCallback,
        queue: MessageQueue | None = None,
    ) -> None:
        """Send a batch that is already encoded (``protocol.message.encode_batch``): the
        same bytes can be sent many times without re-encoding."""
        code = RequestCode.SEND_MESSAGE if count == 1 else RequestCode.SEND_BATCH_MESSAGE
        topic, queue = self._wire(topic, queue)
        self._dispatch(_Send(topic, code, payload, crc, count, callback, queue))

    async def warm_up(self, topic: str) -> None:
        """Fetch the route and open a connection to every master of ``topic``, so the first
        sends do not pay for it (benchmarks, latency-sensitive producers)."""
        route = await self._route(self.core.wire(topic))
        await asyncio.gather(
            *(
                self.core.pool.get(route.master_addr(name))
                for name in {q.broker_name for q in route.write_queues}
            )
        )

    async def send_oneway(self, message: Message) -> None:
        route = await self._route(self.core.wire(message.topic))
        mq = self._select_queue(route, None)
        conn = await self.core.pool.get(route.master_addr(mq.broker_name))
        payload, crc = encode_batch([self.encode(message)])
        conn.oneway(RequestCode.SEND_MESSAGE, self._ext(mq, crc, 1), payload)

    def encode(self, message: Message) -> bytes:
        """``message`` in its wire form with a new UNIQ_KEY (unless it has one)."""
        return message.encode(self._uniq_keys.next())

    # -- internals ----------------------------------------------------------------------
    def _wire(self, topic: str, queue: MessageQueue | None) -> tuple[str, MessageQueue | None]:
        """A send's topic and queue, named by the user, as they go on the wire."""
        return self.core.wire(topic), queue and self.core.wire_queue(queue)

    def _as_future(
        self,
        topic: str,
        encoded: list[bytes],
        code: int,
        queue: MessageQueue | None,
        expected_queue_offset: int = UNCONDITIONAL,
    ) -> asyncio.Future[SendResult]:
        future = asyncio.get_running_loop().create_future()

        def done(result: SendResult | None, err: HamqError | None) -> None:
            if not future.done():
                future.set_exception(err) if err is not None else future.set_result(result)

        payload, crc = encode_batch(encoded)
        topic, queue = self._wire(topic, queue)
        self._dispatch(
            _Send(topic, code, payload, crc, len(encoded), done, queue, expected_queue_offset)
        )
        return future

    def _dispatch(self, s: _Send, route: TopicRoute | None = None) -> None:
        """Send ``s`` on ``route`` (one just looked up for it), else on the cached route,
        else after a lookup."""
        if route is None:
            route = self.core.routes.get(s.topic)
            if route is None or s.topic in self._stale:
                spawn(self._route_then_dispatch(s))
                return
        try:
            mq = s.queue or self._select_queue(route, s.avoid)
        except HamqError as err:
            s.callback(None, err)
            return
        addr = route.master_addr(mq.broker_name)
        if addr is None:
            self._retry_or_fail(
                s, mq, ServiceNotAvailable(f"broker group {mq.broker_name} has no master")
            )
            return
        conn = self.core.pool.get_ready(addr)
        if conn is None:
            spawn(self._connect_then_send(s, mq, addr))
        else:
            self._send_on(conn, s, mq)

    def _send_on(self, conn: Connection, s: _Send, mq: MessageQueue) -> None:
        def on_response(frame: Frame | None, err: HamqError | None) -> None:
            if err is None:
                status = _STATUS_BY_CODE.get(frame.code)
                if status is not None:
                    ext = frame.ext
                    s.callback(
                        SendResult(
                            status,
                            ext["msg_id"],
                            self.core.user_queue(mq),
                            ext["queue_offset"],
                            s.count,
                        ),
                        None,
                    )
                    return
                err = HamqError.for_code(frame.code, frame.remark, frame.ext)
            self._retry_or_fail(s, mq, err)

        ext = self._ext(mq, s.crc, s.count)
        if s.expected_queue_offset != UNCONDITIONAL:
            ext["expected_queue_offset"] = s.expected_queue_offset
        conn.request_cb(s.code, on_response, ext, s.payload, self.send_timeout_s)

    async def _connect_then_send(self, s: _Send, mq: MessageQueue, addr: str) -> None:
        try:
            conn = await self.core.pool.get(addr)
        except HamqError as err:
            self._retry_or_fail(s, mq, err)
            return
        self._send_on(conn, s, mq)

    async def _route_then_dispatch(self, s: _Send) -> None:
        refreshing = self._refreshing.get(s.topic)
        if refreshing is None:  # one route lookup however many sends wait for it
            refreshing = asyncio.ensure_future(self._route(s.topic))
            self._refreshing[s.topic] = refreshing
            refreshing.add_done_callback(lambda _: self._refreshing.pop(s.topic, None))
        try:
            route = await asyncio.shield(refreshing)
        except HamqError as err:
            if not err.retriable or s.attempt >= self.retry_times_when_send_failed:
                s.callback(None, err)
                return
            s.attempt += 1
            await asyncio.sleep(ROUTE_RETRY_DELAY_S * s.attempt)
            self._dispatch(s)
            return
        # Sent on the route just looked up even if that lookup marked the topic stale
        # (the TBW102 template of an auto-created topic is): looking up again here would
        # never send, and the topic would never be created.
        self._dispatch(s, route)

    def _retry_or_fail(self, s: _Send, mq: MessageQueue, err: HamqError) -> None:
        if err.refresh_route:
            self._stale.add(s.topic)
        if isinstance(err, (ConnectionLost, RequestTimeout)):
            route = self.core.routes.get(s.topic)
            addr = route.master_addr(mq.broker_name) if route else None
            if addr is not None:
                self.core.mark_unreachable(addr)
        if (
            err.retriable
            and s.attempt < self.retry_times_when_send_failed
            # a conditional send may have been stored: sent again it would find its own
            # message (a mismatch), and another queue has other offsets
            and s.expected_queue_offset == UNCONDITIONAL
        ):
            s.attempt += 1
            s.avoid = mq.broker_name
            self._dispatch(s)
        else:
            s.callback(None, err)

    async def _route(self, topic: str) -> TopicRoute:
        validate_topic(topic)
        refresh = topic in self._stale
        self._stale.discard(topic)
        try:
            route = await self.core.route(topic, refresh=refresh)
        except TopicNotExist:
            # RocketMQ's auto-create path: brokers that may create topics publish TBW102.
            try:
                template = await self.core.route(AUTO_CREATE_TOPIC_KEY_TOPIC, refresh=refresh)
            except TopicNotExist:
                raise TopicNotExist(
                    f"topic {topic!r} does not exist (no route on the name "
                    "servers) and no broker auto-creates topics"
                ) from None
            route = TopicRoute(
                topic,
                tuple(
                    MessageQueue(topic, q.broker_name, q.queue_id) for q in template.write_queues
                ),
                (),
                template.brokers,
                monotonic_s(),
            )
            self.core.routes[topic] = route
            self._stale.add(topic)  # look up the real route next time
        if not route.write_queues:
            # looked up again at the next send: a group between two masters has none for a
            # moment (a role change), and the route alone says when one is back
            self._stale.add(topic)
            raise TopicNotExist(f"topic {topic!r} has no writable queue (no master alive?)")
        return route

    def _select_queue(self, route: TopicRoute, avoid: str | None) -> MessageQueue:
        queues = route.write_queues
        if not queues:
            raise TopicNotExist(f"topic {route.topic!r} has no writable queue")
        n = next(self._next_queue)
        if avoid is None and not self.core.avoiding_any:  # the common case, cheaply
            return queues[n % len(queues)]
        healthy = [
            q
            for q in queues
            if q.broker_name != avoid and self.core.reachable(route.master_addr(q.broker_name))
        ]
        if healthy and len(healthy) < len(queues):
            return healthy[n % len(healthy)]
        return queues[n % len(queues)]

    @staticmethod
    def _ext(mq: MessageQueue, crc: int, count: int) -> dict:
        return {
            "topic": mq.topic,
            "queue_id": mq.queue_id,
            "count": count,
            "crc": crc,
            "born_ts": wall_ms(),
        }


__all__ = ["AsyncProducer"]


def _conditional(queue: MessageQueue | None, expected_queue_offset: int | None) -> int:
    """The expected offset a send carries, checked: it names one queue's offset."""
    if expected_queue_offset is None:
        return UNCONDITIONAL
    if queue is None:
        raise InvalidArgument("expected_queue_offset needs the queue it is an offset of")
    if expected_queue_offset < 0:
        raise InvalidArgument(f"expected_queue_offset {expected_queue_offset} is negative")
    return expected_queue_offset


class _Send:
    """One send in flight: its bytes, where its answer goes and how far its retries got.
    A plain object (not a task or future), so thousands in flight stay cheap."""

    __slots__ = (
        "attempt",
        "avoid",
        "callback",
        "code",
        "count",
        "crc",
        "expected_queue_offset",
        "payload",
        "queue",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        code: int,
        payload: bytes,
        crc: int,
        count: int,
        callback: SendCallback,
        queue: MessageQueue | None,
        expected_queue_offset: int = UNCONDITIONAL,
    ) -> None:
        self.topic = topic
        self.code = code
        self.payload = payload
        self.crc = crc
        self.count = count
        self.callback = callback
        self.queue = queue
        self.attempt = 0
        self.avoid: str | None = None
        self.expected_queue_offset = expected_queue_offset
