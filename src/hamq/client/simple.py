"""The simple consumer (RocketMQ 5's ``SimpleConsumer``, over pop): ``receive`` messages that
stay invisible to the rest of the group for a while, ``ack`` each one, or
``change_invisible_duration`` to keep it longer. A message not acked in time is received
again (by any member of the group) with ``reconsume_times + 1``.

Each ``receive`` pops from one broker group of the subscribed topics, rotating over them
(and the broker rotates over its queues); when none has messages, the last one asked holds
the request up to ``await_duration_s`` (long polling). Tag expressions (``"*"``,
``"TagA || TagB"``) are applied here, on the client: a received message that does not match
is acked at once and never returned, so it is consumed (and skipped) for the group.

``ack_async`` batches the acks of one event-loop turn per broker into one
``BATCH_ACK_MESSAGE``: per-message acks cost one request per turn, not one per message.

A message handed out again (``reconsume_times`` > 0: its invisible time ran out, or a new
master took over while it was unacked) is marked ``redelivered``. With
``cancel_on_ha_failover=True`` (RabbitMQ's ``x-cancel-on-ha-failover``), once a route shows
another master for a broker group of the subscribed topics (``master_watch.py``),
``receive`` raises ``ConsumerCancelled`` until ``subscribe`` (or ``start``) is called again;
without it a failover only costs the receives that reach the lost master (each refreshes
the route, so the next one finds the new master).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from hamq.client.core import ClientCore, TopicRoute
from hamq.client.master_watch import MasterWatch, failover_notice
from hamq.client.message import MessageExt, user_name
from hamq.client.rebalance import parse_tag_expression
from hamq.clock import monotonic_s
from hamq.errors import ConsumerCancelled, HamqError, InvalidArgument, ServiceNotAvailable
from hamq.net.connection import Connection
from hamq.net.tasks import spawn
from hamq.policy.definition import DEFAULT_VHOST
from hamq.protocol.codes import RequestCode, ResponseCode
from hamq.protocol.frame import Frame, pack_body
from hamq.protocol.message import decode_records
from hamq.protocol.properties import PROPERTY_REDELIVERED

AckCallback = Callable[[HamqError | None], None]

DEFAULT_RECEIVE_BATCH = 32  # RocketMQ's default maxMessageNum
DEFAULT_INVISIBLE_DURATION_S = 30.0
DEFAULT_AWAIT_DURATION_S = 5.0  # RocketMQ awaitDuration: long-polling hold of a receive
MAX_ACKS_PER_REQUEST = 4096  # the broker's limit for one BATCH_ACK_MESSAGE
CLOSE_ACK_WAIT_S = 5.0  # close() waits this long for acks still in flight
_POP_OK = (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND)


class PopMessageExt(MessageExt):
    """A received message: a ``MessageExt`` plus the pop's ``reconsume_times`` and the
    checkpoint (``ck``) that makes its receipt handle."""

    __slots__ = ("ck", "reconsume_times")

    # Acks name the stored topic, on the wire; pop redelivers in place, so there is no
    # retry topic to look through. ``topic`` is the name in the consumer's vhost.
    wire_topic = property(lambda self: self._record.topic)
    topic = property(lambda self: user_name(self._record.topic))

    @property
    def offset(self) -> int:
        return self.queue_offset

    @property
    def receipt_handle(self) -> str:
        return f"{self.wire_topic} {self.broker_name} {self.queue_id} {self.queue_offset} {self.ck}"


class AsyncSimpleConsumer:
    def __init__(
        self,
        group: str,
        namesrv: str | Iterable[str],
        subscriptions: dict[str, str],
        await_duration_s: float = DEFAULT_AWAIT_DURATION_S,
        timeout_s: float = 3.0,
        consume_from_first: bool = True,
        cancel_on_ha_failover: bool = False,
        vhost: str = DEFAULT_VHOST,
    ) -> None:
        if not subscriptions:
            raise InvalidArgument("subscriptions must name at least one topic")
        self.core = ClientCore(namesrv, timeout_s, vhost=vhost)
        self.group = self.core.wire(group)  # topics and groups on the wire (client/core.py)
        self.await_duration_s = await_duration_s
        # RocketMQ ConsumeInitMode for a group without an offset: MIN (first) or MAX (last).
        self.init_mode = "min" if consume_from_first else "max"
        self.filters = {
            self.core.wire(topic): parse_tag_expression(expr)
            for topic, expr in subscriptions.items()
        }
        self._next_target = 0
        self._pending_acks: dict[str, list[tuple[PopMessageExt, AckCallback | None]]] = {}
        self._ack_requests_in_flight = 0
        self._watch = MasterWatch() if cancel_on_ha_failover else None
        self.cancelled: ConsumerCancelled | None = None  # raised by receive until resumed

    async def start(self) -> None:
        """Fetch the subscribed topics' routes now, so a missing topic fails early; a
        consumer cancelled by a failover consumes again."""
        for topic in self.filters:
            self._watch_route(await self.core.route(topic, refresh=True))
        self.cancelled = None

    async def subscribe(self, topic: str, expression: str = "*") -> None:
        """Receive ``topic`` too (or with another tag expression); a consumer cancelled by
        a failover consumes again (RabbitMQ: consume again after the cancel notice)."""
        tags = parse_tag_expression(expression)
        topic = self.core.wire(topic)
        self._watch_route(await self.core.route(topic, refresh=True))
        self.filters[topic] = tags
        self.cancelled = None

    def _watch_route(self, route: TopicRoute) -> None:
        """With ``cancel_on_ha_failover``: a route naming another master for a broker
        group cancels the consumer (module docstring)."""
        if self._watch is None:
            return
        changed = self._watch.observe(route)
        if changed and self.cancelled is None:
            self.cancelled = ConsumerCancelled(
                failover_notice(self.group, changed[0]), broker_name=changed[0]
            )

    async def close(self) -> None:
        deadline = monotonic_s() + CLOSE_ACK_WAIT_S
        while (self._pending_acks or self._ack_requests_in_flight) and monotonic_s() < deadline:
            await asyncio.sleep(0.01)
        await self.core.close()

    # -- receive --------------------------------------------------------------------------
    async def receive(
        self,
        max_messages: int = DEFAULT_RECEIVE_BATCH,
        invisible_duration_s: float = DEFAULT_INVISIBLE_DURATION_S,
    ) -> list[PopMessageExt]:
        """Raises ``ConsumerCancelled`` once a failover cancelled the consumer (module
        docstring)."""
        targets = []
        for topic in self.filters:
            route = await self.core.route(topic)
            self._watch_route(route)
            targets += [(topic, b) for b in sorted({mq.broker_name for mq in route.read_queues})]
        if self.cancelled is not None:
            raise self.cancelled
        if not targets:
            raise ServiceNotAvailable(f"no broker serves {', '.join(self.filters)}")
        for i in range(len(targets)):
            topic, broker = targets[self._next_target % len(targets)]
            self._next_target += 1
            poll_s = self.await_duration_s if i == len(targets) - 1 else 0.0
            messages = await self._pop(
                topic, broker, max_messages, int(invisible_duration_s * 1000), poll_s
            )
            if messages is not None:
                return self._filter(topic, messages)
        return []

    async def _pop(
        self, topic: str, broker: str, max_messages: int, invisible_ms: int, poll_s: float
    ) -> list[PopMessageExt] | None:
        addr = (await self.core.route(topic)).master_addr(broker)
        if addr is None:
            return None  # pop changes state: only a master serves it
        try:
            frame = await self.core.invoke(
                addr,
                RequestCode.POP_MESSAGE,
                {
                    "group": self.group,
                    "topic": topic,
                    "queue_id": -1,
                    "max_msgs": max_messages,
                    "invisible_time_ms": invisible_ms,
                    "poll_time_ms": int(poll_s * 1000),
                    "init_mode": self.init_mode,
                },
                ok=_POP_OK,
                timeout_s=self.core.timeout_s + poll_s,
            )
        except HamqError as err:
            if err.refresh_route:  # the master is lost or deposed: the next receive
                await self._refresh_route(topic)  # asks the one the name servers name
            raise
        if frame.code != ResponseCode.SUCCESS:
            return None
        return decode_pop(frame, broker)

    async def _refresh_route(self, topic: str) -> None:
        try:
            self._watch_route(await self.core.route(topic, refresh=True))
        except HamqError:
            pass  # no name server answers: the cached route is tried again

    def _filter(self, topic: str, messages: list[PopMessageExt]) -> list[PopMessageExt]:
        tags = self.filters[topic]
        if tags is None:
            return messages
        kept = []
        for m in messages:
            if m.tags in tags:
                kept.append(m)
            else:
                self.ack_async(m)
        return kept

    # -- ack ------------------------------------------------------------------------------
    async def ack(self, message: PopMessageExt) -> None:
        """Ack one message and wait for the broker's answer. Raises ``InvalidArgument`` if
        its receipt handle is stale (its invisible time ran out and it was received again)."""
        await self.core.invoke(
            await self._addr(message),
            RequestCode.ACK_MESSAGE,
            {
                "group": self.group,
                "topic": message.wire_topic,
                "queue_id": message.queue_id,
                "offset": message.queue_offset,
                "ck": message.ck,
            },
        )

    def ack_async(self, message: PopMessageExt, callback: AckCallback | None = None) -> None:
        """Ack without waiting; ``callback(error_or_None)`` runs on the event loop. The acks
        of one event-loop turn leave as one BATCH_ACK_MESSAGE per broker."""
        route = self.core.routes.get(message.wire_topic)
        addr = route.master_addr(message.broker_name) if route is not None else None
        if addr is None:
            if callback is not None:
                callback(ServiceNotAvailable(f"broker group {message.broker_name} has no master"))
            return
        pending = self._pending_acks.get(addr)
        if pending is None:
            pending = self._pending_acks[addr] = []
            asyncio.get_running_loop().call_soon(self._flush_acks, addr)
        pending.append((message, callback))

    def _flush_acks(self, addr: str) -> None:
        pending = self._pending_acks.pop(addr)
        conn = self.core.pool.get_ready(addr)
        for i in range(0, len(pending), MAX_ACKS_PER_REQUEST):
            batch = pending[i : i + MAX_ACKS_PER_REQUEST]
            self._ack_requests_in_flight += 1
            if conn is None:
                spawn(self._connect_then_ack(addr, batch))
            else:
                self._send_acks(conn, batch)

    async def _connect_then_ack(self, addr: str, batch: list) -> None:
        try:
            conn = await self.core.pool.get(addr)
        except HamqError as err:
            self._acks_done(batch, err, ())
            return
        self._send_acks(conn, batch)

    def _send_acks(self, conn: Connection, batch: list) -> None:
        def on_response(frame: Frame | None, err: HamqError | None) -> None:
            if err is None and frame.code != ResponseCode.SUCCESS:
                err = HamqError.for_code(frame.code, frame.remark)
            self._acks_done(batch, err, frame.ext.get("stale", ()) if err is None else ())

        body = pack_body([[m.wire_topic, m.queue_id, m.queue_offset, m.ck] for m, _ in batch])
        conn.request_cb(
            RequestCode.BATCH_ACK_MESSAGE,
            on_response,
            {"group": self.group},
            body,
            self.core.timeout_s,
        )

    def _acks_done(self, batch: list, err: HamqError | None, stale: Iterable[int]) -> None:
        self._ack_requests_in_flight -= 1
        stale_at = set(stale)
        for i, (message, callback) in enumerate(batch):
            if callback is None:
                continue
            if err is None and i in stale_at:
                callback(InvalidArgument(f"receipt handle {message.receipt_handle} is stale"))
            else:
                callback(err)

    async def change_invisible_duration(self, message: PopMessageExt, duration_s: float) -> None:
        """Make the message invisible for ``duration_s`` from now (0: visible again at
        once); its receipt handle changes."""
        frame = await self.core.invoke(
            await self._addr(message),
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
            {
                "group": self.group,
                "topic": message.wire_topic,
                "queue_id": message.queue_id,
                "offset": message.queue_offset,
                "ck": message.ck,
                "invisible_time_ms": int(duration_s * 1000),
            },
        )
        message.ck = frame.ext["ck"]

    async def _addr(self, message: PopMessageExt) -> str:
        addr = (await self.core.route(message.wire_topic)).master_addr(message.broker_name)
        if addr is None:
            raise ServiceNotAvailable(f"broker group {message.broker_name} has no master")
        return addr


def decode_pop(frame: Frame, broker_name: str) -> list[PopMessageExt]:
    """The messages of a POP_MESSAGE answer: per chunk (queue id, offsets handed out, their
    reconsume times, record bytes), the chunk's records filtered to those offsets. One
    handed out before (reconsume times > 0) is marked redelivered."""
    ck = frame.ext["ck"]
    body = frame.body
    out: list[PopMessageExt] = []
    pos = 0
    for _, offsets, times, nbytes in frame.ext["chunks"]:
        wanted = dict(zip(offsets, times))
        for m in decode_records(body[pos : pos + nbytes], offsets[0], PopMessageExt, broker_name):
            times_ = wanted.get(m.queue_offset)
            if times_ is not None:
                m.reconsume_times = times_
                m.ck = ck
                if times_:
                    m.properties[PROPERTY_REDELIVERED] = "true"
                out.append(m)
        pos += nbytes
    return out
